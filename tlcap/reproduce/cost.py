"""Predicting a stage's wall time and peak memory before running it.

**The model.** A stage's work is a :class:`Workload`: counts of a few kinds of *units*, each
with its floating-point operations computed from the model's shape (:class:`ModelShape`):

==============  ===============================================  ==============================================
unit            what                                             FLOPs per unit
==============  ===============================================  ==============================================
``ig_row``      one integrated-gradients row: the last token,    ``2 · (2·N_block·f + 2·d_model·d_vocab)``,
                from the scaled layer up, forward + backward     ``f = (L + 1) / (2L)`` (mean share of layers
                (the activations' gradient only: the weights     above the scaled one, late expansion;
                are frozen)                                      :data:`IG_ROW_PASSES`)
``fwd_token``   one token of a forward pass over a sequence      ``2·N_block + 4·L·ctx·d_model`` (``ctx``:
                (accuracy, perplexity, clean runs)               context length), plus ``2·d_model·d_vocab``
                                                                 per position read out (:func:`forward`)
``gen_token``   one greedily generated token (KV cache)          as ``fwd_token``
``train_token`` one token of a fine-tuning step (forward +       ``2 ·`` ``fwd_token`` ``+ 2·trainable``
                backward; the trained matrices' gradients)       (:data:`TRAIN_PASSES`)
``set_token``   one token of a batched many-sets pass (rows =    ``2·N_block + 4·L·ctx·d_model``, plus
                (set, item), each row its own neuron set;        ``2·d_model·d_vocab`` per unembedded
                :mod:`tlcap.metrics.set_scores`)                 position only
==============  ===============================================  ==============================================

``N_block`` is the parameter count of the transformer blocks (attention + MLP; embeddings and
norms excluded). Seconds = Σ_unit (FLOPs × *seconds per FLOP of that unit* + passes × *seconds
per pass of that unit*) on this machine, which :func:`calibrate` measures with a short probe (IG
rows, a forward, a short generation and a fine-tuning step on the actual model). The seconds per
FLOP differ per unit (a batch of IG rows runs at another efficiency than a 1-token generation
step), so each unit has its own. A *pass* is what a unit's caller runs once however small it is
(an IG evaluation of one answer token: the prefix, the clean run and its batched passes; one
forward call over a sequence; one fine-tuning step): on a GPU, a small model's pass is bound by
kernel launches, not FLOPs (SmolLM2-135M: ~0.05 % of the bf16 matmul peak), so the probe on an
accelerator times each unit at two sizes and splits its time into a per-pass and a per-FLOP
part. On a CPU the per-pass part is 0 (one size; the FLOPs dominate).

**Memory.** Peak = the memory with the model loaded (measured by the probe: the process's
resident set on a CPU, CUDA's allocated bytes on a GPU) + the largest working set of the stage
(:attr:`Workload.extra_bytes`: logits of a sequence, plus the IG rows one pass holds, :func:`held_bytes`:
an evaluation's or a batched call's rows, at most what fits) × the probe's
measured / modelled ratio of an IG batch, or, for fine-tuning, the float32 Adam moments and the gradients
(or half-precision rounding residuals) of the trained parameters plus the kept activations
(:attr:`Workload.train_bytes`) × the probe's measured / modelled
ratio of its fine-tuning step, whichever is larger.

**Replaying a probe.** :func:`save_calibrations` writes probes to a JSON file
(``{"format": "tlcap-calibration/1", "calibrations": [...]}``, one per model shape and dtype);
:func:`load_calibration` picks the one of a model's shape and dtype, so a machine without the
GPU prints that GPU's plan (``tlcap reproduce ... --dry-run --calibration FILE``, the model
loaded on the ``meta`` device: shapes and tokenizer only).

Example:
    >>> from tlcap.reproduce.probe import calibrate
    >>> cal = calibrate(model)                           # ~10–30 s on a 2-core CPU for SmolLM2
    >>> shape = ModelShape.of(model)
    >>> w = Workload.of(ig_row=shape.ig_row_flops() * 12_600)
    >>> pred = predict(w, cal)
    >>> type(pred).__name__, pred.seconds > 0            # the seconds depend on the machine
    ('Prediction', True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tlcap.errors import InvalidConfigError
from tlcap.reproduce.calibration import (  # noqa: F401  (re-exported: the cost model's calibrations)
    FORMAT,
    IG_ROW_PASSES,
    TRAIN_PASSES,
    Calibration,
    floor_at_peak,
    load_calibration,
    read_calibrations,
    save_calibrations,
)
from tlcap.reproduce.token_counts import n_tokens, prefill_tokens  # noqa: F401  (re-exported)
from tlcap.runtime.batching import SAFETY
from tlcap.runtime.plateau import BUDGET_S, find_plateau, timed_rate

CPU_MEMORY_ROWS = 128
"""IG rows a CPU probe models its measured memory on (:func:`tlcap.reproduce.probe.calibrate`), and so the most
rows :func:`memory_rows` lets one pass hold on a CPU calibration."""

UNITS = ("ig_row", "fwd_token", "gen_token", "train_token", "set_token")
GATED = ("llama", "mistral", "qwen2", "gemma", "gemma2")
FLOAT_BYTES = 4
PROBE_UNITS = {"trace": "fwd_token"}
"""The unit whose calibrated times a throughput probe of each kind in :attr:`Workload.probes` runs at."""
PROBE_KEY = "plateau_probe"
"""The key of ``batch_rows="auto"``'s throughput probe in :attr:`Prediction.by_unit` (:func:`plateau_probe_seconds`)."""


