"""The model adapter: one object that answers every question a method asks of a model.

Architecture differences (GPT-2 vs Llama/SmolLM2 vs GPT-NeoX, TransformerLens 4.x
``TransformerBridge`` vs TL 3.9 ``HookedTransformer``) live here and nowhere else:
:class:`Model` is the one entry point. This module holds running (hooks, logits, last-position
logits, prefix caches, edge-hook flags); the rest is mixed in from small modules —
:mod:`tlcap.models.tokens` (the tokenizer: encoding, padded batches, subject spans),
:mod:`tlcap.models.recording` (``record``, ``run_with_cache``), :mod:`tlcap.models.generate`
(greedy decoding), :mod:`tlcap.models.weights` (MLP neuron weights, embeddings),
:mod:`tlcap.models.params` (parameters per head / MLP), :mod:`tlcap.models.architecture`
(block layout facts: parallel blocks, post-norms, patchable attention), :mod:`tlcap.models.split_inputs`
(per-head hook points rebuilt where TransformerLens wraps attention generically) and :mod:`tlcap.models.cache`
(:class:`PrefixCache`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import TlcapError
from tlcap.models import hf_compat
from tlcap.models.architecture import ArchitectureMixin
from tlcap.models.cache import PrefixCache, fresh_cache, full_cache
from tlcap.models.edge_hooks import EdgeHooksMixin
from tlcap.models.generate import GenerationMixin
from tlcap.models.packed_rows import continue_packed, packable
from tlcap.models.params import ParamsMixin
from tlcap.models.placement import input_device
from tlcap.models.recording import RecordingMixin
from tlcap.models.rows import PaddedPrefix, RowsMixin
from tlcap.models.token_types import SubjectSpan, TokenBatch, Tokens
from tlcap.models.tokens import TokensMixin
from tlcap.models.weights import _HF_MLP_LAYOUT, WeightSlice, WeightsMixin
from tlcap.runtime import hooks as H
from tlcap.runtime.hooks import HookList
from tlcap.runtime.sites import get_site

# Sites where last_logits keeps only the last position, in order of preference.
_CUT_SITES: tuple[str, ...] = ("unembed_in", "final_out")
# Backend flags that switch on the per-head / split-input hook points edge patching reads.


def transformer_bridge_class() -> Any:
    """``TransformerBridge`` from TL 4.x (``transformer_lens``) or TL 3.9 (``transformer_lens.model_bridge``).

    Returns:
        The ``TransformerBridge`` class (after installing :mod:`tlcap.models.hf_compat`).
    """
    try:
        from transformer_lens import TransformerBridge
    except ImportError:  # TL 3.9 ships the bridge but does not export it at the top level
        from transformer_lens.model_bridge import TransformerBridge
    hf_compat.install()  # the KV cache under transformers >= 5.24 (tlcap.models.hf_compat)
    return TransformerBridge


def _hooked_kv_cache_class() -> Any:
    """TL 3.x's key/value cache class (TL 3.9 moved and renamed it)."""
    try:
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache
    except ImportError:
        from transformer_lens.past_key_value_caching import (
            HookedTransformerKeyValueCache as TransformerLensKeyValueCache,
        )
    return TransformerLensKeyValueCache


def _rows(tokens: Tokens) -> Tokens:
    return tokens[None] if isinstance(tokens, Tensor) and tokens.ndim == 1 else tokens


