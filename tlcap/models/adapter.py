"""The model adapter: one object that answers every question a method asks of a model.

Architecture differences (GPT-2 vs Llama/SmolLM2 vs GPT-NeoX, TransformerLens 4.x
``TransformerBridge`` vs TL 3.9 ``HookedTransformer``) live here and nowhere else.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import PromptTooLongError, TargetTokenizationError

HookFn = Callable[..., Any]
HookList = Sequence[tuple[str, HookFn]]


@dataclass(frozen=True)
class WeightSlice:
    """A parameter together with the axis along which it is indexed by MLP neuron.

    Attributes:
        param: The parameter tensor (edited in place by interventions).
        neuron_dim: The axis of ``param`` that runs over the ``d_mlp`` neurons.
        role: ``"out"`` (down projection, neuron -> residual), ``"in"``/``"gate"``
            (residual -> neuron) or ``"bias"``.
    """

    param: torch.nn.Parameter
    neuron_dim: int
    role: str

    def neuron_view(self) -> Tensor:
        """The parameter with the neuron axis first (a view: writes go through)."""
        return self.param.data.movedim(self.neuron_dim, 0)


# HF module names of each MLP part, by HF ``model_type``. (path of layer list, mlp attr, parts)
_HF_MLP_LAYOUT: dict[str, dict[str, Any]] = {
    "gpt2": {"layers": "transformer.h", "mlp": "mlp", "out": ("c_proj", 0), "in": [("c_fc", 1)], "bias": [("c_fc", 0)], "conv1d": True},
    "llama": {"layers": "model.layers", "mlp": "mlp", "out": ("down_proj", 1), "in": [("up_proj", 0), ("gate_proj", 0)], "bias": []},
    "mistral": {"layers": "model.layers", "mlp": "mlp", "out": ("down_proj", 1), "in": [("up_proj", 0), ("gate_proj", 0)], "bias": []},
    "qwen2": {"layers": "model.layers", "mlp": "mlp", "out": ("down_proj", 1), "in": [("up_proj", 0), ("gate_proj", 0)], "bias": []},
    "gemma": {"layers": "model.layers", "mlp": "mlp", "out": ("down_proj", 1), "in": [("up_proj", 0), ("gate_proj", 0)], "bias": []},
    "gpt_neox": {"layers": "gpt_neox.layers", "mlp": "mlp", "out": ("dense_4h_to_h", 1), "in": [("dense_h_to_4h", 0)], "bias": [("dense_h_to_4h", 0)]},
    "gptj": {"layers": "transformer.h", "mlp": "mlp", "out": ("fc_out", 1), "in": [("fc_in", 0)], "bias": [("fc_in", 0)]},
}


def transformer_bridge_class() -> Any:
    """``TransformerBridge`` from TL 4.x (``transformer_lens``) or TL 3.9 (``transformer_lens.model_bridge``)."""
    try:
        from transformer_lens import TransformerBridge
    except ImportError:  # TL 3.9 ships the bridge but does not export it at the top level
        from transformer_lens.model_bridge import TransformerBridge
    return TransformerBridge


def _getattr_path(obj: Any, path: str) -> Any:
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


class Model:
    """A hookable language model with the shape facts and weight handles methods need.

    Wraps a TransformerLens 4.x ``TransformerBridge`` or a TL 3.9 ``HookedTransformer``
    (duck-typed: anything with ``hooks()``, ``run_with_cache`` and TL hook names works).
    Parameters are frozen on construction; code that trains turns gradients back on for
    exactly what it trains.

    Tokenization follows the model's own HF tokenizer with ``add_special_tokens`` as the
    tokenizer defines it, and ``prepend_bos=False`` by default: GPT-2 and SmolLM2 then see
    the prompt exactly as the reference implementations (Dai et al., EleutherAI
    knowledge-neurons, ROME) feed it.

    Example:
        >>> model = tlcap.load_model("gpt2-tiny")
        >>> toks = model.to_tokens("The capital of France is")
        >>> logits = model.logits(toks)
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

    def __repr__(self) -> str:
        return (
            f"Model({self.name!r}, arch={self.architecture}, n_layers={self.n_layers}, "
            f"d_model={self.d_model}, d_mlp={self.d_mlp}, heads={self.n_heads}/{self.n_kv_heads}kv)"
        )

    # ------------------------------------------------------------------ tokens
    def to_tokens(self, text: str, prepend_bos: bool | None = None) -> Int[Tensor, "1 pos"]:
        """Tokenize one prompt to a ``[1, pos]`` tensor, checking the context length."""
        ids = self.encode(text, prepend_bos=prepend_bos)
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def encode(self, text: str, prepend_bos: bool | None = None) -> list[int]:
        """Token ids of ``text`` (with BOS if ``prepend_bos``, default the model's setting)."""
        if self.tokenizer is None:
            raise TargetTokenizationError(
                "This model has no tokenizer; pass token ids (tensors) instead of strings."
            )
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        bos = self.prepend_bos if prepend_bos is None else prepend_bos
        if bos:
            bos_id = self.tokenizer.bos_token_id
            if bos_id is None:
                bos_id = self.tokenizer.eos_token_id
            ids = [bos_id] + ids
        if len(ids) > self.n_ctx:
            raise PromptTooLongError(
                f"Prompt is {len(ids)} tokens but {self.name} has a context of {self.n_ctx}; "
                "shorten it or truncate it before calling."
            )
        return ids

    def to_str_tokens(self, ids: Sequence[int] | Tensor) -> list[str]:
        if isinstance(ids, Tensor):
            ids = ids.flatten().tolist()
        return [self.tokenizer.decode([i]) for i in ids]

    def target_ids(self, prompt: str, target: str, single_token: bool = False) -> list[int]:
        """Token ids of ``target`` as they follow ``prompt``.

        The target is tokenized in context (``prompt + target``) so that a missing leading
        space or a merge across the boundary is noticed instead of silently mis-scored.

        Raises:
            TargetTokenizationError: the target merges with the prompt's last token, is
                empty, or (with ``single_token``) is more than one token.
        """
        if not target:
            raise TargetTokenizationError("The target is empty; give the answer string, e.g. ' Paris'.")
        p_ids = self.encode(prompt, prepend_bos=False)
        joint = self.encode(prompt + target, prepend_bos=False)
        alone = list(self.tokenizer(target, add_special_tokens=False)["input_ids"])
        if joint[: len(p_ids)] != p_ids:
            raise TargetTokenizationError(
                f"Target {target!r} merges with the end of the prompt {prompt[-20:]!r} when "
                "tokenized together; end the prompt at a word boundary or start the target "
                "with a space (e.g. ' Paris')."
            )
        ids = joint[len(p_ids):]
        if ids != alone:
            raise TargetTokenizationError(
                f"Target {target!r} tokenizes as {self.to_str_tokens(alone)} alone but as "
                f"{self.to_str_tokens(ids)} after the prompt; fix the spacing of prompt/target."
            )
        if not target[0].isspace() and prompt and not prompt[-1].isspace():
            warnings.warn(
                f"Target {target!r} has no leading space and the prompt does not end with one: "
                f"it is scored as the tokens {self.to_str_tokens(ids)} glued to the prompt. "
                "Most facts need a leading space (e.g. ' Paris').",
                stacklevel=2,
            )
        if single_token and len(ids) != 1:
            raise TargetTokenizationError(
                f"Target {target!r} is {len(ids)} tokens {self.to_str_tokens(ids)}; this method "
                "needs a single-token target. Use a shorter answer, or a method that supports "
                "multi-token targets by teacher forcing."
            )
        return ids

    # ------------------------------------------------------------------ running
    def hook_name(self, site: str, layer: int | None = None) -> str:
        """TransformerLens hook name of a named site at ``layer`` (see :mod:`tlcap.runtime.sites`)."""
        from tlcap.runtime.sites import get_site

        return get_site(site).hook_name(layer)

    @contextlib.contextmanager
    def hooks(self, fwd: HookList = (), bwd: HookList = ()) -> Iterator["Model"]:
        """Apply hooks for the body of a ``with`` block; every hook is removed on exit.

        Removal also happens when the body raises. Contexts nest: an inner block (including
        the one every :meth:`logits` call opens) removes only its own hooks, so the outer
        block's hooks stay active for every call in its body. TransformerLens's ``hooks()``
        context does the bookkeeping (per handle on the bridge, per context level on TL 3.9).
        Hooks are TransformerLens-style functions ``fn(activation, hook) -> activation | None``.
        """
        with self.backend.hooks(fwd_hooks=list(fwd), bwd_hooks=list(bwd)):
            yield self

    def logits(
        self,
        tokens: Int[Tensor, "batch pos"],
        hooks: HookList = (),
        prefix: "PrefixCache | None" = None,
        expand_at: int | None = None,
        batch: int | None = None,
    ) -> Float[Tensor, "batch pos d_vocab"]:
        """Run the model (optionally after a cached prefix) and return logits.

        Args:
            tokens: Token ids. With ``prefix``, the tokens that follow the cached prefix.
            hooks: Forward hooks applied for this call only.
            prefix: A :class:`PrefixCache` from :meth:`prefix_cache`; the cache is copied and
                expanded to the batch, so one prefix serves any number of calls.
            expand_at: With ``prefix`` and ``batch``: run a single row through layers
                ``< expand_at`` and repeat it ``batch`` times from ``blocks.{expand_at}`` on.
                Exact when the rows differ only from that layer on (e.g. each row scales a
                neuron in a layer ≥ ``expand_at``); saves the shared lower layers' compute.
            batch: Number of rows when ``expand_at`` is used (``tokens`` has one row).
        """
        if tokens.ndim == 1:
            tokens = tokens[None]
        if expand_at is not None and batch is not None and batch > 1 and expand_at > 0:
            if prefix is not None and prefix.n_tokens > 0 and self.is_bridge:
                from tlcap.runtime.hooks import expand_batch

                late = [(f"blocks.{expand_at}.hook_resid_pre", expand_batch(batch))]
                with self.hooks(fwd=late + list(hooks)):
                    return self.forward(tokens[:1], past=prefix.expanded(batch, from_layer=expand_at))
        if batch is not None and tokens.shape[0] != batch:
            tokens = tokens.expand(batch, -1)
        with self.hooks(fwd=hooks):
            if prefix is None or prefix.n_tokens == 0:
                return self.forward(tokens)
            return self.forward(tokens, past=prefix.expanded(tokens.shape[0]))

    def forward(self, tokens: Int[Tensor, "batch pos"], past: Any = None) -> Float[Tensor, "batch pos d_vocab"]:
        """The raw forward pass: the hooks of enclosing :meth:`hooks` blocks apply, none of its own.

        Args:
            tokens: Token ids.
            past: A live backend KV cache (e.g. ``prefix_cache(...).expanded(1)``) that this call
                extends in place, for incremental decoding; ``None`` runs from scratch. Use
                :meth:`logits` with ``prefix=`` to reuse a cache without consuming it.
        """
        if past is None:
            return self.backend(tokens)
        if self.is_bridge:
            return self.backend(tokens, past_key_values=past)
        return self.backend(tokens, past_kv_cache=past)

    @torch.no_grad()
    def last_position_activations(
        self,
        tokens: Int[Tensor, "batch pos"],
        hook_names: Sequence[str],
        hooks: HookList = (),
        prefix: "PrefixCache | None" = None,
    ) -> tuple[Float[Tensor, "batch n_hooks d"], Float[Tensor, "batch d_vocab"]]:
        """Activations at the last position of each hook point, and the last-position logits.

        One no-grad forward (after ``prefix`` if given) with ``hooks`` applied, e.g. the clean
        neuron values IG scales, or a baseline sentence's neurons (AMIG, SIG).
        """
        from tlcap.runtime.hooks import record

        if tokens.ndim == 1:
            tokens = tokens[None]
        store: dict[str, Tensor] = {}
        rec = [(n, record(store, n, pos=[-1])) for n in hook_names]
        logits = self.logits(tokens, hooks=list(hooks) + rec, prefix=prefix)[:, -1]
        return torch.stack([store[n][:, -1] for n in hook_names], dim=1), logits

    def run_with_cache(self, tokens: Int[Tensor, "batch pos"], names: Sequence[str] | Callable[[str], bool] | None = None, hooks: HookList = ()) -> tuple[Tensor, dict[str, Tensor]]:
        """Forward pass recording the given hook points (all if ``names`` is None)."""
        from tlcap.runtime.hooks import record

        if tokens.ndim == 1:
            tokens = tokens[None]
        if names is None:
            keys = list(self.backend.hook_dict.keys())
        elif callable(names):
            keys = [k for k in self.backend.hook_dict.keys() if names(k)]
        else:
            keys = list(names)
        store: dict[str, Tensor] = {}
        rec = [(k, record(store, k)) for k in keys]
        logits = self.logits(tokens, hooks=list(hooks) + rec)
        return logits, store

    def prefix_cache(self, tokens: Int[Tensor, "1 pos"]) -> "PrefixCache":
        """Key/value cache of ``tokens`` so later calls recompute only what follows them.

        Positions before the one being intervened on are identical to the clean run (attention
        is causal), so methods that scale only the last position compute the prefix once.
        """
        if tokens.ndim == 1:
            tokens = tokens[None]
        n = int(tokens.shape[1])
        if n == 0:
            return PrefixCache(self, None, 0)
        with torch.no_grad():
            if self.is_bridge:
                _, cache = self.backend(tokens, return_type="logits_and_cache")
            else:
                try:  # TL 3.9 moved/renamed the cache class; older TL 3.x had this module
                    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache as HookedTransformerKeyValueCache
                except ImportError:
                    from transformer_lens.past_key_value_caching import HookedTransformerKeyValueCache

                cache = HookedTransformerKeyValueCache.init_cache(self.cfg, self.device, 1)
                self.backend(tokens, past_kv_cache=cache)
        return PrefixCache(self, cache, n)

    # ------------------------------------------------------------------ weights
    def _hf_mlp(self, layer: int) -> tuple[Any, dict[str, Any]]:
        layout = _HF_MLP_LAYOUT.get(self.architecture)
        if layout is None:
            raise NotImplementedError(
                f"Weight edits are not mapped for architecture {self.architecture!r}; add it to "
                "tlcap.models.adapter._HF_MLP_LAYOUT."
            )
        layers = _getattr_path(self.hf_model, layout["layers"])
        return getattr(layers[layer], layout["mlp"]), layout

    def mlp_out_weight(self, layer: int) -> WeightSlice:
        """The down projection of ``layer`` (neuron -> residual), indexed by neuron."""
        if self.hf_model is None:
            return WeightSlice(self.backend.blocks[layer].mlp.W_out, 0, "out")
        mlp, layout = self._hf_mlp(layer)
        name, dim = layout["out"]
        return WeightSlice(getattr(mlp, name).weight, dim, "out")

    def mlp_in_weights(self, layer: int) -> list[WeightSlice]:
        """The weights that read the residual into ``layer``'s neurons (in, gate, biases)."""
        if self.hf_model is None:
            mlp = self.backend.blocks[layer].mlp
            out = [WeightSlice(mlp.W_in, 1, "in"), WeightSlice(mlp.b_in, 0, "bias")]
            if hasattr(mlp, "W_gate"):
                out.append(WeightSlice(mlp.W_gate, 1, "gate"))
            return out
        mlp, layout = self._hf_mlp(layer)
        out = []
        for name, dim in layout["in"]:
            out.append(WeightSlice(getattr(mlp, name).weight, dim, "gate" if "gate" in name else "in"))
        for name, dim in layout["bias"]:
            bias = getattr(mlp, name).bias
            if bias is not None:
                out.append(WeightSlice(bias, dim, "bias"))
        return out

    def mlp_down_matrix(self, layer: int) -> Float[Tensor, "d_model d_mlp"]:
        """The down projection as a ``[d_model, d_mlp]`` matrix (a view when possible)."""
        ws = self.mlp_out_weight(layer)
        w = ws.param.data
        return w if ws.neuron_dim == 1 else w.T

    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        """Token embedding matrix."""
        if self.hf_model is not None:
            return self.hf_model.get_input_embeddings().weight
        return self.backend.W_E

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab"]:
        """Unembedding matrix (``d_model x d_vocab``)."""
        if self.hf_model is not None:
            return self.hf_model.get_output_embeddings().weight.T
        return self.backend.W_U

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.backend.parameters())