@dataclass(frozen=True)
class ModelShape:
    """The dimensions the cost model needs.

    Attributes:
        n_layers: Transformer blocks L.
        d_model: Residual width.
        d_mlp: MLP width (neurons per layer).
        d_vocab: Vocabulary size.
        n_block_params: Parameters of the transformer blocks (attention + MLP weights).
        n_mlp_params: Parameters of the MLPs (the neurons' in/out weights).
        d_kv: Width of a layer's keys (and of its values): key/value heads × head width (0: ``d_model``).
    """

    def dims(self) -> dict[str, int]:
        """``{n_layers, d_model, d_mlp, d_vocab}``: what a calibration file matches a model by.

        Returns:
            The four dimensions as ints, keyed by attribute name.
        """
        return {"n_layers": self.n_layers, "d_model": self.d_model, "d_mlp": self.d_mlp, "d_vocab": self.d_vocab}

    n_layers: int
    d_model: int
    d_mlp: int
    d_vocab: int
    n_block_params: int
    n_mlp_params: int
    d_kv: int = 0

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """The shape of a :class:`tlcap.models.Model` (parameter counts from its MLP layout).

        Args:
            model: A loaded model (or a shape-only model on the ``meta`` device); ``n_kv_heads`` and a gated MLP
                (``cfg.gated_mlp`` or a :data:`GATED` architecture) are taken into account.

        Returns:
            The model's :class:`ModelShape`.
        """
        L, d, m, v = int(model.n_layers), int(model.d_model), int(model.d_mlp), int(model.d_vocab)
        n_heads = int(getattr(model, "n_heads", 1) or 1)
        n_kv = int(getattr(model, "n_kv_heads", None) or n_heads)
        d_head = d // n_heads
        gated = bool(getattr(getattr(model, "cfg", None), "gated_mlp", False)) or getattr(model, "architecture", "") in GATED
        attn = 2 * d * d + 2 * d * n_kv * d_head
        mlp = (3 if gated else 2) * d * m
        return cls(L, d, m, v, L * (attn + mlp), L * mlp, n_kv * d_head)

    @classmethod
    def from_config(cls, n_layers: int, d_model: int, d_mlp: int, d_vocab: int, *, n_heads: int = 1,
                    n_kv_heads: int | None = None, gated: bool = True) -> ModelShape:
        """A shape from dimensions (to predict a model that is not loaded, e.g. LLaMA2-7B).

        Args:
            n_layers: Transformer blocks.
            d_model: Residual width.
            d_mlp: MLP width.
            d_vocab: Vocabulary size.
            n_heads: Attention heads (sets the head width ``d_model // n_heads``).
            n_kv_heads: Key/value heads (``None``: ``n_heads``, no grouped-query attention).
            gated: Whether the MLP has a gate matrix (three MLP weight matrices instead of two).

        Returns:
            The :class:`ModelShape` with its parameter counts.
        """
        d_head = d_model // n_heads
        attn = 2 * d_model * d_model + 2 * d_model * (n_kv_heads or n_heads) * d_head
        mlp = (3 if gated else 2) * d_model * d_mlp
        return cls(n_layers, d_model, d_mlp, d_vocab, n_layers * (attn + mlp), n_layers * mlp, (n_kv_heads or n_heads) * d_head)

    # ------------------------------------------------------------------ FLOPs per unit
    def fwd_token_flops(self, ctx: float = 0.0) -> float:
        """One token of a forward pass attending to ``ctx`` earlier tokens.

        Args:
            ctx: Earlier tokens attended to (mean context length).

        Returns:
            FLOPs: the blocks' weights, the unembedding, and attention over ``ctx`` tokens.
        """
        return 2.0 * self.n_block_params + 2.0 * self.d_model * self.d_vocab + 4.0 * self.n_layers * ctx * self.d_model

    def ig_row_flops(self) -> float:
        """One IG row (one token, from the scaled layer up, forward + backward, with the unembedding).

        Returns:
            FLOPs: :data:`IG_ROW_PASSES` (2) times a forward pass through the layers from the scaled one up (on
            average half of them) plus the unembedding — the backward computes the activations' gradient only (the
            weights are frozen), one matrix product per forward one (counted: ``tests/unit/test_reproduce_cost.py``).
        """
        f = (self.n_layers + 1) / (2.0 * self.n_layers)
        return IG_ROW_PASSES * (2.0 * self.n_block_params * f + 2.0 * self.d_model * self.d_vocab)

    def set_token_flops(self, ctx: float = 0.0) -> float:
        """One token of a batched many-sets pass, without the unembedding (counted per read position).

        Args:
            ctx: Earlier tokens attended to (mean context length).

        Returns:
            FLOPs of the blocks and of attention over ``ctx`` tokens.
        """
        return 2.0 * self.n_block_params + 4.0 * self.n_layers * ctx * self.d_model

    def unembed_flops(self) -> float:
        """The unembedding of one position.

        Returns:
            FLOPs, ``2 · d_model · d_vocab``.
        """
        return 2.0 * self.d_model * self.d_vocab

    def train_token_flops(self, ctx: float = 0.0, trainable: int = 0) -> float:
        """One token of a fine-tuning step (forward + backward) that trains ``trainable`` parameters.

        Args:
            ctx: Earlier tokens attended to (mean context length).
            trainable: Parameters whose gradient the step computes (the whole matrices they sit in: a masked
                fine-tuning's MLP weights; 0 for a gradient of activations or of an added vector, as EAP's and ROME's).

        Returns:
            FLOPs: :data:`TRAIN_PASSES` (2) times :meth:`fwd_token_flops` (the forward and the activations'
            gradient) plus ``2 · trainable`` (the weight gradients). Probes saved before 2026-12-02 counted
            ``3 ·`` :meth:`fwd_token_flops` (:meth:`Calibration.from_dict` rescales them; counted:
            ``tests/unit/test_reproduce_flops.py``).
        """
        return TRAIN_PASSES * self.fwd_token_flops(ctx) + 2.0 * trainable

    # ------------------------------------------------------------------ memory
    def ig_row_bytes(self) -> int:
        """Activations one IG row keeps for its backward pass (float32).

        Returns:
            Bytes per IG row.
        """
        return FLOAT_BYTES * (self.n_layers * (12 * self.d_model + 4 * self.d_mlp) + 3 * self.d_vocab)

    def sequence_bytes(self, tokens: int) -> int:
        """Working memory of a forward pass over ``tokens`` tokens (activations and logits, float32).

        Args:
            tokens: Tokens of the longest sequence of the pass.

        Returns:
            Bytes.
        """
        return FLOAT_BYTES * tokens * (4 * self.d_model + self.d_mlp + 2 * self.d_vocab)

    def kv_token_bytes(self) -> int:
        """Keys and values one cached token holds across the layers (float32).

        Returns:
            Bytes, ``2 · L · d_kv · 4``.
        """
        return FLOAT_BYTES * 2 * self.n_layers * (self.d_kv or self.d_model)

    def train_bytes(self, trainable: int, tokens: int, param_bytes: int = FLOAT_BYTES) -> int:
        """Fine-tuning: per trainable parameter two float32 Adam moments and a gradient (float32) or a rounding
        residual (half precision: the gradients are freed as each parameter steps), plus activations.

        The snapshot for the undo is in host memory on an accelerator (:class:`~tlcap.intervene.weights.WeightEdit`
        with ``host=True``); on a CPU it is in the same memory, which the probe's measured / modelled ratio carries.

        Args:
            trainable: Trainable parameters.
            tokens: Tokens of the longest training sequence (its activations are kept for the backward pass).
            param_bytes: Bytes of one parameter (the gradient or the residual take the parameter's dtype: 2 for
                bfloat16; :func:`~tlcap.intervene.finetune.masked_finetune`'s ``precision="auto"``).

        Returns:
            Bytes above the loaded model.
        """
        return ((param_bytes + 2 * FLOAT_BYTES) * trainable
                + FLOAT_BYTES * tokens * self.n_layers * (12 * self.d_model + 4 * self.d_mlp))


