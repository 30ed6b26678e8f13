"""``tlcap reproduce``: both papers' tables and figures in one command, beside the papers' numbers.

Layers: the paper-values registry (:mod:`.registry`), the verdict rule (:mod:`.verdict`), a stage
runner with a content-addressed cache (:mod:`.stages`), sizes per scale (:mod:`.scales`), the cost
model (:mod:`.cost`), the stages wired to tlcap's experiments (:mod:`.cnl_stages`, :mod:`.ql_stages`)
and the report (:mod:`.report`). See ``docs/reproduce.md``.
"""

from tlcap.reproduce.paper_values import PaperClaim, PaperValue
from tlcap.reproduce.registry import PAPER_CLAIMS, PAPER_VALUES, paper_claim, paper_value, paper_values, values_frame

__all__ = ["PaperValue", "PaperClaim", "PAPER_VALUES", "PAPER_CLAIMS", "paper_values", "paper_value", "paper_claim",
           "values_frame"]
