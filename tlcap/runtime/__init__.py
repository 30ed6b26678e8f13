"""The hook runtime: named sites and hook factories (applied through ``Model.hooks``)."""

from tlcap.runtime import hooks
from tlcap.runtime.sites import SITES, Site, get_site

__all__ = ["hooks", "SITES", "Site", "get_site"]
