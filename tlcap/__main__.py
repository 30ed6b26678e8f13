"""``python -m tlcap`` runs the command-line interface."""

from tlcap.cli import main

main()