class Model(TokensMixin, RecordingMixin, GenerationMixin, WeightsMixin, ParamsMixin, RowsMixin, ArchitectureMixin,
            EdgeHooksMixin):
    """A hookable language model with the shape facts and weight handles methods need.

    Wraps a TransformerLens 4.x ``TransformerBridge`` or a TL 3.9 ``HookedTransformer``
    (duck-typed: anything with ``hooks()``, ``run_with_cache`` and TL hook names works).
    Parameters are frozen on construction; code that trains turns gradients back on for
    exactly what it trains.

    Tokenization follows the model's own HF tokenizer with ``add_special_tokens`` as the
    tokenizer defines it, and ``prepend_bos=False`` by default: GPT-2 and SmolLM2 then see
    the prompt exactly as the reference implementations (Dai et al., EleutherAI
    knowledge-neurons, ROME) feed it.

    Attributes:
        backend: The TransformerLens model. Methods never use it directly.
        tokenizer: The HF tokenizer (``None`` for id-only models).
        n_layers, d_model, d_mlp, n_heads, n_kv_heads, d_head, d_vocab, n_ctx: Shape facts.
        is_bridge: Whether ``backend`` is a ``TransformerBridge``.
        architecture: HF ``model_type`` (``"gpt2"``, ``"llama"``, ...).

    Example:
        >>> model = tlcap.load_model("gpt2-tiny")
        >>> toks = model.to_tokens("The capital of France is")
        >>> logits = model.logits(toks)
        >>> next_logits = model.last_logits(toks)          # [1, d_vocab], unembeds one position
    """

    def __init__(self, backend: Any, tokenizer: Any = None, name: str = "model", prepend_bos: bool = False):
        self.backend = backend
        self.name = name
        self.tokenizer = tokenizer if tokenizer is not None else getattr(backend, "tokenizer", None)
        self.prepend_bos = prepend_bos
        cfg = backend.cfg
        self.cfg = cfg
        self.n_layers: int = int(cfg.n_layers)
        self.d_model: int = int(cfg.d_model)
        self.d_mlp: int = int(cfg.d_mlp)
        self.n_heads: int = int(cfg.n_heads)
        self.d_head: int = int(cfg.d_head)
        n_kv = getattr(cfg, "n_key_value_heads", None)
        self.n_kv_heads: int = int(n_kv) if n_kv else self.n_heads
        self.d_vocab: int = int(cfg.d_vocab)
        self.n_ctx: int = int(cfg.n_ctx)
        self.is_bridge = hasattr(backend, "original_model")
        if self.is_bridge:
            hf_compat.install()
        self.hf_model = backend.original_model if self.is_bridge else None
        if self.hf_model is not None:
            hf_compat.fuse_gelu(self.hf_model)  # the same activation in one kernel (tlcap.models.hf_compat)
        self.architecture = self._architecture()
        names = set(getattr(backend, "hook_dict", {}))
        cut = [get_site(s).hook_name() for s in _CUT_SITES if get_site(s).hook_name() in names]
        self._cut_name: str | None = cut[0] if cut else None
        for p in backend.parameters():
            p.requires_grad_(False)
        backend.eval()

    # ------------------------------------------------------------------ facts
    def _architecture(self) -> str:
        if self.hf_model is not None:
            return str(getattr(self.hf_model.config, "model_type", "unknown"))
        arch = getattr(self.cfg, "original_architecture", None) or ""
        if "GPT2" in arch:
            return "gpt2"
        if "Llama" in arch or "Mistral" in arch or "Qwen" in arch:
            return "llama"
        if "NeoX" in arch:
            return "gpt_neox"
        return "hooked"

    @property
    def device(self) -> torch.device:
        """Where inputs go: the embedding's device (layers may sit elsewhere: :attr:`layer_devices`)."""
        return input_device(self)

    @property
    def dtype(self) -> torch.dtype:
        """The parameter dtype (float32, bfloat16 or float16)."""
        return next(self.backend.parameters()).dtype

    @property
    def n_neurons(self) -> int:
        """Total number of MLP neurons (``n_layers * d_mlp``)."""
        return self.n_layers * self.d_mlp

    def eval(self) -> Model:
        """Put the backend in inference mode (no dropout); returns the model.

        Returns:
            This model.
        """
        self.backend.train(False)
        return self

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, arch={self.architecture}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, d_mlp={self.d_mlp}, heads={self.n_heads}/{self.n_kv_heads}kv)"
        )

    # ------------------------------------------------------------------ hooks
    def hook_name(self, site: str, layer: int | None = None) -> str:
        """TransformerLens hook name of a named site at ``layer`` (see :mod:`tlcap.runtime.sites`).

        Args:
            site: A site name of :mod:`tlcap.runtime.sites` (``"mlp_post"``, ``"resid_post"``, ...).
            layer: The layer (``None`` for sites outside the blocks, e.g. ``"embed"``).

        Returns:
            The hook point's name, e.g. ``"blocks.3.mlp.hook_post"``.
        """
        return get_site(site).hook_name(layer)

    @contextlib.contextmanager
    def hooks(self, fwd: HookList = (), bwd: HookList = ()) -> Iterator[Model]:
        """Apply hooks for the body of a ``with`` block; every hook is removed on exit.

        Removal also happens when the body raises. Contexts nest: an inner block (including
        the one every :meth:`logits` call opens) removes only its own hooks, so the outer
        block's hooks stay active for every call in its body. TransformerLens's ``hooks()``
        context does the bookkeeping (per handle on the bridge, per context level on TL 3.9).
        Hooks are TransformerLens-style functions ``fn(activation, hook) -> activation | None``.

        Args:
            fwd: ``(hook name, fn)`` forward hooks.
            bwd: ``(hook name, fn)`` backward hooks.

        Yields:
            This model, with the hooks applied.
        """
        with self.backend.hooks(fwd_hooks=list(fwd), bwd_hooks=list(bwd)):
            yield self

    # ------------------------------------------------------------------ running
    def logits(
        self,
        tokens: Tokens,
        hooks: HookList = (),
        prefix: PrefixCache | None = None,
        expand_at: int | None = None,
        batch: int | None = None,
    ) -> Float[Tensor, "rows pos d_vocab"]:
        """Run the model (optionally after a cached prefix) and return logits.

        Args:
            tokens: Token ids, or a :class:`TokenBatch` (a left-padded batch is run with its
                attention mask). With ``prefix``, the tokens that follow the cached prefix.
            hooks: Forward hooks applied for this call only.
            prefix: A :class:`PrefixCache` from :meth:`prefix_cache`; the cache is copied and
                expanded to the batch (each prefix row repeated ``batch / rows`` times), so
                one prefix serves any number of calls.
            expand_at: With a one-row ``prefix`` and ``batch``: run a single row through layers
                ``< expand_at`` and repeat it ``batch`` times from the ``resid_pre`` site of
                layer ``expand_at`` on. Exact when the rows differ only from that layer on
                (e.g. each row scales a neuron in a layer ≥ ``expand_at``); saves the shared
                lower layers' compute.
            batch: Number of rows when ``expand_at`` is used (``tokens`` has one row).

        Returns:
            Logits at every position of ``tokens`` (``rows`` = ``batch`` when given).
        """
        return self._run(tokens, hooks, prefix, expand_at, batch)

    def _run(self, tokens: Any, hooks: HookList, prefix: Any, expand_at: Any, batch: Any) -> Any:
        """:meth:`logits` without shape annotations (shape-changing hooks such as the last-position cut)."""
        tokens = _rows(tokens)
        mask = None
        if isinstance(tokens, TokenBatch):
            if tokens.side == "left" and tokens.is_padded:
                mask = tokens.attention_mask
            tokens = tokens.tokens
        if mask is not None and prefix is not None and prefix.n_tokens > 0:
            raise TlcapError("A left-padded batch cannot follow a prefix cache; pad on the right (side='right').")
        late = (
            expand_at is not None and batch is not None and batch > 1 and expand_at > 0 and mask is None
            and prefix is not None and prefix.n_tokens > 0 and prefix.rows == 1 and self.is_bridge
        )
        packed = None if mask is not None else self._packed(tokens, hooks, prefix, expand_at, batch)
        if packed is not None:
            return packed[:, None]
        if late:
            assert prefix is not None and batch is not None and expand_at is not None
            expand = [(self.hook_name("resid_pre", expand_at), H.expand_batch(batch))]
            with self.hooks(fwd=expand + list(hooks)):
                return self._forward(tokens[:1], past=prefix.expanded(batch, from_layer=expand_at))
        if batch is not None and tokens.shape[0] != batch:
            tokens = tokens.expand(batch, -1)
        with self.hooks(fwd=hooks):
            if prefix is None or prefix.n_tokens == 0:
                return self._forward(tokens, attention_mask=mask)
            return self._forward(tokens, past=prefix.expanded(tokens.shape[0]))

    def _packed(self, tokens: Tensor, hooks: HookList, prefix: Any, expand_at: Any, batch: Any) -> Tensor | None:
        """``[batch, d_vocab]`` logits of a one-token run after a one-row prefix, packed
        (:mod:`tlcap.models.packed_rows`); ``None`` where packing does not apply."""
        if (prefix is None or prefix.n_tokens == 0 or prefix.rows != 1 or batch is None or batch < 2
                or tokens.shape[0] != 1 or not packable(self, hooks, tokens.shape[1])):
            return None
        return continue_packed(self, tokens[0].cpu(), fresh_cache(prefix.cache), torch.tensor([prefix.n_tokens]),
                               prefix.n_tokens, torch.tensor([batch]), hooks, int(expand_at or 0))

    def last_logits(
        self,
        tokens: Tokens,
        hooks: HookList = (),
        prefix: PrefixCache | None = None,
        expand_at: int | None = None,
        batch: int | None = None,
    ) -> Float[Tensor, "rows d_vocab"]:
        """Next-token logits of every row: the logits at each row's last (real) token.

        Equal to ``logits(tokens)[:, -1]``, but the unembedding runs on one position per row
        (a shape-changing hook at the ``unembed_in`` site, ``final_out`` on TL 3.9). For a
        right-padded :class:`TokenBatch` each row's own last token is used.

        Args:
            tokens, hooks, prefix, expand_at, batch: As in :meth:`logits`.

        Returns:
            ``[batch, d_vocab]`` logits.

        Example:
            >>> probs = model.last_logits(model.to_tokens("The capital of France is")).softmax(-1)
        """
        tokens = _rows(tokens)
        per_row = isinstance(tokens, TokenBatch) and tokens.side == "right" and tokens.is_padded
        packed = None if isinstance(tokens, TokenBatch) else self._packed(tokens, hooks, prefix, expand_at, batch)
        if packed is not None:
            return packed
        if self._cut_name is None:
            out = self._run(tokens, hooks, prefix, expand_at, batch)
            if per_row:
                assert isinstance(tokens, TokenBatch)
                return out[torch.arange(out.shape[0], device=out.device), tokens.last_positions.to(out.device)]
            return out[:, -1]
        if per_row:
            assert isinstance(tokens, TokenBatch)
            cut = H.select_positions(tokens.last_positions)
        else:
            cut = H.last_position_only()
        return self._run(tokens, [*hooks, (self._cut_name, cut)], prefix, expand_at, batch)[:, -1]

    def forward(
        self,
        tokens: Int[Tensor, "batch pos"],
        past: Any = None,
        attention_mask: Int[Tensor, "batch pos"] | None = None,
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """The raw forward pass: the hooks of enclosing :meth:`hooks` blocks apply, none of its own.

        Args:
            tokens: Token ids.
            past: A live backend KV cache (e.g. ``prefix_cache(...).expanded(1)``) that this call
                extends in place, for incremental decoding; ``None`` runs from scratch. Use
                :meth:`logits` with ``prefix=`` to reuse a cache without consuming it.
            attention_mask: 1 for real tokens, 0 for padding (needed for left padding only).

        Args:
            tokens: Token ids.
            past: A key/value cache to continue from (``None``: none).
            attention_mask: 1 for real tokens, 0 for padding (``None``: all real).

        Returns:
            The logits.
        """
        return self._forward(tokens, past, attention_mask)

    def _forward(self, tokens: Any, past: Any = None, attention_mask: Any = None) -> Any:
        kw: dict[str, Any] = {} if attention_mask is None else {"attention_mask": attention_mask}
        if past is None:
            return self.backend(tokens, **kw)
        if self.is_bridge:
            return self.backend(tokens, past_key_values=past, **kw)
        return self.backend(tokens, past_kv_cache=past, **kw)

    def prefix_cache(self, tokens: Int[Tensor, "rows pos"]) -> PrefixCache:
        """Key/value cache of ``tokens`` so later calls recompute only what follows them.

        Positions before the one being intervened on are identical to the clean run (attention
        is causal), so methods that scale only the last position compute the prefix once.
        Hooks of enclosing :meth:`hooks` blocks apply while the prefix is computed (e.g. noise
        on the prefix). A cache of ``rows`` rows serves batches of ``k · rows`` rows, each
        prefix row repeated ``k`` times (see :class:`PrefixCache`).

        Args:
            tokens: ``[rows, n_tokens]`` prefix token ids (one row for a shared prefix).

        Returns:
            The :class:`PrefixCache`.
        """
        tokens = _rows(tokens)
        rows, n = int(tokens.shape[0]), int(tokens.shape[1])
        if n == 0:
            return PrefixCache(self, None, 0, rows)
        cut = [(self._cut_name, H.last_position_only())] if self._cut_name else []  # logits are discarded
        with torch.no_grad(), self.hooks(fwd=cut):
            if self.is_bridge:
                _, cache = self.backend(tokens, return_type="logits_and_cache", past_key_values=full_cache())
            else:
                cache = _hooked_kv_cache_class().init_cache(self.cfg, self.device, rows)
                self.backend(tokens, past_kv_cache=cache)
        return PrefixCache(self, cache, n, rows)



__all__ = [
    "HookList", "Model", "PaddedPrefix", "PrefixCache", "SubjectSpan", "TokenBatch", "WeightSlice", "transformer_bridge_class",
    "_HF_MLP_LAYOUT",
]
