"""Doctest namespace of ``pytest --doctest-modules tlcap`` (run by ``make test``): every ``>>>`` example in
tlcap runs with ``model`` (a tiny random GPT-2 with the exact BPE), ``tiny_llama`` (a tiny random
Llama: gated MLP, GQA), ``tlcap`` and ``torch`` defined, one torch thread, and the data bundled with tlcap."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.pop("TLCAP_DATA", None)
os.environ["TLCAP_OFFLINE"] = "1"

_MODELS: dict[str, object] = {}


@pytest.fixture(autouse=True)
def _tlcap_doctest_namespace(request, doctest_namespace):
    """Fill the namespace only for doctest items (test modules never pay for the models)."""
    if not isinstance(request.node, pytest.DoctestItem):
        yield
        return
    import torch

    import tlcap
    from tlcap.models import make_gpt2, make_llama

    if not _MODELS:
        _MODELS["model"] = make_gpt2("tiny", seed=0)
        _MODELS["tiny_llama"] = make_llama(seed=0)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    doctest_namespace.update(_MODELS, tlcap=tlcap, torch=torch)
    yield
    torch.set_num_threads(old)
