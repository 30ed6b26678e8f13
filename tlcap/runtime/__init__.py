"""The hook runtime: named sites, hook factories (applied through ``Model.hooks``) and positions."""

from tlcap.runtime import hooks, positions
from tlcap.runtime.sites import SITES, Site, get_site

__all__ = ["hooks", "positions", "SITES", "Site", "get_site"]
