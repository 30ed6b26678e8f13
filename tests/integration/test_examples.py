"""examples/test_my_mechanism.py runs as a user runs it: its own pytest process, fixtures from the plugin."""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _plugin_installed() -> bool:
    return any(ep.value == "tlcap_pytest" for ep in importlib.metadata.entry_points(group="pytest11"))


def test_the_example_mechanism_tests_pass(smollm2):  # smollm2: the example's last test needs the real model
    # -o addopts="": a user's project runs without tlcap's own options (the jaxtyping instrumentation
    # of every tlcap function would triple the time; the suite's other tests check the shapes).
    args = [sys.executable, "-m", "pytest", "examples/test_my_mechanism.py", "-q", "-rs", "-p", "no:cacheprovider",
            "-o", "addopts="]
    if not _plugin_installed():  # an editable install older than the entry point: name the plugin
        args += ["-p", "tlcap_pytest"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    run = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b4 passed, 1 xfailed\b", run.stdout), run.stdout[-2000:]
