"""Which sequence positions an activation intervention acts at.

An intervention (suppress or enhance a neuron set, :mod:`tlcap.intervene.activations`) takes a
position spec ``pos``:

- ``"target"`` (the default): every position that *predicts a target token* of the run being
  scored. Knowledge neurons are located at those positions (the last prompt token, and with
  teacher forcing each later position that predicts the next target token), so that is where
  suppressing or enhancing them means what the attribution measured. The metric that runs the
  model declares these positions for the length of its run with :func:`predicting`
  (:func:`tlcap.metrics.token_probs` and :func:`~tlcap.metrics.target_prob` do); outside any
  declaration the run is a plain next-token prediction and ``"target"`` is the last position.
- ``"last"``: the last position only (the literal Dai et al. intervention; for a multi-token
  target it misses every predicting position but the last).
- ``"all"`` or ``None``: every position, prompt included.
- an int, a list of ints or a slice: those positions.

Example:
    >>> from tlcap.intervene.activations import suppress
    >>> from tlcap.metrics import NeuronSet
    >>> tokens = model.to_tokens("The capital of France is Paris.")     # 5 prompt tokens + " Paris", "."
    >>> neurons = NeuronSet(((1, 5), (1, 9)), shape=(model.n_layers, model.d_mlp))
    >>> prediction_positions(n_prompt=5, n_target=2)                    # positions 4 and 5
    slice(4, 6, None)
    >>> with predicting(prediction_positions(n_prompt=5, n_target=2)):
    ...     logits = model.logits(tokens, hooks=suppress(model, neurons))  # suppressed at 4 and 5
    >>> changed = (logits - model.logits(tokens)).abs().amax(-1)[0] > 0
    >>> changed.nonzero().flatten().tolist()            # layer 1 is the last: no later position reads them
    [4, 5]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from tlcap.errors import InvalidConfigError, UnknownNameError

Positions = int | slice | Sequence[int] | str | None
"""A position spec: ``"target"``, ``"last"``, ``"all"``/``None``, an int, a list or a slice."""

POSITION_NAMES: tuple[str, ...] = ("target", "last", "all")
_PREDICTING: ContextVar[int | slice | tuple[int, ...] | None] = ContextVar("tlcap_predicting_positions", default=None)


def prediction_positions(n_prompt: int, n_target: int) -> slice:
    """Positions that predict the target tokens in a teacher-forced run ``prompt + target[:-1]``.

    Position ``n_prompt - 1 + t`` predicts target token ``t``.

    Args:
        n_prompt: Tokens of the prompt (with its BOS, if any).
        n_target: Tokens of the target.

    Returns:
        ``slice(n_prompt - 1, n_prompt - 1 + n_target)``.
    """
    return slice(n_prompt - 1, n_prompt - 1 + n_target)


@contextmanager
def predicting(positions: int | slice | Sequence[int]) -> Iterator[None]:
    """Declare the positions that predict the scored target for the body of a ``with`` block.

    Interventions with ``pos="target"`` that fire inside the block act at these positions.
    Blocks nest (the innermost declaration holds); the previous one is restored on exit.

    Args:
        positions: An int, a slice or a list of positions of the run's sequence.

    Yields:
        ``None``; the declaration holds until the block exits.
    """
    value = tuple(int(p) for p in positions) if isinstance(positions, (list, tuple)) else positions
    token = _PREDICTING.set(value)
    try:
        yield
    finally:
        _PREDICTING.reset(token)


def check_positions(pos: Positions) -> Positions:
    """Check a position spec (names, kinds); returns it.

    Args:
        pos: ``"target"``, ``"last"``, ``"all"``, ``None`` (every position), an int, a list of ints or a slice.

    Returns:
        ``pos`` unchanged, except a list becomes a tuple.

    Raises:
        UnknownNameError: a string other than ``"target"``, ``"last"``, ``"all"``.
        InvalidConfigError: any other kind of value.
    """
    if isinstance(pos, str):
        if pos not in POSITION_NAMES:
            raise UnknownNameError.of("position", pos, POSITION_NAMES)
        return pos
    if pos is None or isinstance(pos, (int, slice)) and not isinstance(pos, bool):
        return pos
    if isinstance(pos, (list, tuple)) and all(isinstance(p, int) and not isinstance(p, bool) for p in pos):
        return tuple(pos)
    raise InvalidConfigError(f"pos must be 'target', 'last', 'all', None, an int, a list of ints or a slice, got {pos!r}")


def resolve_positions(pos: Positions) -> int | slice | list[int] | None:
    """The positions a spec means now (``"target"`` looks up the declared positions).

    Returns:
        An index usable on the position axis: ``-1`` for ``"last"``, ``None`` for every
        position, an int, a slice or a list.

    Args:
        pos: A position spec accepted by :func:`check_positions`; ``"target"`` is the innermost :func:`predicting`
            declaration, or the last position when none is active.
    """
    if pos == "target":
        declared = _PREDICTING.get()
        if declared is None:
            return -1
        return list(declared) if isinstance(declared, tuple) else declared
    if pos == "last":
        return -1
    if pos == "all" or pos is None:
        return None
    return list(pos) if isinstance(pos, tuple) else pos  # type: ignore[return-value]


__all__ = ["POSITION_NAMES", "Positions", "check_positions", "predicting", "prediction_positions", "resolve_positions"]
