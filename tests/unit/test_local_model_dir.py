"""Invalid local model folders give one clear error (API) and one line, exit 2 (CLI), before any load."""

from __future__ import annotations

import json

import pytest

from tests.cli_helpers import assert_cli_error
from tlcap.errors import MissingFileError, UnknownModelError
from tlcap.models import load_model


def test_config_without_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UnknownModelError, match=r"config.json has no model_type; write the architecture's model_type"):
        load_model(tmp_path)


def test_config_that_is_not_json(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UnknownModelError, match=r"config.json is not readable JSON"):
        load_model(tmp_path)


def test_config_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(MissingFileError, match=r"has a config.json but no weight file"):
        load_model(tmp_path)


def test_cli_one_line_exit_2_nothing_written(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    out = tmp_path / "out"
    assert_cli_error(["kn", "--model", str(model), "--prompt", "The capital of France is", "--target", " Paris",
                      "--out", str(out)], "has a config.json but no weight file", exact=False, out=out)
