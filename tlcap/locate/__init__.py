"""Locating: selection rules, causal tracing, and (in ``tlcap.locate.circuits``) knowledge circuits."""

from tlcap.locate.causal_trace import CausalTrace, causal_trace, trace_dataset
from tlcap.locate.selection import refine, sigma_mask, threshold_select, top_k_select

__all__ = ["CausalTrace", "causal_trace", "trace_dataset", "refine", "sigma_mask", "threshold_select", "top_k_select"]
