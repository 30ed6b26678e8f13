"""Cost model of the CNL evaluation suite (``tlcap.experiments.cnl_eval``): one workload per method call.

Each function turns one call of a locator or validation into :mod:`tlcap.reproduce.cost` units
from the model's shape and the prompt's token counts, following what the call runs:

==================  ===============================================================================
call                work
==================  ===============================================================================
KN (IG)             :func:`ig_token_rows` per target token (per layer the rule's points, a
                    baseline row where the rule has no α = 0 node; a rule's α = 1 row once on the
                    staged path) + the clean forward, read at the answer positions
causal trace (MLP)  the clean run, ``samples`` corrupted runs, then per traced token from the subject on:
                    the corrupted prefix (``samples · t`` tokens) and ``samples · L`` restored rows
                    over the rest of the prompt (``T − t`` tokens each)
KC (EAP / EAP-IG)   the clean and corrupted runs (forward) and ``ig_steps`` interpolated passes
                    (forward + the activations' gradient) over the prompt + the edge-score products
                    (``2 · T · n_upstream · n_readers · d_model`` per pass); the circuit's
                    evaluation: masked forwards of ``1 + n_random`` circuits (2 forwards' worth each)
ROME at one layer   the key (``prefixes`` forwards), ``steps`` value-optimisation steps (forward +
                    backward over ``prefixes`` rows and the essence prompt), the rank-one solve
                    (``d_mlp³``) and the evaluation forwards (before and after the edit); the key
                    covariance once per layer when it is not in the on-disk cache
==================  ===============================================================================
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace
from typing import Any

from tlcap.attribution.config import IGConfig
from tlcap.attribution.quadrature import quadrature
from tlcap.attribution.staged import staged_applies
from tlcap.errors import InvalidConfigError
from tlcap.experiments.cnl_eval.reliability import KC_CPU_ROWS, KC_ROWS
from tlcap.intervene.covariance import covariance_path
from tlcap.intervene.rome.config import RomeConfig
from tlcap.intervene.rome.sweep_rows import VALUE_TOKENS
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.subjects import find_subject
from tlcap.reproduce.cost import ModelShape, Workload, forward, ig_rows, n_tokens, train


def _len(model: Any, text: str, bos: bool = True) -> int:
    return n_tokens(model, text, bos)


_GRAPHS: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()


def _graph_size(model: Any) -> tuple[int, int]:
    """``(n_upstream, n_readers)`` of the model's edge graph (built once per model)."""
    if model not in _GRAPHS:
        g = EdgeGraph.from_model(model)
        _GRAPHS[model] = (g.n_upstream, g.n_readers)
    return _GRAPHS[model]


def ig_token_rows(model: Any, ig: IGConfig, engine: str = "ig") -> int:
    """IG rows of one answer token over every layer, as the row engines build them: per layer the rule's points
    and, for a rule without an α = 0 node, the baseline row; exact IG with a rule that has an α = 1 node (``cnl``,
    ``right``, ``linspace``, ``trapezoid``) reads every layer's α = 1 gradient from one clean row on the staged path
    (:func:`~tlcap.attribution.staged.run_staged`: ``prefix_reuse`` and ``late_expand`` on, a TransformerBridge).
    SIG's word rows (:mod:`tlcap.attribution.word_ig`) always add the baseline row; AMIG's units are recomputed
    from their word on (not staged): neither shares the α = 1 row.

    Args:
        model: A :class:`tlcap.models.Model` (its layers and whether its rows run staged).
        ig: The IG settings (``steps="auto"``: the most points it may use).
        engine: ``"ig"`` (KN, CNL, QL's IG), ``"sig"`` or ``"amig"`` (QL's estimators).

    Returns:
        The number of rows.

    Raises:
        InvalidConfigError: ``engine`` is not one of the three.
    """
    if engine not in ("ig", "sig", "amig"):
        raise InvalidConfigError(f"ig_token_rows prices engine 'ig', 'sig' or 'amig', got {engine!r}")
    alphas, _ = quadrature(ig.max_steps if ig.steps == "auto" else int(ig.steps), ig.rule)
    L = int(model.n_layers)
    if engine == "sig":
        return L * (len(alphas) + 1)
    per_layer = len(alphas) + (0 if float(alphas[0]) == 0.0 else 1)
    shared = (engine == "ig" and ig.method == "ig" and float(alphas[-1]) == 1.0 and ig.prefix_reuse
              and ig.late_expand and staged_applies(model, [model.hook_name(ig.site, 0)]))
    return L * per_layer - (L - 1 if shared else 0)


