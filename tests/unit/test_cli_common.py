"""CLI infrastructure: one-line errors, the output-folder policy, write_outputs, help texts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import typer

from tests.cli_helpers import run_cli
from tlcap.cli import _load_commands, app
from tlcap.cli._common import checkpoint_dir, staged_output, write_outputs
from tlcap.errors import OutputExistsError, TlcapError
from tlcap.metrics import NeuronSet
from tlcap.provenance import Provenance

# Commands whose options lack a help text, with those options. The family helpers empty this;
# the test fails if an entry is fixed but not removed.
PENDING_HELP: dict[str, tuple[str, ...]] = {}


def _commands():
    _load_commands()

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), cmd

    return list(walk(typer.main.get_command(app), []))


def test_every_option_has_a_help_text():
    commands = _commands()
    assert {"kn", "trace", "edit", "circuit", "cnl locate", "ql cas"} <= {n for n, _ in commands}
    missing = {}
    for name, cmd in commands:
        lacking = tuple(p.name for p in cmd.params if p.param_type_name == "option" and not (p.help or "").strip())
        if lacking:
            missing[name] = lacking
    wrong = {k: v for k, v in missing.items() if PENDING_HELP.get(k) != v}
    assert not wrong, f"options without help: {wrong}"
    fixed = sorted(set(PENDING_HELP) - set(missing))
    assert not fixed, f"{fixed} now have help for every option: remove them from PENDING_HELP"


def test_usage_errors_are_one_line_with_exit_2():
    run = run_cli(["no-such-command"])
    assert run.code == 2 and run.stderr.strip() == "error: No such command 'no-such-command'. (see 'tlcap --help')"
    run = run_cli(["kn", "--model", "gpt2-tiny"])
    assert run.code == 2 and run.stderr.strip() == "error: Missing option '--prompt'. (see 'tlcap kn --help')"
    assert run_cli(["kn", "--help"]).code == 0
    assert "Usage" in run_cli([]).stdout


def _write_file(stage, name="a.txt", text="x"):
    (stage.path / name).write_text(text)


def test_staged_output_moves_into_place_only_on_success(tmp_path):
    out = tmp_path / "a" / "b" / "run"
    with pytest.raises(RuntimeError):
        with staged_output(out) as stage:
            _write_file(stage)
            (stage.path / "summary.json").write_text("{}")
            raise RuntimeError("compute failed")
    assert list(tmp_path.iterdir()) == []  # no output, no staging folder, no created parents
    with pytest.raises(KeyboardInterrupt):
        with staged_output(out) as stage:
            _write_file(stage)
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with staged_output(out) as stage:
        assert stage.out == out and stage.path.parent == out.parent and stage.path.name.startswith(".run.staging-")
        _write_file(stage, "table.csv")
        (stage.path / "summary.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == [".tlcap-run.json", "summary.json", "table.csv"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["run"]
    with pytest.raises(OutputExistsError):
        with staged_output(out):
            raise AssertionError("not reached: --out is checked before the body runs")


def test_checkpoints_survive_failures_and_are_reused(tmp_path):
    out = tmp_path / "run"
    assert checkpoint_dir(out) == tmp_path / ".run.checkpoints"
    with pytest.raises(KeyboardInterrupt):
        with staged_output(out) as stage:
            stage.checkpoints.mkdir()
            (stage.checkpoints / "state.json").write_text('{"n": 25}')
            raise KeyboardInterrupt
    assert not out.exists() and (tmp_path / ".run.checkpoints" / "state.json").exists()
    with staged_output(out, keep_checkpoints=True) as stage:
        assert json.loads((stage.checkpoints / "state.json").read_text()) == {"n": 25}  # resumed from here
        (stage.path / "summary.json").write_text("{}")
    assert (out / "checkpoints" / "state.json").exists() and not checkpoint_dir(out).exists()


def test_stale_staging_of_a_dead_process_is_removed(tmp_path):
    out = tmp_path / "run"
    stale = tmp_path / ".run.staging-999999999"  # no such pid
    stale.mkdir()
    with staged_output(out) as stage:
        (stage.path / "summary.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_write_outputs_writes_result_figures_tables_and_summary(tmp_path):
    ns = NeuronSet.from_list([(0, 1), (1, 2)], (2, 4)).with_provenance(Provenance.collect(None, {"k": 1}, seed=2))
    s = write_outputs(tmp_path, ns, figures={"located": ns.figure()}, tables={"neurons": ns.to_frame()},
                      extra={"note": "x"})
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == s
    assert s["n_neurons"] == 2 and s["note"] == "x" and s["tables"] == ["neurons.csv"]
    assert s["provenance"]["seed"] == 2 and s["provenance"]["config"] == {"k": 1}
    assert "located.html" in s["figures"] and all((tmp_path / f).exists() for f in s["figures"])
    assert (tmp_path / "neurons.csv").read_text().splitlines() == ["layer,neuron", "0,1", "1,2"]
    assert (tmp_path / "result" / "result.json").exists()


def test_tlcap_error_in_a_command_is_one_line(tmp_path, monkeypatch):
    import tlcap.cli.kn as kn_cmd

    def boom(*a, **k):
        raise TlcapError("the thing was wrong;\n  do this instead")

    monkeypatch.setattr(kn_cmd, "load", boom)
    out = tmp_path / "run"
    run = run_cli(["kn", "--model", "gpt2-tiny", "--prompt", "a", "--target", " b", "--out", str(out)])
    assert run.code == 2 and run.stderr.strip() == "error: the thing was wrong; do this instead"
    assert not out.exists() and os.listdir(tmp_path) == []


def test_read_only_parent_is_refused(tmp_path, monkeypatch):
    from tlcap.errors import OutputPathError

    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != tmp_path)
    with pytest.raises(OutputPathError, match=r"cannot be written \(.* is read-only\); choose another --out"):
        with staged_output(tmp_path / "run"):
            pass


def test_sigterm_stops_a_command_like_ctrl_c():
    """``kill`` raises KeyboardInterrupt in the main thread, so checkpoints are saved as on Ctrl-C."""
    import os
    import signal
    import time

    import pytest

    from tlcap.cli import stop_on_sigterm

    old = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)  # the handler runs at the next bytecode
    finally:
        signal.signal(signal.SIGTERM, old)
