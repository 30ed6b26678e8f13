"""The CNL evaluation suite in ``reproduce``: its workloads against the work the methods do, its dry-run plan."""

from __future__ import annotations

import importlib

import pytest

from tlcap.attribution.config import IGConfig
from tlcap.locate.causal_trace import causal_trace
from tlcap.reproduce.cost import UNITS, Calibration, ModelShape
from tlcap.reproduce.run import build_stages, predictions
from tlcap.reproduce.scales import ScaleConfig
from tlcap.reproduce.stages import Runner
from tlcap.reproduce.suite_cost import kn_work, trace_work
from tlcap.reproduce.suite_stages import compare_dataset

PROMPT, SUBJECT, TARGET = "The Eiffel Tower is located in the city of", "The Eiffel Tower", " Paris"


@pytest.mark.parametrize("tokens", ["all", "last_subject"])
@pytest.mark.parametrize(("prompt", "subject"), [(PROMPT, SUBJECT),
                                                 ("In the city of Paris, the tower called the Eiffel Tower is",
                                                  "the Eiffel Tower")])
def test_trace_workload_counts_the_tokens_the_engine_runs(tiny_llama, monkeypatch, prompt, subject, tokens):
    m = tiny_llama
    seen = {"tokens": 0}
    for name in ("logits", "last_logits", "prefix_cache"):  # every forward entry point of the batched trace
        f = getattr(m, name)

        def counted(tokens, *a, _f=f, **k):
            seen["tokens"] += tokens.shape[0] * tokens.shape[1]
            return _f(tokens, *a, **k)
        monkeypatch.setattr(m, name, counted)
    # The full-depth engine (late_expand=False): the cost model counts it, an upper bound of late expansion.
    causal_trace(m, prompt, subject, TARGET, kinds=("mlp",), samples=2, window=10, warn=False, late_expand=False,
                 tokens=tokens)
    assert trace_work(m, prompt, subject, 2, tokens).units["fwd_token"] == seen["tokens"]


def test_trace_workload_probes_the_rows_the_engine_asks_batch_rows_auto_for(tiny_llama, monkeypatch):
    """The trace's throughput probe (priced on an accelerator) is capped at the rows the engine sizes its batch for."""
    engine = importlib.import_module("tlcap.locate.causal_trace.engine")

    asked = []
    real = engine.auto_batch_rows

    def spy(row_bytes, total, *a, **k):
        asked.append((total, k.get("kind")))
        return real(row_bytes, total, *a, **k)

    monkeypatch.setattr(engine, "auto_batch_rows", spy)
    causal_trace(tiny_llama, PROMPT, SUBJECT, TARGET, kinds=("mlp",), samples=3, window=10, warn=False,
                 tokens="last_subject")
    rows, flops = trace_work(tiny_llama, PROMPT, SUBJECT, 3, "last_subject").probes["trace"]
    assert asked == [(rows, "trace")] and rows == 3 * tiny_llama.n_layers
    assert flops == ModelShape.of(tiny_llama).fwd_token_flops(len(tiny_llama.to_tokens(PROMPT, prepend_bos=False)[0]))


def test_kn_workload_is_rows_per_target_token(tiny_llama):
    m = tiny_llama
    t = len(m.encode(" Paris France", prepend_bos=False))
    # midpoint: m points + the baseline row per layer
    assert kn_work(m, PROMPT, " Paris France", IGConfig(steps=3)).units["ig_row"] == t * 4 * m.n_layers
    # cnl: the m + 1 nodes 0, 1/m, ..., 1 per layer (α = 0 is the baseline), and on the staged path (a bridge,
    # late_expand) every layer's α = 1 gradient comes from one shared clean row: L - 1 rows fewer per token
    assert kn_work(m, PROMPT, " Paris France", IGConfig(steps=3, rule="cnl")).units["ig_row"] == t * (4 * m.n_layers
                                                                                                      - (m.n_layers - 1))
    assert kn_work(m, PROMPT, TARGET, IGConfig(steps=6)).units["ig_row"] == 7 * m.n_layers * len(m.encode(TARGET,
                                                                                                          prepend_bos=False))


def test_dry_run_predicts_every_suite_stage(tiny_llama, tmp_path):
    scale = ScaleConfig(cnl_datasets=("emotion",), cnl_eval_datasets=("emotion",), cnl_eval_facts=1, cnl_eval_pairs=2,
                        cnl_eval_known_top_k=None)
    runner = Runner(build_stages(("cnl",), scale), tmp_path, tiny_llama)
    cal = Calibration(dict.fromkeys(UNITS, 1e-9))
    pred = predictions(runner, runner.plan(["cnl.compare", "cnl.decoupling"]), cal)
    assert set(pred) == {"cnl.locate.emotion", "cnl.erase.emotion", "cnl.fidelity", "cnl.reliability", "cnl.compare",
                         "cnl.decoupling"}
    for name in ("cnl.fidelity", "cnl.reliability", "cnl.decoupling"):
        assert pred[name] is not None and pred[name].seconds > 0, name
    assert pred["cnl.compare"].seconds == 0  # a composition of the results above
    assert runner.stage("cnl.compare").deps == ("cnl.fidelity", "cnl.reliability", "cnl.locate.emotion",
                                                "cnl.erase.emotion")


