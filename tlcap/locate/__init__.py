"""Locating: selection rules (and, in submodules, causal tracing and circuits)."""

from tlcap.locate.selection import refine, sigma_mask, threshold_select, top_k_select

__all__ = ["refine", "sigma_mask", "threshold_select", "top_k_select"]
