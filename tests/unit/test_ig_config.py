"""IGConfig: validation before any forward pass, and ``config=`` equal to keyword overrides."""

from __future__ import annotations

import pytest
import torch

from tlcap.attribution import IGConfig, integrated_gradients
from tlcap.attribution.amig import amig
from tlcap.attribution.methods import localize
from tlcap.errors import InvalidConfigError, UnknownNameError

PROMPT, TARGET = "The capital of France is", " Paris"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"steps": 0}, "steps (--steps) must be >= 1, got 0"),
        ({"batch_rows": 0}, "batch_rows (--batch-rows) must be >= 1, got 0"),
        ({"layers": (0, 0)}, "layers (--layers) repeats 0; give each once"),
        ({"layers": (-1,)}, "layers[0] (--layers) must be >= 0, got -1"),
    ],
)
def test_invalid_settings_fail_at_construction(kw: dict, message: str) -> None:
    with pytest.raises(InvalidConfigError) as err:
        IGConfig(**kw)
    assert str(err.value) == message


def test_unknown_rule_and_method_are_named_errors(tiny_gpt2) -> None:
    with pytest.raises(UnknownNameError, match="--rule"):
        integrated_gradients(tiny_gpt2, PROMPT, TARGET, rule="simpson")
    with pytest.raises(UnknownNameError, match="--method"):
        localize(tiny_gpt2, PROMPT, TARGET, method="lrp")
    with pytest.raises(UnknownNameError):
        integrated_gradients(tiny_gpt2, PROMPT, TARGET, no_such_field=1)


def test_layer_beyond_the_model_is_refused(tiny_gpt2) -> None:
    with pytest.raises(InvalidConfigError, match="must be below 2"):
        integrated_gradients(tiny_gpt2, PROMPT, TARGET, layers=(5,))


def test_config_equals_keyword_overrides(tiny_llama) -> None:
    cfg = IGConfig(steps=4, rule="left", layers=(1,))
    a = integrated_gradients(tiny_llama, PROMPT, TARGET, config=cfg)
    b = integrated_gradients(tiny_llama, PROMPT, TARGET, steps=4, rule="left", layers=[1])
    c = integrated_gradients(tiny_llama, PROMPT, TARGET, config=IGConfig(steps=9), steps=4, rule="left", layers=(1,))
    assert torch.equal(a.scores, b.scores) and torch.equal(a.scores, c.scores)
    assert a.scores[0].abs().sum() == 0 and a.scores[1].abs().sum() > 0
    m = amig(tiny_llama, PROMPT, TARGET, config=cfg)
    assert m.steps == 4 and m.rule == "left"


def test_kn_config_composes_ig_config() -> None:
    from tlcap.experiments.knowledge_neurons import KNConfig

    cfg = KNConfig.resolve(None, steps=7, rule="left", threshold=0.3)
    assert cfg.ig == IGConfig(steps=7, rule="left") and cfg.threshold == 0.3
    again = KNConfig.resolve(cfg, site="mlp_pre")
    assert again.ig == IGConfig(steps=7, rule="left", site="mlp_pre") and again.threshold == 0.3
    assert KNConfig.from_dict(cfg.to_dict()) == cfg and cfg.to_dict()["ig"]["steps"] == 7
    with pytest.raises(InvalidConfigError) as err:
        KNConfig.resolve(None, steps=0)
    assert str(err.value) == "steps (--steps) must be >= 1, got 0"
    with pytest.raises(UnknownNameError):
        KNConfig.resolve(None, stepz=3)


def test_quadrature_errors_are_named() -> None:
    from tlcap.attribution import quadrature

    with pytest.raises(InvalidConfigError) as err:
        quadrature(0)
    assert str(err.value) == "steps (--steps) must be >= 1, got 0"
    with pytest.raises(UnknownNameError, match="unknown rule 'simpson' \\(--rule\\)"):
        quadrature(4, "simpson")
