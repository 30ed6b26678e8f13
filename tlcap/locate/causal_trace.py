"""Causal tracing (ROME, Meng et al. 2022) on the shared hook runtime.

Three runs of one prompt:

- **clean**: the prompt as is; every state needed later is recorded;
- **corrupted**: Gaussian noise (std ν, default ``3 × std(W_E)``, ROME's "s3") added to the
  *subject* tokens' embeddings (the ``embed`` site), ``samples`` fixed noise draws (seeded);
- **corrupted-with-restoration**: the corrupted run with the clean state of one
  ``(token, layer)`` copied back: the residual stream (``resid_post``, one layer) or the MLP /
  attention output (``mlp_out`` / ``attn_out``) of a *window* of layers centred on the layer
  (ROME: ``range(max(0, l - w//2), min(L, l - (-w//2)))``, w = 10).

The score of a cell is the probability of the target token (the first token of the answer,
as in ROME) at the last position, averaged over the noise samples; the indirect effect is
score − corrupted probability.

How it is made fast (exact, not approximate):

- **Batched restorations**: one forward pass carries many rows, each row one noise sample ×
  one (kind, layer) restoration (:func:`tlcap.runtime.hooks.patch_rows` copies the clean state
  into just that row), instead of one forward per cell.
- **Corrupted-prefix reuse**: a restoration at token t cannot change positions < t (causal
  attention), so those positions are the corrupted run's. Their keys/values are computed once
  per token t (a :class:`tlcap.models.PrefixCache` with one row per noise sample, whose rows
  are repeated for the cells of that sample) and each row recomputes only positions ≥ t.
- **Tokens before the subject**: the clean and corrupted states there are identical, so
  restoring them is a no-op; those cells get the corrupted probability without a forward.
- **Last-position logits**: only the next-token logits are read, so the unembedding runs
  on the last position only (:meth:`tlcap.models.Model.last_logits`).

:func:`trace_reference` is the slow one-cell-at-a-time reference (one forward of ``samples``
rows per cell, full prompt, the ``patch`` / ``add_noise`` factories) used in tests and the
benchmark.

Example:
    >>> tr = causal_trace(model, "The capital of France is", "France", " Paris")
    >>> tr.clean_prob, tr.corrupted_prob, tr.top_layers(k=3)
    >>> tr.figure().show()
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.data.knowns import load_known_facts  # re-exported: it moved to tlcap.data
from tlcap.errors import EmptyDatasetError, SubjectNotFoundError
from tlcap.models.adapter import HookList, Model
from tlcap.results import Result
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site

KINDS: tuple[str, ...] = ("resid", "mlp", "attn")
KIND_SITES: dict[str, str] = {"resid": "resid_post", "mlp": "mlp_out", "attn": "attn_out"}
TOKEN_CLASSES: tuple[str, ...] = (
    "first subject", "middle subject", "last subject", "first subsequent", "further", "last",
)


# ---------------------------------------------------------------------------- helpers
def subject_span(model: Model, prompt: str, subject: str, start: int = 0, occurrence: int = 0) -> tuple[int, int]:
    """Token range ``[start, end)`` of an occurrence of ``subject`` in ``prompt`` (default the first).

    ``start`` (a character index) skips occurrences before it, e.g. inside a prefix. A thin
    wrapper of :meth:`tlcap.models.Model.subject_span`, which also reports how many times the
    subject occurs.

    Raises:
        SubjectNotFoundError: ``subject`` is empty or not a substring of ``prompt``.
    """
    return model.subject_span(prompt, subject, occurrence=occurrence, start=start).range


def window_layers(layer: int, n_layers: int, window: int) -> list[int]:
    """ROME's window of layers restored for an MLP/attention cell at ``layer``."""
    return list(range(max(0, layer - window // 2), min(n_layers, layer - (-window // 2))))


def embedding_noise_std(model: Model, factor: float = 3.0) -> float:
    """ν = ``factor`` × the standard deviation of the token embedding matrix."""
    return float(factor * model.W_E.detach().float().std())


# ---------------------------------------------------------------------------- setup
@dataclass
class TraceSetup:
    """Everything the clean / corrupted runs share: tokens, subject span, noise, clean states.

    Build with :func:`prepare_trace`; :meth:`restored_prob` runs any set of restorations.
    """

    model: Model
    prompt: str
    subject: str
    target: str | None
    tokens: Int[Tensor, "1 pos"]
    subject_range: tuple[int, int]
    target_id: int
    noise: Float[Tensor, "samples n_subj d_model"]
    noise_std: float
    seed: int
    kinds: tuple[str, ...]
    layers: tuple[int, ...]
    window: int
    clean: dict[str, Tensor]
    clean_prob: float
    corrupted_prob: float = float("nan")

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def samples(self) -> int:
        return int(self.noise.shape[0])

    def site_layers(self, kind: str, layer: int) -> list[int]:
        """Layers whose ``kind`` state a cell ``(kind, layer)`` restores."""
        if kind == "resid":
            return [layer]
        return window_layers(layer, self.model.n_layers, self.window)

    def hook(self, kind: str, layer: int) -> str:
        return get_site(KIND_SITES[kind]).hook_name(layer)

    def noise_hooks(self, rows_per_sample: int = 1, offset: int = 0, upto: int | None = None) -> HookList:
        """Noise on the subject embeddings, for a batch of ``samples × rows_per_sample`` rows.

        ``offset``: position of the first token in the run (positions before it come from a
        cache); ``upto``: the run stops before this absolute position (prefix runs).
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

    def _probs(self, last_logits: Tensor) -> Tensor:
        """Target probability of each row from its next-token logits ``[rows, d_vocab]``."""
        return last_logits.float().softmax(-1)[:, self.target_id]

    @torch.no_grad()
    def restored_prob(self, cells: Iterable[tuple[str, int, int]] = ()) -> float:
        """Corrupted run with the clean state of every ``(kind, token, layer)`` cell restored.

        Each cell restores its whole window (MLP/attention kinds). With no cells this is the
        corrupted run. One forward of ``samples`` rows over the full prompt.
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
        return float(self._probs(logits).mean())


@torch.no_grad()
def prepare_trace(
    model: Model,
    prompt: str,
    subject: str,
    target: str | None = None,
    kinds: Sequence[str] = KINDS,
    layers: Sequence[int] | None = None,
    window: int = 10,
    samples: int = 10,
    noise_std: float | None = None,
    noise_factor: float = 3.0,
    seed: int = 0,
) -> TraceSetup:
    """Clean run, noise draws and corrupted probability for :func:`causal_trace`.

    Args:
        target: The answer whose first token is scored (``None``: the clean run's top token).
        noise_std: ν; default ``noise_factor × std(W_E)``.
        samples: Number of noise draws (rows per cell).
        seed: Seed of the noise draws (fixed tensors, so every run sees the same noise).
    """
    for k in kinds:
        if k not in KIND_SITES:
            raise ValueError(f"Unknown kind {k!r}; choose from {', '.join(KINDS)}.")
    if samples < 1:
        raise ValueError("samples must be >= 1")
    layers = tuple(range(model.n_layers)) if layers is None else tuple(int(l) for l in layers)
    bad = [l for l in layers if not 0 <= l < model.n_layers]
    if bad:
        raise ValueError(f"Layers {bad} out of range for {model.name} ({model.n_layers} layers).")
    tokens = model.to_tokens(prompt)
    span = subject_span(model, prompt, subject)
    names = sorted({get_site(KIND_SITES[k]).hook_name(l) for k in kinds for l in range(model.n_layers)})
    logits, clean = model.run_with_cache(tokens, names)
    probs = logits[0, -1].float().softmax(-1)
    if target is None:
        tid = int(probs.argmax())
        target = model.to_str_tokens([tid])[0]
    else:
        tid = model.target_ids(prompt, target)[0]
    nu = float(noise_std) if noise_std is not None else embedding_noise_std(model, noise_factor)
    g = torch.Generator(device="cpu").manual_seed(seed)
    noise = (torch.randn(samples, span[1] - span[0], model.d_model, generator=g) * nu).to(model.device)
    setup = TraceSetup(
        model=model, prompt=prompt, subject=subject, target=target, tokens=tokens, subject_range=span,
        target_id=tid, noise=noise, noise_std=nu, seed=seed, kinds=tuple(kinds), layers=layers,
        window=window, clean=clean, clean_prob=float(probs[tid]),
    )
    setup.corrupted_prob = setup.restored_prob([])
    return setup


# ---------------------------------------------------------------------------- result
@dataclass(frozen=True)
class CausalTrace(Result):
    """Scores of one causal trace: probability of the target with each cell restored.

    Attributes:
        scores: ``[kind, token, layer]`` restored probabilities (mean over noise samples).
        clean_prob / corrupted_prob: Target probability in the clean / corrupted run.
        kinds, layers: The axes of ``scores`` (``layers`` may be a subset of the model's).
        tokens: The prompt's tokens as strings; ``subject_range`` is ``[start, end)``.
    """

    scores: Tensor
    clean_prob: float
    corrupted_prob: float
    prompt: str = ""
    subject: str = ""
    target: str = ""
    target_id: int = -1
    tokens: tuple = ()
    subject_range: tuple = (0, 0)
    kinds: tuple = KINDS
    layers: tuple = ()
    window: int = 10
    samples: int = 10
    noise_std: float = 0.0
    seed: int = 0
    seconds: float = 0.0

    @property
    def indirect_effect(self) -> Float[Tensor, "kind token layer"]:
        """Restored − corrupted probability for every cell."""
        return self.scores - self.corrupted_prob

    def score(self, kind: str) -> Float[Tensor, "token layer"]:
        return self.scores[self.kinds.index(kind)]

    def effect(self, kind: str) -> Float[Tensor, "token layer"]:
        return self.indirect_effect[self.kinds.index(kind)]

    def top_layers(self, k: int = 3, kind: str = "mlp", token: str | int = "last_subject") -> list[int]:
        """The ``k`` layers with the largest indirect effect (the "located layers").

        Args:
            kind: Which state (``"mlp"`` by default: ROME edits the MLP with the largest effect;
                falls back to the first traced kind when ``mlp`` was not traced).
            token: ``"last_subject"`` (ROME's choice), ``"max"`` (max over tokens) or an index.
        """
        if kind not in self.kinds:
            kind = self.kinds[0]
        eff = self.effect(kind)
        if token == "max":
            row = eff.max(0).values
        else:
            t = self.subject_range[1] - 1 if token == "last_subject" else int(token)
            row = eff[t]
        order = torch.argsort(row, descending=True, stable=True)[: min(k, len(self.layers))]
        return [int(self.layers[i]) for i in order]

    def to_frame(self) -> pd.DataFrame:
        """Long table: kind, token index, token, layer, score, indirect effect."""
        rows = []
        eff = self.indirect_effect
        for ki, kind in enumerate(self.kinds):
            for t, tok in enumerate(self.tokens):
                for li, l in enumerate(self.layers):
                    rows.append({"kind": kind, "token_idx": t, "token": tok, "layer": l,
                                 "score": float(self.scores[ki, t, li]), "effect": float(eff[ki, t, li])})
        return pd.DataFrame(rows)

    def figure(self, title: str | None = None):  # noqa: ANN201
        """ROME-style heatmaps (residual, MLP, attention), plotly."""
        from tlcap.viz.trace import trace_heatmap

        return trace_heatmap(self, title=title)

    def summary(self, top_k: int = 3) -> dict[str, Any]:
        """JSON-ready summary (the ``tlcap trace`` contract)."""
        all_kinds = {k: self.score(k).tolist() if k in self.kinds else None for k in KINDS}
        return {
            "prompt": self.prompt, "subject": self.subject, "target": self.target,
            "tokens": list(self.tokens), "subject_range": list(self.subject_range),
            "clean_prob": self.clean_prob, "corrupted_prob": self.corrupted_prob,
            "layers": list(self.layers), "kinds": list(self.kinds),
            "scores": all_kinds,
            "indirect_effects": {k: self.effect(k).tolist() for k in self.kinds},
            "top_layers": self.top_layers(top_k),
            "top_layers_by_kind": {k: self.top_layers(top_k, kind=k) for k in self.kinds},
            "window": self.window, "samples": self.samples, "noise_std": self.noise_std,
            "seed": self.seed, "seconds": self.seconds,
        }


def _result(setup: TraceSetup, scores: Tensor, seconds: float) -> CausalTrace:
    m = setup.model
    return CausalTrace(
        scores=scores, clean_prob=setup.clean_prob, corrupted_prob=setup.corrupted_prob,
        prompt=setup.prompt, subject=setup.subject, target=str(setup.target), target_id=setup.target_id,
        tokens=tuple(m.to_str_tokens(setup.tokens[0])), subject_range=tuple(setup.subject_range),
        kinds=setup.kinds, layers=setup.layers, window=setup.window, samples=setup.samples,
        noise_std=setup.noise_std, seed=setup.seed, seconds=seconds,
    )


# ---------------------------------------------------------------------------- tracing
@torch.no_grad()
def trace_batched(setup: TraceSetup, batch_rows: int = 256, prefix_reuse: bool = True, skip_pre_subject: bool = True, progress: bool = False) -> Float[Tensor, "kind token layer"]:
    """All cells of ``setup``, batched (see the module docstring); returns ``[kind, token, layer]``."""
    model = setup.model
    n, T = setup.samples, setup.n_tokens
    kinds, layers = setup.kinds, setup.layers
    s0 = setup.subject_range[0]
    scores = torch.full((len(kinds), T, len(layers)), float("nan"))
    cells = [(ki, li) for ki in range(len(kinds)) for li in range(len(layers))]
    k_max = max(1, batch_rows // n)
    todo = [t for t in range(T) if not (skip_pre_subject and t < s0)]
    for t in range(T):
        if t not in todo:
            scores[:, t, :] = setup.corrupted_prob
    bar = tqdm(total=len(todo) * len(cells), desc="causal trace", disable=not progress, unit="cell")
    for t in todo:
        offset = t if (prefix_reuse and t > 0) else 0
        prefix = None
        if offset:  # one cache row per noise sample; a batch of n*k rows repeats each k times
            with model.hooks(setup.noise_hooks(upto=t)):
                prefix = model.prefix_cache(setup.tokens[:, :t].expand(n, -1))
        run = setup.tokens[:, offset:]
        for c0 in range(0, len(cells), k_max):
            chunk = cells[c0 : c0 + k_max]
            k = len(chunk)
            per_hook: dict[str, list[int]] = {}
            for ci, (ki, li) in enumerate(chunk):
                kind = kinds[ki]
                for ll in setup.site_layers(kind, layers[li]):
                    per_hook.setdefault(setup.hook(kind, ll), []).append(ci)
            hooks = list(setup.noise_hooks(rows_per_sample=k, offset=offset))
            for name, cis in per_hook.items():
                ci_t = torch.tensor(cis, dtype=torch.long)
                rows = (torch.arange(n)[:, None] * k + ci_t[None, :]).reshape(-1)  # sample-major rows
                src = setup.clean[name][:, offset:]
                hooks.append((name, H.patch_rows(src, rows, t - offset)))
            logits = model.last_logits(run.expand(n * k, -1), hooks=hooks, prefix=prefix)
            p = setup._probs(logits).reshape(n, k).mean(0)
            for ci, (ki, li) in enumerate(chunk):
                scores[ki, t, li] = p[ci]
            bar.update(k)
    bar.close()
    return scores


@torch.no_grad()
def trace_cell(setup: TraceSetup, kind: str, token: int, layer: int) -> float:
    """One cell, the reference way: one forward of ``samples`` rows with ``patch`` hooks."""
    return setup.restored_prob([(kind, token, layer)])


def causal_trace(
    model: Model,
    prompt: str,
    subject: str,
    target: str | None = None,
    kinds: Sequence[str] = KINDS,
    layers: Sequence[int] | None = None,
    window: int = 10,
    samples: int = 10,
    noise_std: float | None = None,
    noise_factor: float = 3.0,
    seed: int = 0,
    batch_rows: int = 256,
    prefix_reuse: bool = True,
    progress: bool = False,
) -> CausalTrace:
    """Causal trace of one fact: restored probability for every (kind, token, layer).

    Args:
        model: The model.
        prompt: The fact's prompt, e.g. ``"The capital of France is"``.
        subject: The subject as written in the prompt (``"France"``); its tokens are noised.
        target: The answer (first token scored); ``None`` = the model's clean prediction.
        kinds: Any of ``"resid"``, ``"mlp"``, ``"attn"``.
        layers: Layers to trace (default all); windows still reach the layers around them.
        window: Window of layers restored for MLP/attention cells (ROME: 10).
        samples: Noise draws per cell (ROME: 10).
        noise_std: ν (default ``noise_factor × std(W_E)``, ROME's "s3").
        seed: Noise seed.
        batch_rows: Rows per forward pass (``samples`` rows per cell).
        prefix_reuse: Reuse the corrupted prefix's keys/values (exact).

    Returns:
        A :class:`CausalTrace`.

    Example:
        >>> tr = causal_trace(model, "The capital of France is", "France", " Paris", samples=10)
        >>> tr.top_layers(3)
    """
    t0 = time.perf_counter()
    setup = prepare_trace(model, prompt, subject, target, kinds, layers, window, samples, noise_std, noise_factor, seed)
    scores = trace_batched(setup, batch_rows=batch_rows, prefix_reuse=prefix_reuse, progress=progress)
    return _result(setup, scores, time.perf_counter() - t0)


def trace_reference(
    model: Model,
    prompt: str,
    subject: str,
    target: str | None = None,
    kinds: Sequence[str] = KINDS,
    layers: Sequence[int] | None = None,
    window: int = 10,
    samples: int = 10,
    noise_std: float | None = None,
    noise_factor: float = 3.0,
    seed: int = 0,
    tokens: Sequence[int] | None = None,
    progress: bool = False,
) -> CausalTrace:
    """The per-cell loop: one forward (``samples`` rows, full prompt) per (kind, token, layer).

    Same arguments as :func:`causal_trace`; ``tokens`` restricts the loop to some token
    positions (the other rows are NaN) — used by the benchmark to time a subset of cells.
    """
    t0 = time.perf_counter()
    setup = prepare_trace(model, prompt, subject, target, kinds, layers, window, samples, noise_std, noise_factor, seed)
    T = setup.n_tokens
    toks = range(T) if tokens is None else tokens
    scores = torch.full((len(setup.kinds), T, len(setup.layers)), float("nan"))
    bar = tqdm(total=len(toks) * len(setup.kinds) * len(setup.layers), desc="trace (per cell)", disable=not progress)
    for ki, kind in enumerate(setup.kinds):
        for t in toks:
            for li, l in enumerate(setup.layers):
                scores[ki, t, li] = trace_cell(setup, kind, t, l)
                bar.update(1)
    bar.close()
    return _result(setup, scores, time.perf_counter() - t0)


# ---------------------------------------------------------------------------- dataset mode
def token_classes(n_tokens: int, subject_range: tuple[int, int]) -> dict[str, list[int]]:
    """Token positions of each ROME token class for a prompt of ``n_tokens``.

    first / middle / last subject token, the first token after the subject, further tokens,
    and the last token. A one-token subject is both first and last subject token; a class the
    prompt does not have is empty (and left out of that class's average).
    """
    s0, s1 = subject_range
    last = n_tokens - 1
    return {
        "first subject": [s0],
        "middle subject": list(range(s0 + 1, s1 - 1)),
        "last subject": [s1 - 1],
        "first subsequent": [s1] if s1 < last else [],
        "further": list(range(s1 + 1, last)),
        "last": [last],
    }


@dataclass(frozen=True)
class DatasetTrace(Result):
    """Average indirect effect over facts, by token class (ROME Figure 2 style).

    Attributes:
        effects: ``[kind, class, layer]`` mean indirect effect (facts lacking a class skip it).
        counts: ``[class]`` number of facts contributing to each class.
        clean_prob / corrupted_prob: Means over facts.
        top_layers: Per fact, its top-k MLP layers (at the last subject token).
    """

    effects: Tensor
    counts: Tensor
    clean_prob: float
    corrupted_prob: float
    n_facts: int = 0
    kinds: tuple = KINDS
    layers: tuple = ()
    classes: tuple = TOKEN_CLASSES
    window: int = 10
    samples: int = 10
    noise_std: float = 0.0
    prompts: tuple = ()
    top_layers: tuple = ()
    seconds: float = 0.0

    def effect(self, kind: str) -> Float[Tensor, "cls layer"]:
        return self.effects[self.kinds.index(kind)]

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for ki, kind in enumerate(self.kinds):
            for ci, cls in enumerate(self.classes):
                for li, l in enumerate(self.layers):
                    rows.append({"kind": kind, "token_class": cls, "layer": l, "effect": float(self.effects[ki, ci, li]),
                                 "n_facts": int(self.counts[ci])})
        return pd.DataFrame(rows)

    def figure(self, title: str | None = None):  # noqa: ANN201
        """Average-indirect-effect heatmaps (class × layer) per kind."""
        from tlcap.viz.trace import average_effect_heatmap

        return average_effect_heatmap(self, title=title)

    def line_figure(self, token_class: str = "last subject"):  # noqa: ANN201
        from tlcap.viz.trace import average_effect_lines

        return average_effect_lines(self, token_class=token_class)

    def summary(self) -> dict[str, Any]:
        return {
            "n_facts": self.n_facts, "clean_prob": self.clean_prob, "corrupted_prob": self.corrupted_prob,
            "kinds": list(self.kinds), "layers": list(self.layers), "classes": list(self.classes),
            "counts": self.counts.tolist(),
            "average_effects": {k: self.effect(k).tolist() for k in self.kinds},
            "top_layers": [list(t) for t in self.top_layers], "seconds": self.seconds,
        }


def trace_dataset(
    model: Model,
    facts: Iterable[dict[str, Any]],
    kinds: Sequence[str] = KINDS,
    layers: Sequence[int] | None = None,
    window: int = 10,
    samples: int = 10,
    noise_std: float | None = None,
    noise_factor: float = 3.0,
    seed: int = 0,
    use_attribute: bool = False,
    top_k: int = 3,
    batch_rows: int = 256,
    progress: bool = False,
) -> DatasetTrace:
    """Average indirect effect over many facts, grouped by token class.

    Args:
        facts: Dicts with ``prompt`` and ``subject`` (and ``target``/``attribute``).
        use_attribute: Score the fact's ``target`` / `` attribute`` instead of the model's own
            prediction (ROME traces the model's prediction, the default here).
        noise_std: ν; default ``noise_factor × std(W_E)`` (one value for the whole dataset).

    Example:
        >>> ds = trace_dataset(model, load_known_facts(n=20), samples=5)
        >>> ds.figure().show()
    """
    t0 = time.perf_counter()
    facts = list(facts)
    if not facts:
        raise EmptyDatasetError("trace_dataset got no facts.")
    nu = noise_std if noise_std is not None else embedding_noise_std(model, noise_factor)
    layers_t = tuple(range(model.n_layers)) if layers is None else tuple(layers)
    sums = torch.zeros(len(kinds), len(TOKEN_CLASSES), len(layers_t), dtype=torch.float64)
    counts = torch.zeros(len(TOKEN_CLASSES), dtype=torch.long)
    clean, corrupt, prompts, tops = [], [], [], []
    for i, f in enumerate(tqdm(facts, desc="trace dataset", disable=not progress)):
        target = None
        if use_attribute:
            target = f.get("target") or (" " + f["attribute"].strip() if f.get("attribute") else None)
        tr = causal_trace(model, f["prompt"], f["subject"], target, kinds, layers_t, window, samples, nu,
                          noise_factor, seed + i, batch_rows)
        eff = tr.indirect_effect.double()
        for ci, (cls, pos) in enumerate(token_classes(len(tr.tokens), tr.subject_range).items()):
            if pos:
                sums[:, ci] += eff[:, pos].mean(1)
                counts[ci] += 1
        clean.append(tr.clean_prob)
        corrupt.append(tr.corrupted_prob)
        prompts.append(f["prompt"])
        tops.append(tuple(tr.top_layers(top_k)))
    effects = (sums / counts.clamp(min=1)[None, :, None]).float()
    effects[:, counts == 0] = float("nan")
    return DatasetTrace(
        effects=effects, counts=counts, clean_prob=float(sum(clean) / len(clean)),
        corrupted_prob=float(sum(corrupt) / len(corrupt)), n_facts=len(facts), kinds=tuple(kinds), layers=layers_t,
        window=window, samples=samples, noise_std=float(nu), prompts=tuple(prompts), top_layers=tuple(tops),
        seconds=time.perf_counter() - t0,
    )


__all__ = [
    "KINDS", "TOKEN_CLASSES", "CausalTrace", "DatasetTrace", "SubjectNotFoundError", "TraceSetup",
    "causal_trace", "embedding_noise_std", "load_known_facts", "prepare_trace", "subject_span",
    "token_classes", "trace_batched", "trace_cell", "trace_dataset", "trace_reference", "window_layers",
]
