"""``tlcap circuit`` bad inputs (issue 15): each refused with its exact one-line error, exit 2, no ``--out``.

Every case here fails before the model is loaded (the model name ``no-such-model`` would
otherwise fail with an unknown-model error), so a wrong order of checks is caught too.
"""

from __future__ import annotations

import warnings

import pytest

from tests.cli_helpers import assert_cli_error
from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits import EAPConfig, check_circuit_inputs, edge_attribution, size_sweep

PROMPT, TARGET, CORRUPT = "The capital of France is", " Paris", "The capital of Italy is"


def _args(out, *extra, model="no-such-model", prompt=PROMPT, target=TARGET, corrupt=CORRUPT):
    args = ["circuit", "--model", model, "--prompt", prompt, "--target", target]
    if corrupt is not None:
        args += ["--corrupt-prompt", corrupt]
    return [*args, *extra, "--out", str(out)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sweep", "10,abc"], "--sweep must be comma-separated integers (e.g. 10,30,100), got '10,abc' "
                                "('abc' is not an integer)"),
        (["--sweep", "10,,20"], "--sweep must be comma-separated integers (e.g. 10,30,100), got '10,,20' "
                                "('' is not an integer)"),
        (["--sweep", "10,-3"], "sweep_sizes[1] (--sweep) must be >= 0, got -3"),
        (["--sweep", "10", "--no-sweep"], "give --sweep SIZES or --no-sweep, not both"),
        (["--top-n", "0"], "top_n (--top-n) must be >= 1, got 0"),
        (["--top-n", "-5"], "top_n (--top-n) must be >= 1, got -5"),
        (["--threshold", "0"], "threshold (--threshold) must be > 0, got 0"),
        (["--threshold", "nan"], "threshold (--threshold) must be a finite number, got nan"),
        (["--top-n", "5", "--threshold", "0.1"], "give --top-n or --threshold, not both"),
        (["--ig-steps", "0"], "steps (--ig-steps) must be >= 1, got 0"),
        (["--metric", "foo"], "unknown metric 'foo' (--metric); choose one of: nll, logit-diff"),
        (["--metric", "logit-diff"], "--metric logit-diff needs --corrupt-target (the corrupted prompt's answer, "
                                     "e.g. ' Rome')"),
        (["--corrupt-target", " Rome"], "--corrupt-target is only used by --metric logit-diff; drop it or add "
                                        "--metric logit-diff"),
        (["--seed", "-1"], "seed (--seed) must be >= 0, got -1"),
        (["--zero-ablate"], "give --corrupt-prompt or --zero-ablate, not both"),
    ],
)
def test_options_are_refused_before_the_model_is_loaded(tmp_path, extra, message):
    out = tmp_path / "run"
    assert_cli_error(_args(out, *extra), message, out=out)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(prompt=""), "prompt (--prompt) must not be empty"),
        (dict(prompt="   "), "prompt (--prompt) must not be empty"),
        (dict(target=""), "target (--target) must not be empty"),
        (dict(corrupt=""), "corrupt_prompt (--corrupt-prompt) must not be empty"),
        (dict(corrupt=PROMPT), "the corrupted prompt (--corrupt-prompt) is the clean prompt: every edge score would "
                               "be 0; give the same relation with another subject (e.g. 'The capital of Italy is')"),
        (dict(corrupt=None), "ablation 'corrupt' needs a corrupted prompt: give --corrupt-prompt (same relation, "
                             "another subject of the same token length) or use --zero-ablate"),
        # prompt boundary: the trailing space would be scored as a token of its own
        (dict(prompt=PROMPT + " "), "prompt (--prompt) 'The capital of France is ' ends with whitespace, which "
                                    "belongs to the answer's first token; end it at the last word ('The capital of "
                                    "France is') and start the answer with the space (' Paris')"),
        (dict(prompt=PROMPT + " ", target="Paris"), "prompt (--prompt) 'The capital of France is ' ends with "
                                                    "whitespace, which belongs to the answer's first token; end it "
                                                    "at the last word ('The capital of France is') and start the "
                                                    "answer with the space (' Paris')"),
        (dict(corrupt=CORRUPT + "\t"), "corrupt_prompt (--corrupt-prompt) 'The capital of Italy is\\t' ends with "
                                       "whitespace, which belongs to the answer's first token; end it at the last "
                                       "word ('The capital of Italy is') and start the answer with the space "
                                       "(' Paris')"),
    ],
)
def test_strings_are_refused_before_the_model_is_loaded(tmp_path, kw, message):
    out = tmp_path / "run"
    assert_cli_error(_args(out, **kw), message, out=out)


