"""Recording activations: early-stopping ``record``, last-position activations, ``run_with_cache``.

:class:`tlcap.models.Model` mixes :class:`RecordingMixin` in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.errors import TlcapError
from tlcap.models.cache import PrefixCache
from tlcap.models.token_types import Tokens
from tlcap.runtime import hooks as H
from tlcap.runtime.hooks import HookFn, HookList


class RecordingMixin:
    """Activation recording of :class:`tlcap.models.Model` (see the class for attributes)."""

    backend: Any
    logits: Callable[..., Tensor]
    _run: Callable[..., Tensor]
    last_logits: Callable[..., Tensor]

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
            >>> toks = model.to_tokens("The capital of France is")
            >>> acts = model.record(toks, [model.hook_name("mlp_post", l) for l in (0, 1)])
            >>> {name: tuple(a.shape) for name, a in acts.items()}    # [batch, pos, d_mlp]
            {'blocks.0.mlp.hook_post': (1, 5, 256), 'blocks.1.mlp.hook_post': (1, 5, 256)}
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
            self._run(tokens, fwd, prefix, None, None)
        except H.StopForward:
            pass
        if pending:
            where = f"before the pass stopped at {stop_after!r}" if stop_after else "in the forward pass"
            raise TlcapError(
                f"Hook points {sorted(pending)} did not fire {where}; check the names (model.hook_name(site, layer))."
            )
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

        Args:
            tokens: ``[batch, pos]`` token ids (a 1-D tensor is one row).
            hook_names: Hook points recorded.
            hooks: Activation interventions applied during the forward.
            prefix: Cached keys/values the tokens continue.

        Returns:
            ``[batch, n_hooks, d]`` activations (hooks in ``hook_names`` order) and ``[batch, d_vocab]`` logits.
        """
        if isinstance(tokens, Tensor) and tokens.ndim == 1:
            tokens = tokens[None]
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
        """Forward pass recording the given hook points (all if ``names`` is None).

        Args:
            tokens: ``[batch, pos]`` token ids (a 1-D tensor is one row).
            names: Hook names, a predicate on hook names, or None for every hook point.
            hooks: Activation interventions applied during the forward.

        Returns:
            ``[batch, pos, d_vocab]`` logits and hook name → recorded activation.
        """
        if isinstance(tokens, Tensor) and tokens.ndim == 1:
            tokens = tokens[None]
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


__all__ = ["RecordingMixin"]
