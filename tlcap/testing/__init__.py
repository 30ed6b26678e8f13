"""Testing mechanistic claims: planted ground-truth models and assertions with readable messages.

- :mod:`tlcap.testing.planted` — :func:`planted_fact_model` and :func:`planted_capability_model`:
  tiny GPT-2s whose facts / toy task sit in neurons and a head chosen by the seed
  (``wired=False``: the same model without them).
- :mod:`tlcap.testing.assertions` — ``assert_causal``, ``assert_localized``,
  ``assert_circuit_faithful``, ``assert_hooks_clean``, ``assert_weights_unchanged``.
- The pytest fixtures (``tlcap_tiny_gpt2``, ``tlcap_planted_fact``, ...) come from the plugin
  package ``tlcap_pytest``, registered by ``pip install tlcap`` (``docs/testing.md``).
"""

from tlcap.testing.assertions import (
    CausalCheck,
    MechanismAssertionError,
    assert_causal,
    assert_circuit_faithful,
    assert_hooks_clean,
    assert_localized,
    assert_weights_unchanged,
)
from tlcap.testing.planted import (
    PlantedCapability,
    PlantedFact,
    PlantedTruth,
    planted_capability_model,
    planted_fact_model,
)

__all__ = [
    "CausalCheck", "MechanismAssertionError", "assert_causal", "assert_circuit_faithful", "assert_hooks_clean",
    "assert_localized", "assert_weights_unchanged", "PlantedCapability", "PlantedFact", "PlantedTruth",
    "planted_capability_model", "planted_fact_model",
]