def kn_work(model: Any, prompt: str, target: str, ig: IGConfig) -> Workload:
    """One :func:`tlcap.integrated_gradients` call (every layer, teacher-forced over the target's tokens).

    Args:
        model: A :class:`tlcap.models.Model` (shapes and tokenizer are read).
        prompt: The fact's prompt.
        target: The target text (one IG evaluation per token of it).
        ig: The IG settings (``points`` per evaluation).

    Returns:
        The :class:`Workload`: the IG rows and one clean forward pass.
    """
    shape = ModelShape.of(model)
    # the prompt as integrated_gradients encodes it (the model's BOS default)
    p, t = n_tokens(model, prompt), max(1, _len(model, target, bos=False))
    rows = t * ig_token_rows(model, ig)
    return ig_rows(shape, rows, ctx=p + t, evals=t) + forward(shape, p + t, (p + t) / 2, p + t, 1, reads=t)


def trace_work(model: Any, prompt: str, subject: str, samples: int, tokens: str = "all") -> Workload:
    """One causal trace of the MLP kind at every layer (the batched engine: prefix reuse, no BOS, cells before
    the subject skipped) over the token rows ``tokens`` (``"all"``, ``"subject"`` or ``"last_subject"``, the rows of
    ``TraceConfig.tokens``). Counted without late expansion (``TraceConfig.late_expand``, on by default), which
    skips the layers below each batch's lowest restored one: an upper bound of the default engine's work.

    Args:
        model: A :class:`tlcap.models.Model` (shapes and tokenizer are read).
        prompt: The fact's prompt.
        subject: The subject, found in ``prompt``.
        samples: Corrupted runs per traced cell.
        tokens: Which token rows are traced.

    Returns:
        The ``fwd_token`` :class:`Workload` of the trace.

    Raises:
        InvalidConfigError: ``tokens`` is not one of the three rows.
    """
    shape = ModelShape.of(model)
    T = len(model.to_tokens(prompt, prepend_bos=False)[0])
    s0, s1 = find_subject(model, prompt, subject, prepend_bos=False).range
    toks = T * (1 + samples)  # the clean run and the corrupted runs
    rows = {"all": range(s0, T), "subject": range(s0, s1), "last_subject": [s1 - 1]}
    if tokens not in rows:
        raise InvalidConfigError(f"trace_work costs tokens='all', 'subject' or 'last_subject', got {tokens!r}")
    for t in rows[tokens]:
        toks += samples * t + samples * shape.n_layers * (T - t)
    # read out: the clean run at every position, each corrupted run, each cell's rows and each traced token's noised
    # prefix (its last position: Model.prefix_cache) at theirs (tested against counted FLOPs)
    reads = T + samples * (1 + shape.n_layers * len(rows[tokens]) + sum(1 for t in rows[tokens] if t > 0))
    work = forward(shape, toks, T / 2, T, 2 + len(rows[tokens]), reads=reads)  # clean, corrupted, a batch per token
    # batch_rows="auto" probes the forward rows' plateau on an accelerator, capped at the trace's rows (the engine's)
    return replace(work, probes={"trace": (float(samples * shape.n_layers), shape.fwd_token_flops(T))})


def kc_work(model: Any, prompt: str, target: str, ig_steps: int, n_circuits: int = 0) -> Workload:
    """One :func:`edge_attribution` (zero ablation) and, with ``n_circuits``, the circuits' evaluation.

    Args:
        model: A :class:`tlcap.models.Model` (shapes, tokenizer and edge graph are read).
        prompt: The fact's prompt.
        target: The target text.
        ig_steps: IG steps of the edge attribution.
        n_circuits: Circuits evaluated afterwards (0: none).

    Returns:
        The :class:`Workload`, the edge products counted as ``train_token`` FLOPs.

    The evaluation (the reliability experiment's KC part, ``n_circuits`` = the located circuit and the random
    ones): the full model, the fully ablated run and the located circuit as rows of one circuit-only pass, then
    the random circuits :data:`~tlcap.experiments.cnl_eval.reliability.KC_CPU_ROWS` a pass on a CPU and
    :data:`~tlcap.experiments.cnl_eval.reliability.KC_ROWS` on an accelerator (zero ablation: no pass of its own;
    tested against counted runs).
    """
    shape = ModelShape.of(model)
    # the prompt as edge attribution encodes it (the model's BOS default) with the teacher-forced target
    T = n_tokens(model, prompt) + max(1, _len(model, target, bos=False)) - 1
    n_upstream, n_readers = _graph_size(model)
    passes = 2 + ig_steps
    products = 2.0 * T * n_upstream * n_readers * shape.d_model * passes
    # the clean and corrupted runs are forward passes, each IG step a forward and the activations' gradient (tested
    # against counted FLOPs); the passes stay the attribution's (train_token)
    w = forward(shape, 2 * T, T / 2, T) + train(shape, T * ig_steps, 0, T / 2, T, passes) \
        + Workload.of(train_token=products)
    if n_circuits:  # each row: a forward and its masked sums (on average half the upstream nodes before a reader)
        cpu, acc = kc_eval_passes(n_circuits - 1, KC_CPU_ROWS), kc_eval_passes(n_circuits - 1, KC_ROWS)
        ev = forward(shape, T * (2 + n_circuits), T / 2, T, cpu) \
            + Workload.of(fwd_token=(2 + n_circuits) * T * n_upstream * n_readers * shape.d_model)
        w = w + replace(ev, accelerator_passes={"fwd_token": float(acc - cpu)})
    return w


