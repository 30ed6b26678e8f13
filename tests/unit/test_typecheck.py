"""Shape checking is live in the test run: jaxtyping + beartype instrument every tlcap module
(``--jaxtyping-packages`` in pyproject.toml), so a call with a wrong shape raises."""

from __future__ import annotations

import pytest
import torch
from jaxtyping import TypeCheckError

from tlcap.experiments.knowledge_neurons import KnowledgeNeurons
from tlcap.locate.selection import threshold_select
from tlcap.metrics import NeuronSet
from tlcap.runtime import hooks as H


def test_function_arguments_are_shape_checked():
    assert len(threshold_select(torch.tensor([[0.0, 1.0], [0.5, 0.1]]), 0.2)) == 2
    with pytest.raises(TypeCheckError, match="layer d_mlp"):
        threshold_select(torch.zeros(3), 0.2)  # a vector, not [layer, d_mlp]


def test_hook_factories_are_shape_checked():
    act = torch.arange(24.0).reshape(2, 3, 4)
    out = H.patch_rows(act[:1] + 100, torch.tensor([1]), 2)(act)
    assert torch.equal(out[1, 2], act[0, 2] + 100) and torch.equal(out[0], act[0])
    with pytest.raises(TypeCheckError):
        H.patch_rows(act, torch.zeros(2, 2, dtype=torch.long), 0)  # rows must be a vector
    assert H.last_position_only()(act).shape == (2, 1, 4)
    with pytest.raises(TypeCheckError):
        H.scale(2.0)(torch.zeros(3, dtype=torch.long))  # activations are float [batch, ...]


def test_result_tensor_fields_are_shape_checked():
    ns = NeuronSet((), (3, 4))
    kw = dict(neurons=ns, per_prompt=(ns,), prompts=("a",), target=" b", target_prob=0.5, completeness_rel_error=0.0)
    KnowledgeNeurons(scores=torch.zeros(1, 3, 4), activations=torch.zeros(1, 3, 4), **kw)
    with pytest.raises(TypeCheckError):
        KnowledgeNeurons(scores=torch.zeros(1, 3, 4), activations=torch.zeros(1, 3, 5), **kw)  # d_mlp differs
