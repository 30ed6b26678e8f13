"""Rows of many different contexts in one batch: padded prefix caches and per-row continuations.

Exact integrated gradients scales only the last position, so a row needs the keys/values of its
context's prefix and recomputes one token. To put rows of *different* samples (prompts of
different lengths) in one forward pass, :meth:`RowsMixin.padded_prefix` caches the prefixes of
``G`` contexts right-padded to the longest one, and :meth:`RowsMixin.continue_rows` runs each
context's last token after its own prefix:

- the last token of context ``g`` sits at its true position ``len(prefix_g)`` (explicit position
  ids), and the padded keys between are masked out, so every row sees exactly its own context;
- context ``g`` is repeated ``counts[g]`` times (``repeat_interleave``: rows of a context are
  consecutive); with ``expand_at = e`` it runs as one row through layers ``< e`` and is
  repeated from the ``resid_pre`` site of layer ``e`` on (rows that differ only from layer
  ``e`` on share the lower layers, as ``Model.logits(expand_at=...)`` does for one context).

TransformerBridge backends only (the attention mask and position embeddings the backend hands
to each attention layer are repeated with the rows, which needs the bridge's module layout).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import TlcapError
from tlcap.models.cache import fresh_cache, full_cache
from tlcap.models.packed_rows import attention_windows, continue_packed, packable
from tlcap.models.packed_rows import position_major_names as _position_major_names
from tlcap.models.staged_rows import Staging
from tlcap.models.staged_rows import continue_staged as _continue_staged
from tlcap.runtime import hooks as H
from tlcap.runtime.hooks import HookList
from tlcap.runtime.sites import get_site

_REPEATED_KWARGS = ("attention_mask", "position_embeddings", "position_ids")


@dataclass(frozen=True)
class PaddedPrefix:
    """Keys/values of ``rows`` token prefixes of different lengths, right-padded to ``n_tokens``.

    Attributes:
        cache: The backend's cache of the padded ``[rows, n_tokens]`` prefix batch (``None`` when
            every prefix is empty).
        lengths: Real length of each prefix.
        n_tokens: The padded length (the longest prefix).
    """

    cache: Any
    lengths: tuple[int, ...]
    n_tokens: int

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def select(self, rows: Sequence[int], lengths: Sequence[int]) -> PaddedPrefix:
        """A prefix of the given rows, each seeing only its first ``lengths[i]`` positions (keys copied).

        Positions of a row beyond its new length are masked out like padding, so the rows of one cached
        run serve each of its prefixes (the answer tokens of one sample).

        Args:
            rows: Rows of this prefix to keep, in the new order.
            lengths: New real length of each kept row.

        Returns:
            The new :class:`PaddedPrefix` (same ``n_tokens``; no cache when this one has none).
        """
        if self.cache is None:
            return PaddedPrefix(None, tuple(0 for _ in rows), 0)
        idx = torch.as_tensor(list(rows), dtype=torch.long).to(self.cache.layers[0].keys.device)
        out = fresh_cache(self.cache, idx)
        return PaddedPrefix(out, tuple(int(n) for n in lengths), self.n_tokens)


def concat_prefixes(prefixes: Sequence[PaddedPrefix]) -> PaddedPrefix:
    """The rows of several prefixes as one, right-padded to the longest (keys/values copied).

    Row ``i`` of ``prefixes[k]`` becomes row ``sum(p.rows for p in prefixes[:k]) + i``; its keys, values and
    length are unchanged (the padding is zeros, masked out like any padding).

    Args:
        prefixes: Prefixes of one model (:meth:`RowsMixin.stack_prefixes`, :meth:`RowsMixin.padded_prefix`).

    Returns:
        One :class:`PaddedPrefix` with every row (the one prefix itself when given one).

    Example:
        >>> a, b = model.padded_prefix([[464, 3139]]), model.padded_prefix([[383, 3797, 3332], [40]])
        >>> both = concat_prefixes([a, b])
        >>> both.rows, both.lengths, both.n_tokens
        (3, (2, 3, 1), 3)
        >>> torch.equal(both.cache.layers[0].keys[1:], b.cache.layers[0].keys)
        True
        >>> torch.equal(both.cache.layers[0].keys[0, :, :2], a.cache.layers[0].keys[0])
        True
    """
    if len(prefixes) == 1:
        return prefixes[0]
    lengths = tuple(n for p in prefixes for n in p.lengths)
    if all(p.cache is None for p in prefixes):
        return PaddedPrefix(None, lengths, 0)
    return _pad_caches([(p.cache, p.rows, p.n_tokens) for p in prefixes], lengths)


def _pad_caches(parts: Sequence[tuple[Any, int, int]], lengths: Sequence[int]) -> PaddedPrefix:
    """One :class:`PaddedPrefix` from the first ``rows`` rows and ``n`` positions of each ``(cache, rows, n)``, in order.

    Keys/values are copied into a fresh cache right-padded with zeros to the longest ``n`` (masked out like any
    padding); a part without a cache (``None``) or with ``n = 0`` gives rows of zeros. Layers without keys are left as
    they are.

    Args:
        parts: ``(cache or None, rows, n positions)`` per part; at least one has a cache and ``n > 0``.
        lengths: The real length of every row of the result (``sum(rows)`` of them).

    Returns:
        The :class:`PaddedPrefix` (its ``n_tokens`` the longest ``n``).
    """
    big = max(n for c, _, n in parts if c is not None)
    cached = [c for c, _, n in parts if c is not None]
    out = fresh_cache(next((c for c, _, n in parts if c is not None and n > 0), cached[0]))  # keys/values replaced below
    total = sum(r for _, r, _ in parts)
    for i, layer in enumerate(out.layers):
        if getattr(layer, "keys", None) is None or not layer.keys.numel():
            continue
        k0 = layer.keys
        keys = k0.new_zeros(total, k0.shape[1], big, k0.shape[3])
        values = keys.clone()
        r = 0
        for c, rows, n in parts:
            if c is not None and n:
                src = c.layers[i]
                keys[r:r + rows, :, :n] = src.keys[:rows, :, :n]
                values[r:r + rows, :, :n] = src.values[:rows, :, :n]
            r += rows
        layer.keys, layer.values = keys, values
    return PaddedPrefix(out, tuple(int(n) for n in lengths), big)


def _repeat(x: Any, counts: Tensor, rows: int) -> Any:
    if isinstance(x, Tensor) and x.ndim >= 1 and x.shape[0] == rows and rows != int(counts.sum()):
        return x.repeat_interleave(counts.to(x.device), 0)
    if isinstance(x, tuple):
        return tuple(_repeat(y, counts, rows) for y in x)
    return x


class RowsMixin:
    """:meth:`padded_prefix` and :meth:`continue_rows` (mixed into :class:`tlcap.models.Model`)."""

    backend: Any
    is_bridge: bool
    n_layers: int
    _cut_name: str | None
    device: torch.device
    pad_token_id: int
    hooks: Callable[..., contextlib.AbstractContextManager[Any]]

    packed_rows: bool = True
    """Run the rows of a context as its query positions (:mod:`tlcap.models.packed_rows`; exact, off only to compare)."""

    @functools.cached_property
    def position_major_names(self) -> frozenset[str]:
        """Hook names whose activations are ``batch pos ...`` (neurons, residual-stream sites)."""
        return _position_major_names(self.n_layers)

    @property
    def continues_rows(self) -> bool:
        """Whether rows can continue after cached prefixes (:meth:`continue_rows`, staged and packed rows): the
        fast paths of IG, AMIG and causal tracing; the TL 4.x bridge can, TL 3.9's ``HookedTransformer`` cannot."""
        return bool(self.is_bridge)

    @property
    def attention_windows(self) -> list[int | None]:
        """Each layer's sliding attention window (``None``: full causal attention)."""
        return attention_windows(self.hf_model.config, self.n_layers)

    def _check_rows_backend(self) -> None:
        if not self.is_bridge:
            raise TlcapError("Rows of several contexts in one batch need a TransformerBridge backend; "
                             "score one sample at a time (sample_batch=1) on this model.")

    def padded_prefix(self, prefixes: Sequence[Sequence[int]]) -> PaddedPrefix:
        """Cache the keys/values of several prefixes at once (right-padded, module docstring).

        Args:
            prefixes: Token ids of each prefix (lengths may differ; empty prefixes are allowed).

        Returns:
            The :class:`PaddedPrefix` (padding sits after each prefix: it never changes a real
            position, attention being causal).

        Raises:
            TlcapError: the backend is not a TransformerBridge.
        """
        self._check_rows_backend()
        lengths = tuple(len(p) for p in prefixes)
        n = max(lengths) if lengths else 0
        if n == 0:
            return PaddedPrefix(None, lengths, 0)
        pad = self.pad_token_id
        toks = torch.tensor([list(p) + [pad] * (n - len(p)) for p in prefixes], device=self.device)
        cut = [(self._cut_name, H.last_position_only())] if self._cut_name else []  # logits are discarded
        with torch.no_grad(), self.hooks(fwd=cut):
            _, cache = self.backend(toks, return_type="logits_and_cache", past_key_values=full_cache())
        return PaddedPrefix(cache, lengths, n)

    def logits_at(
        self, tokens: Any, positions: Int[Tensor, "rows k"], hooks: HookList = (), prefix: Any = None
    ) -> Float[Tensor, "rows k d_vocab"]:
        """Logits at ``k`` chosen positions of each row: ``logits(tokens)[r, positions[r]]``.

        The unembedding runs on those positions only (a shape-changing hook at the cut site, as
        :meth:`last_logits` does for one position), e.g. the answer positions of teacher-forced
        rows of different lengths (right-padded :class:`TokenBatch`; repeat a row's last position
        to fill its ``k``).

        Args:
            tokens: Token ids or a right-padded :class:`TokenBatch` (after ``prefix`` when given).
            positions: ``[rows, k]`` positions within ``tokens``.
            hooks: Forward hooks for this call.
            prefix: A :class:`~tlcap.models.cache.PrefixCache` the tokens continue.

        Returns:
            ``[rows, k, d_vocab]`` logits.
        """
        if self._cut_name is None:
            out = self.logits(tokens, hooks=hooks, prefix=prefix)  # type: ignore[attr-defined]
            return out[torch.arange(out.shape[0], device=out.device)[:, None], positions.to(out.device)]
        fwd = [*hooks, (self._cut_name, H.gather_positions(positions))]
        return self._run(tokens, fwd, prefix, None, None)  # type: ignore[attr-defined]

    def context_run(
        self, tokens: Sequence[int], hook_names: Sequence[str]
    ) -> tuple[Float[Tensor, "pos n_hooks d"], Float[Tensor, "pos d_vocab"], Any]:
        """One forward of ``tokens``: the named states and logits at every position, and the cache.

        The cache's first ``n`` positions are the prefix cache of ``tokens[:n]`` for every ``n``
        (attention is causal), so one run serves every teacher-forced position of a sample
        (:meth:`stack_prefixes`).

        Args:
            tokens: Token ids of one sequence.
            hook_names: Hook points recorded.

        Returns:
            ``[pos, n_hooks, d]`` states, ``[pos, d_vocab]`` logits and the backend's cache of the run.

        Raises:
            TlcapError: the backend is not a TransformerBridge.
        """
        acts, _, logits, cache = self.context_states(tokens, hook_names, ())
        return acts, logits, cache

    def context_states(
        self, tokens: Sequence[int], hook_names: Sequence[str], state_names: Sequence[str], logits_from: int = 0
    ) -> tuple[Float[Tensor, "pos n_hooks d"], Float[Tensor, "pos n_states d_state"] | None, Float[Tensor, "lpos d_vocab"], Any]:
        """:meth:`context_run` that also records ``state_names`` (e.g. the residual stream at the
        ``resid_pre`` sites, where :meth:`continue_staged` pieces join; ``None`` when there are none) and
        unembeds only the positions from ``logits_from`` on (the logits' row ``i`` is position
        ``logits_from + i``).

        Args:
            tokens: Token ids of one sequence.
            hook_names: Hook points recorded.
            state_names: Further hook points stacked separately (e.g. ``resid_pre`` sites).
            logits_from: First position whose logits are computed.

        Returns:
            ``[pos, n_hooks, d]`` states, ``[pos, n_states, d_state]`` states or None, the logits and the cache.
        """
        self._check_rows_backend()
        store: dict[str, Tensor] = {}
        toks = torch.tensor([list(tokens)], device=self.device)
        names = list(dict.fromkeys([*hook_names, *state_names]))
        fwd = [(n, H.record(store, n)) for n in names]
        if logits_from > 0 and self._cut_name is not None:  # the unembedding is the largest matrix: skip unread rows
            fwd.append((self._cut_name, lambda act, hook=None: act[:, logits_from:]))
        with torch.no_grad(), self.hooks(fwd=fwd):
            logits, cache = self.backend(toks, return_type="logits_and_cache", past_key_values=full_cache())
        logits = logits[0] if logits_from == 0 or self._cut_name is not None else logits[0, logits_from:]
        dev = logits.device  # layers may sit on different devices: the records meet on the output's
        states = torch.stack([store[n][0].to(dev) for n in state_names], 1) if state_names else None
        return torch.stack([store[n][0].to(dev) for n in hook_names], 1), states, logits, cache

    def context_states_many(
        self, seqs: Sequence[Sequence[int]], hook_names: Sequence[str], state_names: Sequence[str],
        logits_from: Sequence[int],
    ) -> tuple[list[tuple[Tensor, Tensor | None, Tensor]], PaddedPrefix]:
        """:meth:`context_states` of several sequences in one right-padded forward pass.

        Right padding never changes a real position (attention is causal), so each sequence's states and
        logits are its own run's (up to float rounding), and the run's cache is at once the
        :class:`PaddedPrefix` of every sequence (row ``i``: sequence ``i``, its real length; padding is masked
        out by the callers). Only the positions ``logits_from[i]`` to the end of each sequence are unembedded.

        Args:
            seqs: Token ids of each sequence (non-empty).
            hook_names: Hook points recorded (stacked per sequence as ``[pos, n_hooks, d]``).
            state_names: Further hook points stacked separately (``[pos, n_states, d_state]``; none: ``None``).
            logits_from: Per sequence, the first position whose logits are returned.

        Returns:
            ``([(states, further states, logits), ...] per sequence, prefix)``: the logits' row ``j`` of
            sequence ``i`` is position ``logits_from[i] + j``.

        Raises:
            TlcapError: the backend is not a TransformerBridge.

        Example:
            >>> per_seq, prefix = model.context_states_many([[464, 3139, 286], [40]], ["blocks.0.mlp.hook_post"], (),
            ...                                             logits_from=[1, 0])
            >>> a, _, lg = per_seq[0]
            >>> a.shape[:2], lg.shape[0], prefix.lengths
            (torch.Size([3, 1]), 2, (3, 1))
            >>> alone = model.context_states([464, 3139, 286], ["blocks.0.mlp.hook_post"], (), logits_from=1)
            >>> torch.allclose(a, alone[0], atol=1e-5) and torch.allclose(lg, alone[2], atol=1e-4)
            True
        """
        self._check_rows_backend()
        lengths = [len(q) for q in seqs]
        n, pad = max(lengths), self.pad_token_id
        toks = torch.tensor([list(q) + [pad] * (n - len(q)) for q in seqs], device=self.device)
        store: dict[str, Tensor] = {}
        names = list(dict.fromkeys([*hook_names, *state_names]))
        fwd: list = [(nm, H.record(store, nm)) for nm in names]
        flat = torch.tensor([r * n + p for r, q in enumerate(seqs) for p in range(int(logits_from[r]), len(q))],
                            dtype=torch.long)
        if self._cut_name is not None:  # unembed the read positions only: [positions, 1, d]
            fwd.append((self._cut_name,
                        lambda act, hook=None: act.reshape(-1, act.shape[-1]).index_select(0, flat.to(act.device))[:, None]))
        with torch.no_grad(), self.hooks(fwd=fwd):
            logits, cache = self.backend(toks, return_type="logits_and_cache", past_key_values=full_cache())
        logits = logits[:, 0] if self._cut_name is not None else logits.reshape(-1, logits.shape[-1])[flat.to(logits.device)]
        dev = logits.device  # layers may sit on different devices: the records meet on the output's
        out, k = [], 0
        for r, m in enumerate(lengths):
            acts = torch.stack([store[nm][r, :m].to(dev) for nm in hook_names], 1)
            states = torch.stack([store[nm][r, :m].to(dev) for nm in state_names], 1) if state_names else None
            j = m - int(logits_from[r])
            out.append((acts, states, logits[k:k + j]))
            k += j
        return out, PaddedPrefix(cache, tuple(lengths), n)

    def stack_prefixes(self, parts: Sequence[tuple[Any, int]]) -> PaddedPrefix:
        """A :class:`PaddedPrefix` of the first ``n`` positions of each ``(cache, n)`` (from :meth:`context_run`).

        The same keys/values :meth:`padded_prefix` would compute for those prefixes, without
        running them again; padding is zeros (masked out by :meth:`continue_rows`).

        Args:
            parts: ``(cache, n)`` pairs: a :meth:`context_run` cache and the prefix length taken from it.

        Returns:
            The prefixes right-padded to the longest (no cache when every ``n`` is 0).
        """
        self._check_rows_backend()
        lengths = tuple(int(n) for _, n in parts)
        if not lengths or max(lengths) == 0:
            return PaddedPrefix(None, lengths, 0)
        return _pad_caches([(c, 1, int(n)) for c, n in parts], lengths)

    @contextlib.contextmanager
    def _repeat_attention_inputs(self, counts: Tensor, rows: int, from_layer: int) -> Iterator[None]:
        """Repeat the mask / position inputs of attention layers ≥ ``from_layer`` with the rows."""

        def pre(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return args, {k: (_repeat(v, counts, rows) if k in _REPEATED_KWARGS else v) for k, v in kwargs.items()}

        handles = [self.backend.blocks[l].attn.register_forward_pre_hook(pre, with_kwargs=True)
                   for l in range(from_layer, self.n_layers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def staged_rows_apply(self, hooks: HookList = ()) -> bool:
        """Whether :meth:`continue_staged` can run these hooks (the conditions of packed rows).

        Args:
            hooks: The hooks of the call.

        Returns:
            True on a TransformerBridge when :func:`~tlcap.models.packed_rows.packable` holds for one new token.
        """
        return bool(self.is_bridge) and packable(self, hooks, 1)

    def continue_staged(
        self,
        prefix: PaddedPrefix,
        rows: Int[Tensor, " contexts"],
        lengths: Int[Tensor, " contexts"],
        last: Int[Tensor, " contexts"],
        staging: Staging,
        states: Float[Tensor, "pieces d_model"],
        hooks: HookList = (),
        normed: bool = False,
    ) -> Float[Tensor, "out_rows d_out"]:
        """Rows that join one forward pass at different layers (:mod:`tlcap.models.staged_rows`).

        Args:
            prefix: Cached prefix rows (:meth:`padded_prefix`, :meth:`stack_prefixes`).
            rows: The prefix row of each context.
            lengths: How many positions of its row each context sees.
            last: The token after each context's prefix.
            staging: The pieces: their context, join layer, real rows and width.
            states: The clean ``resid_pre`` of each piece's context at its join layer.
            hooks: Forward hooks on position-major sites, handed ``[active pieces, width, ...]``.
            normed: Return the states after the final norm instead of logits (the unembedding is skipped;
                :func:`tlcap.models.unembedding.target_probs` reads them out).

        Returns:
            Logits (with ``normed``: ``[rows, d_model]`` normalised states) of the real positions, piece-major
            (:meth:`Staging.keep`).

        Raises:
            TlcapError: the backend is not a TransformerBridge.
        """
        self._check_rows_backend()
        return _continue_staged(self, prefix, torch.as_tensor(rows, dtype=torch.long).cpu(),
                                torch.as_tensor(lengths, dtype=torch.long).cpu(), torch.as_tensor(last, dtype=torch.long).cpu(),
                                staging, states, hooks, normed=normed)

    def continue_rows(
        self,
        last_tokens: Sequence[int] | Sequence[Sequence[int]],
        prefix: PaddedPrefix,
        counts: Int[Tensor, " contexts"],
        hooks: HookList = (),
        expand_at: int | None = None,
    ) -> Float[Tensor, "rows d_vocab"]:
        """Next-token logits of ``counts[g]`` rows of each context ``prefix_g ⊕ last_tokens[g]``.

        Args:
            last_tokens: The token after each prefix (one per prefix row), or the same number of
                tokens after each prefix (lists; the logits are those after the last one).
            prefix: From :meth:`padded_prefix`.
            counts: Rows of each context (``0``: the context is left out of this batch).
            hooks: Forward hooks; activations have ``sum(counts)`` rows (from layer ``expand_at``
                on when given, else everywhere), context-major.
            expand_at: Run one row per context below this layer, repeat from its ``resid_pre``.

        Returns:
            ``[sum(counts), d_vocab]`` logits.

        Raises:
            TlcapError: the backend is not a TransformerBridge, or the sizes disagree.
        """
        self._check_rows_backend()
        counts = torch.as_tensor(counts, dtype=torch.long).cpu()
        if len(last_tokens) != prefix.rows or counts.shape[0] != prefix.rows or bool((counts < 0).any()):
            raise TlcapError(f"continue_rows needs one last token and one count >= 0 per prefix row ({prefix.rows}).")
        if int(counts.sum()) == 0:
            return torch.empty(0, int(self.backend.cfg.d_vocab), device=self.device)
        sel = (counts > 0).nonzero().flatten()
        cs = counts[sel]
        g, b = int(sel.numel()), int(cs.sum())
        e = 0 if not expand_at else int(expand_at)
        dev = self.device
        lengths = torch.tensor(prefix.lengths, dtype=torch.long)[sel]
        toks = torch.tensor([list(t) if isinstance(t, Sequence) else [t] for t in last_tokens], dtype=torch.long)[sel]
        n, q = prefix.n_tokens, int(toks.shape[1])
        mask = (torch.arange(n + q)[None, :] < lengths[:, None]).long()
        mask[:, n:] = 1
        pos = lengths[:, None] + torch.arange(q)[None, :]
        past = None if prefix.cache is None else fresh_cache(prefix.cache, sel.to(dev))  # the contexts of this batch
        if packable(self, hooks, q):
            return continue_packed(self, toks[:, 0], past, lengths, n, cs, hooks, e)
        windows = [w for w in self.attention_windows if w is not None]
        if windows and n + q > min(windows) and bool((lengths != n).any()):
            # batch rows take the sliding window from the padded position, not the row's own
            raise TlcapError(f"Prefixes of unequal lengths padded to {n} tokens exceed {self.name}'s sliding attention "
                             f"window ({min(windows)}): run them with neuron/residual hooks only and one new token "
                             "(packed rows), or one context at a time.")
        if e == 0:  # every layer has all rows
            toks, mask, pos = (x.repeat_interleave(cs, 0) for x in (toks, mask, pos))
        if past is not None:  # each context's keys/values repeated with its rows from layer e on
            for layer in past.layers[e:]:
                if getattr(layer, "keys", None) is not None and layer.keys.numel():
                    cs_d = cs.to(layer.keys.device)  # each layer's cache sits on that layer's device
                    layer.keys, layer.values = layer.keys.repeat_interleave(cs_d, 0), layer.values.repeat_interleave(cs_d, 0)
        fwd = list(hooks)
        if self._cut_name is not None and q > 1:  # unembed the last position only
            fwd.append((self._cut_name, H.last_position_only()))
        if e > 0:
            fwd = [(get_site("resid_pre").hook_name(e), H.repeat_rows(cs)), *fwd]
        kw: dict[str, Any] = {"attention_mask": mask.to(dev), "position_ids": pos.to(dev)}
        if past is not None:
            kw["past_key_values"] = past
        with self._repeat_attention_inputs(cs, g, e), self.hooks(fwd=fwd):
            out = self.backend(toks.to(dev), **kw)
        if out.shape[0] != b:
            raise TlcapError(f"continue_rows produced {out.shape[0]} rows, expected {b}.")
        return out[:, -1]


__all__ = ["PaddedPrefix", "RowsMixin", "Staging", "concat_prefixes"]
