"""Key/value caches of token prefixes, reusable by any number of later forward passes.

A :class:`PrefixCache` holds the keys and values of ``rows`` prefix rows (built by
:meth:`tlcap.models.Model.prefix_cache` from a ``[rows, n_tokens]`` token tensor).
:meth:`PrefixCache.expanded` gives a fresh backend cache for a batch of ``batch = rows · k``
rows in which **each prefix row is repeated k times, consecutively** (``repeat_interleave``):
row ``i`` of the batch continues prefix row ``i // k``. A one-row cache therefore serves a batch
of any size, and a cache with one row per noise sample serves "sample-major" batches (all rows
of sample 0, then all rows of sample 1, ...).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from torch import Tensor
from transformers import DynamicCache

from tlcap.errors import ShapeMismatchError

if TYPE_CHECKING:
    from tlcap.models.adapter import Model


def full_cache() -> Any:
    """An empty HF cache whose layers keep every position (no sliding-window layer drops old keys).

    Prefix caches are built on it: a sliding layer of a config-built cache keeps only the last
    ``window - 1`` positions, which loses the keys of shorter prefixes padded to a longer one.
    The window itself is applied by the attention mask.

    Returns:
        An empty ``DynamicCache``.
    """
    return DynamicCache()


def fresh_cache(cache: Any, rows: Tensor | None = None) -> Any:
    """A TransformerBridge (HF) cache that a run may append to, sharing the stored keys/values.

    HF appends by ``torch.cat`` into the layer objects, so copies of the cache and of its layers
    keep the stored cache intact without copying any tensor (``rows``: keep those batch rows).

    Args:
        cache: The stored HF cache.
        rows: Batch rows to keep (index tensor); None: all.

    Returns:
        A shallow copy of ``cache`` with copied layer objects.
    """
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    if rows is not None:
        for layer in out.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                idx = rows.to(layer.keys.device)  # each layer's cache sits on that layer's device
                layer.keys, layer.values = layer.keys[idx], layer.values[idx]
    return out


class PrefixCache:
    """A key/value cache of ``rows`` token prefixes of ``n_tokens`` tokens each (module docstring).

    Attributes:
        model: The model the cache belongs to.
        cache: The backend's cache object (HF ``DynamicCache`` on a ``TransformerBridge``,
            ``HookedTransformerKeyValueCache`` on TL 3.9), or ``None`` for an empty prefix.
        n_tokens: Prefix length.
        rows: Number of prefix rows.
    """

    def __init__(self, model: Model, cache: Any, n_tokens: int, rows: int = 1):
        self.model = model
        self.cache = cache
        self.n_tokens = n_tokens
        self.rows = rows

    def __repr__(self) -> str:
        return f"PrefixCache(rows={self.rows}, n_tokens={self.n_tokens})"

    def repeats(self, batch: int) -> int:
        """``k = batch / rows``: how many consecutive batch rows continue each prefix row.

        Args:
            batch: Rows of the batch run after the prefix.

        Returns:
            ``k``, ``>= 1``.

        Raises:
            ShapeMismatchError: ``batch`` is not a multiple of :attr:`rows`.
        """
        if batch < 1 or batch % self.rows:
            raise ShapeMismatchError(
                f"A prefix cache of {self.rows} rows serves batches of a multiple of {self.rows} rows "
                f"(each prefix row repeated k times), not {batch}."
            )
        return batch // self.rows

    def expanded(self, batch: int, from_layer: int = 0) -> Any:
        """A fresh backend cache of ``batch`` rows, prefix row ``i // k`` in row ``i`` (``k = batch / rows``).

        The stored cache stays intact, so one prefix serves any number of calls. A one-row
        cache is expanded as broadcast views (no copy until the backend appends to it).

        Args:
            batch: Rows of the batch that continues the prefix (a multiple of :attr:`rows`).
            from_layer: Bridge only: layers below it keep :attr:`rows` rows, for runs that
                expand the batch at that layer (``Model.logits(expand_at=...)``).

        Returns:
            The backend cache object, to pass as ``past`` to :meth:`tlcap.models.Model.forward`.
        """
        k = self.repeats(batch)
        c = fresh_cache(self.cache) if self.model.is_bridge else copy.deepcopy(self.cache)
        if self.model.is_bridge:
            if k == 1:
                return c
            for i, layer in enumerate(c.layers):
                if i < from_layer or getattr(layer, "keys", None) is None or not layer.keys.numel():
                    continue
                if self.rows == 1:
                    # Broadcast views, not copies: HF concatenates the new keys/values onto them,
                    # which materialises each layer's batch exactly once.
                    layer.keys = layer.keys.expand(batch, *layer.keys.shape[1:])
                    layer.values = layer.values.expand(batch, *layer.values.shape[1:])
                else:
                    layer.batch_repeat_interleave(k)
            return c
        for entry in c.entries:
            entry.past_keys = entry.past_keys.repeat_interleave(k, 0)
            entry.past_values = entry.past_values.repeat_interleave(k, 0)
        c.previous_attention_mask = c.previous_attention_mask.repeat_interleave(k, 0)
        return c


__all__ = ["PrefixCache", "fresh_cache", "full_cache"]
