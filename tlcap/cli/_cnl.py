"""Input checks and output helpers of ``tlcap cnl`` (checked before any model load).

- list options (``--sigma 3,6,12``, ``--eval-epochs``, ``--layers 0-5,8``) parsed with one-line
  errors;
- ``--neurons`` files (a ``tlcap cnl locate`` summary or its folder) read and checked: present,
  a finished located run (not a shard part), not empty;
- data and CNL warnings printed as one ``warning: ...`` line each, before the error line if the
  command fails.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tlcap.cli._checks import neuron_pairs, neurons_fit, spec
from tlcap.data.sample import DataWarning
from tlcap.errors import DataFormatError, EmptyNeuronSetError, InvalidConfigError, MissingFileError, ShapeMismatchError
from tlcap.experiments.cnl import CNLLocation, CNLWarning
from tlcap.metrics.sets import NeuronSet
from tlcap.models import Model
from tlcap.results import load_result


def floats(option: str, spec: str) -> list[float]:
    """``"3,6,12"`` → ``[3.0, 6.0, 12.0]``."""
    try:
        return [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise InvalidConfigError(f"{option} takes comma-separated numbers (e.g. 3,6,12), got {spec!r}") from None


def ints(option: str, spec: str) -> list[int]:
    """``"1,5,10"`` → ``[1, 5, 10]``."""
    try:
        return [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise InvalidConfigError(f"{option} takes comma-separated integers (e.g. 1,5,10), got {spec!r}") from None


def parse_steps(spec: str) -> int | str:
    """``"20"`` → 20, ``"auto"`` → ``"auto"`` (``--steps``).

    Raises:
        InvalidConfigError: neither an integer nor ``auto``.
    """
    if spec.strip().lower() == "auto":
        return "auto"
    try:
        return int(spec)
    except ValueError:
        raise InvalidConfigError(f"--steps must be an integer >= 1 or 'auto', got {spec!r}") from None


def layers(spec: str | None) -> list[int] | None:
    """``"0-3,8"`` → ``[0, 1, 2, 3, 8]`` (None / empty: all layers)."""
    if not spec:
        return None
    out: list[int] = []
    try:
        for part in spec.split(","):
            if "-" in part.strip()[1:]:
                a, b = part.split("-")
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise InvalidConfigError(f"--layers takes layers and ranges such as 0-5,8, got {spec!r}") from None
    return out


@dataclass(frozen=True)
class NeuronSource:
    """A ``tlcap cnl locate`` (or ``merge``) output given to ``--neurons``."""

    summary_path: Path
    run_dir: Path
    task: str
    neurons: list
    sigma: float | None

    def check_model(self, model: str) -> None:
        """Refuse, before loading ``model``, neurons outside its shape (a file located on another model)."""
        neurons_fit(spec(model), neuron_pairs(self.neurons, str(self.summary_path)), str(self.summary_path))

    def neuron_set(self, model: Model) -> NeuronSet:
        """The located set, checked against the model's shape."""
        try:
            return NeuronSet.from_list(self.neurons, (model.n_layers, model.d_mlp))
        except ValueError as exc:
            raise ShapeMismatchError(f"neurons in {self.summary_path} do not fit {model.name} ({exc}); locate them on the "
                                     "same model") from None

    def location(self, model: Model) -> CNLLocation:
        """The saved scores (``result/``) of the run, for re-thresholding at other σ."""
        res_dir = self.run_dir / "result"
        if not (res_dir / "result.json").exists():
            raise MissingFileError(f"--sigma re-thresholds the saved scores of a `tlcap cnl locate` run, but {res_dir} "
                                   "does not exist; pass the --out folder of `tlcap cnl locate` (or `merge`) to --neurons")
        loc = load_result(res_dir)
        if not isinstance(loc, CNLLocation):
            raise DataFormatError(f"{res_dir} holds a {type(loc).__name__}, not the scores of `tlcap cnl locate`")
        if loc.shape != (model.n_layers, model.d_mlp):
            raise ShapeMismatchError(f"the scores in {res_dir} have shape {loc.shape}, {model.name} has "
                                     f"{(model.n_layers, model.d_mlp)}; locate them on the same model")
        return loc


def neuron_source(path: Path, option: str = "--neurons", allow_empty: bool = False) -> NeuronSource:
    """Read and check a ``--neurons`` argument before any model load.

    Raises:
        MissingFileError: no such file or folder.
        DataFormatError: not the summary of a finished ``locate`` (or a shard part).
        EmptyNeuronSetError: the located set is empty (unless ``allow_empty``).
    """
    path = Path(path)
    summary = path / "summary.json" if path.is_dir() else path
    if not summary.exists():
        raise MissingFileError(f"{option} {path}: {summary} not found; pass the --out folder (or summary.json) of "
                               "`tlcap cnl locate`")
    try:
        data = json.loads(summary.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataFormatError(f"{summary} is not valid JSON ({exc}); pass the summary.json of `tlcap cnl locate`") from None
    if not isinstance(data, dict) or data.get("partial"):
        raise DataFormatError(f"{summary} is a shard part of `tlcap cnl locate --shard`; merge the parts first "
                              "(`tlcap cnl merge`) and pass the merged folder")
    if "neurons" not in data:
        raise DataFormatError(f"{summary} has no 'neurons' list; pass the summary.json written by `tlcap cnl locate`")
    neuron_pairs(data["neurons"], str(summary))  # malformed entries: named here, not blamed on the model later
    if not data["neurons"] and not allow_empty:
        raise EmptyNeuronSetError(
            f"the neuron set in {summary} is empty (0 neurons located at σ={data.get('sigma')}): erasing or fine-tuning it "
            "changes nothing; locate with a lower --sigma or on more samples"
        )
    return NeuronSource(summary, summary.parent, str(data.get("task", "")), list(data["neurons"]), data.get("sigma"))


@contextmanager
def print_warnings() -> Iterator[None]:
    """Show the data and CNL warnings raised inside (every one, not once per place), as ``warning: ...`` lines.

    The one-line format and the once-per-run rule are :func:`tlcap.cli.one_line_warnings`'s, which
    ``tlcap``'s entry point applies to every command.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("always", DataWarning)
        warnings.simplefilter("always", CNLWarning)
        yield


def skips_line(data: dict[str, Any], skipped: dict[str, int] | None = None) -> str:
    """``"data: 4 of 50 requested samples used; skipped 1 malformed row, 0 unknown labels, 0 too long"``."""
    req = data.get("requested")
    used = data.get("used")
    head = f"{used} of {req} requested samples used" if req is not None else f"{used} samples used"
    sk = skipped or {}
    parts = [f"{data.get('skipped_bad_rows', 0)} malformed rows", f"{data.get('skipped_unknown_labels', 0)} unknown labels"]
    parts += [f"{v} {k.replace('_', ' ')}" for k, v in sk.items()]
    return f"data: {head}; skipped {', '.join(parts)}"


__all__ = ["floats", "ints", "layers", "NeuronSource", "neuron_source", "print_warnings", "skips_line"]