@dataclass(frozen=True)
class Workload:
    """FLOPs and passes per unit kind and the peak working memory of a stage.

    Attributes:
        flops: ``{unit: FLOPs}`` (units of :data:`UNITS`).
        units: ``{unit: count}`` (rows, tokens) for the plan table.
        extra_bytes: Largest working memory above the loaded model (IG batches, sequences).
        passes: ``{unit: passes}`` (module docstring: IG evaluations, forward calls, fine-tuning steps).
        train_bytes: Largest working memory of a fine-tuning step above the loaded model (scaled by the
            probe's own fine-tuning ratio, :attr:`Calibration.train_memory_scale`).
        batched: ``{unit: calls}`` for units whose rows the caller batches across items (dataset windows, fact
            windows): each call's rows take ``ceil(rows per call / B)`` passes, ``B`` the rows of the probe's
            larger run of that unit (:func:`predict`), on top of :attr:`passes`.
        row_bytes: ``{unit: bytes}`` one row of the unit keeps for its backward pass: a pass holds up to an
            evaluation's (a batched call's) rows of them, at most the rows the calibration measured, on top of
            :attr:`extra_bytes` (:func:`held_bytes`).
        probes: ``{kind: (rows, FLOPs per row)}`` of ``batch_rows="auto"`` throughput probes other than IG's (whose
            rows the ``ig_row`` unit gives): ``"trace"``, a causal trace's forward rows, timed as ``fwd_token``
            (:func:`plateau_probe_seconds`); the rows are one call's, the probe's cap.
        gen_steps: Decoding steps of the ``gen_token`` work where an accelerator generates several samples as rows
            of one batch (:func:`~tlcap.metrics.accuracy.task_accuracy`, ``GEN_ROWS`` samples per batch): there
            :func:`predict` prices those tokens as ``fwd_token`` FLOPs in one pass per step; on a CPU they stay
            ``gen_token`` (one sample at a time). ``0``: none batched.
        gen_bytes: The batched generation's working memory (its rows' keys/values), counted on an accelerator.
        accelerator_passes: ``{unit: passes}`` added to :attr:`passes` on an accelerator calibration, where the code
            batches more (negative: passes saved, e.g. Table 2's erasures of several sets as rows of one pass).
    """

    flops: Mapping[str, float] = field(default_factory=dict)
    units: Mapping[str, float] = field(default_factory=dict)
    extra_bytes: int = 0
    passes: Mapping[str, float] = field(default_factory=dict)
    train_bytes: int = 0
    batched: Mapping[str, float] = field(default_factory=dict)
    row_bytes: Mapping[str, int] = field(default_factory=dict)
    probes: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    gen_steps: float = 0.0
    gen_bytes: int = 0
    accelerator_passes: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted((set(self.flops) | set(self.units) | set(self.passes) | set(self.batched)) - set(UNITS))
        if unknown:
            raise InvalidConfigError(f"unknown cost units {unknown}; use {', '.join(UNITS)}")
        if set(self.probes) - set(PROBE_UNITS):
            raise InvalidConfigError(f"unknown probe kinds {sorted(set(self.probes) - set(PROBE_UNITS))}; use "
                                     f"{', '.join(PROBE_UNITS)}")

    @classmethod
    def of(cls, extra_bytes: int = 0, **flops: float) -> Workload:
        """A workload from FLOPs per unit (no unit counts, no passes).

        Args:
            extra_bytes: Peak working memory above the loaded model.
            **flops: ``unit=FLOPs`` for units of :data:`UNITS`.

        Returns:
            The :class:`Workload`.
        """
        return cls(dict(flops), {}, extra_bytes)

    def __add__(self, other: Workload) -> Workload:
        def add(a: Mapping[str, float], b: Mapping[str, float]) -> dict[str, float]:
            return {k: a.get(k, 0.0) + b.get(k, 0.0) for k in set(a) | set(b)}

        if set(self.batched) & set(other.batched):
            raise InvalidConfigError("two batched workloads of one unit cannot be added (their calls' rows differ)")
        probes = dict(self.probes)
        for kind, (rows, fl) in other.probes.items():  # a process probes a kind once: the largest call's rows
            if kind not in probes or rows > probes[kind][0]:
                probes[kind] = (rows, fl)
        return Workload(add(self.flops, other.flops), add(self.units, other.units),
                        max(self.extra_bytes, other.extra_bytes), add(self.passes, other.passes),
                        max(self.train_bytes, other.train_bytes), {**self.batched, **other.batched},
                        {**self.row_bytes, **other.row_bytes}, probes, self.gen_steps + other.gen_steps,
                        max(self.gen_bytes, other.gen_bytes), add(self.accelerator_passes, other.accelerator_passes))

    def scaled(self, times: float) -> Workload:
        """The same work done ``times`` times (memory unchanged).

        Args:
            times: The factor of FLOPs, units and passes.

        Returns:
            A new :class:`Workload`.
        """
        return Workload({k: v * times for k, v in self.flops.items()}, {k: v * times for k, v in self.units.items()},
                        self.extra_bytes, {k: v * times for k, v in self.passes.items()}, self.train_bytes,
                        {k: v * times for k, v in self.batched.items()}, self.row_bytes, self.probes,
                        self.gen_steps * times, self.gen_bytes,
                        {k: v * times for k, v in self.accelerator_passes.items()})


