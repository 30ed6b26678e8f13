"""CNL experiments (CNL paper §5): locate capability neurons on a dataset with split-half
stability and convergence, then erase, enhance and compare them across datasets.

Modules: :mod:`~tlcap.experiments.cnl.config` (validated configs), :mod:`.locate` (scores,
σ-mask, split-half, convergence), :mod:`.erase` (erase and σ sweep, Table 3), :mod:`.enhance`
(masked fine-tuning, Table 2), :mod:`.cross` (overlap / erase / enhance across datasets, Fig. 5,
App. G). Figures are in :mod:`tlcap.viz.cnl`.

Example:
    >>> from tlcap.data import load_task
    >>> from tlcap import RunControl
    >>> loc = cnl_locate(model, "emotion", load_task("emotion", split="train", n=4), sigma=3, steps=2,
    ...                  run=RunControl(progress=False))
    >>> round(loc.split_overlap, 3), round(loc.neuron_ratio, 4)
    (0.24, 0.0234)
    >>> test = load_task("emotion", split="test", n=4)
    >>> er = erase_effect(model, "emotion", test, loc.neuron_set(), n_random=2)
    >>> round(er.located_delta, 3), er.random_scores.shape
    (0.0, torch.Size([2, 4]))
    >>> sweep = erase_sweep(model, "emotion", test, loc, (3, 6), n_random=2)
    >>> len(sweep.to_frame())                  # one row per sigma
    2

The tiny random model answers no test sample correctly, so every accuracy change above is 0; on
SmolLM2-135M erasing the located neurons lowers accuracy far more than erasing random ones.
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
