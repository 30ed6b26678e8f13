"""CNL experiments (CNL paper §5): locate capability neurons on a dataset with split-half
stability and convergence, then erase, enhance and compare them across datasets.

Modules: :mod:`~tlcap.experiments.cnl.config` (validated configs), :mod:`.locate` (scores,
σ-mask, split-half, convergence), :mod:`.erase` (erase and σ sweep, Table 3), :mod:`.enhance`
(masked fine-tuning, Table 2), :mod:`.cross` (overlap / erase / enhance across datasets, Fig. 5,
App. G). Figures are in :mod:`tlcap.viz.cnl`.

Example:
    >>> from tlcap.data import load_task
    >>> loc = cnl_locate(model, "imdb", load_task("imdb", split="train", n=200), sigma=3)
    >>> loc.split_overlap, loc.neuron_ratio
    >>> er = erase_effect(model, "imdb", load_task("imdb", split="test", n=200), loc.neuron_set())
    >>> sweep = erase_sweep(model, "imdb", load_task("imdb", split="test", n=200), loc, (3, 6, 12))
"""

from tlcap.experiments.cnl.config import (
    ENHANCE_MODES,
    CNLConfig,
    CNLWarning,
    CrossConfig,
    EnhanceConfig,
    EraseConfig,
    check_sigmas,
)
from tlcap.experiments.cnl.cross import CrossResult, CrossRow, cross_dataset
from tlcap.experiments.cnl.enhance import EnhanceResult, EnhanceRow, enhance_effect, tuned
from tlcap.experiments.cnl.erase import EraseResult, EraseRow, EraseSweep, SweepRow, erase_effect, erase_sweep
from tlcap.experiments.cnl.locate import (
    CNLLocation,
    ConvergenceRow,
    Parts,
    cnl_locate,
    finalize,
    ladder,
    load_parts,
    merge_parts,
    save_parts,
    score_parts,
    split_halves,
)
from tlcap.viz.cnl import located_sets_figure

__all__ = [
    "CNLConfig", "EraseConfig", "EnhanceConfig", "CrossConfig", "CNLWarning", "ENHANCE_MODES", "check_sigmas",
    "CNLLocation", "ConvergenceRow", "EraseResult", "EraseRow", "EraseSweep", "SweepRow", "EnhanceResult", "EnhanceRow",
    "CrossResult", "CrossRow", "Parts", "cnl_locate", "score_parts", "merge_parts", "finalize", "save_parts",
    "load_parts", "split_halves", "ladder", "erase_effect", "erase_sweep", "enhance_effect", "tuned", "cross_dataset",
    "located_sets_figure",
]
