"""The activation index: the top-k activating contexts of every MLP neuron over a corpus, on disk.

One streamed pass over a corpus (default: the bundled WikiText-2 test split) records, for every
neuron of every layer, its ``k`` largest activations, where they occur, and the neuron's activation
on the tokens around each of them (``window`` tokens, for the shaded snippets of a neuron card),
plus running statistics (mean, standard deviation, share of tokens with activation > 0, maximum).

- **Contexts.** The corpus is tokenized once and cut into consecutive contexts of ``context``
  tokens (default 256); each is run as its own sequence. The first ``skip`` positions of every
  context (default 1: the attention sink, whose activations are outliers in most models) are
  context only: they are neither candidates nor counted in the statistics.
- **Exact and streamed.** Each batch of contexts is one forward pass stopped after the last MLP
  (the unembedding is never computed); per layer, the batch's top-k per neuron is merged with
  the running top-k (``torch.topk``), so memory is one batch of activations, whatever the corpus.
  The result equals a brute-force top-k over all recorded activations (tested).
- **Cached.** :func:`activation_index` stores the index as a result (safetensors + JSON) under
  ``$TLCAP_CACHE/activation_index/<model>-<key>``, the key hashing the weights' identity and the
  corpus settings, and reuses it: a card then opens without touching the corpus.
- **Cost.** One forward pass per token (about 0.2 GFLOP per token for SmolLM2-135M): see
  ``benchmarks/bench_activation_index.py`` for the measured time and ``docs/explore.md``.

Example (2,000 tokens of WikiText-2; ``cache`` defaults to ``$TLCAP_CACHE``):

    >>> import tempfile
    >>> idx = activation_index(model, max_tokens=2_000, cache=tempfile.mkdtemp())  # built once, then loaded
    >>> snips = idx.snippets(layer=1, neuron=17)     # [(value, tokens, window activations, mark), ...]
    >>> len(snips), [type(x).__name__ for x in snips[0]]     # the neuron's k=16 top contexts
    (16, ['float', 'list', 'list', 'int'])
    >>> value, tokens, acts, mark = snips[0]
    >>> round(value, 3), round(acts[mark], 3)        # the mark is the activating token of the window
    (0.287, 0.287)
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.config import check_int
from tlcap.data.wikitext import load_wikitext
from tlcap.errors import ResultTypeError
from tlcap.models.adapter import Model
from tlcap.models.paths import cache_dir, model_fingerprint
from tlcap.provenance import Provenance, model_identity
from tlcap.results import Result, load_result
from tlcap.rows import frame
from tlcap.viz.html import summary_html

BEFORE, AFTER = 12, 3  # snippet window: tokens before and after the activating one


@dataclass(frozen=True)
class IndexRow:
    """Per-neuron statistics (one row of :meth:`ActivationIndex.to_frame`)."""

    layer: int
    neuron: int
    mean: float
    std: float
    frac_active: float
    max: float


@dataclass(frozen=True)
class ActivationIndex(Result):
    """Top-k activations of every MLP neuron over a corpus (module docstring).

    Attributes:
        values: ``[layer, d_mlp, k]`` the largest activations, descending.
        positions: ``[layer, d_mlp, k]`` their token positions in :attr:`tokens` (-1: fewer than k).
        windows: ``[layer, d_mlp, k, window]`` the neuron's activation on the snippet's tokens
            (``BEFORE`` tokens before the activating one, itself, ``AFTER`` after; NaN outside
            the context), stored as float16 (shading only; :attr:`values` are float32).
        tokens: ``[n_tokens]`` the corpus' token ids, contexts one after another.
        mean, std, frac_active: ``[layer, d_mlp]`` statistics over every counted token.
        corpus: The corpus' name; ``context``, ``skip``: the contexts it was cut into.
        n_counted: Tokens counted (all but the ``skip`` first of each context).
        seconds: Time of the pass.
        dtype: The model's parameter dtype during the pass.
    """

    values: Float[Tensor, "layer d_mlp k"]
    positions: Int[Tensor, "layer d_mlp k"]
    windows: Float[Tensor, "layer d_mlp k window"]
    tokens: Int[Tensor, " n_tokens"]
    mean: Float[Tensor, "layer d_mlp"]
    std: Float[Tensor, "layer d_mlp"]
    frac_active: Float[Tensor, "layer d_mlp"]
    corpus: str = "wikitext2-test"
    context: int = 256
    skip: int = 1
    n_counted: int = 0
    seconds: float = 0.0
    dtype: str = "float32"
    model_name: str = ""

    @property
    def k(self) -> int:
        return int(self.values.shape[-1])

    def snippet_tokens(self, position: int) -> tuple[int, int]:
        """``[start, end)`` token range of the snippet around ``position`` (cut at its context's start).

        Args:
            position: A token position in the indexed corpus.

        Returns:
            ``(start, end)`` token positions of the snippet.
        """
        ctx_start = position - position % self.context
        return max(ctx_start, position - BEFORE), min(ctx_start + self.context, position + AFTER + 1)

    def snippets(self, layer: int, neuron: int) -> list[tuple[float, list[int], list[float], int]]:
        """``(activation, token ids, activations on them, index of the activating token)`` per top context.

        Args:
            layer: The neuron's layer.
            neuron: Its index in the layer.

        Returns:
            One tuple per kept context, strongest first.
        """
        out = []
        for v, p, win in zip(self.values[layer, neuron].tolist(), self.positions[layer, neuron].tolist(),
                             self.windows[layer, neuron]):
            if p < 0:
                continue
            a, b = self.snippet_tokens(p)
            lo = BEFORE - (p - a)
            out.append((v, self.tokens[a:b].tolist(), win[lo:lo + (b - a)].tolist(), p - a))
        return out

    def stats(self, layer: int, neuron: int) -> dict[str, float]:
        """Mean, std, share of tokens with activation > 0 and the maximum of one neuron.

        Args:
            layer: The neuron's layer.
            neuron: Its index in the layer.

        Returns:
            ``{"mean", "std", "frac_active", "max"}``.
        """
        return {"mean": float(self.mean[layer, neuron]), "std": float(self.std[layer, neuron]),
                "frac_active": float(self.frac_active[layer, neuron]), "max": float(self.values[layer, neuron, 0])}

    def summary(self) -> dict[str, Any]:
        """Corpus, size, settings and time of the pass.

        Returns:
            A JSON-ready dict.
        """
        return {"model": self.model_name, "corpus": self.corpus, "n_tokens": int(self.tokens.numel()),
                "n_counted": self.n_counted, "context": self.context, "skip": self.skip, "k": self.k,
                "n_layers": int(self.values.shape[0]), "d_mlp": int(self.values.shape[1]), "seconds": self.seconds,
                "dtype": self.dtype}

    def to_frame(self) -> pd.DataFrame:
        """One :class:`IndexRow` per neuron.

        Returns:
            A DataFrame with the fields of :class:`IndexRow` as columns.
        """
        L, D = self.mean.shape
        rows = [IndexRow(l, j, float(self.mean[l, j]), float(self.std[l, j]), float(self.frac_active[l, j]),
                         float(self.values[l, j, 0])) for l in range(L) for j in range(D)]
        return frame(rows, IndexRow)

    def figure(self) -> go.Figure:
        """Each neuron's maximum activation over the corpus (layer × neuron).

        Returns:
            A plotly ``Figure``.
        """
        from_viz = self.values[..., 0]
        fig = go.Figure(go.Heatmap(z=from_viz.numpy(), colorscale="Viridis", colorbar=dict(title="max act"),
                                   hovertemplate="layer %{y}<br>neuron %{x}<br>max %{z:.3g}<extra></extra>"))
        fig.update_layout(title=f"Max activation over {self.corpus} ({self.tokens.numel()} tokens)",
                          xaxis_title="neuron", yaxis_title="layer", template="plotly_white")
        return fig

    def _repr_html_(self) -> str:
        return summary_html("ActivationIndex", self.summary())


def corpus_tokens(model: Model, corpus: str = "wikitext2-test", max_tokens: int | None = None) -> list[int]:
    """Token ids of a corpus: ``"wikitext2-test"`` (the bundled raw test split, one line per row) or a text.

    Args:
        model: The model (its tokenizer).
        corpus: ``"wikitext2-test"`` or the text itself.
        max_tokens: Keep the first ``max_tokens`` ids; ``None`` = all.

    Returns:
        The token ids (no context-length check).
    """
    text = "\n".join(load_wikitext(min_chars=1, include_headings=True)) if corpus == "wikitext2-test" else corpus
    ids = model.encode(text, check_length=False)
    return ids[:max_tokens] if max_tokens is not None else ids


def _windows(acts: Tensor, b: Tensor, t: Tensor, cols: Tensor) -> Tensor:
    """Activations of neuron ``cols[...]`` on the window around token ``t`` of context ``b`` (NaN outside)."""
    T = acts.shape[1]
    tt = t[..., None] + torch.arange(-BEFORE, AFTER + 1)
    w = acts[b[..., None], tt.clamp(0, T - 1), cols[..., None]]
    return w.masked_fill((tt < 0) | (tt >= T), float("nan"))


def _merge(best_v: Tensor, best_p: Tensor, best_w: Tensor, acts: Tensor, pos0: Tensor, k: int,
           valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Merge one batch of one layer (``acts [B, T, D]``) into the running top-k ``[D, k]`` (+ windows).

    Once a neuron holds ``k`` entries, only activations above its ``k``-th can enter; after the first
    batches these are few, so they are gathered and merged for the neurons they hit (the sparse path:
    the same top-k values, an order of magnitude less work per batch than a top-k over every token).
    """
    B, T, D = acts.shape
    if best_v.shape[1] >= k:
        hit = acts > best_v[:, k - 1]  # [B, T, D]
        hit &= valid[..., None]
        n_hit = int(hit.sum())
        if n_hit == 0:
            return best_v, best_p, best_w
        if n_hit * 8 < hit.numel():
            return _merge_sparse(best_v, best_p, best_w, acts, pos0, k, hit)
    flat = acts.masked_fill(~valid[..., None], float("-inf")).reshape(B * T, D)
    kk = min(k, B * T)
    v, i = flat.T.contiguous().topk(kk, dim=1)  # [D, kk] (a contiguous last dimension: the fast top-k)
    b, t = i // T, i % T
    w = _windows(acts, b, t, torch.arange(D)[:, None].expand_as(b))  # [D, kk, W]
    v_all = torch.cat([best_v, v], 1)
    p_all = torch.cat([best_p, pos0[b] + t], 1)
    w_all = torch.cat([best_w, w], 1)
    top_v, j = v_all.topk(k, dim=1)
    return top_v, p_all.gather(1, j), w_all.gather(1, j[..., None].expand(-1, -1, w_all.shape[-1]))


def _merge_sparse(best_v: Tensor, best_p: Tensor, best_w: Tensor, acts: Tensor, pos0: Tensor, k: int,
                  hit: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`_merge` of the activations ``hit`` marks (those above their neuron's ``k``-th), neuron by neuron."""
    b, t, cols = hit.nonzero(as_tuple=True)
    vals = acts[b, t, cols]
    order = vals.argsort(descending=True, stable=True)
    order = order[cols[order].argsort(stable=True)]  # by neuron, then value descending
    b, t, cols, vals = b[order], t[order], cols[order], vals[order]
    counts = torch.bincount(cols, minlength=best_v.shape[0])
    rank = torch.arange(cols.numel()) - (counts.cumsum(0) - counts)[cols]
    keep = rank < k  # at most k candidates per neuron can enter
    b, t, cols, vals, rank = b[keep], t[keep], cols[keep], vals[keep], rank[keep]
    aff = torch.unique(cols)
    row = torch.searchsorted(aff, cols)
    W = best_w.shape[-1]
    cand_v = torch.full((aff.numel(), k), float("-inf"))
    cand_p = torch.zeros((aff.numel(), k), dtype=best_p.dtype)
    cand_w = torch.full((aff.numel(), k, W), float("nan"))
    cand_v[row, rank] = vals
    cand_p[row, rank] = pos0[b] + t
    cand_w[row, rank] = _windows(acts, b, t, cols)
    v_all = torch.cat([best_v[aff], cand_v], 1)
    p_all = torch.cat([best_p[aff], cand_p], 1)
    w_all = torch.cat([best_w[aff], cand_w], 1)
    top_v, j = v_all.topk(k, dim=1)
    best_v, best_p, best_w = best_v.clone(), best_p.clone(), best_w.clone()
    best_v[aff] = top_v
    best_p[aff] = p_all.gather(1, j)
    best_w[aff] = w_all.gather(1, j[..., None].expand(-1, -1, W))
    return best_v, best_p, best_w


@torch.no_grad()
def build_activation_index(
    model: Model,
    tokens: Sequence[int],
    *,
    k: int = 16,
    context: int = 256,
    skip: int = 1,
    batch_contexts: int = 8,
    corpus: str = "wikitext2-test",
    progress: bool = True,
    on_batch: Callable[[int, int], None] | None = None,
) -> ActivationIndex:
    """Stream ``tokens`` through ``model`` in contexts and keep every neuron's top-k (module docstring).

    Args:
        model: The model.
        tokens: The corpus' token ids (:func:`corpus_tokens`).
        k: Contexts kept per neuron.
        context: Tokens per context (at most the model's context window).
        skip: First positions of each context that are context only.
        batch_contexts: Contexts per forward pass.
        corpus: The corpus' name (recorded).
        progress: Progress bar.
        on_batch: Called with ``(tokens done, tokens total)`` after each batch.

    Returns:
        The :class:`ActivationIndex` (not cached; :func:`activation_index` caches).
    """
    k = check_int("k", k, min=1, cli="--k")
    context = check_int("context", context, min=skip + 1, max=model.n_ctx, cli="--context")
    ids = torch.tensor(list(tokens), dtype=torch.long)
    n_ctx = ids.numel() // context
    ids = ids[: n_ctx * context]
    L, D, W = model.n_layers, model.d_mlp, BEFORE + AFTER + 1
    best_v = torch.full((L, D, 0), float("-inf"))
    best_p = torch.zeros((L, D, 0), dtype=torch.long)
    best_w = torch.zeros((L, D, 0, W))
    s1, s2, pos = torch.zeros(L, D, dtype=torch.float64), torch.zeros(L, D, dtype=torch.float64), torch.zeros(L, D)
    names = [model.hook_name("mlp_post", l) for l in range(L)]
    valid_row = torch.arange(context) >= skip
    t0 = time.perf_counter()
    bar = tqdm(total=n_ctx * context, unit="tok", desc="activation index", disable=not progress)
    for c0 in range(0, n_ctx, batch_contexts):
        batch = ids[c0 * context:(c0 + batch_contexts) * context].view(-1, context).to(model.device)
        rec = model.record(batch, names)
        pos0 = torch.arange(c0, c0 + batch.shape[0]) * context
        valid = valid_row.expand(batch.shape[0], -1)
        parts = [], [], []
        for l, name in enumerate(names):
            acts = rec.pop(name).float().cpu()
            flat, head = acts.view(-1, D), acts[:, :skip].reshape(-1, D)  # column sums of every token, less the skipped
            s1[l] += flat.sum(0).double() - head.sum(0).double()
            s2[l] += (flat * flat).sum(0).double() - (head * head).sum(0).double()
            pos[l] += (flat > 0).sum(0) - (head > 0).sum(0)
            v, p, w = _merge(best_v[l], best_p[l], best_w[l], acts, pos0, k, valid)
            parts[0].append(v), parts[1].append(p), parts[2].append(w)
        best_v, best_p, best_w = (torch.stack(x) for x in parts)
        bar.update(batch.numel())
        if on_batch is not None:
            on_batch(min((c0 + batch_contexts) * context, ids.numel()), ids.numel())
    bar.close()
    empty = best_v == float("-inf")  # fewer counted tokens than k so far: no entry
    best_v, best_p = best_v.masked_fill(empty, float("nan")), best_p.masked_fill(empty, -1)
    n = max(n_ctx * (context - skip), 1)
    mean = s1 / n
    std = (s2 / n - mean.pow(2)).clamp_min(0).sqrt()
    if best_v.shape[-1] < k:  # a corpus with fewer counted tokens than k
        pad = k - best_v.shape[-1]
        best_v = torch.cat([best_v, torch.full((L, D, pad), float("nan"))], -1)
        best_p = torch.cat([best_p, torch.full((L, D, pad), -1)], -1)
        best_w = torch.cat([best_w, torch.full((L, D, pad, W), float("nan"))], -2)
    res = ActivationIndex(
        values=best_v.float(), positions=best_p, windows=best_w.half(), tokens=ids, mean=mean.float(), std=std.float(),
        frac_active=(pos / n).float(), corpus=corpus, context=context, skip=skip, n_counted=n_ctx * (context - skip),
        seconds=time.perf_counter() - t0, dtype=str(model.dtype).replace("torch.", ""), model_name=model.name,
    )
    return res.with_provenance(Provenance.collect(model))


def index_path(model: Model, corpus: str, max_tokens: int | None, k: int, context: int, skip: int,
               root: str | Path | None = None) -> Path:
    """Where :func:`activation_index` caches the index of these settings (keyed by the weights' identity).

    Args:
        model: The model (its weights' identity, else fingerprint, and name).
        corpus: ``"wikitext2-test"`` or a text (keyed by its hash).
        max_tokens: Corpus tokens indexed (``None``: all).
        k: Contexts kept per neuron.
        context: Tokens per context.
        skip: First positions of each context that are context only (not indexed).
        root: The cache root (default :func:`~tlcap.models.paths.cache_dir`).

    Returns:
        ``root / "activation_index" / "<model name>-<key>"`` (it may not exist yet).
    """
    ident = model_identity(model) or model_fingerprint(model)
    corpus_key = corpus if corpus == "wikitext2-test" else hashlib.sha1(corpus.encode()).hexdigest()[:12]
    key = hashlib.sha1(f"{ident}|{corpus_key}|{max_tokens}|{k}|{context}|{skip}".encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model.name)
    return (Path(root) if root is not None else cache_dir()) / "activation_index" / f"{safe}-{key}"


def activation_index(
    model: Model,
    corpus: str = "wikitext2-test",
    *,
    max_tokens: int | None = None,
    k: int = 16,
    context: int = 256,
    skip: int = 1,
    build: bool = True,
    cache: str | Path | None = None,
    progress: bool = True,
    **kwargs: Any,
) -> ActivationIndex | None:
    """The cached activation index of ``model`` on ``corpus``, built (once) when missing.

    Args:
        model: The model.
        corpus: ``"wikitext2-test"`` (bundled) or a text to index.
        max_tokens: Index only the first ``max_tokens`` tokens (``None``: the whole corpus).
        k, context, skip: See :func:`build_activation_index`.
        build: Build when not cached (``False``: return ``None`` instead).
        cache: Cache root (default ``$TLCAP_CACHE``).
        progress: Progress bar while building.
        **kwargs: Passed to :func:`build_activation_index` (``batch_contexts``...).

    Returns:
        The :class:`ActivationIndex`, or ``None`` when it is not cached and ``build`` is false.
    """
    context = min(context, model.n_ctx)
    path = index_path(model, corpus, max_tokens, k, context, skip, cache)
    if (path / "result.json").exists():
        return load_index(path)
    if not build:
        return None
    idx = build_activation_index(model, corpus_tokens(model, corpus, max_tokens), k=k, context=context, skip=skip,
                                 corpus=corpus if corpus == "wikitext2-test" else "text", progress=progress, **kwargs)
    idx.save(path)
    return idx


_LOADED: dict[tuple[str, int], ActivationIndex] = {}


def load_index(path: str | Path) -> ActivationIndex:
    """Load a saved index, kept in memory per path and modification time (cards reopen instantly).

    Args:
        path: The folder a saved :class:`ActivationIndex` is in.

    Returns:
        The index (the cached object when the folder is unchanged since its last load).

    Raises:
        ResultTypeError: the folder holds another kind of result.
    """
    p = Path(path)
    key = (str(p.resolve()), (p / "result.json").stat().st_mtime_ns)
    if key not in _LOADED:
        idx = load_result(p)
        if not isinstance(idx, ActivationIndex):
            raise ResultTypeError(f"{p} holds a {type(idx).__name__}, not an ActivationIndex")
        _LOADED.clear()
        _LOADED[key] = idx
    return _LOADED[key]


__all__ = ["ActivationIndex", "IndexRow", "activation_index", "build_activation_index", "corpus_tokens", "index_path",
           "load_index", "BEFORE", "AFTER"]
