"""Quadrature rules for the integral of integrated gradients, ``∫₀¹ f(α) dα ≈ Σ_k w_k f(α_k)``.

``steps`` = m is the rule's size parameter; every rule but ``cnl`` evaluates the gradient m
times (``cnl`` evaluates it m + 1 times, as CNL eq. 7 prints).

=================  ==========================================  ==========================================
rule               points α and weights w                      source
=================  ==========================================  ==========================================
``midpoint``       α = (k + ½)/m, k = 0..m-1; w = 1/m           default: second order, best completeness
``left``           α = k/m, k = 0..m-1; w = 1/m                 Dai et al.'s reference code
``linspace``       α = linspace(0, 1, m); w = 1/m               EleutherAI knowledge-neurons
``trapezoid``      α = linspace(0, 1, m); trapezoid weights     the composite trapezoid rule
=================  ==========================================  ==========================================
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice, check_int

RULES: tuple[str, ...] = ("midpoint", "left", "linspace", "trapezoid")


def quadrature(steps: int, rule: str = "midpoint") -> tuple[Float[Tensor, " n"], Float[Tensor, " n"]]:
    """Points α and weights for ∫₀¹ f(α) dα (float64).

    Args:
        steps: The rule's size m, ``>= 1`` (the number of gradient evaluations).
        rule: One of :data:`RULES` (table in the module docstring).

    Returns:
        ``(alphas, weights)``, both of length m.

    Raises:
        InvalidConfigError: ``steps < 1``.
        UnknownNameError: an unknown rule.

    Example:
        >>> alphas, weights = quadrature(4, "midpoint")
        >>> alphas.tolist(), weights.tolist()
        ([0.125, 0.375, 0.625, 0.875], [0.25, 0.25, 0.25, 0.25])
    """
    steps = check_int("steps", steps, min=1)
    check_choice("rule", rule, RULES)
    k = torch.arange(steps, dtype=torch.float64)
    flat = torch.full((steps,), 1.0 / steps, dtype=torch.float64)
    if rule == "midpoint":
        return (k + 0.5) / steps, flat
    if rule == "left":
        return k / steps, flat
    if rule == "linspace":
        return torch.linspace(0, 1, steps, dtype=torch.float64), flat
    # trapezoid
    if steps == 1:
        return torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    w = torch.full((steps,), 1.0 / (steps - 1), dtype=torch.float64)
    w[0] = w[-1] = 0.5 / (steps - 1)
    return torch.linspace(0, 1, steps, dtype=torch.float64), w


__all__ = ["RULES", "quadrature"]
