"""Knowledge neurons: inputs that used to give silently wrong results (issue 15) — the prompt/target
boundary, an empty located set, a threshold at which nothing can be kept — through the API and
``tlcap kn`` (exact warning/error text, exit code, what the result records)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from tests.cli_helpers import assert_cli_error, run_cli
from tlcap.attribution import integrated_gradients
from tlcap.errors import (
    EmptyNeuronSetWarning,
    InvalidConfigError,
    PromptBoundaryWarning,
    TargetTokenizationError,
)
from tlcap.experiments.knowledge_neurons import check_fact, locate_knowledge_neurons
from tlcap.models.boundary import fix_prompt_boundary

PROMPT, TARGET = "The capital of France is", " Paris"
NOTE = ("--prompt 'The capital of France is ' ends with whitespace and the target ' Paris' starts with a space; "
        "removed the prompt's trailing whitespace (using 'The capital of France is') so the target starts at a "
        "token boundary")
REFUSED = ("--prompt 'The capital of France is ' ends with whitespace and the target 'Paris' does not start with it; "
           "the space belongs to the answer's first token: use --prompt 'The capital of France is' --target ' Paris'")


def test_fix_prompt_boundary_rules() -> None:
    with pytest.warns(PromptBoundaryWarning) as rec:
        assert fix_prompt_boundary(PROMPT + " ", TARGET) == (PROMPT, NOTE)
    assert [str(w.message) for w in rec] == [NOTE]
    with pytest.warns(PromptBoundaryWarning):
        assert fix_prompt_boundary(PROMPT + " \t ", TARGET)[0] == PROMPT
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where nothing is changed
        assert fix_prompt_boundary(PROMPT, TARGET) == (PROMPT, None)
        # a template's trailing newline is kept
        assert fix_prompt_boundary("Q: capital of France?\n", "Paris") == ("Q: capital of France?\n", None)
    with pytest.raises(TargetTokenizationError) as err:
        fix_prompt_boundary(PROMPT + " ", "Paris")
    assert str(err.value) == REFUSED
    with pytest.raises(TargetTokenizationError, match=r'^--paraphrase "France\'s capital is " ends with whitespace'):
        check_fact(PROMPT, "Paris", ["France's capital is "])


def test_trailing_space_is_the_silent_error_and_is_normalised(tiny_gpt2) -> None:
    # the defect: scored after a lone ' ' token the fact is another one (different probability)
    clean = integrated_gradients(tiny_gpt2, PROMPT, TARGET, steps=2)
    spaced = integrated_gradients(tiny_gpt2, PROMPT + " ", TARGET, steps=2)
    assert spaced.target_prob != pytest.approx(clean.target_prob, rel=1e-3)
    # KN normalises it, warns, records it, and computes exactly the clean run
    with pytest.warns(PromptBoundaryWarning, match="ends with whitespace"):
        res = locate_knowledge_neurons(tiny_gpt2, PROMPT + " ", TARGET, ["France's capital city is  "],
                                       steps=2, n_random=0, progress=False)
    ref = locate_knowledge_neurons(tiny_gpt2, PROMPT, TARGET, ["France's capital city is"], steps=2, n_random=0,
                                   progress=False)
    assert res.prompts == ref.prompts == (PROMPT, "France's capital city is")
    assert torch.equal(res.scores, ref.scores) and res.target_prob == ref.target_prob
    assert res.notes[0] == NOTE and res.notes[1].startswith("--paraphrase \"France's capital city is  \" ends with")
    assert res.summary()["notes"] == list(res.notes) and ref.notes == ()


def test_cli_prompt_boundary(tmp_path) -> None:
    out = tmp_path / "run"
    run = run_cli(["kn", "--model", "gpt2-tiny", "--prompt", PROMPT + " ", "--target", TARGET, "--steps", "1",
                   "--n-random", "0", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    assert [ln for ln in run.stderr.splitlines() if ln.startswith("warning:")] == [f"warning: {NOTE}"]
    s = json.loads((out / "summary.json").read_text())
    assert s["prompt"] == PROMPT and s["notes"] == [NOTE]
    bad = tmp_path / "bad"
    assert_cli_error(["kn", "--model", "gpt2-tiny", "--prompt", PROMPT + " ", "--target", "Paris", "--out", str(bad)],
                     REFUSED, out=bad)


EMPTY = ("the located neuron set is empty (top-1, kept only if found in more than 50% of 2 prompts): "
         "suppress/enhance and the random controls were not run; lower --threshold or --refine-p, or use --top-k")


def test_empty_located_set_says_so(tmp_path, tiny_gpt2) -> None:
    # top-1 neuron of each prompt differs on gpt2-tiny (0/225 vs 1/124): refinement keeps none
    with pytest.warns(EmptyNeuronSetWarning) as rec:
        res = locate_knowledge_neurons(tiny_gpt2, PROMPT, TARGET, ["The city of"], steps=2, top_k=1, n_random=3,
                                       progress=False)
    assert [str(w.message) for w in rec if w.category is EmptyNeuronSetWarning] == [EMPTY]
    assert len(res.neurons) == 0 and all(len(s) == 1 for s in res.per_prompt)
    s = res.summary()
    assert s["suppress_located_rel_change"] is None and s["enhance_located_rel_change"] is None  # not "no change"
    assert s["suppress_random_rel_change"] is None and s["suppress_random_draws"] == [] and s["notes"] == [EMPTY]
    out = tmp_path / "run"
    run = run_cli(["kn", "--model", "gpt2-tiny", "--prompt", PROMPT, "--target", TARGET, "--paraphrase", "The city of",
                   "--steps", "2", "--top-k", "1", "--n-random", "3", "--out", str(out)])
    assert run.code == 0, run.stderr[-3000:]
    assert f"warning: {EMPTY}" in run.stderr.splitlines()
    assert "0 neurons (empty located set: no intervention run)" in run.stdout and "+0.0 %" not in run.stdout
    assert json.loads((out / "summary.json").read_text())["suppress_located_rel_change"] is None


def test_select_refuses_thresholds_that_keep_nothing(tiny_gpt2) -> None:
    attr = integrated_gradients(tiny_gpt2, PROMPT, TARGET, steps=1)
    assert len(attr.select(0.999)) >= 1
    with pytest.raises(InvalidConfigError) as err:
        attr.select(1.0)  # score > 1 · max: nothing, ever
    assert str(err.value) == "threshold (--threshold) must be in (0, 1), got 1"
    with pytest.raises(InvalidConfigError) as err:
        attr.select(top_k=0)
    assert str(err.value) == "top_k (--top-k) must be >= 1, got 0"


def test_target_merging_into_the_prompt_is_refused(tmp_path, tiny_gpt2) -> None:
    msg = ("Target 'n' merges with the end of the prompt 'capital of France is' when tokenized together; end the "
           "prompt at a word boundary or start the target with a space (e.g. ' Paris').")
    with pytest.raises(TargetTokenizationError) as err:
        integrated_gradients(tiny_gpt2, PROMPT, "n", steps=1)
    assert str(err.value) == msg
    out = tmp_path / "run"
    assert_cli_error(["kn", "--model", "gpt2-tiny", "--prompt", PROMPT, "--target", "n", "--out", str(out)], msg, out=out)
