"""The CNL paper's evaluation of individual-knowledge localization (§3–4, Table 4).

- :func:`fidelity` — do rewrites of a fact get the same KN neurons / traced layers / circuit?
- :func:`reliability` — do the methods' own validations single out the located parameters
  (KN double / zero vs matched random neurons, ROME at every layer, KC recall with the circuit
  alone)?
- :func:`decoupling` — KN on comparative pairs (one arithmetic main part, two framings):
  coincidence rates ``C^{1,2}``, ``C^{1,1}``, ``C^{2,2}``.
- :func:`compare` — the paper's Table 4 (Overlap, Neuron, IPP) for KN, ROME, KC and CNL.

Every experiment is a composition of the methods' public APIs (nothing re-implemented), streams
with a progress bar, checkpoints every few items and resumes. See ``docs/cnl_eval.md``.

Example:
    >>> from tlcap.data.rewrites import rewrite_facts
    >>> from tlcap.experiments.cnl_eval import fidelity
    >>> facts = rewrite_facts(model, n=2, n_rewrites=2, known_top_k=5000)   # tiny random model: wide top-k
    >>> from tlcap import RunControl
    >>> res = fidelity(model, facts, kn__steps=2, trace__top_k=1, samples=2, top_n=20, kc__steps=2,
    ...                run=RunControl(progress=False))
    >>> print(res.estimate("kn"))
    0.940 [0.93, 0.95] (n=2)
    >>> fig = res.figure()
"""

from tlcap.experiments.cnl_eval.compare import CompareResult, Table4Row, compare
from tlcap.experiments.cnl_eval.decoupling import DecouplingConfig, decoupling
from tlcap.experiments.cnl_eval.decoupling_result import DecouplingResult, PairRow
from tlcap.experiments.cnl_eval.fidelity import FidelityConfig, fidelity
from tlcap.experiments.cnl_eval.reliability import ReliabilityConfig, reliability
from tlcap.experiments.cnl_eval.reliability_merge import merge_reliability
from tlcap.experiments.cnl_eval.reliability_result import KCRow, KNRow, ReliabilityResult, RomeRow
from tlcap.experiments.cnl_eval.results import PAPER, FidelityResult, FidelityRow, RewriteRow

__all__ = [
    "PAPER", "CompareResult", "DecouplingConfig", "DecouplingResult", "FidelityConfig", "FidelityResult", "FidelityRow",
    "KCRow", "KNRow", "PairRow", "ReliabilityConfig", "ReliabilityResult", "RewriteRow", "RomeRow", "Table4Row",
    "compare", "decoupling", "fidelity", "merge_reliability", "reliability",
]
