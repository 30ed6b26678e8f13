"""A scope in which the model's weights do not change, and values computed from them once.

Some checks read a value of the weights back to the host on every call — whether the read-out has a bias,
the spread of the subject embeddings a causal trace's noise is scaled by. Each read is a host round trip on
a GPU (:mod:`tlcap.runtime.host_syncs`), and the batched methods make these calls once per batch or per fact.
Inside :func:`weights_fixed` such a value is computed once (:func:`once`); outside it, every time, so a
weight edited between two calls is always seen.

Example:
    >>> calls = []
    >>> def nu():
    ...     calls.append(1)
    ...     return 0.5
    >>> with weights_fixed():
    ...     [once(("nu", 0), nu) for _ in range(3)]
    [0.5, 0.5, 0.5]
    >>> len(calls), once(("nu", 0), nu), len(calls)   # outside the block: computed again
    (1, 0.5, 2)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")
_SCOPE: ContextVar[dict[Hashable, Any] | None] = ContextVar("tlcap_weights_fixed", default=None)


@contextlib.contextmanager
def weights_fixed() -> Iterator[None]:
    """Within the block the model's weights do not change: :func:`once` computes each value once.

    Blocks nest (the outermost one holds the values). Do not edit weights inside one.

    Returns:
        A context manager.
    """
    token = _SCOPE.set({}) if _SCOPE.get() is None else None
    try:
        yield
    finally:
        if token is not None:
            _SCOPE.reset(token)


def once(key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()``, once per :func:`weights_fixed` block and ``key`` (every call outside a block).

    Args:
        key: What the value is of (include the ``id`` of the tensors it reads: they live as long as the block).
        compute: Computes the value.

    Returns:
        The value.
    """
    scope = _SCOPE.get()
    if scope is None:
        return compute()
    if key not in scope:
        scope[key] = compute()
    return scope[key]


__all__ = ["once", "weights_fixed"]