def test_compare_uses_gsm8k_when_it_is_located_and_erased():
    assert compare_dataset(ScaleConfig(cnl_eval_datasets=("emotion", "gsm8k"))) == "gsm8k"
    assert compare_dataset(ScaleConfig(cnl_eval_datasets=("imdb", "emotion"))) == "imdb"
    assert compare_dataset(ScaleConfig(cnl_datasets=("emotion",), cnl_eval_datasets=("imdb",))) == ""


def test_scale_checks_rules_and_the_random_set_minimum():
    from tlcap.errors import InvalidConfigError

    with pytest.raises(InvalidConfigError, match="rule"):
        ScaleConfig(cnl_ig=IGConfig(rule="simpson"))
    ScaleConfig(n_random=5)  # smoke: the fewest draws an IPP takes
    with pytest.raises(InvalidConfigError, match="n_random"):
        ScaleConfig(name="cpu", n_random=5)  # every other scale: >= 20 matched random sets
    # the permutation tests ask for what the scale draws: 5 at smoke, the 20 minimum elsewhere
    assert ScaleConfig(n_random=5).min_null_draws == 5
    assert ScaleConfig(name="cpu", n_random=30).min_null_draws == 20
    with pytest.raises(InvalidConfigError, match="cnl_eval_rome_layers"):
        ScaleConfig(cnl_eval_rome_layers=(3,))  # Fig. 2 needs the traced layer and another


def test_sig_and_amig_attribute_the_scale_s_first_facts():
    """SIG and AMIG (one IG per token / per word) run on the first ql_sig_facts / ql_amig_facts facts, IG on all."""
    stages = {s.name: s for s in build_stages(("ql",), ScaleConfig(ql_n_facts=4, ql_sig_facts=2, ql_amig_facts=3))}
    assert [stages[f"ql.localize.{m}"].config.n_facts for m in ("ig", "sig", "amig")] == [None, 2, 3]


def test_locate_passes_the_scale_rule(tiny_llama, tmp_path):
    scale = ScaleConfig(cnl_datasets=("emotion",), cnl_eval_datasets=(), cnl_locate_n=4,
                        cnl_ig=IGConfig(steps=1, rule="gauss_legendre"))
    runner = Runner(build_stages(("cnl",), scale), tmp_path, tiny_llama)
    runner.run(runner.plan(["cnl.locate.emotion"]))
    group = runner.outputs("cnl.locate.emotion")["group_A0"]
    assert group.rule == "gauss_legendre" and group.steps == 1


@pytest.mark.parametrize("steps", [3, 5])
def test_rome_work_counts_the_passes_of_a_counted_sweep(tiny_gpt2, steps):
    """``rome_work`` (``cnl.reliability``'s ROME part) counts the forward passes ``rome_sweep`` makes: the unedited
    measures once (two batches), then per edited layer two set-up passes, one per optimisation step and the two
    measure batches under the edit (the model had counted one pass per evaluation prompt, before and after)."""
    from tlcap.intervene.covariance import key_covariance
    from tlcap.intervene.rome import RomeConfig
    from tlcap.intervene.rome.evaluate import rome_sweep
    from tlcap.reproduce.suite_cost import rome_work

    m = tiny_gpt2
    prompt, paras, neigh = "The Eiffel Tower is located in the city of", ["Fact: The Eiffel Tower is in"], \
        ["Rome is the capital of", "Paris is in", "Madrid is in"]
    covs = key_covariance(m, [0, 1], n_tokens=512, cache=False)
    calls = []
    handle = m.backend.register_forward_pre_hook(lambda mod, args: calls.append(1))
    try:
        sweep = rome_sweep(m, prompt, "The Eiffel Tower", " Rome", [0, 1], target_old=" Paris", paraphrases=paras,
                           neighbourhood=neigh, covs=covs, steps=steps, bos=True)
    finally:
        handle.remove()
    assert all(len(r.losses) == steps for r in sweep.results)  # no early stop: every step ran
    w = rome_work(m, prompt, " Rome", 2, RomeConfig(steps=steps, bos=True), 1 + len(paras) + len(neigh), [])
    assert len(calls) == w.passes["fwd_token"] + w.passes["train_token"] == 2 + 2 * (2 + steps + 2)
    # on an accelerator (policy forced on the CPU) the two layers are rows: keys once, a pass per step, 2 measures
    from unittest import mock

    from tlcap.runtime import device

    calls.clear()
    handle = m.backend.register_forward_pre_hook(lambda mod, args: calls.append(1))
    try:
        with mock.patch.object(device, "one_pass_default", lambda model: True):
            rows = rome_sweep(m, prompt, "The Eiffel Tower", " Rome", [0, 1], target_old=" Paris", paraphrases=paras,
                              neighbourhood=neigh, covs=covs, steps=steps, bos=True)
    finally:
        handle.remove()
    for a, b in zip(sweep.results, rows.results):
        assert b.losses == pytest.approx(a.losses, rel=1e-4)
    acc = sum(w.passes[u] + w.accelerator_passes[u] for u in ("fwd_token", "train_token"))
    assert len(calls) == acc == 2 + 1 + steps + 2