def ig_rows(shape: ModelShape, rows: float, ctx: float = 0.0, evals: float = 0.0, reads: float | None = None) -> Workload:
    """``rows`` IG rows (plus the clean forward of the context they share) in ``evals`` IG evaluations (passes).

    An evaluation's rows run in passes of at most the rows the calibration measured memory on (:func:`held_bytes`).

    Args:
        shape: The model's shape.
        rows: IG rows in total (token rows: a row that recomputes several positions counts once per position).
        ctx: Tokens of the context (its forward pass's memory counts).
        evals: IG evaluations (passes; 0: one evaluation of all ``rows``).
        reads: Rows read out through the unembedding (``None``: every row; AMIG's word rows recompute the positions
            from their word on and read the last one only).

    Returns:
        The ``ig_row`` :class:`Workload`.

    Example:
        >>> shape = ModelShape.from_config(2, 64, 256, 1000)
        >>> unread = ig_rows(shape, 10).flops["ig_row"] - ig_rows(shape, 10, reads=4).flops["ig_row"]
        >>> unread == 6 * IG_ROW_PASSES * shape.unembed_flops()      # six rows without their read-out
        True
    """
    unread = 0.0 if reads is None else (rows - reads) * IG_ROW_PASSES * shape.unembed_flops()
    return Workload({"ig_row": rows * shape.ig_row_flops() - unread}, {"ig_row": rows}, shape.sequence_bytes(int(ctx)),
                    {"ig_row": evals}, row_bytes={"ig_row": shape.ig_row_bytes()})


