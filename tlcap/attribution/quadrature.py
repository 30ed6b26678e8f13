"""Quadrature rules for the integral of integrated gradients, ``∫₀¹ f(α) dα ≈ Σ_k w_k f(α_k)``.

``steps`` = m is the rule's size parameter; every rule but ``cnl`` evaluates the gradient m
times (``cnl`` evaluates it m + 1 times, as CNL eq. 7 prints).

==================  ===============================================  ==========================================
rule                points α and weights w                           source
==================  ===============================================  ==========================================
``midpoint``        α = (k + ½)/m, k = 0..m-1; w = 1/m                default: second order
``left``            α = k/m, k = 0..m-1; w = 1/m                      Dai et al.'s reference code
``right``           α = k/m, k = 1..m; w = 1/m                        Dai et al. and QL eq. 10 as printed
``linspace``        α = linspace(0, 1, m); w = 1/m                    EleutherAI knowledge-neurons
``trapezoid``       α = linspace(0, 1, m); trapezoid weights          the composite trapezoid rule
``cnl``             α = n/m, n = 0..m (m + 1 points); w = 1/m         CNL eq. 7 as printed (Σ w = (m+1)/m)
``gauss_legendre``  Gauss–Legendre nodes and weights mapped to [0, 1]  captum's default (``gausslegendre``)
==================  ===============================================  ==========================================

``cnl`` is the paper's literal ``(1/S) Σ_{n=0}^{S} ∂P(n/S · w̄)/∂w``: its weights sum to
``(S+1)/S``: it is the trapezoid rule plus ``(f(0) + f(1))/(2S)``, so it over-counts the
integral by that much — a completeness error that only shrinks as 1/S. ``docs/kn.md``
tabulates the completeness error of every rule against m on SmolLM2.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.config import check_choice, check_int

RULES: tuple[str, ...] = ("midpoint", "left", "right", "linspace", "trapezoid", "cnl", "gauss_legendre")


def n_points(steps: int, rule: str = "midpoint") -> int:
    """How many points :func:`quadrature` returns, without building them.

    Args:
        steps: The rule's size m, ``>= 1``.
        rule: One of :data:`RULES`.

    Returns:
        m (m + 1 for ``cnl``).

    Example:
        >>> n_points(20, "cnl"), n_points(4, "gauss_legendre")
        (21, 4)
    """
    return int(steps) + (1 if rule == "cnl" else 0)


def quadrature(steps: int, rule: str = "midpoint") -> tuple[Float[Tensor, " n"], Float[Tensor, " n"]]:
    """Points α and weights for ∫₀¹ f(α) dα (float64).

    Args:
        steps: The rule's size m, ``>= 1`` (the number of gradient evaluations; m + 1 for ``cnl``).
        rule: One of :data:`RULES` (table in the module docstring).

    Returns:
        ``(alphas, weights)``, both of length m (m + 1 for ``cnl``), α ascending.

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
    if rule == "right":
        return (k + 1) / steps, flat
    if rule == "cnl":
        n = torch.arange(steps + 1, dtype=torch.float64)
        return n / steps, torch.full((steps + 1,), 1.0 / steps, dtype=torch.float64)
    if rule == "gauss_legendre":
        x, w = np.polynomial.legendre.leggauss(steps)  # nodes on [-1, 1], weights summing to 2
        return torch.from_numpy(0.5 * (1.0 + x)), torch.from_numpy(0.5 * w)
    if rule == "linspace":
        return torch.linspace(0, 1, steps, dtype=torch.float64), flat
    # trapezoid
    if steps == 1:
        return torch.tensor([1.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    w = torch.full((steps,), 1.0 / (steps - 1), dtype=torch.float64)
    w[0] = w[-1] = 0.5 / (steps - 1)
    return torch.linspace(0, 1, steps, dtype=torch.float64), w


__all__ = ["n_points", "RULES", "quadrature"]
