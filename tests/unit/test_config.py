"""The Config base: validation at construction, messages naming the CLI option, JSON round trip."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from tlcap.config import Config, check_bool, check_choice, check_float, check_int, check_sequence, check_str
from tlcap.errors import InvalidConfigError, UnknownNameError
from tlcap.intervene.rome import DEFAULT_PREFIXES, RomeConfig


@dataclass(frozen=True)
class _Inner(Config):
    steps: int = 20
    rule: str = "midpoint"

    def validate(self) -> None:
        check_int("steps", self.steps, min=1)
        check_choice("rule", self.rule, ("midpoint", "left"))


@dataclass(frozen=True)
class _Outer(Config):
    inner: _Inner = field(default_factory=_Inner)
    layers: tuple[int, ...] | None = None
    threshold: float = 0.2
    sigma: float = float("inf")

    def validate(self) -> None:
        if self.layers is not None:
            self._set("layers", check_sequence("layers", self.layers, item=lambda n, x: check_int(n, x, min=0, cli=None)))
        check_float("threshold", self.threshold, gt=0, le=1)
        check_float("sigma", self.sigma, gt=0, finite=False)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: check_int("steps", 0, min=1), "steps (--steps) must be >= 1, got 0"),
        (lambda: check_int("top_k", 5, max=3), "top_k (--top-k) must be <= 3, got 5"),
        (lambda: check_int("layer", -1, min=0, max=29), "layer (--layer) must be between 0 and 29, got -1"),
        (lambda: check_int("steps", 2.0), "steps (--steps) must be an integer, got 2.0"),
        (lambda: check_int("steps", True), "steps (--steps) must be an integer, got True"),
        (lambda: check_float("threshold", 1.5, gt=0, le=1), "threshold (--threshold) must be in (0, 1], got 1.5"),
        (lambda: check_float("threshold", 0, gt=0, le=1), "threshold (--threshold) must be in (0, 1], got 0"),
        (lambda: check_float("refine_p", 1.0, ge=0, lt=1), "refine_p (--refine-p) must be in [0, 1), got 1"),
        (lambda: check_float("sigma", -1.0, gt=0), "sigma (--sigma) must be > 0, got -1"),
        (lambda: check_float("lr", 2.0, lt=1), "lr (--lr) must be < 1, got 2"),
        (lambda: check_float("lr", float("nan")), "lr (--lr) must be a finite number, got nan"),
        (lambda: check_float("lr", "0.1"), "lr (--lr) must be a number, got '0.1'"),
        (lambda: check_str("prompt", "  "), "prompt (--prompt) must not be empty"),
        (lambda: check_bool("resume", 1), "resume (--resume) must be true or false, got 1"),
        (lambda: check_sequence("kinds", "mlp"), "kinds (--kinds) must be a list, got 'mlp'"),
        (lambda: check_sequence("kinds", [], min_len=1), "kinds (--kinds) must hold at least 1 item, got 0"),
        (lambda: check_sequence("kinds", ["a", "a"], unique=True), "kinds (--kinds) repeats 'a'; give each once"),
        (lambda: check_int("n", 0, min=1, cli="--n-facts"), "n (--n-facts) must be >= 1, got 0"),
        (lambda: check_int("cov_seq_len", 1, min=2, cli=None), "cov_seq_len must be >= 2, got 1"),
    ],
)
def test_check_messages(call, message):
    with pytest.raises(InvalidConfigError) as info:
        call()
    assert str(info.value) == message


def test_check_choice_is_an_unknown_name():
    with pytest.raises(UnknownNameError) as info:
        check_choice("rule", "mid", ("midpoint", "left"))
    assert str(info.value) == "unknown rule 'mid' (--rule); choose one of: midpoint, left"
    assert check_choice("rule", "left", ("midpoint", "left")) == "left"


def test_checks_return_the_canonical_value():
    assert check_float("lr", 1, gt=0) == 1.0 and isinstance(check_float("lr", 1, gt=0), float)
    assert check_sequence("layers", [3, 1], item=lambda n, x: check_int(n, x, min=0)) == (3, 1)
    with pytest.raises(InvalidConfigError, match=r"^layers\[1\] \(--layers\) must be >= 0, got -1$"):
        check_sequence("layers", [3, -1], item=lambda n, x: check_int(n, x, min=0))


def test_invalid_value_fails_at_construction_and_on_replace():
    with pytest.raises(InvalidConfigError, match=r"^steps \(--steps\) must be >= 1, got 0$"):
        _Inner(steps=0)
    cfg = _Inner(steps=3)
    with pytest.raises(InvalidConfigError):
        cfg.replace(steps=0)
    assert cfg.replace(rule="left") == _Inner(steps=3, rule="left")
    with pytest.raises(UnknownNameError, match="unknown _Inner field 'stepz'"):
        cfg.replace(stepz=2)


def test_resolve_applies_overrides_to_the_config_or_defaults():
    assert _Inner.resolve() == _Inner()
    assert _Inner.resolve(None, steps=4) == _Inner(steps=4)
    base = _Inner(rule="left")
    assert _Inner.resolve(base) is base
    assert _Inner.resolve(base, steps=7) == _Inner(steps=7, rule="left")
    with pytest.raises(InvalidConfigError, match="config must be a _Inner, got a _Outer"):
        _Inner.resolve(_Outer())


def test_json_round_trip_with_nested_config_tuples_and_infinity():
    cfg = _Outer(inner=_Inner(steps=5, rule="left"), layers=[2, 0], threshold=0.5)
    assert cfg.layers == (2, 0)  # canonicalised by validate()
    d = json.loads(json.dumps(cfg.to_dict()))
    assert d == {"inner": {"steps": 5, "rule": "left"}, "layers": [2, 0], "threshold": 0.5, "sigma": "inf"}
    again = _Outer.from_dict(d)
    assert again == cfg and isinstance(again.inner, _Inner) and again.layers == (2, 0)
    with pytest.raises(UnknownNameError):
        _Outer.from_dict({**d, "thresold": 0.1})
    with pytest.raises(InvalidConfigError):
        _Outer.from_dict({**d, "threshold": 2.0})


def test_rome_config_on_the_base():
    cfg = RomeConfig()
    assert cfg.prefixes == DEFAULT_PREFIXES
    assert RomeConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert RomeConfig(prefixes=("", "A. ")).prefixes == ("", "A. ")
    for kw, msg in [
        ({"steps": 0}, "steps (--steps) must be >= 1, got 0"),
        ({"lr": 0.0}, "lr (--lr) must be > 0, got 0"),
        ({"cov_tokens": 0}, "cov_tokens (--cov-tokens) must be >= 1, got 0"),
        ({"prefixes": ()}, "prefixes must hold at least 1 item, got 0"),
        ({"kl_prompt": "is a"}, "kl_prompt must contain {} (where the subject goes), got 'is a'"),
        ({"weight_decay": -0.1}, "weight_decay (--weight-decay) must be >= 0, got -0.1"),
    ]:
        with pytest.raises(InvalidConfigError) as info:
            RomeConfig(**kw)
        assert str(info.value) == msg, kw