def ig_rows_batched(shape: ModelShape, rows: float, calls: float, ctx: float = 0.0, reads: float | None = None) -> Workload:
    """``rows`` IG rows in ``calls`` calls that batch the rows of several items (samples, facts) together.

    A call runs its items' clean runs and their rows in passes of as many rows as the device takes; the
    number of passes and the rows one pass holds are known only with the calibration (:func:`predict`:
    ``calls · ceil(rows per call / B)`` passes of ``min(rows per call, B)`` rows, :func:`held_bytes`).

    Args:
        shape: The model's shape.
        rows: IG rows in total.
        calls: Calls that each batch the rows of their items (``ceil(items / items per call)``).
        ctx: Tokens of the context (its forward pass's memory counts).
        reads: Rows read out through the unembedding (:func:`ig_rows`; ``None``: every row).

    Returns:
        The ``ig_row`` :class:`Workload`, its passes left to :func:`predict`.
    """
    return replace(ig_rows(shape, rows, ctx=ctx, reads=reads), passes={}, batched={"ig_row": float(calls)})


def forward(shape: ModelShape, tokens: float, ctx: float = 0.0, longest: int = 0, calls: float = 0.0,
            reads: float | None = None) -> Workload:
    """Forward passes over ``tokens`` tokens in total, mean context ``ctx``, longest sequence ``longest``, in ``calls`` calls.

    Args:
        shape: The model's shape.
        tokens: Tokens in total.
        ctx: Mean context a token attends to.
        longest: Tokens of the longest sequence (sets the working memory).
        calls: Forward calls (passes).
        reads: Positions unembedded over the whole vocabulary (``None``: every token; a clean run read at its
            answer positions, a baseline read at the MLP only: fewer; tested against counted FLOPs).

    Returns:
        The ``fwd_token`` :class:`Workload`.

    Example:
        >>> shape = ModelShape.from_config(2, 64, 256, 1000)
        >>> forward(shape, 10, reads=10).flops == forward(shape, 10).flops
        True
        >>> forward(shape, 10).flops["fwd_token"] - forward(shape, 10, reads=1).flops["fwd_token"] == 9 * shape.unembed_flops()
        True
    """
    reads = tokens if reads is None else reads
    return Workload({"fwd_token": tokens * shape.set_token_flops(ctx) + reads * shape.unembed_flops()},
                    {"fwd_token": tokens}, shape.sequence_bytes(longest), {"fwd_token": calls})


def generate(shape: ModelShape, tokens: float, ctx: float = 0.0) -> Workload:
    """``tokens`` greedily generated tokens at mean context ``ctx`` (each token is its own pass: FLOPs only).

    Args:
        shape: The model's shape.
        tokens: Generated tokens in total.
        ctx: Mean context a generated token attends to.

    Returns:
        The ``gen_token`` :class:`Workload` (no passes).
    """
    return Workload({"gen_token": tokens * shape.fwd_token_flops(ctx)}, {"gen_token": tokens}, shape.sequence_bytes(int(ctx)))


SET_ROW_TOKENS = 4096
"""Tokens per call of the batched many-sets passes (:data:`tlcap.metrics.set_scores.ROW_TOKENS`)."""


def set_rows(shape: ModelShape, tokens: float, reads: float, ctx: float = 0.0) -> Workload:
    """Batched many-sets passes over ``tokens`` tokens in total, ``reads`` of them unembedded, mean context ``ctx``.

    Args:
        shape: The model's shape.
        tokens: Tokens in total, over every set.
        reads: Positions unembedded, over every set.
        ctx: Mean context a token attends to.

    Returns:
        The ``set_token`` :class:`Workload`, one pass per :data:`SET_ROW_TOKENS` tokens.
    """
    flops = tokens * shape.set_token_flops(ctx) + reads * shape.unembed_flops()
    work = FLOAT_BYTES * SET_ROW_TOKENS * (8 * shape.d_model + 4 * shape.d_mlp) + 2**28  # activations + the logits bound
    return Workload({"set_token": flops}, {"set_token": tokens}, work, {"set_token": math.ceil(tokens / SET_ROW_TOKENS)})


