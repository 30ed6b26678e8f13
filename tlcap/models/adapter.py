"""The model adapter: one object that answers every question a method asks of a model.

Architecture differences (GPT-2 vs Llama/SmolLM2 vs GPT-NeoX, TransformerLens 4.x
``TransformerBridge`` vs TL 3.9 ``HookedTransformer``) live here and nowhere else:
:class:`Model` is the one entry point, split over small modules —
:mod:`tlcap.models.tokens` (tokenizer, padded batches, subject spans),
:mod:`tlcap.models.weights` (MLP neuron weights, embeddings),
:mod:`tlcap.models.params` (parameters per head / MLP) and :mod:`tlcap.models.cache`
(prefix key/value caches).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import EmptyDatasetError, TlcapError
from tlcap.models.cache import PrefixCache
from tlcap.models.params import (
    ParameterGroups,
    build_parameter_groups,
    unique_parameter_count,
)
from tlcap.models.tokens import SubjectSpan, TokenBatch, TokensMixin
from tlcap.models.weights import _HF_MLP_LAYOUT, WeightSlice, WeightsMixin
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site

HookFn = Callable[..., Any]
HookList = Sequence[tuple[str, HookFn]]
Tokens = Int[Tensor, "batch pos"] | TokenBatch

# Sites where last_logits keeps only the last position, in order of preference.
_CUT_SITES: tuple[str, ...] = ("unembed_in", "final_out")
# Backend flags that switch on the per-head / split-input hook points edge patching reads.
_EDGE_FLAGS: tuple[str, ...] = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in")


def transformer_bridge_class() -> Any:
    """``TransformerBridge`` from TL 4.x (``transformer_lens``) or TL 3.9 (``transformer_lens.model_bridge``)."""
    try:
        from transformer_lens import TransformerBridge
    except ImportError:  # TL 3.9 ships the bridge but does not export it at the top level
        from transformer_lens.model_bridge import TransformerBridge
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


class Model(TokensMixin, WeightsMixin):
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
        self.hf_model = backend.original_model if self.is_bridge else None
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
        return next(self.backend.parameters()).device

    @property
    def n_neurons(self) -> int:
        """Total number of MLP neurons (``n_layers * d_mlp``)."""
        return self.n_layers * self.d_mlp

    @property
    def parallel_attn_mlp(self) -> bool:
        """Whether attention and MLP read the same block input (GPT-J, NeoX) instead of in sequence."""
        return bool(getattr(self.cfg, "parallel_attn_mlp", False))

    def eval(self) -> Model:
        """Put the backend in inference mode (no dropout); returns the model."""
        self.backend.train(False)
        return self

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, arch={self.architecture}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, d_mlp={self.d_mlp}, heads={self.n_heads}/{self.n_kv_heads}kv)"
        )

    # ------------------------------------------------------------------ hooks
    def hook_name(self, site: str, layer: int | None = None) -> str:
        """TransformerLens hook name of a named site at ``layer`` (see :mod:`tlcap.runtime.sites`)."""
        return get_site(site).hook_name(layer)

    @contextlib.contextmanager
    def hooks(self, fwd: HookList = (), bwd: HookList = ()) -> Iterator[Model]:
        """Apply hooks for the body of a ``with`` block; every hook is removed on exit.

        Removal also happens when the body raises. Contexts nest: an inner block (including
        the one every :meth:`logits` call opens) removes only its own hooks, so the outer
        block's hooks stay active for every call in its body. TransformerLens's ``hooks()``
        context does the bookkeeping (per handle on the bridge, per context level on TL 3.9).
        Hooks are TransformerLens-style functions ``fn(activation, hook) -> activation | None``.
        """
        with self.backend.hooks(fwd_hooks=list(fwd), bwd_hooks=list(bwd)):
            yield self

    @contextlib.contextmanager
    def edge_hooks(self) -> Iterator[Model]:
        """Switch on the per-head and split-input hook points for the body of a ``with`` block.

        Turns on the backend's ``use_split_qkv_input`` (per-head pre-norm q/k/v inputs: the
        ``q_input``/``k_input``/``v_input`` sites), ``use_attn_result`` (per-head outputs:
        ``head_result``) and ``use_hook_mlp_in`` (``mlp_input``), and off ``use_attn_in``
        (which excludes split inputs). The previous flags are restored on exit, also when
        the body raises.

        Example:
            >>> with model.edge_hooks():
            ...     logits, cache = model.run_with_cache(toks, [model.hook_name("q_input", 0)])
        """
        b = self.backend
        saved = self.edge_hook_flags()
        attn_in = bool(getattr(b.cfg, "use_attn_in", False))
        try:
            if attn_in:
                b.set_use_attn_in(False)
            b.set_use_split_qkv_input(True)
            b.set_use_attn_result(True)
            b.set_use_hook_mlp_in(True)
            yield self
        finally:
            b.set_use_split_qkv_input(saved["use_split_qkv_input"])
            b.set_use_attn_result(saved["use_attn_result"])
            b.set_use_hook_mlp_in(saved["use_hook_mlp_in"])
            if attn_in:
                b.set_use_attn_in(True)

    def edge_hook_flags(self) -> dict[str, bool]:
        """The backend's current ``use_split_qkv_input`` / ``use_attn_result`` / ``use_hook_mlp_in`` flags."""
        return {f: bool(getattr(self.backend.cfg, f, False)) for f in _EDGE_FLAGS}

    # ------------------------------------------------------------------ running
    def logits(
        self,
        tokens: Tokens,
        hooks: HookList = (),
        prefix: PrefixCache | None = None,
        expand_at: int | None = None,
        batch: int | None = None,
    ) -> Float[Tensor, "batch pos d_vocab"]:
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
            Logits at every position of ``tokens``.
        """
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
        if late:
            assert prefix is not None and batch is not None and expand_at is not None
            expand = [(self.hook_name("resid_pre", expand_at), H.expand_batch(batch))]
            with self.hooks(fwd=expand + list(hooks)):
                return self.forward(tokens[:1], past=prefix.expanded(batch, from_layer=expand_at))
        if batch is not None and tokens.shape[0] != batch:
            tokens = tokens.expand(batch, -1)
        with self.hooks(fwd=hooks):
            if prefix is None or prefix.n_tokens == 0:
                return self.forward(tokens, attention_mask=mask)
            return self.forward(tokens, past=prefix.expanded(tokens.shape[0]))

    def last_logits(
        self,
        tokens: Tokens,
        hooks: HookList = (),
        prefix: PrefixCache | None = None,
        expand_at: int | None = None,
        batch: int | None = None,
    ) -> Float[Tensor, "batch d_vocab"]:
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
        if self._cut_name is None:
            out = self.logits(tokens, hooks, prefix, expand_at, batch)
            if per_row:
                assert isinstance(tokens, TokenBatch)
                return out[torch.arange(out.shape[0], device=out.device), tokens.last_positions.to(out.device)]
            return out[:, -1]
        if per_row:
            assert isinstance(tokens, TokenBatch)
            cut = H.select_positions(tokens.last_positions)
        else:
            cut = H.last_position_only()
        return self.logits(tokens, [*hooks, (self._cut_name, cut)], prefix, expand_at, batch)[:, -1]

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
        """
        kw: dict[str, Any] = {} if attention_mask is None else {"attention_mask": attention_mask}
        if past is None:
            return self.backend(tokens, **kw)
        if self.is_bridge:
            return self.backend(tokens, past_key_values=past, **kw)
        return self.backend(tokens, past_kv_cache=past, **kw)

    def record(
        self,
        tokens: Tokens,
        names: Sequence[str],
        stop_after: str | None = None,
        hooks: HookList = (),
        prefix: PrefixCache | None = None,
        pos: H.Index = None,
    ) -> dict[str, Tensor]:
        """Record hook points and stop the forward pass as soon as they are all recorded.

        The layers above the last recorded point (and the unembedding) are never computed.
        Recordings are detached copies taken after ``hooks`` (interventions at the same hook
        point apply first). Runs with gradients off unless the caller turned them on.

        Args:
            tokens: Token ids or a :class:`TokenBatch`.
            names: Hook names to record (e.g. ``model.hook_name("mlp_post", 3)``).
            stop_after: Stop right after this hook point fires instead (every name must have
                fired by then); default: after the last of ``names`` fires.
            hooks: Forward hooks applied during the run.
            prefix: A :class:`PrefixCache` the tokens follow.
            pos: Record only these positions (a selection as in :mod:`tlcap.runtime.hooks`,
                e.g. ``[-1]``); default all.

        Returns:
            ``{name: activation}`` in the order of ``names``.

        Raises:
            TlcapError: a name did not fire (misspelt, or after ``stop_after``).

        Example:
            >>> acts = model.record(toks, [model.hook_name("mlp_post", l) for l in (2, 3)])
        """
        wanted = list(dict.fromkeys(names))
        if not wanted:
            raise TlcapError("record needs at least one hook name.")
        store: dict[str, Tensor] = {}
        pending = set(wanted)

        def recorder(name: str) -> HookFn:
            rec = H.record(store, name, pos=pos)

            def hook(act: Tensor, hook: Any = None) -> None:
                rec(act, hook)
                pending.discard(name)
                if stop_after is None and not pending:
                    raise H.StopForward(name)

            return hook

        fwd = [*hooks, *((n, recorder(n)) for n in wanted)]
        if stop_after is not None:
            fwd.append((stop_after, H.stop_forward()))
        try:
            self.logits(tokens, hooks=fwd, prefix=prefix)
        except H.StopForward:
            pass
        if pending:
            where = f"before the pass stopped at {stop_after!r}" if stop_after else "in the forward pass"
            raise TlcapError(f"Hook points {sorted(pending)} did not fire {where}; check the names (model.hook_name(site, layer)).")
        return {n: store[n] for n in wanted}

    @torch.no_grad()
    def last_position_activations(
        self,
        tokens: Int[Tensor, "batch pos"],
        hook_names: Sequence[str],
        hooks: HookList = (),
        prefix: PrefixCache | None = None,
    ) -> tuple[Float[Tensor, "batch n_hooks d"], Float[Tensor, "batch d_vocab"]]:
        """Activations at the last position of each hook point, and the last-position logits.

        One no-grad forward (after ``prefix`` if given) with ``hooks`` applied, e.g. the clean
        neuron values IG scales, or a baseline sentence's neurons (AMIG, SIG).
        """
        tokens = _rows(tokens)
        store: dict[str, Tensor] = {}
        rec = [(n, H.record(store, n, pos=[-1])) for n in hook_names]
        logits = self.last_logits(tokens, hooks=list(hooks) + rec, prefix=prefix)
        return torch.stack([store[n][:, -1] for n in hook_names], dim=1), logits

    def run_with_cache(
        self,
        tokens: Tokens,
        names: Sequence[str] | Callable[[str], bool] | None = None,
        hooks: HookList = (),
    ) -> tuple[Float[Tensor, "batch pos d_vocab"], dict[str, Tensor]]:
        """Forward pass recording the given hook points (all if ``names`` is None)."""
        tokens = _rows(tokens)
        if names is None:
            keys = list(self.backend.hook_dict)
        elif callable(names):
            keys = [k for k in self.backend.hook_dict if names(k)]
        else:
            keys = list(names)
        store: dict[str, Tensor] = {}
        rec = [(k, H.record(store, k)) for k in keys]
        logits = self.logits(tokens, hooks=list(hooks) + rec)
        return logits, store

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
                _, cache = self.backend(tokens, return_type="logits_and_cache")
            else:
                cache = _hooked_kv_cache_class().init_cache(self.cfg, self.device, rows)
                self.backend(tokens, past_kv_cache=cache)
        return PrefixCache(self, cache, n, rows)

    @torch.no_grad()
    def generate(
        self,
        prompt: str | Sequence[int] | Tensor,
        max_new_tokens: int = 32,
        hooks: HookList = (),
        stop_ids: Sequence[int] = (),
        stop_text: Sequence[str] = (),
        use_cache: bool = True,
    ) -> list[int]:
        """Greedy continuation of a prompt (the new token ids only).

        With ``use_cache`` the prompt is encoded once into a key/value cache and every step
        feeds only the newest token; ``use_cache=False`` re-runs the whole sequence each step
        (the reference the cached path is tested against). ``hooks`` apply to every forward
        pass, the prompt's included, so position-independent hooks (e.g. scaling neurons at
        all positions) give the same tokens either way.

        Args:
            prompt: Text (encoded with :meth:`encode`) or token ids.
            max_new_tokens: Most tokens to generate.
            hooks: Forward hooks (activation interventions).
            stop_ids: Stop after generating one of these ids (e.g. EOS), which is included.
            stop_text: Stop once the decoded continuation contains one of these strings.
            use_cache: Decode incrementally with a key/value cache.

        Returns:
            The generated token ids.

        Example:
            >>> ids = model.generate("Question: 2 + 2 =", 8, stop_ids=[model.special_token_id("eos")])
            >>> model.decode(ids)
        """
        if isinstance(prompt, str):
            ids = self.encode(prompt)
        elif isinstance(prompt, Tensor):
            ids = [int(i) for i in prompt.flatten().tolist()]
        else:
            ids = [int(i) for i in prompt]
        if not ids:
            raise EmptyDatasetError("generate needs a prompt of at least one token.")
        out: list[int] = []
        stop = {int(s) for s in stop_ids}
        with self.hooks(fwd=hooks):
            cache = None
            if use_cache and len(ids) > 1:
                cache = self.prefix_cache(torch.tensor([ids[:-1]], device=self.device)).expanded(1)
            nxt = torch.tensor([ids[-1:] if cache is not None else ids], device=self.device)
            for _ in range(max_new_tokens):
                if cache is not None:
                    logits = self.forward(nxt, past=cache)  # the cache grows in place
                else:
                    logits = self.forward(torch.tensor([ids + out], device=self.device))
                tok = int(logits[0, -1].argmax())
                out.append(tok)
                if tok in stop:
                    break
                if stop_text and any(s in self.decode(out) for s in stop_text):
                    break
                nxt = torch.tensor([[tok]], device=self.device)
        return out

    # ------------------------------------------------------------------ parameters
    def parameter_count(self) -> int:
        """Number of parameter elements (tensors that share storage, e.g. tied embeddings, once)."""
        return unique_parameter_count(self.backend)

    def parameter_groups(self) -> ParameterGroups:
        """The model's parameters grouped by the heads, MLPs and embeddings that use them.

        Every parameter element is in exactly one group. A head owns its slices of ``W_Q``,
        ``b_Q`` and ``W_O``; the ``W_K``/``W_V`` slices of a kv head are shared by the
        ``n_heads / n_kv_heads`` query heads of its group (grouped-query attention); ``b_O``
        and ``ln1`` are shared by all heads of the layer; an MLP owns its weights and ``ln2``.
        See :mod:`tlcap.models.params` for the exact counts per node and per set of nodes.

        Returns:
            The :class:`ParameterGroups`.

        Example:
            >>> pg = model.parameter_groups()
            >>> pg.count(["a3.h0", "m3"]) / pg.block_total   # share of block parameters
        """
        return build_parameter_groups(self.backend, self.n_layers, self.n_heads, self.n_kv_heads, self.is_bridge)


__all__ = [
    "HookList", "Model", "PrefixCache", "SubjectSpan", "TokenBatch", "WeightSlice", "transformer_bridge_class",
    "_HF_MLP_LAYOUT",
]
