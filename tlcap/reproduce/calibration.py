"""Calibrations of the cost model: a machine's measured seconds per FLOP and per pass, saved and replayed.

A :class:`Calibration` is what :func:`tlcap.reproduce.probe.calibrate` measured on a model (the cost model,
:mod:`tlcap.reproduce.cost`, prices a stage's work with it). :func:`save_calibrations` writes probes to a JSON
file (``{"format": "tlcap-calibration/1", "calibrations": [...]}``, one per model shape and dtype);
:func:`load_calibration` picks the one of a model's shape and dtype, so a machine without the GPU prints that
GPU's plan.

Example:
    >>> cal = Calibration({"ig_row": 2e-15}, seconds_per_pass={"ig_row": 0.1}, device="cuda (H100)")
    >>> Calibration.from_dict(cal.to_dict()) == cal
    True
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tlcap.errors import InvalidConfigError, MissingFileError

if TYPE_CHECKING:
    from tlcap.reproduce.cost import ModelShape

FORMAT = "tlcap-calibration/1"
IG_ROW_PASSES = 2.0
"""Forward-pass equivalents of an IG row's FLOPs: the forward and the activations' gradient (weights frozen: no
weight gradient). Probes saved before 2026-12-02 counted 3 (no ``"ig_row_passes"`` field in the saved dict); :meth:`Calibration.
from_dict` rescales their IG FLOPs and seconds per FLOP, which leaves their predicted seconds unchanged."""
TRAIN_PASSES = 2.0
"""Forward-pass equivalents of a fine-tuning token's FLOPs besides its weight gradients (``2 · trainable``): the
forward and the activations' gradient. Probes saved before 2026-12-02 counted 3 forward passes and no weight
gradient (no ``"train_passes"`` field); :meth:`Calibration.from_dict` rescales them, the same seconds."""


def split_pass_flop(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float]:
    """Seconds per pass and per FLOP from two timings ``(passes, flops, seconds)`` of one unit.

    Solves ``seconds = passes · c + flops · s`` for ``(c, s)``, both ``>= 0``: a larger run that is
    not slower (timing noise) gives ``s = 0``; a negative ``c`` gives ``c = 0`` with ``s`` from the
    larger run.

    Args:
        a: ``(passes, flops, seconds)`` of the smaller run.
        b: ``(passes, flops, seconds)`` of the larger run.

    Returns:
        ``(seconds per pass, seconds per FLOP)``, both ``>= 0``.
    """
    (p1, f1, t1), (p2, f2, t2) = a, b
    det = p1 * f2 - p2 * f1
    if det == 0:
        return 0.0, t2 / f2 if f2 else 0.0
    c = (t1 * f2 - t2 * f1) / det
    s = (p1 * t2 - p2 * t1) / det
    if s <= 0:
        return (t1 + t2) / (p1 + p2), 0.0
    if c < 0:
        return 0.0, t2 / f2
    return c, s



def _recount_train(spf: dict[str, float], spp: dict[str, float], probe: dict[str, dict[str, Any]],
                   dims: Mapping[str, int]) -> tuple[dict[str, float], dict[str, float]]:
    """A probe saved with the older fine-tuning FLOP count (``3 ·`` a forward token per token fed or not), its runs
    recounted as :meth:`ModelShape.train_token_flops` counts them now (:data:`TRAIN_PASSES` forward passes and every
    MLP matrix's gradient over the tokens fed, one fewer per sample) and the seconds per pass and per FLOP solved
    again from the same timings: the probe's own runs take the seconds they took. Whether the MLP is gated is read
    from the forward token's FLOPs (attention is 2-4 d_model² a layer). Without runs or dimensions: unchanged."""
    runs = [k for k in ("train_token@0", "train_token") if k in probe and "flops" in probe[k]]
    if not runs or not {"n_layers", "d_model", "d_mlp", "d_vocab"} <= set(dims):
        return spf, spp
    L, d, m, v = (int(dims[k]) for k in ("n_layers", "d_model", "d_mlp", "d_vocab"))
    timed = []
    for k in runs:
        run = probe[k]
        units, passes = float(run["units"]), float(run.get("passes", 1.0))
        fwd = float(run["flops"]) / (3.0 * units)  # one forward token, as the older count had it
        gated = (fwd - 2.0 * d * v) / (2.0 * L) - 3.0 * d * m >= 1.5 * d * d
        n_mlp = L * (3 if gated else 2) * d * m
        run["units"] = units - passes
        run["flops"] = run["units"] * (TRAIN_PASSES * fwd + 2.0 * n_mlp)
        timed.append((passes, run["flops"], float(run["seconds"])))
    spf, spp = dict(spf), dict(spp)
    if len(timed) == 2:
        spp["train_token"], spf["train_token"] = split_pass_flop(timed[0], timed[1])
    else:
        spf["train_token"] = timed[0][2] / timed[0][1]
    return spf, spp


@dataclass(frozen=True)
class Calibration:
    """Seconds per FLOP and per pass of each unit kind on this machine, and the memory with the model loaded.

    Attributes:
        seconds_per_flop: ``{unit: s/FLOP}`` measured by the probe.
        base_bytes: Memory with the model loaded (resident set on a CPU, CUDA allocated bytes on a GPU).
        memory_scale: Measured / modelled working memory of an IG batch (1.0 if not measured).
        probe: ``{unit: {"units": n, "flops": F, "seconds": s, ...}}`` of the probe runs.
        device: Where the probe ran (``"cpu (2 threads)"``, ``"cuda (NVIDIA H100 80GB HBM3)"``).
        load: The machine's 1-minute load average at the probe (other processes slow a shared machine).
        seconds: Wall time of the probe.
        seconds_per_pass: ``{unit: s/pass}`` (0 or absent: FLOPs only, as on a CPU).
        model: The probed model's name.
        shape: Its :meth:`ModelShape.dims` (what :func:`load_calibration` matches).
        dtype: Its parameter dtype (``"bfloat16"``).
        meta: Provenance (date, torch version, peak memory of each probe); ``two_sizes``: the probe ran each unit at
            two sizes, its larger IG run as one pass; ``device_bytes``: the card's memory (:func:`memory_rows`).
        train_memory_scale: Measured / modelled working memory of the probe's fine-tuning step (``None``: not
            measured, the model's bytes are used as they are).
        peak_flops: The measured matrix-product peak of the model's dtype on the device (FLOP/s; ``None``: not
            measured). No unit runs faster: a seconds-per-FLOP below ``1 / peak_flops`` (two launch-bound probe
            sizes fit a zero) is raised to it and the per-pass part refitted (:func:`floor_at_peak`).
    """

    seconds_per_flop: Mapping[str, float]
    base_bytes: int = 0
    memory_scale: float = 1.0
    probe: Mapping[str, Any] = field(default_factory=dict)
    device: str = ""
    load: float | None = None
    seconds: float = 0.0
    seconds_per_pass: Mapping[str, float] = field(default_factory=dict)
    model: str = ""
    shape: Mapping[str, int] = field(default_factory=dict)
    dtype: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    train_memory_scale: float | None = None
    peak_flops: float | None = None

    def __post_init__(self) -> None:
        if self.peak_flops:
            spf, spp = floor_at_peak(self.seconds_per_flop, self.seconds_per_pass, self.probe, float(self.peak_flops))
            object.__setattr__(self, "seconds_per_flop", spf)
            object.__setattr__(self, "seconds_per_pass", spp)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (the entries of a calibration file).

        Returns:
            ``{field name: value}``, mappings copied to plain dicts.
        """
        return {"ig_row_passes": IG_ROW_PASSES, "train_passes": TRAIN_PASSES, "seconds_per_flop": dict(self.seconds_per_flop),
                "seconds_per_pass": dict(self.seconds_per_pass),
                "base_bytes": self.base_bytes, "memory_scale": self.memory_scale, "probe": dict(self.probe),
                "device": self.device, "load": self.load, "seconds": self.seconds, "model": self.model,
                "shape": dict(self.shape), "dtype": self.dtype, "meta": dict(self.meta),
                "train_memory_scale": self.train_memory_scale, "peak_flops": self.peak_flops}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        """Inverse of :meth:`to_dict` (missing optional fields take their defaults; a probe of the older IG FLOP count,
        without ``"ig_row_passes"``, is rescaled to :data:`IG_ROW_PASSES`: the same seconds).

        Args:
            d: A dict as :meth:`to_dict` writes it; ``seconds_per_flop`` is required.

        Returns:
            The :class:`Calibration`.
        """
        spf, meta = dict(d["seconds_per_flop"]), dict(d.get("meta", {}))
        probe = {k: dict(v) for k, v in d.get("probe", {}).items()}
        if "train_passes" not in d:  # a probe of the older fine-tuning count (3 forward passes, no weight gradient)
            spf, spp = _recount_train(spf, dict(d.get("seconds_per_pass", {})), probe, dict(d.get("shape", {})))
        else:
            spp = dict(d.get("seconds_per_pass", {}))
        counted = float(d.get("ig_row_passes", 3.0))
        if counted != IG_ROW_PASSES:  # a probe of the older IG FLOP count (IG_ROW_PASSES): same seconds, fewer FLOPs
            r = IG_ROW_PASSES / counted
            for k, run in probe.items():
                if (k == "ig_row" or k.startswith("ig_row@")) and "flops" in run:
                    run["flops"] = float(run["flops"]) * r
            if "ig_row" in spf:
                spf["ig_row"] = float(spf["ig_row"]) / r
        return cls(spf, int(d.get("base_bytes", 0)), float(d.get("memory_scale", 1.0)),
                   probe, str(d.get("device", "")), d.get("load"), float(d.get("seconds", 0.0)),
                   spp, str(d.get("model", "")), dict(d.get("shape", {})),
                   str(d.get("dtype", "")), meta,
                   None if d.get("train_memory_scale") is None else float(d["train_memory_scale"]),
                   None if d.get("peak_flops") is None else float(d["peak_flops"]))

    def timing_note(self) -> str:
        """How repeatable the probe's timings were, for the plan's calibration line.

        Returns:
            ``"; 3 trials, the slowest within 4 % of the fastest"`` (``meta["trials"]`` and ``meta["timing_spread"]``,
            :data:`tlcap.reproduce.probe.PROBE_TRIALS`); ``"; each op timed once"`` for a probe saved before the
            trials (the plan is then one timing's).

        Example:
            >>> Calibration({"ig_row": 1e-9}, meta={"trials": 3, "timing_spread": 0.041}).timing_note()
            '; 3 trials, the slowest within 4.1 % of the fastest'
            >>> Calibration({"ig_row": 1e-9}).timing_note()
            '; each op timed once'
        """
        trials, spread = self.meta.get("trials"), self.meta.get("timing_spread")
        if not trials or spread is None:
            return "; each op timed once"
        pct = 100 * float(spread)
        txt = f"{pct:.0f}" if pct >= 10 else f"{pct:.1f}"
        return f"; {int(trials)} trials, the slowest within {txt} % of the fastest"

    def matches(self, shape: ModelShape, dtype: str | None = None, vocab: bool = True) -> bool:
        """Whether this probe was taken on a model of ``shape`` (and ``dtype``, when given; ``vocab=False``: any
        vocabulary size, e.g. a shape model built with another tokenizer on the GPU machine).

        Args:
            shape: The model's shape.
            dtype: The model's parameter dtype (``None``, or a probe without one: any dtype).
            vocab: Whether ``d_vocab`` must match too.

        Returns:
            ``True`` when :attr:`shape` equals ``shape.dims()`` and the dtype fits.
        """
        mine, want = dict(self.shape), shape.dims()
        if not vocab:
            mine.pop("d_vocab", None)
            want.pop("d_vocab")
        return mine == want and (dtype is None or not self.dtype or self.dtype == dtype)


def floor_at_peak(spf: Mapping[str, float], spp: Mapping[str, float], probe: Mapping[str, Any],
                  peak: float) -> tuple[dict[str, float], dict[str, float]]:
    """Seconds per FLOP raised to ``1 / peak`` where the fit gave less, the per-pass part refitted through the
    probe's larger run (``seconds = passes · c + flops / peak``, ``c >= 0``).

    Two probe sizes that are both launch-bound (7B on an H200: 16 and 128 tokens of a forward pass both take
    48 ms) fit a zero seconds per FLOP, which makes any batch free; the matrix-product peak bounds it.

    Args:
        spf: ``{unit: s/FLOP}`` as fitted.
        spp: ``{unit: s/pass}`` as fitted.
        probe: The probe runs (``{unit: {"passes", "flops", "seconds"}}``, the larger run under the unit's name).
        peak: Measured matrix-product peak, FLOP/s.

    Returns:
        ``(seconds per FLOP, seconds per pass)``, new dicts.

    Example:
        >>> probe = {"fwd_token": {"passes": 1.0, "flops": 2e12, "seconds": 0.05}}
        >>> floor_at_peak({"fwd_token": 0.0}, {"fwd_token": 0.05}, probe, 800e12)
        ({'fwd_token': 1.25e-15}, {'fwd_token': 0.0475})
    """
    floor = 1.0 / float(peak)
    out_f, out_p = dict(spf), dict(spp)
    for unit, s in spf.items():
        if s >= floor:
            continue
        out_f[unit] = floor
        run = probe.get(unit) or {}
        passes, flops, secs = float(run.get("passes", 0) or 0), float(run.get("flops", 0) or 0), float(run.get("seconds", 0) or 0)
        if unit in spp and passes > 0:
            out_p[unit] = max(0.0, (secs - flops * floor) / passes)
    return out_f, out_p


def save_calibrations(path: str | Path, cals: Sequence[Calibration]) -> Path:
    """Write probes to ``path`` (module docstring's format; a probe of the same shape and dtype already in the
    file is replaced, others kept). Returns the path.

    Args:
        path: The calibration file (written atomically; its folder is created).
        cals: The probes to add.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    kept: list[Calibration] = []
    if path.exists():
        kept = [c for c in read_calibrations(path)
                if not any(dict(c.shape) == dict(n.shape) and c.dtype == n.dtype and c.device == n.device for n in cals)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "calibrations": [c.to_dict() for c in [*kept, *cals]]}, indent=1))
    tmp.replace(path)
    return path


def read_calibrations(path: str | Path) -> list[Calibration]:
    """Every probe in a calibration file (a file of :func:`save_calibrations`, or one ``Calibration.to_dict``).

    Args:
        path: The calibration file.

    Returns:
        The file's probes, in file order.

    Raises:
        MissingFileError: no such file.
        InvalidConfigError: not a calibration file.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"--calibration {path}: no such file; write one with `tlcap reproduce ... --dry-run "
                               "--device cuda --save-calibration FILE` on the GPU")
    try:
        d = json.loads(path.read_text())
        items = d["calibrations"] if isinstance(d, dict) and "calibrations" in d else [d]
        return [Calibration.from_dict(x) for x in items]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidConfigError(f"--calibration {path} is not a tlcap calibration file ({type(exc).__name__}: {exc})") \
            from None


def load_calibration(path: str | Path, shape: ModelShape, dtype: str | None = None) -> Calibration:
    """The probe in ``path`` taken on a model of ``shape`` (and ``dtype``; the last one when several match).

    A probe of the same layers and widths but another vocabulary size (the random-weight shapes take
    the vocabulary of the tokenizer on the machine) is used when none matches exactly: its seconds
    per FLOP transfer, and the plan counts the unembedding with this model's vocabulary.

    Args:
        path: The calibration file.
        shape: The model's shape.
        dtype: The model's parameter dtype (``None``: any).

    Returns:
        The matching :class:`Calibration`.

    Raises:
        InvalidConfigError: no probe of that shape (the message lists the file's shapes).
    """
    cals = read_calibrations(path)
    hits = [c for c in cals if c.matches(shape, dtype)] or [c for c in cals if c.matches(shape, dtype, vocab=False)]
    if not hits:
        have = "; ".join(f"{c.model or '?'} {c.dtype or '?'} {dict(c.shape)} on {c.device}" for c in cals) or "none"
        raise InvalidConfigError(f"--calibration {path} has no probe of a model shaped {shape.dims()}"
                                 f"{' in ' + dtype if dtype else ''} (it has: {have}); probe this model on the GPU")
    return hits[-1]


__all__ = ["Calibration", "FORMAT", "IG_ROW_PASSES", "TRAIN_PASSES", "floor_at_peak", "save_calibrations", "read_calibrations",
           "load_calibration"]