def train(shape: ModelShape, tokens: float, trainable: int, ctx: float = 0.0, longest: int = 0,
          steps: float = 0.0, param_bytes: int = FLOAT_BYTES) -> Workload:
    """Fine-tuning over ``tokens`` tokens in total with ``trainable`` parameters, in ``steps`` forward + backward passes.

    Args:
        shape: The model's shape.
        tokens: Tokens in total, over every epoch.
        trainable: Trainable parameters (optimizer state).
        ctx: Mean context a token attends to.
        longest: Tokens of the longest training sequence.
        steps: Forward + backward passes.
        param_bytes: Bytes of one parameter (:meth:`ModelShape.train_bytes`).

    Returns:
        The ``train_token`` :class:`Workload` (its memory in :attr:`Workload.train_bytes`).
    """
    return Workload({"train_token": tokens * shape.train_token_flops(ctx, trainable)}, {"train_token": tokens}, 0,
                    {"train_token": steps}, shape.train_bytes(trainable, longest, param_bytes))


@dataclass(frozen=True)
class Prediction:
    """Predicted wall time and peak memory of a workload.

    Attributes:
        seconds: Wall time, the sum of :attr:`by_unit`.
        peak_bytes: Peak memory of the process (device memory on an accelerator).
        by_unit: Seconds per unit of :data:`UNITS`, and under :data:`PROBE_KEY` the throughput probe's.
        floor_seconds: The stage's FLOPs at the calibration's matrix-product peak (its compute floor: no
            batching or launch saving runs it faster); ``None`` where the calibration has no measured peak.
    """

    seconds: float
    peak_bytes: int
    by_unit: Mapping[str, float] = field(default_factory=dict)
    floor_seconds: float | None = None


def predict(work: Workload, cal: Calibration) -> Prediction:
    """Seconds = Σ_unit FLOPs × s/FLOP + passes × s/pass (+ ``batch_rows="auto"``'s throughput probe on an
    accelerator, :func:`plateau_probe_seconds`); peak = base + the larger of memory_scale × working memory (with the
    rows one pass holds, :func:`held_bytes`) and train_memory_scale × fine-tuning memory; the floor = Σ FLOPs / the
    calibration's matrix-product peak (where it measured one). On an accelerator calibration a workload's batched
    generation (:attr:`Workload.gen_steps`) is priced as forward passes, one per decoding step.

    Args:
        work: The stage's workload.
        cal: The machine's calibration.

    Returns:
        A :class:`Prediction` with the total seconds, the peak bytes and the seconds per unit.

    Raises:
        InvalidConfigError: the workload uses a unit the calibration did not measure.
    """
    by_unit: dict[str, float] = {}
    extra = work.extra_bytes
    if work.accelerator_passes and cal.meta.get("two_sizes"):  # what the code batches more on an accelerator
        passes = dict(work.passes)
        for unit, n in work.accelerator_passes.items():
            passes[unit] = max(0.0, passes.get(unit, 0.0) + n)
        work = replace(work, passes=passes)
    if work.gen_steps > 0 and cal.meta.get("two_sizes") and work.flops.get("gen_token"):  # batched generation
        flops, passes = dict(work.flops), dict(work.passes)
        flops["fwd_token"] = flops.get("fwd_token", 0.0) + flops.pop("gen_token")
        passes["fwd_token"] = passes.get("fwd_token", 0.0) + work.gen_steps
        work = replace(work, flops=flops, passes=passes)
    if cal.meta.get("two_sizes"):  # an accelerator's batched generation holds its rows' keys/values
        extra = max(extra, work.gen_bytes)
    for unit in set(work.flops) | set(work.passes):
        fl, n = work.flops.get(unit, 0.0), work.passes.get(unit, 0.0) + batched_passes(work, cal, unit)
        if fl == 0 and n == 0:
            continue
        if unit not in cal.seconds_per_flop:
            raise InvalidConfigError(f"the calibration has no measurement for {unit!r}; re-run the probe")
        by_unit[unit] = fl * cal.seconds_per_flop[unit] + n * cal.seconds_per_pass.get(unit, 0.0)
    probe = plateau_probe_seconds(work, cal)
    if probe > 0:
        by_unit[PROBE_KEY] = probe
    train_scale = 1.0 if cal.train_memory_scale is None else cal.train_memory_scale
    peak = cal.base_bytes + max(int(math.ceil(cal.memory_scale * (extra + held_bytes(work, cal)))),
                                int(math.ceil(train_scale * work.train_bytes)))
    floor = sum(work.flops.values()) / float(cal.peak_flops) if cal.peak_flops else None
    return Prediction(sum(by_unit.values()), peak, by_unit, floor)


def batched_passes(work: Workload, cal: Calibration, unit: str) -> float:
    """Passes of ``work``'s batched ``unit`` rows (:attr:`Workload.batched`) on the calibrated machine.

    Each of the ``calls`` calls holds ``rows / calls`` rows and runs them in ``ceil(rows per call / B)`` passes,
    ``B`` the rows of the probe's larger run of the unit (a pass the machine was timed on); without a probe
    size, one pass per call.

    Args:
        work: The workload.
        cal: The calibration.
        unit: The unit.

    Returns:
        The passes (0 where the unit is not batched).
    """
    calls = float(work.batched.get(unit, 0.0))
    if calls <= 0:
        return 0.0
    per_call = work.units.get(unit, 0.0) / calls
    b = float(cal.probe.get(unit, {}).get("units", 0.0) or 0.0)
    return calls * (max(1, math.ceil(per_call / b - 1e-9)) if b > 0 else 1)