class PrefixCache:
    """A key/value cache of a token prefix that can be reused by any number of calls."""

    def __init__(self, model: Model, cache: Any, n_tokens: int):
        self.model = model
        self.cache = cache
        self.n_tokens = n_tokens

    def expanded(self, batch: int, from_layer: int = 0) -> Any:
        """A fresh copy of the cache repeated ``batch`` times (the original stays intact).

        With ``from_layer`` > 0 (bridge only) layers below it keep batch 1, for runs that
        expand the batch at that layer (``Model.logits(expand_at=...)``).
        """
        c = copy.deepcopy(self.cache)
        if self.model.is_bridge:
            if batch != 1:
                # Broadcast views, not copies: HF concatenates the new keys/values onto them,
                # which materialises each layer's batch exactly once.
                for i, layer in enumerate(c.layers):
                    if i >= from_layer and getattr(layer, "keys", None) is not None and layer.keys.numel():
                        if layer.keys.shape[0] == 1:
                            layer.keys = layer.keys.expand(batch, *layer.keys.shape[1:])
                            layer.values = layer.values.expand(batch, *layer.values.shape[1:])
                        else:  # a multi-row cache: each row repeated ``batch`` times
                            layer.batch_repeat_interleave(batch)
            return c
        for entry in c.entries:
            entry.past_keys = entry.past_keys.expand(batch, *entry.past_keys.shape[1:]).contiguous()
            entry.past_values = entry.past_values.expand(batch, *entry.past_values.shape[1:]).contiguous()
        c.previous_attention_mask = c.previous_attention_mask.expand(batch, -1).contiguous()
        return c
