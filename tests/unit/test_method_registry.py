"""The method registry (issue 27 item 2) and the nested config overrides (item 1).

``tlcap.localize`` must return exactly what each method's own function returns; a toy method added
the way ``docs/design.md`` ("Add a method") says is listed by ``tlcap methods`` and runs through
``tlcap localize``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import plotly.graph_objects as go
import pytest
import torch
from jaxtyping import Float
from torch import Tensor

import tlcap
from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.attribution import integrated_gradients
from tlcap.attribution.config import IGConfig
from tlcap.config import Config
from tlcap.errors import InvalidConfigError, UnknownNameError
from tlcap.experiments.knowledge_neurons import KNConfig, locate_knowledge_neurons
from tlcap.locate.causal_trace import causal_trace
from tlcap.locate.circuits import knowledge_circuit
from tlcap.method_registry import Method, get_method, method_names, register, unregister
from tlcap.results import Result, load_result

pytestmark = pytest.mark.usefixtures("one_thread")

FACT = ("The capital of France is", " Paris")


# ------------------------------------------------------------------ nested overrides

@dataclass(frozen=True)
class _Inner(Config):
    steps: int = 1
    shared: int = 0


@dataclass(frozen=True)
class _Other(Config):
    shared: int = 0
    width: int = 2


@dataclass(frozen=True)
class _Outer(Config):
    a: _Inner = field(default_factory=_Inner)
    b: _Other = field(default_factory=_Other)
    seed: int = 0


def test_flat_dotted_and_double_underscore_overrides_reach_the_config_that_owns_them():
    cfg = _Outer.resolve(seed=3, steps=7, width=5, **{"a.shared": 1}, b__shared=2)
    assert (cfg.seed, cfg.a.steps, cfg.a.shared, cfg.b.width, cfg.b.shared) == (3, 7, 1, 5, 2)
    base = _Outer(a=_Inner(steps=4, shared=9))
    again = _Outer.resolve(base, width=6)  # a given config keeps its nested values
    assert (again.a.steps, again.a.shared, again.b.width) == (4, 9, 6)
    kn = KNConfig.resolve(threshold=0.3, steps=5, **{"ig.rule": "left"})
    assert (kn.threshold, kn.ig.steps, kn.ig.rule) == (0.3, 5, "left")


def test_ambiguous_and_unknown_overrides_are_refused_by_name():
    with pytest.raises(UnknownNameError, match=r"'shared' is a field of a and b; write a.shared"):
        _Outer.resolve(shared=1)
    with pytest.raises(UnknownNameError, match=r"unknown _Outer field 'nope'; choose one of: a, b, seed, a.steps"):
        _Outer.resolve(nope=1)
    with pytest.raises(UnknownNameError, match=r"unknown _Outer nested config 'c'"):
        _Outer.resolve(**{"c.steps": 1})
    with pytest.raises(InvalidConfigError, match="steps"):
        KNConfig.resolve(steps=0)


# ------------------------------------------------------------------ built-in methods

def test_the_registry_lists_every_method_of_both_papers():
    assert method_names() == ("kn", "ig", "sig", "amig", "trace", "eap", "eap-ig", "cnl")
    for name in method_names():
        m = get_method(name)
        assert m.paper and m.cost and m.inputs and m.config_type() is not None
    assert get_method("eap-ig").resolve().steps == 5 and get_method("eap").resolve().steps == 1
    with pytest.raises(UnknownNameError, match="unknown method 'rome'; choose one of: kn, ig, sig"):
        get_method("rome")


def test_localize_returns_what_each_method_function_returns(tiny_gpt2):
    model = tiny_gpt2
    kn = tlcap.localize(model, FACT, "kn", steps=3, n_random=2, progress=False)
    ref = locate_knowledge_neurons(model, *FACT, config=KNConfig(ig=IGConfig(steps=3), n_random=2), progress=False)
    assert kn.neurons.to_list() == ref.neurons.to_list()
    torch.testing.assert_close(kn.scores, ref.scores, rtol=0, atol=0)
    assert kn.effects == ref.effects

    ig = tlcap.localize(model, {"prompt": FACT[0], "target": FACT[1]}, "ig", steps=4)
    torch.testing.assert_close(ig.scores, integrated_gradients(model, *FACT, steps=4).scores, rtol=0, atol=0)

    tr = tlcap.localize(model, ("The capital of France is", "France", " Paris"), "trace", samples=2, kinds=("mlp",))
    tr_ref = causal_trace(model, "The capital of France is", "France", " Paris", samples=2, kinds=("mlp",))
    torch.testing.assert_close(tr.scores, tr_ref.scores, rtol=0, atol=0)

    kc = tlcap.localize(model, (*FACT, "The capital of Italy is"), "eap", top_n=20)
    kc_ref = knowledge_circuit(model, *FACT, "The capital of Italy is", top_n=20)
    assert kc.summary() == kc_ref.summary()


def test_method_data_mistakes_are_refused_before_any_forward(tiny_gpt2):
    with pytest.raises(InvalidConfigError, match=r"method 'trace' needs subject in its data"):
        tlcap.localize(tiny_gpt2, {"prompt": "The capital of France is"}, "trace")
    with pytest.raises(InvalidConfigError, match=r"takes the data fields prompt, target, paraphrases; got 'subject'"):
        tlcap.localize(tiny_gpt2, {"prompt": "a", "target": " b", "subject": "a"}, "kn")
    with pytest.raises(InvalidConfigError, match="eap scores edges with one gradient"):
        tlcap.localize(tiny_gpt2, FACT, "eap", steps=3)
    with pytest.raises(UnknownNameError, match="unknown EAPConfig field 'samples'"):
        tlcap.localize(tiny_gpt2, FACT, "eap-ig", samples=3)


# ------------------------------------------------------------------ a toy method, as docs/design.md adds one

@dataclass(frozen=True)
class LastActivations(Result):
    """The toy method's result: the MLP activations at the prompt's last position."""

    prompt: str
    scores: Float[Tensor, "layer neuron"]

    def summary(self) -> dict:
        flat = int(self.scores.abs().argmax())
        return {"prompt": self.prompt, "top_layer": flat // self.scores.shape[1], "top_neuron": flat % self.scores.shape[1]}

    def to_frame(self):
        import pandas as pd
        return pd.DataFrame({"layer": [self.summary()["top_layer"]], "neuron": [self.summary()["top_neuron"]]})

    def figure(self) -> go.Figure:
        return go.Figure(go.Heatmap(z=self.scores.numpy()))


@dataclass(frozen=True)
class LastActivationsConfig(Config):
    scale: float = 1.0


def last_activations(model, *, config, progress, prompt):
    """The toy method: ``scale`` × the ``mlp_post`` activations at the last prompt position."""
    names = [model.hook_name("mlp_post", l) for l in range(model.n_layers)]
    rec = model.record(model.to_tokens(prompt), names)
    scores = torch.stack([rec[n][0, -1].float() for n in names]) * config.scale
    return LastActivations(prompt=prompt, scores=scores)


@pytest.fixture
def toy_method():
    m = register(Method("lastact", "activations at the last position", "none (a test)", "LastActivations",
                        "1 forward", ("prompt",), (), f"{__name__}:LastActivationsConfig", f"{__name__}:last_activations"))
    yield m
    unregister("lastact")


def test_a_registered_toy_method_is_listed_and_runs_through_the_api_and_the_cli(toy_method, tiny_gpt2, tmp_path):
    listing = run_cli(["methods"])
    assert listing.code == 0 and "lastact" in listing.stdout and "returns LastActivations" in listing.stdout
    api = tlcap.localize(tiny_gpt2, "The capital of France is", "lastact", scale=2.0)
    names = [tiny_gpt2.hook_name("mlp_post", l) for l in range(tiny_gpt2.n_layers)]
    rec = tiny_gpt2.record(tiny_gpt2.to_tokens("The capital of France is"), names)
    torch.testing.assert_close(api.scores, 2.0 * torch.stack([rec[n][0, -1] for n in names]), rtol=0, atol=0)

    out = tmp_path / "toy"
    run = run_cli(["localize", "lastact", "--model", "gpt2-tiny", "--prompt", "The capital of France is",
                   "--set", "scale=2.0", "--out", str(out)])
    assert run.code == 0, run.stderr
    saved = load_result(out / "result")
    torch.testing.assert_close(saved.scores, api.scores, rtol=0, atol=0)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["method"] == "lastact" and summary["top_neuron"] == api.summary()["top_neuron"]
    assert (out / "lastact_figure.html").exists()


def test_cli_localize_runs_a_built_in_method_and_refuses_mistakes_before_loading(tmp_path):
    out = tmp_path / "ig"
    run = run_cli(["localize", "ig", "--model", "gpt2-tiny", "--prompt", FACT[0], "--target", FACT[1],
                   "--set", "steps=3", "--set", "rule=left", "--out", str(out)])
    assert run.code == 0, run.stderr
    saved = load_result(out / "result")
    from tlcap.models import make_gpt2
    ref = integrated_gradients(make_gpt2("tiny", seed=0), *FACT, steps=3, rule="left")
    torch.testing.assert_close(saved.scores, ref.scores, rtol=0, atol=0)
    bad = tmp_path / "bad"
    assert_cli_error(["localize", "rome", "--model", "gpt2-tiny", "--out", str(bad)],
                     "unknown method 'rome'; choose one of: kn, ig, sig, amig, trace, eap, eap-ig, cnl", out=bad)
    assert_cli_error(["localize", "trace", "--model", "gpt2-tiny", "--prompt", "a b", "--target", " c", "--out", str(bad)],
                     "method 'trace' needs subject in its data (fields: prompt, subject, target)", out=bad)
    assert_cli_error(["localize", "ig", "--model", "gpt2-tiny", "--prompt", "a", "--target", " b", "--subject", "a",
                      "--out", str(bad)], "--subject is not an input of method 'ig' (it takes: prompt, target)", out=bad)
    assert_cli_error(["localize", "ig", "--model", "gpt2-tiny", "--prompt", "a", "--target", " b", "--set", "steps",
                      "--out", str(bad)], "--set takes KEY=VALUE (e.g. --set steps=10), got 'steps'", out=bad)
    assert_cli_error(["localize", "ig", "--model", "gpt2-tiny", "--prompt", "a", "--target", " b", "--set", "steps=0",
                      "--out", str(bad)], "steps", out=bad, exact=False)


def test_register_refuses_a_taken_name_and_a_bad_entry():
    with pytest.raises(InvalidConfigError, match="method 'kn' is already registered"):
        register(dataclasses.replace(get_method("kn")))
    with pytest.raises(InvalidConfigError, match="one lower-case word"):
        register(Method("Bad Name", "x", "x", "x", "x", ("prompt",), runner="m:f"))


def test_experiment_configs_nest_the_method_configs_and_share_one_seed():
    from tlcap.errors import InvalidConfigError
    from tlcap.experiments.cnl_eval import FidelityConfig, ReliabilityConfig
    from tlcap.locate.causal_trace import TraceConfig

    cfg = FidelityConfig.resolve(seed=3, samples=2, top_n=40, **{"kn.steps": 4, "kc.steps": 2, "trace.top_k": 1})
    assert (cfg.trace.samples, cfg.kc.top_n, cfg.kn.ig.steps, cfg.kc.steps, cfg.trace.top_k) == (2, 40, 4, 2, 1)
    assert cfg.kn.seed == cfg.trace.seed == cfg.kc.seed == 3  # one seed, followed by every nested config
    moved = cfg.replace(seed=5)
    assert moved.kn.seed == moved.trace.seed == moved.kc.seed == 5 and moved.trace.samples == 2
    assert FidelityConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(UnknownNameError, match="kn and kc; write kn.steps"):  # KN's IG steps or EAP-IG's
        FidelityConfig.resolve(steps=4)
    with pytest.raises(UnknownNameError, match="'seed' is one setting here.*write seed="):
        FidelityConfig.resolve(**{"trace.seed": 1})
    with pytest.raises(InvalidConfigError, match=r"seed is one setting of FidelityConfig: set seed=2 there, not trace.seed"):
        FidelityConfig(trace=TraceConfig(seed=2))
    rel = ReliabilityConfig.resolve(bos=True, n_random=7)
    assert rel.trace.bos and rel.rome.bos and rel.kn.n_random == 7
    assert not ReliabilityConfig().rome.bos
