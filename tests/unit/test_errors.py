"""The error hierarchy: every class is a TlcapError and keeps its builtin parent."""

from __future__ import annotations

import pickle

import pytest

import tlcap.errors as E
from tlcap.attribution.dataset import CheckpointMismatchError


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (E.InvalidConfigError, ValueError), (E.UnknownNameError, ValueError), (E.DataFormatError, ValueError),
        (E.OutputPathError, ValueError), (E.OutputExistsError, FileExistsError), (E.CheckpointError, ValueError),
        (E.CheckpointMismatchError, ValueError), (E.ResultIntegrityError, ValueError), (E.ResultTypeError, TypeError),
        (E.MissingFileError, FileNotFoundError), (E.UnknownModelError, ValueError),
    ],
)
def test_each_error_is_a_tlcap_error_and_its_builtin(cls, builtin):
    err = cls("x was wrong; do y")
    assert isinstance(err, E.TlcapError) and isinstance(err, builtin)
    assert str(pickle.loads(pickle.dumps(err))) == "x was wrong; do y"  # survives multiprocessing


def test_family_relations():
    assert issubclass(E.UnknownNameError, E.InvalidConfigError)
    assert issubclass(E.CheckpointMismatchError, E.CheckpointError)
    assert CheckpointMismatchError is E.CheckpointMismatchError  # old import path still works


def test_unknown_name_message():
    err = E.UnknownNameError.of("rule", "mid", ["midpoint", "left"], option="--rule")
    assert str(err) == "unknown rule 'mid' (--rule); choose one of: midpoint, left"
    assert str(E.UnknownNameError.of("kind", "x", ("a",))) == "unknown kind 'x'; choose one of: a"