def kc_eval_passes(n_random: int, per_pass: int) -> int:
    """Circuit-only passes of the KC evaluation of one fact: the full / ablated / located rows, then ``n_random``
    random circuits ``per_pass`` a pass.

    Args:
        n_random: Random circuits.
        per_pass: Random circuits per pass.

    Returns:
        The number of passes.

    Example:
        >>> kc_eval_passes(200, 8), kc_eval_passes(200, 32), kc_eval_passes(0, 8)
        (26, 8, 1)
    """
    return 1 + math.ceil(max(int(n_random), 0) / max(int(per_pass), 1))


def rome_work(model: Any, prompt: str, target_new: str, layers: int, cfg: RomeConfig, n_eval_prompts: int,
              cov_layers: list[int]) -> Workload:
    """``layers`` ROME edits of one fact (:func:`~tlcap.intervene.rome.evaluate.rome_sweep`), each evaluated on
    ``n_eval_prompts`` prompts, the unedited model once; on an accelerator calibration the layers as rows of shared
    passes (:mod:`tlcap.intervene.rome.sweep_rows`; both tested against a counted sweep).

    Args:
        model: A :class:`tlcap.models.Model` (on the ``meta`` device, no covariance counts as cached).
        prompt: The fact's prompt.
        target_new: The new target the edit writes.
        layers: Layers edited (one edit each).
        cfg: The ROME settings (prefixes, steps, covariance sizes).
        n_eval_prompts: Prompts each edit is evaluated on.
        cov_layers: Layers whose key covariance the edits need; those not cached on disk are counted.

    Returns:
        The :class:`Workload` of the edits, their evaluation and any covariance recording.
    """
    shape = ModelShape.of(model)
    T = _len(model, prompt) + _len(model, target_new, bos=False)
    P = len(cfg.prefixes)
    pre = sum(_len(model, p, bos=False) for p in cfg.prefixes) / max(P, 1)
    rows = P * (T + pre) + _len(model, cfg.kl_prompt)
    # per edit: the prefixed prompts' subject keys and the prompt's own key and output (two passes), the value's
    # optimisation (one pass per step), the update's solve, then the edited model's measures: the targets'
    # log-probabilities and the neighbourhood's top tokens (one batch each, rome.evaluate.unedited_measures); the
    # memory of the optimisation's largest pass: its layers' rows on an accelerator (at most VALUE_TOKENS tokens)
    per_layer = forward(shape, P * (T + pre) + T, T, int(T + pre), 2) \
        + train(shape, cfg.steps * rows, 0, T, max(int(T + pre), min(VALUE_TOKENS, int(rows) * layers)), cfg.steps) \
        + Workload.of(fwd_token=2.0 * shape.d_mlp ** 3) \
        + forward(shape, n_eval_prompts * T, T / 2, T, 2)
    w = per_layer.scaled(layers) + forward(shape, n_eval_prompts * T, T / 2, T, 2)  # unedited: once per sweep
    # on an accelerator the layers are rows (rome.sweep_rows): the keys of every layer in one pass, then per chunk of
    # b layers one pass per step and the two measure batches
    chunks = math.ceil(layers / max(1, min(layers, VALUE_TOKENS // max(1, int(rows)))))
    w = w + Workload(accelerator_passes={"fwd_token": float(1 + 2 * chunks - 4 * layers),
                                         "train_token": float(cfg.steps * (chunks - layers))})
    shape_only = getattr(getattr(model, "device", None), "type", "") == "meta"  # no weights: nothing can be cached
    missing = [l for l in cov_layers
               if shape_only or not covariance_path(model, l, cfg.cov_tokens, cfg.cov_seq_len).exists()]
    if missing and cfg.mom2_adjustment:
        top = max(missing) + 1  # the recording stops after the highest layer's keys
        w = w + forward(shape, cfg.cov_tokens * top / shape.n_layers, cfg.cov_seq_len / 2, cfg.cov_seq_len,
                        cfg.cov_tokens / cfg.cov_seq_len) \
            + Workload.of(fwd_token=2.0 * cfg.cov_tokens * shape.d_mlp ** 2 * len(missing))
    return w


__all__ = ["ig_token_rows", "kn_work", "trace_work", "kc_eval_passes", "kc_work", "rome_work"]
