"""Every warning class tlcap defines derives from ``TlcapWarning``, so users can filter them all at once."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import tlcap
from tlcap.errors import TlcapWarning


def _warning_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(tlcap.__path__, prefix="tlcap."):
        if info.name.startswith("tlcap.cli") or info.name == "tlcap.__main__":
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, Warning) and obj.__module__ == info.name:
                found[f"{info.name}.{name}"] = obj
    return found


def test_every_tlcap_warning_is_a_tlcap_warning() -> None:
    classes = _warning_classes()
    # The known ones must be found (guards against the walk silently finding nothing).
    assert {"tlcap.locate.subjects.SubjectWarning", "tlcap.data.sample.DataWarning",
            "tlcap.experiments.cnl.config.CNLWarning", "tlcap.viz.export.StaticExportWarning"} <= set(classes)
    stray = sorted(name for name, cls in classes.items() if not issubclass(cls, TlcapWarning))
    assert stray == []