@pytest.mark.parametrize("n_random", [3, 20])
def test_kc_work_counts_the_passes_of_the_reliability_kc_part(tiny_gpt2, n_random):
    """``kc_work(..., n_circuits)`` counts the circuit-only passes of the reliability experiment's KC evaluation:
    the full / ablated / located rows in one pass, then the random circuits 8 a pass on a CPU and up to ``KC_ROWS``
    a pass on an accelerator (policy forced on the CPU), where every rank and NLL equals the CPU path's (the model
    had counted two passes per circuit)."""
    from unittest import mock

    from tlcap.data.rewrites import rewrite_facts
    from tlcap.experiments.cnl_eval.common import Stopwatch
    from tlcap.reproduce.suite_cost import kc_work
    from tlcap.runtime import device

    rel = importlib.import_module("tlcap.experiments.cnl_eval.reliability")
    m = tiny_gpt2
    fact = rewrite_facts(m, n=1, n_rewrites=2, known_top_k=5000)[0]
    cfg = rel.ReliabilityConfig.resolve(None, parts=("kc",), n_random_circuits=n_random, kc__steps=2, top_n=20)
    circ = rel._located(m, [0], [fact], cfg, Stopwatch())["kc"][0]
    w = kc_work(m, fact.rewrites[0], fact.target, 2, 1 + n_random)
    out = {}
    for policy in (False, True):
        calls: list[int] = []
        handle = m.backend.register_forward_pre_hook(lambda mod, args, c=calls: c.append(1))
        try:
            with mock.patch.object(device, "one_pass_default", lambda model, p=policy: p):
                out[policy] = rel._kc_rows(m, 0, fact, cfg, Stopwatch(), circ)
        finally:
            handle.remove()
        want = w.passes["fwd_token"] + (w.accelerator_passes["fwd_token"] if policy else 0)
        assert len(calls) == want == (2 if policy else 1 + -(-n_random // 8)), policy
    assert len(out[True]) == len(out[False]) == 1 + n_random
    for a, b in zip(out[False], out[True]):
        assert (a.set, a.draw, a.rank, a.n_edges) == (b.set, b.draw, b.rank, b.n_edges)
        assert b.nll == pytest.approx(a.nll, rel=1e-5, abs=1e-6)
    assert len({r.nll for r in out[True]}) > 1  # the circuits differ: equal values are not one row copied


@pytest.mark.parametrize("scale", ["cpu", "full"])
def test_every_monte_carlo_null_of_a_reported_scale_resolves_below_one_percent(scale):
    """Each "located vs matched random" p-value of the cpu / full stages can fall to 2/201 ≈ 0.00995, well below
    the report's levels; the perplexity control drew 50 sets at cpu (floor 0.039, above the 0.026 a discovery
    needed in the committed report: it could never be resolved)."""
    from tlcap.metrics.permutation import p_floor
    from tlcap.reproduce.scales import get_scale

    stages = {s.name: s.config for s in build_stages(("cnl",), get_scale(scale))}
    draws = {}
    for name, cfg in stages.items():
        if name.startswith("cnl.erase."):
            draws[f"{name} accuracy"] = cfg.n_random
            draws[f"{name} perplexity"] = min(cfg.ppl_n_random, cfg.n_random)
            assert cfg.ppl_texts > 0, name  # the control is measured
    for name in ("cnl.fidelity", "cnl.reliability", "cnl.decoupling"):
        draws[f"{name} KN sets"] = stages[name].kn.n_random
        draws[f"{name} KC circuits"] = stages[name].n_random_circuits
    assert len([k for k in draws if k.startswith("cnl.erase.")]) == 2 * len(get_scale(scale).cnl_eval_datasets)
    floors = {k: p_floor(n, "two-sided") for k, n in draws.items()}
    assert max(floors.values()) == pytest.approx(2 / 201), floors
