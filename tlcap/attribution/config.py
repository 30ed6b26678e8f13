"""``IGConfig``: the settings of neuron attribution, shared by KN, QL and CNL.

One frozen, validated value carries what defines an attribution (steps, quadrature rule,
estimator, neuron site, layers) and the exact speed knobs (batch size, prefix reuse, late
expansion, layer groups — results do not depend on them). :func:`integrated_gradients`,
:func:`~tlcap.attribution.sig.sig`, :func:`~tlcap.attribution.amig.amig`,
:func:`~tlcap.attribution.methods.localize` and the dataset scorer take it as ``config=`` plus
keyword overrides of its fields (``Config.resolve``), so an invalid value fails at construction,
before any forward pass.

Example:
    >>> from tlcap.attribution import integrated_gradients
    >>> cfg = IGConfig(steps=10, rule="left")
    >>> attr = integrated_gradients(model, "The capital of France is", " Paris", config=cfg)
    >>> again = integrated_gradients(model, "The capital of France is", " Paris", steps=10, rule="left")  # same
    >>> torch.equal(attr.scores, again.scores), attr.summary()["steps"], attr.summary()["rule"]
    (True, 10, 'left')
    >>> IGConfig(steps=0)
    Traceback (most recent call last):
    ...
    tlcap.errors.InvalidConfigError: steps (--steps) must be >= 1, got 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tlcap.attribution.quadrature import RULES, n_points
from tlcap.config import Config, check_bool, check_choice, check_float, check_int, check_sequence
from tlcap.errors import InvalidConfigError
from tlcap.runtime.batching import parse_memory

ESTIMATORS: tuple[str, ...] = ("ig", "joint", "grad_x_act")
NEURON_SITES: tuple[str, ...] = ("mlp_post", "mlp_pre")


@dataclass(frozen=True)
class IGConfig(Config):
    """Settings of integrated-gradient neuron attribution.

    Attributes:
        steps: Gradient evaluations m per layer (per word for SIG), ``>= 1``; or ``"auto"``
            (exact IG only): per answer token and layer, the rule's size is doubled from 4 until
            the completeness error is at most ``tol`` (:mod:`tlcap.attribution.grouped`); the
            ``trapezoid`` rule goes 5 → 9 → 17 points, computing only the new midpoints.
        rule: Quadrature rule, one of :data:`~tlcap.attribution.quadrature.RULES` (see
            :func:`tlcap.attribution.quadrature`).
        method: ``ig`` (exact, one layer scaled at a time) or the cheaper estimators ``joint``
            and ``grad_x_act`` (labelled as such in results).
        site: Neuron site: ``mlp_post`` (activations, the papers' neurons) or ``mlp_pre``.
        layers: Layers to attribute (``None`` = all; stored as a tuple); layer bounds are checked against the
            model when the attribution runs.
        batch_rows: Most rows (layer × step pairs) per forward pass, ``>= 1``, or ``"auto"`` (the
            default): within what fits ``max_memory``, the smallest batch that reaches the throughput
            plateau on an accelerator (a short timed probe, cached per model/device/dtype), at most
            256 on a CPU; halved and rerun on out-of-memory (:mod:`tlcap.runtime.batching`). Exact:
            results do not depend on it.
        max_memory: Memory budget of ``batch_rows="auto"`` per device (bytes or ``"8GiB"``); ``None`` = free memory.
        prefix_reuse: Reuse the prompt prefix's keys/values (exact; off only to compare).
        late_expand: Run a batch as one row below its lowest scaled layer (exact; off only to
            compare). Exact IG on a TransformerBridge that packs rows goes further: every row joins
            the pass at its own layer (staged rows, :mod:`tlcap.attribution.staged`); with
            ``late_expand=False`` it runs the batch-row layout without either.
        tol: Completeness target of ``steps="auto"`` (relative error, e.g. 0.01 = 1 %), ``> 0``.
        max_steps: Largest size ``steps="auto"`` tries, ``>= 1`` (trapezoid: intervals, i.e. ``max_steps + 1`` points).
        sample_batch: Samples whose rows share batches in dataset scoring (exact IG;
            :func:`~tlcap.attribution.dataset.score_dataset`), ``>= 1``. Exact: results do not
            depend on it (beyond float rounding).
        layer_chunks: Split the layers into at least this many groups, one batch each, ``>= 1``
            (exact; the batch-row layout only: staged rows hold every layer in one pass).
        stream_depth: ``steps="auto"`` in dataset scoring: windows of ``sample_batch`` samples in flight,
            ``>= 1``; a window's refinement rounds share batches with the next windows' first rounds
            (:func:`~tlcap.attribution.grouped.ig_units_stream`) instead of running as small batches of
            their own. 1: each window alone. Exact: results do not depend on it (beyond float rounding).
    """

    steps: int | str = 20
    rule: str = "midpoint"
    method: str = "ig"
    site: str = "mlp_post"
    layers: Sequence[int] | None = None
    batch_rows: int | str = "auto"
    prefix_reuse: bool = True
    late_expand: bool = True
    layer_chunks: int = 4
    max_memory: int | str | None = None
    tol: float = 0.01
    max_steps: int = 64
    sample_batch: int = 1
    stream_depth: int = 4

    def validate(self) -> None:
        check_choice("rule", self.rule, RULES)
        check_choice("method", self.method, ESTIMATORS)
        if self.steps == "auto":
            if self.method != "ig":
                raise InvalidConfigError(f"steps='auto' is for exact IG (method='ig'), not method={self.method!r}; "
                                         "give a number of steps")
        else:
            check_int("steps", self.steps, min=1)
        check_float("tol", self.tol, gt=0, lt=1)
        check_int("max_steps", self.max_steps, min=1)
        check_int("sample_batch", self.sample_batch, min=1)
        check_int("stream_depth", self.stream_depth, min=1, cli=None)
        check_choice("site", self.site, NEURON_SITES)
        if self.layers is not None:
            self._set(
                "layers",
                check_sequence("layers", self.layers, min_len=1, unique=True,
                               item=lambda n, x: check_int(n, x, min=0, cli="--layers")),
            )
        if self.batch_rows != "auto":
            check_int("batch_rows", self.batch_rows, min=1)
        if self.max_memory is not None:
            parse_memory(self.max_memory)
        check_bool("prefix_reuse", self.prefix_reuse, cli=None)
        check_bool("late_expand", self.late_expand, cli=None)
        check_int("layer_chunks", self.layer_chunks, min=1, cli=None)

    @property
    def points(self) -> int:
        """Quadrature points per layer and answer token (:func:`~tlcap.attribution.quadrature.n_points`;
        ``steps="auto"``: ``max_steps``, the most it may use).

        Example:
            >>> IGConfig(steps=20, rule="cnl").points
            21
        """
        return n_points(self.max_steps if self.steps == "auto" else int(self.steps), self.rule)


__all__ = ["IGConfig", "RULES", "ESTIMATORS", "NEURON_SITES"]
