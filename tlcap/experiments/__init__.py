"""Experiments: compositions of runtime pieces returning result values (KN, CNL, QL)."""
