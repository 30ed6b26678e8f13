"""CNL rows of the interventions: Table 3 (erase), Table 2 (enhance), Fig. 5 (cross-dataset).

- **Table 3**: located − random accuracy after erasing, per σ. The effect is ``mean_i(L_i − R̄_i)``
  over the test items (``L_i`` the item's score with the located set erased, ``R̄_i`` its mean
  score over the matched random sets), with a paired bootstrap CI over items. The claim needs two
  things: the located set is beyond the random sets (its accuracy's two-sided rank among the R
  random sets', floor ``2/(R+1)``), *and* the effect is not item noise (a two-sided paired t-test of
  ``L_i − R̄_i`` over the items). The row's p-value is the larger of the two (an intersection–union
  test: its size is at most α). The rank alone is not enough: when every random set leaves the
  accuracy where it was, moving two of thirty test items gives the located set the best rank.
  Beside it, the WikiText-2 perplexity control: the located set's perplexity change against the
  random sets' (a *control* row: tested, no paper claim).
- **Table 2**: located − random (and located − w/o located) after masked fine-tuning, on the same
  held-out items: exact McNemar test on the items' 0/1 outcomes, paired bootstrap CI. With one
  random fine-tune (the paper's protocol) the located − random test is conditional on that draw;
  with R ≥ 2 (``enhance_n_random`` of the scale) the row compares located with the mean of the R
  random sets (:func:`~tlcap.metrics.effects.random_draws_effect`: the larger p of a prediction
  t-test over the draws and a paired t-test over items, a CI resampling both), and a value row
  gives the draws' mean accuracy.
- **Fig. 5**: the change on the dataset the neurons were located on minus on the others.

Rows fall back to what an older cached result holds (no per-item random scores: the random sets'
mean accuracy stands in for ``R̄_i``; no per-item enhance outcomes: the unpaired two-proportion
z-test, named as such).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tlcap.data.tasks import get_task
from tlcap.errors import InvalidConfigError
from tlcap.experiments.cnl import CrossResult, EnhanceResult, EraseResult
from tlcap.metrics import bootstrap_ci, share_ci
from tlcap.metrics.accuracy import TaskAccuracy
from tlcap.metrics.bootstrap import crossed_ci
from tlcap.metrics.effects import (
    NO_EFFECT,
    Effect,
    mcnemar_effect,
    paired_effect,
    paired_p,
    proportion_diff,
    random_draws_effect,
    two_group_effect,
)
from tlcap.metrics.estimate import Estimate
from tlcap.metrics.permutation import p_floor, permutation_p_value
from tlcap.metrics.sensitivity import SensitivityCurve
from tlcap.reproduce.registry import paper_claim
from tlcap.reproduce.report import RowBuilder
from tlcap.reproduce.scales import SIGMAS, ScaleConfig
from tlcap.results import Result

Get = Callable[[str], "dict[str, Result] | None"]
LABEL = {"gsm8k": "GSM8K", "svamp": "Meta_Math", "mbpp": "Code25K", "emotion": "Emotion", "imdb": "IMDB"}
STAND_IN = {"svamp": "data: SVAMP stands in for Meta_Math", "mbpp": "data: MBPP stands in for Code25K"}
MODE = {"located": "located", "random": "random", "wo_located": "w/o located", "except_frozen": "w/o located (frozen)"}
UNIT = {"choice": "test items", "code": "test items", "number": "test items"}


def _f(row: object, name: str) -> Any:
    """A field of a result row (typed row dataclass or dict)."""
    return row[name] if isinstance(row, dict) else getattr(row, name)


def _scores(res: Result | None) -> np.ndarray | None:
    return np.asarray(res.scores, dtype=float) if isinstance(res, TaskAccuracy) and res.scores else None


def _spread(values: Sequence[float] | np.ndarray) -> str:
    v = np.asarray(values, dtype=float)
    if not len(v):
        return "–"
    lo, hi = np.quantile(v, [0.025, 0.975])
    return f"mean {v.mean():.3g}, middle 95 % of sets [{lo:.3g}, {hi:.3g}] ({len(v)} sets)"


def erase_effect_row(located: np.ndarray, random_items: np.ndarray | None, random_acc: Sequence[float] | np.ndarray, *,
                     n_boot: int, seed: int) -> Effect:
    """Located − random accuracy after erasing (module doc): paired CI over items, set-rank p-value.

    Args:
        located: Per-item scores with the located set erased, ``(n,)``.
        random_items: Per-item scores with each random set erased, ``(R, n)`` (``None`` when the
            result holds only the random sets' accuracies).
        random_acc: Accuracy per random set, ``(R,)``.
        n_boot: Bootstrap resamples.
        seed: Their seed.

    Returns:
        The :class:`Effect` (estimate over items, two-sided Monte-Carlo p over sets, its floor).
    """
    rnd = np.asarray(random_acc, dtype=float)
    if random_items is not None:
        rbar = np.asarray(random_items, dtype=float).mean(0)
        rnd = np.asarray(random_items, dtype=float).mean(1)
    else:
        rbar = np.full(len(located), float(rnd.mean()))
    est = bootstrap_ci(located - rbar, n_boot=n_boot, seed=seed)
    p_rank = permutation_p_value(float(located.mean()), rnd, "two-sided")
    p_items = paired_p(located - rbar)
    p_items = 1.0 if p_items != p_items else p_items
    return Effect(est, max(p_rank, p_items), f"max of the rank among {len(rnd)} matched random sets (p {p_rank:.2g}) and "
                                             f"a paired t-test over items (p {p_items:.2g})", p_floor(len(rnd)))


def _ppl_control(rb: RowBuilder, item: str, tag: str, er: EraseResult) -> None:
    ppl = er.perplexities.tolist()  # unedited, located erased, then the first random sets erased
    if len(ppl) < 3:
        return
    base, loc, rnd = ppl[0], ppl[1], np.asarray(ppl[2:], dtype=float)
    d_loc, d_rnd = float(loc) - float(base), rnd - float(base)
    lo, hi = np.quantile(d_rnd, [0.025, 0.975])
    est = Estimate(d_loc - float(d_rnd.mean()), d_loc - hi, d_loc - lo, n=len(d_rnd), method="null quantiles")
    rb.control(item, f"{tag} WikiText-2 perplexity change: located − random", est,
               permutation_p_value(d_loc, d_rnd, "two-sided"), f"rank among {len(d_rnd)} matched random sets",
               p_floor=p_floor(len(d_rnd)), n_unit="random sets",
               control=f"base perplexity {float(base):.4g}; random erased: {_spread(d_rnd)}",
               what="– (control: erasing a capability's neurons should not wreck language modelling)")


def table3(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """CNL Table 3 (erase at σ = 3, 6, 12) with located-vs-random tests, perplexity controls and σ curves.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        scale: The scale's sizes (``cnl_eval_datasets``).
        n_boot: Bootstrap resamples of the CIs.
        seed: Seed of the bootstraps.
    """
    item = "CNL Table 3"
    claim = paper_claim("cnl.table3.located-vs-random")
    for ds in scale.cnl_eval_datasets:
        label = LABEL[ds]
        diffs = [*rb.model_difference("cnl"), *([STAND_IN[ds]] if ds in STAND_IN else [])]
        out = get(f"cnl.erase.{ds}")
        base_pv = rb.paper_value("cnl", "Table 3", "accuracy", method="base", dataset=label)
        unit = UNIT.get(get_task(ds).kind, "test items")
        if out is None:
            rb.missing(item, f"{ds} · base accuracy", why(f"cnl.erase.{ds}"), base_pv)
            for s in SIGMAS:
                rb.missing(item, f"{ds} · σ={s:g} located − random", why(f"cnl.erase.{ds}"), claim=claim)
            continue
        base = _scores(out.get("base"))
        rb.value(item, f"{ds} · base accuracy", bootstrap_ci(base, n_boot=n_boot, seed=seed) if base is not None else None,
                 base_pv, differences=diffs, n_unit=unit)
        located_curve = []
        for s in SIGMAS:
            er, loc = out.get(f"sigma{s:g}"), _scores(out.get(f"sigma{s:g}_located"))
            if isinstance(er, EraseResult) and loc is None:
                loc = er.located_scores.double().numpy() if er.located_scores.numel() else None
            if not isinstance(er, EraseResult) or loc is None:
                rb.missing(item, f"{ds} · σ={s:g} located − random",
                           "not computed: no neuron above mean + σ·std at this σ (empty located set)", claim=claim)
                continue
            tag = f"{ds} · σ={s:g} ({er.n_neurons} neurons)"
            le = bootstrap_ci(loc, n_boot=n_boot, seed=seed)
            located_curve.append(le)
            rnd_items = er.random_scores.double().numpy() if er.random_scores.numel() else None
            rnd_acc = rnd_items.mean(1) if rnd_items is not None else np.asarray(er.random_accuracies, dtype=float)
            rb.value(item, f"{tag} located erased", le,
                     rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="located", dataset=label),
                     differences=diffs, n_unit=unit)
            rmean = bootstrap_ci(rnd_items.mean(0), n_boot=n_boot, seed=seed) if rnd_items is not None else \
                Estimate(float(rnd_acc.mean()), math.nan, math.nan, n=len(rnd_acc), method="none")
            rb.value(item, f"{tag} random erased (mean of {len(rnd_acc)} sets)", rmean,
                     rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="random", dataset=label),
                     differences=diffs, n_unit=unit if rnd_items is not None else "random sets",
                     no_ci="" if rnd_items is not None else "no per-item scores of the random sets in this result",
                     control=_spread(rnd_acc))
            eff = erase_effect_row(loc, rnd_items, rnd_acc, n_boot=n_boot, seed=seed)
            pl = rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="located", dataset=label)
            pr = rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="random", dataset=label)
            rb.effect(item, f"{tag} located − random", claim, eff.estimate, eff.p_value, eff.test, p_floor=eff.p_floor,
                      paper=(pl.value - pr.value) / 100 if pl and pr else None,
                      paper_text=f"{pl.printed} − {pr.printed} % ({pl.model})" if pl and pr else "", differences=diffs,
                      n_unit=unit, control=f"random erased: {_spread(rnd_acc)}")
            _ppl_control(rb, item, tag, er)
        if len(located_curve) == len(SIGMAS):
            c = SensitivityCurve.from_estimates(SIGMAS, located_curve, "sigma", f"{ds} accuracy, located neurons erased")
            rb.figure(item, f"cnl_table3_sigma_{ds}", c.figure(f"CNL Table 3: {ds} accuracy after erasing vs σ"))


def _outcomes(res: EnhanceResult, mode: str, epoch: int) -> np.ndarray | None:
    """Per-item held-out outcomes of one (mode, epoch), when the result keeps them."""
    scores = getattr(res, "item_scores", None)
    if scores is None or not scores.numel() or scores.shape[0] != len(res.rows):
        return None  # a result saved before tlcap kept per-item scores
    for k, r in enumerate(res.rows):
        if _f(r, "mode") == mode and _f(r, "epoch") == epoch:
            return scores[k].double().numpy()
    return None


def _random_draws(res: EnhanceResult, epoch: int) -> np.ndarray | None:
    """``[draw, item]`` scores of the random fine-tunes after ``epoch`` when the result has two or more and the
    located row's per-item scores (else ``None``: the one-draw row, conditional on that draw)."""
    if getattr(res, "n_random", 1) < 2 or _outcomes(res, "located", epoch) is None:
        return None
    try:
        return res.random_draws(epoch).double().numpy()
    except InvalidConfigError:
        return None


def _enhance_contrast(res: EnhanceResult, a: str, b: str, epoch: int, acc: dict, binary: bool, n_boot: int,
                      seed: int) -> Effect:
    xa, xb = _outcomes(res, a, epoch), _outcomes(res, b, epoch)
    if xa is not None and xb is not None and len(xa) == len(xb):
        if binary:
            return mcnemar_effect(xa, xb, n_boot=n_boot, seed=seed)
        if len(xa) < 2:
            return NO_EFFECT
        return paired_effect(xa, xb, n_boot=n_boot, seed=seed)
    if not binary:
        return Effect(Estimate(acc[(a, epoch)] - acc[(b, epoch)], math.nan, math.nan, n=res.n_eval), None,
                      "", None)
    e = proportion_diff(round(acc[(a, epoch)] * res.n_eval), res.n_eval, round(acc[(b, epoch)] * res.n_eval), res.n_eval)
    return e._replace(test="two-proportion z-test (unpaired: this result keeps no per-item outcomes)")


def table2(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int = 5000,
           seed: int = 0) -> None:
    """CNL Table 2 (enhance): accuracy per mode and epoch; located − random and located − w/o located.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        scale: The scale's sizes (``cnl_eval_datasets``, ``cnl_sigma``, ``enhance_epochs``).
        n_boot: Bootstrap resamples of the CIs.
        seed: Seed of the bootstraps.
    """
    item = "CNL Table 2"
    claim = paper_claim("cnl.table2.located-vs-random")
    sig = f"{scale.cnl_sigma:g}"
    for ds in scale.cnl_eval_datasets:
        label = LABEL[ds]
        diffs = [*rb.model_difference("cnl"), *([STAND_IN[ds]] if ds in STAND_IN else [])]
        out = get(f"cnl.enhance.{ds}")
        res = out.get("enhance") if out else None
        if not isinstance(res, EnhanceResult):
            for e in scale.enhance_epochs:
                rb.missing(item, f"{ds} · epoch {e} located − random", why(f"cnl.enhance.{ds}"), claim=claim)
            continue
        binary = get_task(ds).kind != "code"
        acc = {(_f(r, "mode"), _f(r, "epoch")): _f(r, "accuracy") for r in res.rows}
        for (mode, epoch), a in acc.items():
            x = _outcomes(res, mode, epoch)
            if binary:
                k = int(round(a * res.n_eval))
                est = share_ci([1.0] * k + [0.0] * (res.n_eval - k))
            else:
                est = bootstrap_ci(x, n_boot=n_boot, seed=seed) if x is not None else \
                    Estimate(a, np.nan, np.nan, n=res.n_eval, method="none")
            rb.value(item, f"{ds} · {MODE.get(mode, mode)} · epoch {epoch}", est,
                     rb.paper_value("cnl", "Table 2", "accuracy", sigma=sig, method=MODE.get(mode, mode), epoch=str(epoch),
                                    dataset=label), differences=diffs, n_unit="test items",
                     no_ci="" if x is not None or binary else "this result keeps no per-item scores of the code task")
        for e in sorted({ep for _, ep in acc}):
            draws = _random_draws(res, e)
            if draws is not None:  # R >= 2 random fine-tunes: the value row of their mean accuracy
                est = crossed_ci(draws, n_boot=n_boot, seed=seed)
                rb.value(item, f"{ds} · random, mean of {len(draws)} random sets · epoch {e}", est,
                         rb.paper_value("cnl", "Table 2", "accuracy", sigma=sig, method="random", epoch=str(e),
                                        dataset=label), differences=diffs, n_unit="test items")
            for other in ("random", "wo_located"):
                if ("located", e) not in acc or (other, e) not in acc:
                    continue
                pl = rb.paper_value("cnl", "Table 2", "accuracy", sigma=sig, method="located", epoch=str(e), dataset=label)
                pr = rb.paper_value("cnl", "Table 2", "accuracy", sigma=sig, method=MODE[other], epoch=str(e), dataset=label)
                control = ""
                if other == "random" and draws is not None:
                    # several random fine-tunes: located against random sets in general (prediction t over the draws)
                    # and against item noise; the paper's one draw is the first of them
                    eff = random_draws_effect(_outcomes(res, "located", e), draws, n_boot=n_boot, seed=seed)
                    lab, test = f"random (mean of {len(draws)} random sets)", eff.test
                    control = f"random fine-tuned: {_spread(draws.mean(1))}"
                else:
                    eff = _enhance_contrast(res, "located", other, e, acc, binary, n_boot, seed)
                    lab = "random (1 random set, as the paper)" if other == "random" else "w/o located"
                    # one random fine-tune, as the paper: its test is conditional on that draw (is located better
                    # than this random set on these items?), not a test against random sets in general
                    test = eff.test + ("; conditional on the one random set drawn, not a test against random sets"
                                       if other == "random" and eff.test else "")
                rb.effect(item, f"{ds} · epoch {e} located − {lab}", claim, eff.estimate, eff.p_value, test,
                          p_floor=eff.p_floor, paper=(pl.value - pr.value) / 100 if pl and pr else None,
                          differences=diffs, n_unit="test items", control=control,
                          no_ci="the code task's per-item scores are not kept in this result" if eff.p_value is None else "")
        rb.figure(item, f"cnl_table2_{ds}", res.figure())


def _cross_item_deltas(res: CrossResult) -> list[list[np.ndarray]] | None:
    """Per cell ``[source][dataset]``: each item's score with the source's neurons erased minus its mean score over
    the random erasures (the base score cancels); ``None`` when the result keeps no per-item scores or no random set."""
    sc = getattr(res, "erase_scores", None)
    if sc is None or sc.ndim != 4 or not sc.numel() or sc.shape[2] < 2 or len(res.n_items) != sc.shape[1]:
        return None
    x = sc.double().numpy()
    return [[x[i, j, 0, :n] - x[i, j, 1:, :n].mean(0) for j, n in enumerate(res.n_items)] for i in range(sc.shape[0])]


def fig5(rb: RowBuilder, get: Get, why: Callable[[str], str], *, n_boot: int = 5000, seed: int = 0) -> None:
    """CNL Fig. 5: the cross-dataset erase matrix and the "own dataset" claim.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        n_boot: Bootstrap resamples of the own-vs-other effect's CI.
        seed: Seed of the bootstraps.
    """
    item, claim = "CNL Fig. 5", paper_claim("cnl.fig5.own-dataset")
    out = get("cnl.cross")
    res = out.get("cross") if out else None
    if not isinstance(res, CrossResult):
        rb.missing(item, "erase Δ on own dataset − mean Δ on the others", why("cnl.cross"), claim=claim)
        return
    rb.figure(item, "cnl_fig5_erase_delta", res.matrix_figure("erase_delta"))
    rb.figure(item, "cnl_fig5_random_delta", res.matrix_figure("random_delta"))
    d = (res.erase_delta - res.random_delta).numpy()
    items = _cross_item_deltas(res)
    for i, a in enumerate(res.names):
        row = f"{a} neurons · (erase − random) Δ on {a} − on the other datasets' items pooled"
        if items is not None:
            own = np.asarray(items[i][i], dtype=float)
            rest = np.concatenate([np.asarray(items[i][j], dtype=float) for j in range(len(res.names)) if j != i])
            eff = two_group_effect(own, rest, n_boot=n_boot, seed=seed)
            rb.effect(item, row, claim, eff.estimate, eff.p_value, eff.test, p_floor=eff.p_floor,
                      differences=rb.model_difference("cnl"), n_unit="test items")
            continue
        others = [d[i, j] for j in range(len(res.names)) if j != i]
        eff_est = Estimate(float(d[i, i] - np.mean(others)), np.nan, np.nan, n=len(res.names))
        rb.effect(item, row, claim, eff_est, None, "", differences=rb.model_difference("cnl"), n_unit="datasets",
                  no_ci=f"one number per cell of the {len(res.names)}×{len(res.names)} matrix (no per-item scores kept): "
                        "no test")


__all__ = ["table2", "table3", "fig5", "erase_effect_row", "LABEL", "STAND_IN", "MODE"]
