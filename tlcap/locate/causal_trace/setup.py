"""The shared part of every trace of one prompt: tokens, subject span, noise, clean states.

:func:`prepare_trace` runs the clean pass (recording every state a restoration may need), draws
the fixed noise tensors and runs the corrupted pass; :class:`TraceSetup` then runs any set of
restorations (:meth:`TraceSetup.restored_prob`) and provides the noise hooks the batched engine
(:mod:`tlcap.locate.causal_trace.engine`) uses.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.config import check_str
from tlcap.data.knowns import load_known_facts
from tlcap.errors import EmptyDatasetError, InvalidConfigError
from tlcap.locate.causal_trace.config import KIND_SITES, TraceConfig
from tlcap.locate.subjects import SubjectWarning, find_subject, sink_message
from tlcap.models.adapter import HookList, Model
from tlcap.runtime import device as runtime_device
from tlcap.runtime import hooks as H
from tlcap.runtime.batching import auto_batch_rows, run_auto_batched, trace_row_bytes
from tlcap.runtime.fixed import once, weights_fixed
from tlcap.runtime.sites import get_site


def subject_span(model: Model, prompt: str, subject: str, start: int = 0, occurrence: int = 0) -> tuple[int, int]:
    """Token range ``[start, end)`` of an occurrence of ``subject`` in ``prompt`` (default the first).

    ``start`` (a character index) skips occurrences before it, e.g. inside a prefix. A thin
    wrapper of :meth:`tlcap.models.Model.subject_span`, which also reports how many times the
    subject occurs.

    Args:
        model: The model (its tokenizer places the subject).
        prompt: The prompt.
        subject: The subject exactly as written in the prompt.
        start: Character index where the search begins.
        occurrence: Which occurrence (0-based).

    Returns:
        ``(first token, one past the last token)``.

    Raises:
        SubjectNotFoundError: ``subject`` is empty or not a substring of ``prompt``.
    """
    return model.subject_span(prompt, subject, occurrence=occurrence, start=start).range


def window_layers(layer: int, n_layers: int, window: int) -> list[int]:
    """ROME's window of layers restored for an MLP/attention cell at ``layer``.

    Args:
        layer: The cell's layer.
        n_layers: Layers of the model.
        window: Window size w.

    Returns:
        ``range(max(0, layer - w // 2), min(n_layers, layer - (-w // 2)))`` as a list.
    """
    return list(range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2))))


def embedding_noise_std(model: Model, factor: float = 3.0) -> float:
    """ν = ``factor`` × the standard deviation of the token embedding matrix's entries.

    Args:
        model: The model.
        factor: The factor (ROME: 3).

    Returns:
        ν as a float.
    """
    return float(factor * model.W_E.detach().float().std())


def subject_noise_std(model: Model, subjects: Sequence[str], factor: float = 3.0) -> float:
    """ν = ``factor`` × the standard deviation of the subjects' token embeddings (ROME's "s3").

    ROME's ``collect_embedding_std`` (``experiments/causal_trace.py``): each subject is tokenised
    on its own (no BOS, no leading space), the embeddings of all its tokens are gathered over all
    subjects (repeats included), and the standard deviation is taken over every entry.

    Args:
        model: The model.
        subjects: The subjects (ROME: the traced dataset's).
        factor: The factor (ROME: 3).

    Returns:
        ν as a float.

    Raises:
        EmptyDatasetError: no subject gives a token.
    """
    ids = [i for s in subjects for i in model.encode(s, prepend_bos=False, check_length=False)]
    if not ids:
        raise EmptyDatasetError("no subject tokens to take the embedding standard deviation over; give subjects")
    W_E = model.W_E.detach()
    return float(factor * W_E[torch.tensor(ids, device=W_E.device)].float().std())


def known_subjects() -> list[str]:
    """The subjects of ROME's known facts (:func:`tlcap.data.load_known_facts`).

    Returns:
        The subject strings, in file order (repeats kept).
    """
    return [f["subject"] for f in load_known_facts()]


def noise_level(model: Model, config: TraceConfig, subjects: Sequence[str] | None = None) -> float:
    """ν for a trace: ``config.noise_std`` if set, else ``noise_factor`` × the std ``noise_from`` names.

    Args:
        model: The model.
        config: The trace settings.
        subjects: The subjects for ``noise_from="subjects"`` (default: ROME's known facts').

    Returns:
        ν as a float.
    """
    if config.noise_std is not None:
        return float(config.noise_std)
    key = ("noise_level", id(model), config.noise_from, config.noise_factor, None if subjects is None else tuple(subjects))
    if config.noise_from == "embedding":  # once per weights_fixed block (causal_trace_facts: once per fact batch)
        return once(key, lambda: embedding_noise_std(model, config.noise_factor))
    return once(key, lambda: subject_noise_std(model, known_subjects() if subjects is None else subjects,
                                               config.noise_factor))


@dataclass
class TraceSetup:
    """Everything the clean / corrupted runs share: tokens, subject span, noise, clean states.

    Build with :func:`prepare_trace`; :meth:`restored_prob` runs any set of restorations.

    Attributes:
        model: The model.
        prompt, subject, target: The fact (``target`` is the scored answer's text).
        tokens: The prompt's token ids.
        subject_range: ``[start, end)`` of the noised subject tokens.
        target_id: The scored token (the target's first token).
        noise: The fixed noise draws added to the subject embeddings.
        noise_std: ν.
        config: The trace's settings.
        layers: The traced layers.
        clean: Clean states of every restorable hook (``[1, pos, d_model]`` each).
        clean_prob, corrupted_prob: Target probability in the clean / corrupted run.
        subject_at_start: The subject's first token is at position 0 (no BOS before it).
    """

    model: Model
    prompt: str
    subject: str
    target: str
    tokens: Int[Tensor, "1 pos"]
    subject_range: tuple[int, int]
    target_id: int
    noise: Float[Tensor, "samples n_subj d_model"]
    noise_std: float
    config: TraceConfig
    layers: tuple[int, ...]
    clean: dict[str, Tensor]
    clean_prob: float
    corrupted_prob: float = float("nan")
    subject_at_start: bool = False

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def samples(self) -> int:
        return int(self.noise.shape[0])

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.config.kinds)

    @property
    def window(self) -> int:
        return self.config.window

    @property
    def seed(self) -> int:
        return self.config.seed

    def site_layers(self, kind: str, layer: int) -> list[int]:
        """Layers whose ``kind`` state a cell ``(kind, layer)`` restores.

        Args:
            kind: ``"resid"``, ``"mlp"`` or ``"attn"``.
            layer: The cell's layer.

        Returns:
            ``[layer]`` for the residual stream, else ROME's window of layers around it (:func:`window_layers`).
        """
        if kind == "resid":
            return [layer]
        return window_layers(layer, self.model.n_layers, self.window)

    def hook(self, kind: str, layer: int) -> str:
        """The hook name of a ``kind`` state at ``layer``.

        Args:
            kind: ``"resid"``, ``"mlp"`` or ``"attn"``.
            layer: The layer.

        Returns:
            The TransformerLens hook name (``resid_post``, ``mlp_out`` or ``attn_out`` of ``layer``).
        """
        return get_site(KIND_SITES[kind]).hook_name(layer)

    def noise_hooks(self, rows_per_sample: int = 1, offset: int = 0, upto: int | None = None) -> HookList:
        """Noise on the subject embeddings, for a batch of ``samples × rows_per_sample`` rows.

        Args:
            rows_per_sample: Consecutive rows sharing one noise draw (sample-major batches).
            offset: Position of the first token in the run (positions before it come from a cache).
            upto: The run stops before this absolute position (prefix runs).

        Returns:
            The hook list (empty when no subject token is in the run).
        """
        s0, s1 = self.subject_range
        end = self.n_tokens if upto is None else upto
        a, b = max(s0, offset), min(s1, end)
        if b <= a:
            return []
        nz = self.noise[:, a - s0 : b - s0]
        if rows_per_sample > 1:
            nz = nz.repeat_interleave(rows_per_sample, 0)
        return [(get_site("embed").hook_name(), H.add_noise(nz, pos=slice(a - offset, b - offset)))]

    def probs(self, last_logits: Float[Tensor, "rows d_vocab"]) -> Float[Tensor, " rows"]:
        """Target probability of each row from its next-token logits.

        Args:
            last_logits: ``[rows, d_vocab]`` next-token logits at the last position.

        Returns:
            ``[rows]`` softmax probabilities (float32) of the target token.
        """
        return last_logits.float().softmax(-1)[:, self.target_id]

    @torch.no_grad()
    def restored_prob(self, cells: Iterable[tuple[str, int, int]] = ()) -> float:
        """Corrupted run with the clean state of every ``(kind, token, layer)`` cell restored.

        Each cell restores its whole window (MLP/attention kinds). With no cells this is the
        corrupted run. One forward of ``samples`` rows over the full prompt.

        Args:
            cells: ``(kind, token, layer)`` triples.

        Returns:
            The target probability, mean over the noise samples.
        """
        per_hook: dict[str, set[int]] = {}
        for kind, t, l in cells:
            for ll in self.site_layers(kind, l):
                per_hook.setdefault(self.hook(kind, ll), set()).add(int(t))
        hooks = list(self.noise_hooks())
        for name, pos in per_hook.items():
            hooks.append((name, H.patch(self.clean[name], pos=sorted(pos))))
        n = self.samples
        logits = self.model.last_logits(self.tokens.expand(n, -1), hooks=hooks)
        return float(self.probs(logits).mean())


@torch.no_grad()
def prepare_trace(
    model: Model,
    prompt: str,
    subject: str,
    target: str | None = None,
    *,
    config: TraceConfig | None = None,
    occurrence: int | None = None,
    warn: bool = True,
    **overrides: Any,
) -> TraceSetup:
    """Clean run, noise draws and corrupted probability for :func:`causal_trace`.

    Args:
        model: The model.
        prompt: The fact's prompt.
        subject: The subject as written in the prompt (its tokens are noised).
        target: The answer whose first token is scored (``None``: the clean run's top token).
        config: A :class:`TraceConfig` (default: its defaults).
        occurrence: Which occurrence of the subject to noise (0-based, negative from the last);
            ``None``: the first, with a :class:`~tlcap.locate.subjects.SubjectWarning` when the
            subject occurs more than once.
        warn: Warn (:class:`~tlcap.locate.subjects.SubjectWarning`) when the subject starts the
            prompt without a BOS (dataset mode counts these instead).
        **overrides: :class:`TraceConfig` fields overriding ``config`` (``samples=5``...).

    Returns:
        A :class:`TraceSetup` with the clean and corrupted probabilities.

    Raises:
        InvalidConfigError: an invalid setting, an empty prompt, subject or target, an
            occurrence the prompt does not have, or a layer beyond the model.
        SubjectNotFoundError: the subject is not in the prompt.

    Example:
        >>> setup = prepare_trace(model, "The capital of France is", "France", " Paris", samples=3)
        >>> setup.restored_prob([("resid", 3, 0)]) == setup.corrupted_prob     # (kind, token, layer) cells
        False
        >>> setup.restored_prob() == setup.corrupted_prob                        # no cell: the corrupted run
        True
        >>> abs(setup.restored_prob([("resid", 4, 1)]) - setup.clean_prob) < 1e-9   # last token, last layer
        True
    """
    cfg = TraceConfig.resolve(config, **overrides)
    layers = cfg.check_layers(model.n_layers, model.name)
    tokens, span = _fact_inputs(model, prompt, subject, target, cfg, occurrence, warn)
    return _prepare_one(model, prompt, subject, target, cfg, layers, tokens, span)


def _prepare_one(model: Model, prompt: str, subject: str, target: str | None, cfg: TraceConfig,
                 layers: tuple[int, ...], tokens: Tensor, span: tuple[int, int]) -> TraceSetup:
    """:func:`prepare_trace` of one fact whose inputs are checked (:func:`_fact_inputs`): its clean and corrupted runs."""
    logits, clean = model.run_with_cache(tokens, _clean_names(model, cfg))
    probs = logits[0, -1].float().softmax(-1)
    if target is None:
        tid = int(probs.argmax())
        target = model.to_str_tokens([tid])[0]
    else:
        tid = model.target_ids(prompt, target)[0]
    nu = noise_level(model, cfg)
    setup = TraceSetup(
        model=model, prompt=prompt, subject=subject, target=target, tokens=tokens, subject_range=span,
        target_id=tid, noise=_noise(model, cfg, span, nu), noise_std=nu, config=cfg, layers=layers, clean=clean,
        clean_prob=float(probs[tid]), subject_at_start=span[0] == 0,
    )
    setup.corrupted_prob = setup.restored_prob([])
    return setup


def _fact_inputs(model: Model, prompt: str, subject: str, target: str | None, cfg: TraceConfig,
                 occurrence: int | None, warn: bool) -> tuple[Tensor, tuple[int, int]]:
    """A fact's checked ``(tokens [1, pos], subject span)``; warns when the subject starts the prompt."""
    if target is not None:
        check_str("target", target)
    tokens = model.to_tokens(prompt, prepend_bos=cfg.bos)
    span = find_subject(model, prompt, subject, occurrence, prepend_bos=cfg.bos).range
    cfg.token_positions(int(tokens.shape[1]), span)  # a position outside the prompt fails here
    if span[0] == 0 and warn:
        warnings.warn(sink_message(prompt, subject), SubjectWarning, stacklevel=4)
    return tokens, span


def _clean_names(model: Model, cfg: TraceConfig) -> list[str]:
    """Every restorable hook of the trace's kinds (their clean states are kept)."""
    return sorted({get_site(KIND_SITES[k]).hook_name(l) for k in cfg.kinds for l in range(model.n_layers)})


def _noise(model: Model, cfg: TraceConfig, span: tuple[int, int], nu: float) -> Tensor:
    """The fact's fixed noise draws (seeded by ``cfg.seed``), ``[samples, subject tokens, d_model]``."""
    g = torch.Generator(device="cpu").manual_seed(cfg.seed)
    return (torch.randn(cfg.samples, span[1] - span[0], model.d_model, generator=g) * nu).to(model.device)


def dense_noise(setups: Sequence[TraceSetup], pairs: Sequence[tuple[int, int]], start: str, width: int,
                dtype: torch.dtype) -> Tensor:
    """Every row's subject noise as one dense tensor, zero elsewhere (rows are ``pair``-major, ``samples`` each).

    Args:
        setups: The facts' set-ups (their noise draws and subject spans).
        pairs: ``(fact, t)`` per pair of rows: the fact and the position ``t`` its rows split at.
        start: ``"prefix"``: the positions ``< t``; ``"cont"``: the positions ``>= t``, shifted by ``t``.
        width: Positions per row.
        dtype: The tensor's dtype.

    Returns:
        ``[pairs · samples, width, d_model]`` noise on the model's device.
    """
    model = setups[0].model
    n = setups[0].samples
    out = torch.zeros(len(pairs) * n, width, model.d_model, device=model.device, dtype=dtype)
    for p, (f, t) in enumerate(pairs):
        s0, s1 = setups[f].subject_range
        a, b = (s0, min(s1, t)) if start == "prefix" else (max(s0, t), s1)
        if b > a:
            shift = 0 if start == "prefix" else t
            out[p * n:(p + 1) * n, a - shift:b - shift] = setups[f].noise[:, a - s0:b - s0].to(out)
    return out


def add_dense(noise: Tensor) -> Any:
    """A hook adding ``noise`` (:func:`dense_noise`) to the activation, in the activation's dtype.

    Args:
        noise: A tensor of the activation's shape.

    Returns:
        The hook.
    """
    def hook(act: Tensor, hook: Any = None) -> Tensor:
        return act + noise.to(act.dtype)
    return hook


@torch.no_grad()
def prepare_traces(model: Model, facts: Sequence[tuple[str, str, str | None]], *, config: TraceConfig | None = None,
                   warn: bool = True, seeds: Sequence[int] | None = None, **overrides: Any) -> list[TraceSetup]:
    """:func:`prepare_trace` of several ``(prompt, subject, target or None)`` facts.

    On an accelerator (:func:`~tlcap.runtime.device.one_pass_default`) the facts' clean runs are one
    right-padded pass and their corrupted runs another (each fact's noise on its own rows), so a batch of
    facts costs two passes' launches and three or four host round trips (the clean and corrupted probabilities,
    ν, the top tokens where a target is ``None``) instead of two passes and two or three round trips per
    fact; each setup equals the fact's own :func:`prepare_trace` up to float rounding (tested). The corrupted
    pass holds at most ``config.batch_rows`` rows (whole facts, ``samples`` rows each; ``"auto"``: the trace
    engine's batch, halved on out-of-memory), so it is split into several where the facts' rows do not fit. On
    a CPU, and for one fact, each fact is prepared alone. ν is computed once for all of them.

    Args:
        model: The model.
        facts: ``(prompt, subject, target)`` per fact (``target=None``: the clean run's top token).
        config: A :class:`TraceConfig` (default: its defaults).
        warn: Warn when a subject starts its prompt without a BOS (:func:`prepare_trace`).
        seeds: Per fact, the seed of its noise draws (default: every fact ``config.seed``).
        **overrides: :class:`TraceConfig` fields overriding ``config``.

    Returns:
        One :class:`TraceSetup` per fact, in order.

    Raises:
        InvalidConfigError: an invalid setting, prompt, subject or target (before any forward pass).
        SubjectNotFoundError: a subject is not in its prompt.

    Example:
        >>> a, b = prepare_traces(model, [("The capital of France is", "France", " Paris"),
        ...                               ("The capital of Italy is", "Italy", None)], samples=3)
        >>> a.clean_prob == prepare_trace(model, "The capital of France is", "France", " Paris", samples=3).clean_prob
        True
    """
    cfg = TraceConfig.resolve(config, **overrides)
    layers = cfg.check_layers(model.n_layers, model.name)
    if seeds is not None and len(seeds) != len(facts):
        raise InvalidConfigError(f"seeds needs one entry per fact ({len(facts)}), got {len(seeds)}")
    cfgs = [cfg] * len(facts) if seeds is None else [cfg.replace(seed=int(x)) for x in seeds]
    inputs = [_fact_inputs(model, p, s, t, cfg, None, warn) for p, s, t in facts]  # every fact checked first
    with weights_fixed():  # ν once
        if len(facts) < 2 or not runtime_device.one_pass_default(model) or not model.continues_rows:
            return [_prepare_one(model, p, s, t, c, layers, tok, span)
                    for (p, s, t), c, (tok, span) in zip(facts, cfgs, inputs)]
        nu = noise_level(model, cfg)
    k, n_s = len(facts), cfg.samples
    lengths = [int(tok.shape[1]) for tok, _ in inputs]
    toks = torch.full((k, max(lengths)), model.pad_token_id, dtype=torch.long, device=model.device)
    for f, (tok, _) in enumerate(inputs):  # right padding: a real position never sees it (attention is causal)
        toks[f, :lengths[f]] = tok[0].to(toks.device)
    last = torch.tensor([[m - 1] for m in lengths])
    store: dict[str, Tensor] = {}
    rec = [(nm, H.record(store, nm)) for nm in _clean_names(model, cfg)]
    probs = model.logits_at(toks, last, hooks=rec)[:, 0].float().softmax(-1)
    top = probs.argmax(-1).tolist() if any(t is None for _, _, t in facts) else []
    tids = [top[f] if t is None else model.target_ids(p, t)[0] for f, (p, _, t) in enumerate(facts)]
    clean_probs = probs[torch.arange(k, device=probs.device), torch.tensor(tids, device=probs.device)].tolist()
    setups = []
    for f, ((p, subj, t), (tok, span)) in enumerate(zip(facts, inputs)):
        clean = {nm: a[f:f + 1, :lengths[f]] for nm, a in store.items()}
        setups.append(TraceSetup(
            model=model, prompt=p, subject=subj, target=model.to_str_tokens([tids[f]])[0] if t is None else t,
            tokens=tok, subject_range=span, target_id=tids[f], noise=_noise(model, cfgs[f], span, nu), noise_std=nu,
            config=cfgs[f], layers=layers, clean=clean, clean_prob=clean_probs[f], subject_at_start=span[0] == 0))
    width = int(toks.shape[1])

    def corrupted(batch_rows: int) -> list[float]:
        """The corrupted runs: ``n_s`` rows per fact (its noise on its subject positions), whole facts per pass."""
        per = max(1, int(batch_rows) // n_s)
        out = torch.empty(k, device=model.device)
        for a in range(0, k, per):
            b = min(k, a + per)
            noise = dense_noise(setups, [(f, 0) for f in range(a, b)], "cont", width, model.dtype)
            embed = [(get_site("embed").hook_name(), add_dense(noise))]
            lg = model.logits_at(toks[a:b].repeat_interleave(n_s, 0), last[a:b].repeat_interleave(n_s, 0),
                                 hooks=embed)[:, 0]
            rows = torch.tensor(tids[a:b], device=lg.device).repeat_interleave(n_s)
            out[a:b] = lg.float().softmax(-1).gather(1, rows[:, None])[:, 0].view(b - a, n_s).mean(1)
        return out.tolist()  # one read for the facts

    if cfg.batch_rows == "auto":  # the batch the trace engine takes (its probe, shared), halved on out-of-memory
        rows = auto_batch_rows(trace_row_bytes(model, width), k * n_s, cfg.max_memory, model.device, model=model,
                               kind="trace", context_len=width)
        probs_c = run_auto_batched(corrupted, rows, model.device)
    else:
        probs_c = corrupted(int(cfg.batch_rows))
    for st, c in zip(setups, probs_c):
        st.corrupted_prob = c
    return setups


__all__ = ["TraceSetup", "embedding_noise_std", "known_subjects", "noise_level", "prepare_trace", "prepare_traces",
           "subject_noise_std",
           "subject_span", "window_layers"]
