"""The edge-hook switch of :class:`~tlcap.models.Model`: per-head and split-input hook points for EAP.

A mixin of the adapter (it reads ``backend``, ``hf_model``, ``n_heads`` and ``emulated_split_inputs``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tlcap.models.placement import has_offloaded, resident_while_running
from tlcap.models.split_inputs import emulated_edge_hooks

_EDGE_FLAGS: tuple[str, ...] = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in")


class EdgeHooksMixin:
    """:meth:`edge_hooks` and :meth:`edge_hook_flags` of the adapter."""

    backend: Any
    hf_model: Any
    n_heads: int
    emulated_split_inputs: bool

    @contextlib.contextmanager
    def edge_hooks(self, split_inputs: bool = True) -> Iterator[EdgeHooksMixin]:
        """Switch on the per-head and split-input hook points for the body of a ``with`` block.

        Turns on the backend's ``use_split_qkv_input`` (per-head pre-norm q/k/v inputs: the
        ``q_input``/``k_input``/``v_input`` sites; not with ``split_inputs=False``),
        ``use_attn_result`` (per-head outputs: ``head_result``) and ``use_hook_mlp_in``
        (``mlp_input``), and off ``use_attn_in`` (which excludes split inputs). The previous
        flags are restored on exit, also when the body raises. Where TransformerLens wraps the
        attention generically (GPT-J on TL 4.x, :attr:`emulated_split_inputs`) the same hook
        points are made to fire by :mod:`tlcap.models.split_inputs`.

        Args:
            split_inputs: Also split the q/k/v and MLP inputs per upstream node (EAP's reader hooks).

        Yields:
            This model, with the flags on (restored on exit).

        Example:
            >>> toks = model.to_tokens("The capital of France is")
            >>> with model.edge_hooks():
            ...     logits, cache = model.run_with_cache(toks, [model.hook_name("q_input", 0)])
            >>> {name: tuple(t.shape) for name, t in cache.items()}     # [batch, pos, head, d_model]
            {'blocks.0.hook_q_input': (1, 5, 4, 64)}
        """
        b = self.backend
        if self.emulated_split_inputs:  # GPT-J on TL 4.x: the flags are not available, rebuild the points
            with emulated_edge_hooks(b, self.n_heads, split_inputs):
                yield self
            return
        offloaded = self.hf_model is not None and getattr(self.hf_model, "hf_device_map", None) and has_offloaded(b)
        saved = self.edge_hook_flags()
        attn_in = bool(getattr(b.cfg, "use_attn_in", False))
        try:
            if attn_in:
                b.set_use_attn_in(False)
            b.set_use_split_qkv_input(bool(split_inputs))
            b.set_use_attn_result(True)
            b.set_use_hook_mlp_in(True)
            # the per-head points read projection weights directly: offloaded blocks keep theirs while they run
            with resident_while_running(list(b.blocks)) if offloaded else contextlib.nullcontext():
                yield self
        finally:
            b.set_use_split_qkv_input(saved["use_split_qkv_input"])
            b.set_use_attn_result(saved["use_attn_result"])
            b.set_use_hook_mlp_in(saved["use_hook_mlp_in"])
            if attn_in:
                b.set_use_attn_in(True)

    def edge_hook_flags(self) -> dict[str, bool]:
        """The backend's current ``use_split_qkv_input`` / ``use_attn_result`` / ``use_hook_mlp_in`` flags.

        Returns:
            Flag name → value.
        """
        return {f: bool(getattr(self.backend.cfg, f, False)) for f in _EDGE_FLAGS}


__all__ = ["EdgeHooksMixin"]