def test_out_rules(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    assert_cli_error(_args(f), f"--out {f} is a file; give a folder path", out=f)
    done = tmp_path / "done"
    done.mkdir()
    (done / "summary.json").write_text("{}")
    assert_cli_error(_args(done), f"{done} already holds a finished run (summary.json); pass --overwrite to replace "
                                  "it or choose another --out", out=done)


def test_unknown_model_and_misaligned_corrupted_prompt(tmp_path):
    out = tmp_path / "run"
    assert_cli_error(_args(out, model="no-such-model"), "Unknown model 'no-such-model'", out=out, exact=False)
    other = "The capital of the United Kingdom is"
    assert_cli_error(
        _args(out, "--no-sweep", model="gpt2-tiny", corrupt=other),
        "the corrupted prompt is 7 tokens ['The', ' capital', ' of', ' the', ' United', ' Kingdom', ' is'] but the "
        "clean prompt is 5 tokens ['The', ' capital', ' of', ' France', ' is']; edge patching aligns them position "
        "by position: pick a corrupted subject with the same number of tokens (change only the subject), or use "
        "zero ablation (--zero-ablate; ablation='zero' in the API)", out=out)


def test_api_names_are_validated_at_construction():
    with pytest.raises(InvalidConfigError, match=r"^unknown ablation 'median'"):
        EAPConfig(ablation="median")
    with pytest.raises(InvalidConfigError, match=r"^unknown direction 'up'"):
        EAPConfig(direction="up")
    with pytest.raises(InvalidConfigError, match=r"^unknown metric 'kl' \(--metric\); choose one of: nll, logit-diff$"):
        EAPConfig(metric="kl")
    with pytest.raises(InvalidConfigError, match=r"ends with whitespace"):
        check_circuit_inputs(PROMPT + " ", TARGET, None, None, EAPConfig())


def test_top_n_beyond_the_graph_warns_and_records_requested_and_used(tiny_gpt2):
    sc = edge_attribution(tiny_gpt2, PROMPT, TARGET, CORRUPT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c = sc.select(top_n=sc.n_edges + 1, prune=False)
    assert [str(w.message) for w in caught] == [
        f"top_n={sc.n_edges + 1} is more than the {sc.n_edges} edges of the graph: the circuit holds all of them "
        f"(requested {sc.n_edges + 1}, selected {sc.n_edges}; recorded as selection and n_selected)"]
    assert c.selection == f"top_n={sc.n_edges + 1}" and c.n_selected == c.n_edges == sc.n_edges
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sc.select(top_n=sc.n_edges)  # exactly every edge: no warning


def test_sweep_sizes_beyond_the_graph_warn_and_keep_the_requested_size(tiny_gpt2):
    sc = edge_attribution(tiny_gpt2, PROMPT, TARGET, CORRUPT)
    big = sc.n_edges + 7
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sw = size_sweep(tiny_gpt2, sc, [3, big])
    assert [str(w.message) for w in caught] == [
        f"sweep sizes [{big}] are more than the {sc.n_edges} edges of the graph: each keeps all of them "
        "(top_n records the requested size, n_edges the edges kept)"]
    assert sw.top_n == (3, big) and sw.n_edges[1] == sc.n_edges
    assert sw.nll[1] == pytest.approx(sw.full_nll, abs=1e-5)
