"""Testing mechanistic claims: planted ground-truth models, assertions and pytest fixtures."""

from tlcap.testing.planted import (
    PlantedCapability,
    PlantedFact,
    PlantedTruth,
    planted_capability_model,
    planted_fact_model,
)

__all__ = ["PlantedCapability", "PlantedFact", "PlantedTruth", "planted_capability_model", "planted_fact_model"]