def memory_rows(cal: Calibration, row_bytes: int) -> float:
    """The most IG rows one pass holds on the calibrated machine (the cap :func:`held_bytes` applies).

    A CPU probe measures ``memory_scale`` on :data:`CPU_MEMORY_ROWS` (128) modelled rows: that many (the CPU's
    resident set is too coarse to tell more). On an accelerator (``meta["two_sizes"]``) ``batch_rows="auto"``
    probes the throughput plateau up to every row of a call that fits before it picks the batch, so a pass may hold
    that many: the rows whose modelled bytes fit in :data:`tlcap.runtime.batching.SAFETY` (0.8) of the card's
    memory above the loaded model (``meta["device_bytes"]``), the rule :func:`tlcap.runtime.batching.auto_batch_rows`
    sizes by (without its attention term, which grows with
    the context); no cap where the probe did not record the card's memory.

    Args:
        cal: The calibration.
        row_bytes: Modelled bytes of one row (before ``memory_scale``).

    Returns:
        Rows (``inf``: no cap).
    """
    if not cal.meta.get("two_sizes"):
        return float(CPU_MEMORY_ROWS)
    dev = cal.meta.get("device_bytes")
    if not dev:
        return math.inf
    return max(1.0, float(int(SAFETY * (float(dev) - cal.base_bytes)) // max(int(row_bytes), 1)))


def held_bytes(work: Workload, cal: Calibration) -> int:
    """Working memory (modelled, before ``memory_scale``) of the most rows one pass of ``work`` holds.

    A pass holds an evaluation's rows (:attr:`Workload.passes`), or a batched call's (:attr:`Workload.batched`),
    at most :func:`memory_rows`, each of :attr:`Workload.row_bytes`. On an accelerator this is the peak of
    ``batch_rows="auto"``'s plateau probe, which may run a whole call's rows once (it stops at the rows there are,
    at what fits, or two doublings without a 10 % gain) before the chosen batch (the probe's ``B`` rows,
    :func:`batched_passes`) runs; the accelerator probe measures ``memory_scale`` on one pass of all its rows, so a
    pass of ``n`` rows is predicted at ``n`` / ``B`` times the memory it measured. The largest over the units.

    Args:
        work: The workload.
        cal: The calibration.

    Returns:
        Bytes (0 without rows).

    Example:
        >>> shape = ModelShape.from_config(n_layers=2, d_model=8, d_mlp=32, d_vocab=50)
        >>> cpu = Calibration({"ig_row": 1e-12})
        >>> held_bytes(ig_rows_batched(shape, rows=3 * 250, calls=3), cpu) == 128 * shape.ig_row_bytes()
        True
        >>> gpu = Calibration({"ig_row": 1e-12}, probe={"ig_row": {"units": 100, "flops": 1.0, "seconds": 1.0}},
        ...                   meta={"two_sizes": True})
        >>> w = ig_rows_batched(shape, rows=3 * 250, calls=3)      # 250 rows per call: passes of 100 rows
        >>> held_bytes(w, gpu) == 250 * shape.ig_row_bytes(), batched_passes(w, gpu, "ig_row")
        (True, 9.0)
        >>> held_bytes(ig_rows(shape, rows=60, evals=2), gpu) == 30 * shape.ig_row_bytes()  # 30 rows per evaluation
        True
    """
    return max((int(math.ceil(held_rows(work, cal, unit))) * int(row) for unit, row in work.row_bytes.items()),
               default=0)


def held_rows(work: Workload, cal: Calibration, unit: str) -> float:
    """The most rows of ``unit`` one pass of ``work`` holds: an evaluation's or a batched call's, at most
    :func:`memory_rows` (:func:`held_bytes`).

    Args:
        work: The workload.
        cal: The calibration.
        unit: A unit with :attr:`Workload.row_bytes`.

    Returns:
        Rows (0 where ``work`` has no rows of ``unit``).
    """
    groups = float(work.batched.get(unit, 0.0)) or float(work.passes.get(unit, 0.0)) or 1.0
    return min(work.units.get(unit, 0.0) / groups, memory_rows(cal, int(work.row_bytes.get(unit, 0))))


def plateau_probe_seconds(work: Workload, cal: Calibration) -> float:
    """Seconds of ``batch_rows="auto"``'s throughput probes (:mod:`tlcap.runtime.plateau`) for ``work``.

    On an accelerator (``meta["two_sizes"]``) the first call of a process probes the rows-per-second plateau of
    its kind of rows before it runs: each size ``START, 2·START, …`` up to the probe's cap is measured by
    :func:`tlcap.runtime.plateau.timed_rate` (a warm-up batch, then the timed ones), and the probe stops as
    :func:`tlcap.runtime.plateau.find_plateau` does (two doublings without a 10 % gain, the cap, or ``BUDGET_S``).
    Here both run on a clock that the calibration's own time of a batch of ``b`` rows advances
    (``s/pass + b · FLOPs per row · s/FLOP`` of the rows' unit), so the sizes, the stop and the seconds are those
    the calibrated machine would take. IG rows (kind ``"ig"``): the ``ig_row`` unit, capped at the rows one pass
    holds (:func:`held_rows`); the kinds in :attr:`Workload.probes` (``"trace"``: forward rows, ``fwd_token``) at
    their own cap. One probe per kind and stage: an upper bound where stages of one process share a context
    length (a process probes once per power-of-two context length and kind). Zero on a CPU (no probe there).

    Args:
        work: The stage's workload.
        cal: The calibration.

    Returns:
        Predicted seconds of the probes.

    Example:
        >>> shape = ModelShape.from_config(n_layers=2, d_model=8, d_mlp=32, d_vocab=50)
        >>> f = shape.ig_row_flops()
        >>> gpu = Calibration({"ig_row": 1e-3 / f}, seconds_per_pass={"ig_row": 0.1}, meta={"two_sizes": True})
        >>> round(plateau_probe_seconds(ig_rows(shape, rows=64), gpu), 3)   # sizes 8, 16, 32, 64: 3 batches each
        1.56
        >>> plateau_probe_seconds(ig_rows(shape, rows=64), Calibration({"ig_row": 1e-3 / f}))   # a CPU: none
        0.0
    """
    if not cal.meta.get("two_sizes"):
        return 0.0
    todo = [(PROBE_UNITS[kind], rows, fl) for kind, (rows, fl) in work.probes.items()]
    rows = work.units.get("ig_row", 0.0)
    if rows > 0:
        todo.append(("ig_row", held_rows(work, cal, "ig_row"), work.flops.get("ig_row", 0.0) / rows))
    return sum(_probe_seconds(cal, unit, cap, fl) for unit, cap, fl in todo if unit in cal.seconds_per_flop)


def _probe_seconds(cal: Calibration, unit: str, cap: float, flops_per_row: float) -> float:
    """The probe's seconds: :func:`~tlcap.runtime.plateau.find_plateau` and :func:`~tlcap.runtime.plateau.timed_rate`
    on a clock that each batch of ``b`` rows advances by its calibrated time."""
    per_row, per_pass = flops_per_row * cal.seconds_per_flop[unit], cal.seconds_per_pass.get(unit, 0.0)
    clock = [0.0]

    def run(b: int) -> None:
        clock[0] += per_pass + b * per_row

    now = lambda: clock[0]  # noqa: E731
    find_plateau(lambda b: timed_rate(run, b, clock=now), max(1, int(math.floor(cap))), budget_s=BUDGET_S, clock=now)
    return clock[0]


def dominant(seconds: Mapping[str, float], share: float = 0.8) -> list[tuple[str, float]]:
    """The fewest items whose predicted seconds make up at least ``share`` of the total, largest first,
    as ``(name, share of the total)``.

    Args:
        seconds: ``{name: predicted seconds}`` (non-positive values are ignored).
        share: The fraction of the total to cover.

    Returns:
        ``(name, share of the total)`` pairs, largest first (empty when the total is 0).
    """
    total = sum(v for v in seconds.values() if v > 0)
    out: list[tuple[str, float]] = []
    acc = 0.0
    for name, v in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if total <= 0 or acc >= share * total or v <= 0:
            break
        out.append((name, v / total))
        acc += v
    return out


def fmt_seconds(s: float) -> str:
    """``42 s``, ``3.5 min``, ``1.25 h``.

    Args:
        s: Seconds (NaN is written ``–``).

    Returns:
        Seconds below 90 s, minutes below 90 min, else hours.
    """
    if s != s:
        return "–"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"


def fmt_bytes(b: float) -> str:
    """``512 MB``, ``1.3 GB``.

    Args:
        b: Bytes (0 is written ``–``).

    Returns:
        Whole megabytes below 1 GB, else gigabytes with one decimal.
    """
    if not b:
        return "–"
    return f"{b / 1e6:.0f} MB" if b < 1e9 else f"{b / 1e9:.1f} GB"


__all__ = ["IG_ROW_PASSES", "TRAIN_PASSES", "ModelShape", "Workload", "Calibration", "Prediction", "predict", "ig_rows",
           "forward", "generate", "train",
           "fmt_seconds", "fmt_bytes", "UNITS", "FORMAT", "save_calibrations", "read_calibrations", "load_calibration",
           "dominant", "n_tokens", "prefill_tokens", "set_rows", "SET_ROW_TOKENS", "ig_rows_batched", "batched_passes",
           "held_bytes", "held_rows", "memory_rows", "CPU_MEMORY_ROWS", "floor_at_peak", "plateau_probe_seconds",
           "PROBE_KEY", "PROBE_UNITS"]
