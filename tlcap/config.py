"""Method-family configs: frozen, validated at construction, JSON round-trippable.

A family config holds the hyper-parameters that define a result (what a re-run needs to give
the same numbers), not run-time plumbing (progress bars, checkpoint folders, batch sizes that do
not change the result may go either way). Write one as a frozen dataclass subclass of
:class:`Config` and check every field in :meth:`Config.validate` with the ``check_*`` helpers;
an invalid value then fails at construction, before any model load or forward pass, with an
:class:`~tlcap.errors.InvalidConfigError` naming the field and its CLI option::

    steps (--steps) must be >= 1, got 0

The CLI option of a field is ``--`` + the field name with ``_`` → ``-`` (typer's spelling);
pass ``cli=`` to a helper when a command spells it otherwise, ``cli=None`` for API-only fields.

Example:
    >>> @dataclass(frozen=True)
    ... class IGConfig(Config):
    ...     steps: int = 20
    ...     rule: str = "midpoint"
    ...
    ...     def validate(self) -> None:
    ...         check_int("steps", self.steps, min=1)
    ...         check_choice("rule", self.rule, ("midpoint", "left", "linspace", "trapezoid"))
    >>> cfg = IGConfig.resolve(None, steps=5)          # defaults + keyword overrides
    >>> cfg
    IGConfig(steps=5, rule='midpoint')
    >>> cfg.replace(steps=0)
    Traceback (most recent call last):
    ...
    tlcap.errors.InvalidConfigError: steps (--steps) must be >= 1, got 0
    >>> IGConfig.from_dict(cfg.to_dict()) == cfg
    True
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from tlcap.config_json import default_of, from_json, jsonable
from tlcap.errors import InvalidConfigError, UnknownNameError

C = TypeVar("C", bound="Config")
_DEFAULT = object()


def cli_option(name: str) -> str:
    """``"cov_tokens"`` → ``"--cov-tokens"`` (typer's spelling); ``"layers[2]"`` → ``"--layers"``.

    Args:
        name: A config field name, possibly indexed (``"layers[2]"``).

    Returns:
        The option's typer spelling: ``--`` plus the name without its index, underscores as dashes.
    """
    return "--" + name.split("[", 1)[0].replace("_", "-")


def _label(name: str, cli: str | None | object) -> str:
    opt = cli_option(name) if cli is _DEFAULT else cli
    return f"{name} ({opt})" if opt else name


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def check_int(name: str, value: Any, *, min: int | None = None, max: int | None = None, cli: Any = _DEFAULT) -> int:
    """Check an integer (``bool`` is refused) in ``[min, max]``; returns it as ``int``.

    Args:
        name: Field name, used in the error message.
        value: The value to check.
        min: Smallest allowed value (``None``: no lower bound).
        max: Largest allowed value (``None``: no upper bound).
        cli: CLI spelling shown in the message (default ``--name``; ``None`` shows none).

    Returns:
        ``value`` as a plain ``int``.

    Raises:
        InvalidConfigError: ``steps (--steps) must be >= 1, got 0``.
    """
    label = _label(name, cli)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidConfigError(f"{label} must be an integer, got {value!r}")
    v = int(value)
    if min is not None and max is not None and not min <= v <= max:
        raise InvalidConfigError(f"{label} must be between {min} and {max}, got {v}")
    if min is not None and v < min:
        raise InvalidConfigError(f"{label} must be >= {min}, got {v}")
    if max is not None and v > max:
        raise InvalidConfigError(f"{label} must be <= {max}, got {v}")
    return v


def check_layers_below(name: str, layers: Any, n_layers: int, model_name: str, *, cli: Any = _DEFAULT) -> None:
    """Check that every layer in ``layers`` (an int or a sequence) exists in a model of ``n_layers`` layers.

    Args:
        name: Field name, used in the error message.
        layers: A layer index or a sequence of them (``None`` checks nothing).
        n_layers: The model's number of layers.
        model_name: The model's name, used in the error message.
        cli: CLI spelling shown in the message (default ``--name``; ``None`` shows none).

    Raises:
        InvalidConfigError: ``layers (--layers) [2, 3] out of range for gpt2-tiny (2 layers: 0..1)``.
    """
    values = [layers] if isinstance(layers, numbers.Integral) else list(layers or ())
    bad = [int(v) for v in values if int(v) >= n_layers]
    if bad:
        shown = bad[0] if isinstance(layers, numbers.Integral) else bad
        raise InvalidConfigError(f"{_label(name, cli)} {shown} out of range for {model_name} ({n_layers} layers: "
                                 f"0..{n_layers - 1})")


def check_float(
    name: str,
    value: Any,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
    finite: bool = True,
    cli: Any = _DEFAULT,
) -> float:
    """Check a real number against open (``gt``/``lt``) and closed (``ge``/``le``) bounds.

    Ints are accepted; NaN is always refused, infinities unless ``finite=False``.

    Args:
        name: Field name, used in the error message.
        value: The value to check (an int or a float; ``bool`` is refused).
        gt: Exclusive lower bound, or ``None``.
        ge: Inclusive lower bound, or ``None`` (ignored in the message when ``gt`` is given).
        lt: Exclusive upper bound, or ``None``.
        le: Inclusive upper bound, or ``None`` (ignored in the message when ``lt`` is given).
        finite: Refuse infinities too.
        cli: CLI spelling shown in the message (default ``--name``; ``None`` shows none).

    Returns:
        ``value`` as a ``float``.

    Raises:
        InvalidConfigError: ``threshold (--threshold) must be in (0, 1], got 1.5``.
    """
    label = _label(name, cli)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidConfigError(f"{label} must be a number, got {value!r}")
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise InvalidConfigError(f"{label} must be a finite number, got {v}")
    low = (gt, "(") if gt is not None else (ge, "[") if ge is not None else None
    high = (lt, ")") if lt is not None else (le, "]") if le is not None else None
    ok = (gt is None or v > gt) and (ge is None or v >= ge) and (lt is None or v < lt) and (le is None or v <= le)
    if ok:
        return v
    if low and high:
        raise InvalidConfigError(f"{label} must be in {low[1]}{_fmt(low[0])}, {_fmt(high[0])}{high[1]}, got {_fmt(v)}")
    if low:
        raise InvalidConfigError(f"{label} must be {'>' if low[1] == '(' else '>='} {_fmt(low[0])}, got {_fmt(v)}")
    assert high is not None
    raise InvalidConfigError(f"{label} must be {'<' if high[1] == ')' else '<='} {_fmt(high[0])}, got {_fmt(v)}")


def check_choice(name: str, value: Any, choices: Collection[Any], *, cli: Any = _DEFAULT) -> Any:
    """Check that ``value`` is one of ``choices``; returns it.

    Args:
        name: Field name, used in the error message.
        value: The value to check.
        choices: The allowed values (listed in the message when ``value`` is not one).
        cli: CLI spelling shown in the message (default ``--name``; ``None`` shows none).

    Returns:
        ``value`` unchanged.

    Raises:
        UnknownNameError: ``unknown rule 'mid' (--rule); choose one of: midpoint, left, ...``
            (an :class:`InvalidConfigError`).
    """
    if value not in choices:
        opt = cli_option(name) if cli is _DEFAULT else cli
        raise UnknownNameError.of(name, value, choices, option=opt)
    return value


def check_str(name: str, value: Any, *, nonempty: bool = True, cli: Any = _DEFAULT) -> str:
    """Check a string (non-empty, not only whitespace, unless ``nonempty=False``); returns it.

    Args:
        name: Field name, used in the error message.
        value: The value to check.
        nonempty: Refuse an empty or whitespace-only string.
        cli: CLI spelling shown in the message (default ``--name``; ``None`` shows none).

    Returns:
        ``value`` unchanged.

    Raises:
        InvalidConfigError: ``value`` is not a string, or is blank while ``nonempty``.
    """
    label = _label(name, cli)
    if not isinstance(value, str):
        raise InvalidConfigError(f"{label} must be a string, got {value!r}")
    if nonempty and not value.strip():
        raise InvalidConfigError(f"{label} must not be empty")
    return value


def check_bool(name: str, value: Any, *, cli: Any = _DEFAULT) -> bool:
    """Check a ``bool`` (0/1 and strings are refused).

    Args:
        name: Field name, used in the error message.
        value: The value to check.
        cli: CLI spelling shown in the message (default ``--name``; ``None`` shows none).

    Returns:
        ``value`` unchanged.

    Raises:
        InvalidConfigError: ``value`` is not a ``bool``.
    """
    if not isinstance(value, bool):
        raise InvalidConfigError(f"{_label(name, cli)} must be true or false, got {value!r}")
    return value


def check_sequence(
    name: str,
    value: Any,
    *,
    min_len: int = 0,
    max_len: int | None = None,
    item: Callable[[str, Any], Any] | None = None,
    unique: bool = False,
    cli: Any = _DEFAULT,
) -> tuple[Any, ...]:
    """Check a list/tuple (a bare string is refused) and each item; returns it as a tuple.

    Args:
        name: Field name.
        value: The sequence.
        min_len: Fewest items.
        max_len: Most items.
        item: Checker called as ``item(f"{name}[{i}]", x)`` for each item (e.g.
            ``lambda n, x: check_int(n, x, min=0, cli=None)``); its return value replaces the item.
        unique: Refuse repeated items.
        cli: CLI spelling (default ``--name``).

    Returns:
        The items as a tuple, each replaced by ``item``'s return value when ``item`` is given.
    """
    label = _label(name, cli)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidConfigError(f"{label} must be a list, got {value!r}")
    out = tuple(item(f"{name}[{i}]", x) if item is not None else x for i, x in enumerate(value))
    if len(out) < min_len:
        raise InvalidConfigError(f"{label} must hold at least {min_len} item{'s' if min_len != 1 else ''}, got {len(out)}")
    if max_len is not None and len(out) > max_len:
        raise InvalidConfigError(f"{label} must hold at most {max_len} items, got {len(out)}")
    if unique and len(set(out)) != len(out):
        dup = sorted({x for x in out if out.count(x) > 1}, key=str)
        raise InvalidConfigError(f"{label} repeats {', '.join(map(repr, dup))}; give each once")
    return out


@dataclass(frozen=True)
class Config:
    """Base of method-family configs (frozen dataclasses validated in ``__post_init__``).

    Subclasses are ``@dataclass(frozen=True)`` with defaults for every field and override
    :meth:`validate`. Construction, :meth:`replace`, :meth:`resolve` and :meth:`from_dict` all
    validate, so a config that exists is valid.
    """

    shared_fields: ClassVar[tuple[str, ...]] = ()
    """Settings of this config that its nested configs also have (``seed``, ``bos``): one value,
    set here only. Construction copies it into each nested config that still has its own default
    there; a nested config with another value is refused (:meth:`replace` and :meth:`resolve` keep
    them in step)."""

    def __post_init__(self) -> None:
        self._share()
        self.validate()

    def _share(self) -> None:
        """Copy each :attr:`shared_fields` field into the nested configs that have it (class docstring)."""
        for name in type(self).shared_fields:
            value = getattr(self, name)
            for fname, sub in self.nested().items():
                if name not in sub.field_names() or getattr(sub, name) == value:
                    continue
                own = getattr(sub, name)
                if own != default_of(type(sub), name):
                    raise InvalidConfigError(
                        f"{name} is one setting of {type(self).__name__}: set {name}={own!r} there, not "
                        f"{fname}.{name} (it has {name}={value!r})")
                self._set(fname, dataclasses.replace(sub, **{name: value}))

    def validate(self) -> None:
        """Raise :class:`InvalidConfigError` for any invalid field (override; call ``check_*``).

        A subclass may canonicalise a field here with ``self._set(name, value)`` (e.g. a list
        given for a tuple field), since the dataclass is frozen.
        """

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The names of the dataclass fields of this config, in declaration order.

        Returns:
            A tuple of field names.
        """
        return tuple(f.name for f in dataclasses.fields(cls))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict of every field (tuples → lists, nested configs → dicts).

        Returns:
            ``{field name: JSON-safe value}`` for every field, accepted back by :meth:`from_dict`.
        """
        return {f.name: jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Rebuild a config from :meth:`to_dict` output (validated; unknown keys refused).

        Args:
            data: ``{field name: value}`` as :meth:`to_dict` writes it (a subset; missing fields keep their defaults).

        Returns:
            A validated instance of ``cls``.
        """
        unknown = sorted(set(data) - set(cls.field_names()))
        if unknown:
            raise UnknownNameError.of(f"{cls.__name__} field", unknown[0], cls.field_names(), option=None)
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            kwargs[name] = from_json(hints.get(name), value)
        return cls(**kwargs)

    def replace(self: C, **changes: Any) -> C:
        """A copy with ``changes`` applied, validated again.

        Args:
            **changes: ``field=value`` for fields of this config; a changed shared field also changes in the nested
                configs that still follow it.

        Returns:
            A new validated config of the same class.
        """
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise UnknownNameError.of(f"{type(self).__name__} field", unknown[0], self.field_names(), option=None)
        for name in type(self).shared_fields:  # a shared setting changes in the nested configs that follow it
            if name not in changes:
                continue
            for fname, sub in self.nested().items():
                base = changes.get(fname, sub)
                if isinstance(base, Config) and name in base.field_names() and getattr(base, name) == getattr(self, name):
                    changes[fname] = dataclasses.replace(base, **{name: changes[name]})
        return dataclasses.replace(self, **changes)

    @classmethod
    def resolve(cls: type[C], config: C | None = None, **overrides: Any) -> C:
        """The config a function runs with: ``config`` (default: ``cls()``) with ``overrides``.

        An override names a field of this config (``threshold=0.3``), a field of a nested config
        (a field whose value is a :class:`Config`) dotted (``ig__steps`` or, through ``**{...}``,
        ``"ig.steps"``), or flat when exactly one nested config owns the name (``steps=10`` goes
        to ``ig``). The one way family functions take their settings::

            def integrated_gradients(model, prompt, target, *, config=None, progress=True, **overrides):
                cfg = IGConfig.resolve(config, **overrides)

        Args:
            config: The base config (default: ``cls()``).
            **overrides: Fields to change (flat, dotted or ``__``-separated).

        Returns:
            The validated config.

        Raises:
            InvalidConfigError: ``config`` of another type, or an invalid value.
            UnknownNameError: an override no field owns, or a flat name two nested configs own.

        Example:
            >>> from tlcap.experiments.knowledge_neurons import KNConfig
            >>> cfg = KNConfig.resolve(threshold=0.3, steps=5, **{"ig.rule": "left"})
            >>> cfg.threshold, cfg.ig.steps, cfg.ig.rule
            (0.3, 5, 'left')
        """
        if config is not None and not isinstance(config, cls):
            raise InvalidConfigError(f"config must be a {cls.__name__}, got a {type(config).__name__}")
        base = config if config is not None else cls()
        return base.with_overrides(overrides) if overrides else base

    def nested(self) -> dict[str, Config]:
        """The fields whose values are configs (``{"ig": IGConfig(...)}`` for a ``KNConfig``).

        Returns:
            Field name → nested config.
        """
        return {f.name: v for f in dataclasses.fields(self) if isinstance(v := getattr(self, f.name), Config)}

    def with_overrides(self: C, overrides: dict[str, Any]) -> C:
        """A copy with ``overrides`` routed as :meth:`resolve` describes, validated again.

        Args:
            overrides: Field (flat, dotted or ``__``-separated) → value.

        Returns:
            The new config.

        Raises:
            UnknownNameError: an override no field owns, or a flat name two nested configs own.
        """
        own: dict[str, Any] = {}
        inner: dict[str, dict[str, Any]] = {}
        nested = self.nested()
        for key, value in overrides.items():
            head, sep, rest = key.replace("__", ".").partition(".")
            if sep:
                if rest in type(self).shared_fields:
                    raise UnknownNameError(f"{type(self).__name__}: {rest!r} is one setting here, shared by its nested "
                                           f"configs; write {rest}= instead of {head}.{rest}")
                if head not in nested:
                    raise UnknownNameError.of(f"{type(self).__name__} nested config", head, list(nested), option=None)
                inner.setdefault(head, {})[rest] = value
            elif key in self.field_names():
                own[key] = value
            else:
                owners = [n for n, c in nested.items() if c.owns(key)]
                if len(owners) > 1:
                    raise UnknownNameError(f"{type(self).__name__}: {key!r} is a field of {' and '.join(owners)}; "
                                           f"write {owners[0]}.{key}")
                if not owners:
                    names = [*self.field_names(), *(f"{n}.{f}" for n, c in nested.items() for f in c.field_names())]
                    raise UnknownNameError.of(f"{type(self).__name__} field", key, names, option=None)
                inner.setdefault(owners[0], {})[key] = value
        for name, sub in inner.items():
            base = own.get(name, nested[name])
            own[name] = base.with_overrides(sub) if isinstance(base, Config) else base
        return self.replace(**own) if own else self

    def owns(self, name: str) -> bool:
        """Whether ``name`` is a field of this config or, flat, of one of its nested configs.

        Args:
            name: A field name.

        Returns:
            True when :meth:`resolve` can route ``name``.
        """
        return name in self.field_names() or any(c.owns(name) for c in self.nested().values())


def check_nested(config: Config, **types_: type) -> None:
    """Check that each named field of ``config`` holds a config of the given type.

    Args:
        config: The config being validated.
        **types_: Field name → the :class:`Config` subclass it must hold.

    Raises:
        InvalidConfigError: a field holding something else.

    Example:
        >>> from tlcap.experiments.knowledge_neurons import KNConfig
        >>> from tlcap.attribution import IGConfig
        >>> check_nested(KNConfig(), ig=IGConfig)
    """
    for name, cls in types_.items():
        value = getattr(config, name)
        if not isinstance(value, cls):
            raise InvalidConfigError(f"{name} must be a {cls.__name__}, got a {type(value).__name__}")


__all__ = [
    "Config", "check_int", "check_float", "check_choice", "check_str", "check_bool", "check_sequence", "cli_option",
    "check_layers_below", "check_nested",
]
