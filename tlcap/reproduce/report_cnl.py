"""The CNL paper's report rows and figures, from the outputs of :mod:`.cnl_stages`.

Statistics (see ``docs/reproduce.md``):

- **Table 1** (split-half overlap, IoU, neuron ratio): CIs from a cluster bootstrap over the
  scoring groups (groups of each half resampled with replacement, the located sets re-selected
  from the resampled sums); the located-vs-random effect is the overlap of the half-A set with
  the half-B set minus with ≥ 20 random sets matched to the half-B set (same count per layer),
  with its permutation p-value. σ sensitivity: the same at σ = 3, 6, 12 (a curve per dataset).
- **Fig. 6** (convergence): overlap of the full halves minus the mean overlap of single groups.
- **Table 3** (erase): accuracies with per-sample bootstrap CIs; located minus the mean of ≥ 20
  matched random sets, permutation p-value (:func:`located_vs_random`, ``alternative="less"``).
- **Table 2** (enhance): Wilson CIs (0/1 accuracies); located minus random by Newcombe's interval.
- The evaluation suite (§3.1, §3.2, Fig. 2, §4, Table 4): :mod:`tlcap.reproduce.report_cnl_eval`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go
import torch

from tlcap.attribution.dataset import DatasetScores, from_fixed
from tlcap.data.tasks import get_task
from tlcap.experiments.cnl import CNLLocation, CrossResult, EnhanceResult, EraseResult, located_sets_figure
from tlcap.locate.selection import sigma_mask
from tlcap.metrics import NeuronSet, bootstrap_ci, located_vs_random, share_ci
from tlcap.metrics.accuracy import TaskAccuracy
from tlcap.metrics.effects import bootstrap_p, proportion_diff
from tlcap.metrics.estimate import Estimate
from tlcap.metrics.sensitivity import SensitivityCurve
from tlcap.reproduce.registry import paper_claim
from tlcap.reproduce.report import RowBuilder
from tlcap.reproduce.report_cnl_eval import suite_report
from tlcap.reproduce.scales import SIGMAS, ScaleConfig
from tlcap.results import Result

Get = Callable[[str], "dict[str, Result] | None"]
LABEL = {"gsm8k": "GSM8K", "svamp": "Meta_Math", "mbpp": "Code25K", "emotion": "Emotion", "imdb": "IMDB"}
STAND_IN = {"svamp": "data: SVAMP stands in for Meta_Math", "mbpp": "data: MBPP stands in for Code25K"}
MODE = {"located": "located", "random": "random", "wo_located": "w/o located", "except_frozen": "w/o located (frozen)"}
MAX_SET_BOOT = 1000


class Groups:
    """The group sums of one dataset's ``cnl.locate`` outputs, for bootstrapping located sets."""

    def __init__(self, out: dict[str, Result]) -> None:
        parts = {k[len("group_"):]: v for k, v in out.items() if k.startswith("group_") and isinstance(v, DatasetScores)}
        self.a = [parts[k] for k in sorted(parts) if k.startswith("A")]
        self.b = [parts[k] for k in sorted(parts) if k.startswith("B")]
        self.sa = torch.stack([from_fixed(p.sums) for p in self.a])
        self.sb = torch.stack([from_fixed(p.sums) for p in self.b])
        self.na = torch.tensor([float(p.n_samples) for p in self.a], dtype=torch.float64)
        self.nb = torch.tensor([float(p.n_samples) for p in self.b], dtype=torch.float64)
        self.n = int(self.na.sum() + self.nb.sum())
        self.n_groups = len(self.a) + len(self.b)

    @staticmethod
    def _select(sums: torch.Tensor, n: torch.Tensor, w: torch.Tensor, sigma: float) -> NeuronSet:
        total = float((w * n).sum())
        scores = torch.einsum("g,gld->ld", w, sums) / max(total, 1.0)
        return sigma_mask(scores, sigma)

    def halves(self, sigma: float, wa: torch.Tensor | None = None, wb: torch.Tensor | None = None) -> tuple[NeuronSet, NeuronSet]:
        wa = torch.ones(len(self.a), dtype=torch.float64) if wa is None else wa
        wb = torch.ones(len(self.b), dtype=torch.float64) if wb is None else wb
        return self._select(self.sa, self.na, wa, sigma), self._select(self.sb, self.nb, wb, sigma)

    def pooled(self, sigma: float, w: torch.Tensor | None = None) -> NeuronSet:
        sums, n = torch.cat([self.sa, self.sb]), torch.cat([self.na, self.nb])
        return self._select(sums, n, torch.ones(len(n), dtype=torch.float64) if w is None else w, sigma)

    def weights(self, rng: np.random.Generator, k: int) -> torch.Tensor:
        return torch.tensor(np.bincount(rng.integers(0, k, k), minlength=k), dtype=torch.float64)


def _f(row: object, name: str) -> object:
    """A field of a result row (typed row dataclass or dict)."""
    return row[name] if isinstance(row, dict) else getattr(row, name)


def _est(value: float, reps: Sequence[float], n: int, n_groups: int, n_boot: int, seed: int) -> Estimate:
    r = np.asarray(reps, dtype=float)
    r = r[~np.isnan(r)]
    lo, hi = (float(np.quantile(r, 0.025)), float(np.quantile(r, 0.975))) if len(r) > 1 and n_groups > 2 else (np.nan, np.nan)
    return Estimate(value, lo, hi, n=n, method="percentile", n_groups=n_groups, n_boot=n_boot, seed=seed)


def _split_stats(g: Groups, sigma: float, n_boot: int, seed: int) -> dict[str, Estimate]:
    a, b = g.halves(sigma)
    full = g.pooled(sigma)
    rng = np.random.default_rng(seed)
    reps: dict[str, list[float]] = {"overlap": [], "IoU": [], "neuron": []}
    for _ in range(min(n_boot, MAX_SET_BOOT)):
        ra, rb = g.halves(sigma, g.weights(rng, len(g.a)), g.weights(rng, len(g.b)))
        reps["overlap"].append(ra.overlap(rb))
        reps["IoU"].append(ra.iou(rb))
        w = torch.cat([g.weights(rng, len(g.a)), g.weights(rng, len(g.b))])
        reps["neuron"].append(g.pooled(sigma, w).ratio())
    B = min(n_boot, MAX_SET_BOOT)
    return {"overlap": _est(a.overlap(b), reps["overlap"], g.n, g.n_groups, B, seed),
            "IoU": _est(a.iou(b), reps["IoU"], g.n, g.n_groups, B, seed),
            "neuron": _est(full.ratio(), reps["neuron"], g.n, g.n_groups, B, seed)}


def table1(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int,
           seed: int) -> dict[str, Groups]:
    """CNL Table 1, its located-vs-random rows, the σ curves and Fig. 6 (convergence)."""
    item, out_groups = "CNL Table 1", {}
    curves: dict[str, list[Estimate]] = {}
    conv = go.Figure()
    for ds in scale.cnl_datasets:
        out = get(f"cnl.locate.{ds}")
        diffs = [rb.model_difference("cnl"), *([STAND_IN[ds]] if ds in STAND_IN else [])]
        label = LABEL[ds]
        if out is None:
            for q in ("overlap", "IoU", "neuron"):
                rb.missing(item, f"{ds} · {q}", why(f"cnl.locate.{ds}"), rb.paper_value("cnl", "Table 1", q, dataset=label))
            rb.missing(item, f"{ds} · overlap vs matched random sets", why(f"cnl.locate.{ds}"),
                       claim=paper_claim("cnl.table1.above-random"))
            rb.missing("CNL Fig. 6", f"{ds} · convergence", why(f"cnl.locate.{ds}"), claim=paper_claim("cnl.fig6.converges"))
            continue
        g = Groups(out)
        out_groups[ds] = g
        st = _split_stats(g, scale.cnl_sigma, n_boot, seed)
        for q in ("overlap", "IoU", "neuron"):
            rb.value(item, f"{ds} · {q} (σ={scale.cnl_sigma:g}, n={g.n})", st[q],
                     rb.paper_value("cnl", "Table 1", q, dataset=label), differences=diffs)
        a, b = g.halves(scale.cnl_sigma)
        null = [a.overlap(b.random_like(seed=seed + i)) for i in range(scale.n_random)]
        test = located_vs_random(a.overlap(b), null, alternative="greater", statistic="split-half overlap",
                                 min_draws=scale.min_null_draws)
        eff = Estimate(st["overlap"].value - test.null_mean, st["overlap"].low - test.null_mean,
                       st["overlap"].high - test.null_mean, n=g.n, n_groups=g.n_groups, method="percentile")
        rb.effect(item, f"{ds} · overlap − overlap with matched random sets", paper_claim("cnl.table1.above-random"), eff,
                  test.p_value, f"permutation vs {test.n_null} matched random sets", differences=diffs[1:])
        curves[ds] = [_split_stats(g, s, n_boot // 4 or 1, seed)["overlap"] for s in SIGMAS]
        loc = out.get("location")
        if isinstance(loc, CNLLocation):
            df = loc.to_frame()
            if len(df):
                conv.add_trace(go.Scatter(x=df["n_half"], y=df["overlap"], mode="lines+markers", name=ds))
        rng = np.random.default_rng(seed)
        k = min(len(g.a), len(g.b))
        single = float(np.mean([g._select(g.sa[j:j + 1], g.na[j:j + 1], torch.ones(1, dtype=torch.float64), scale.cnl_sigma)
                                .overlap(g._select(g.sb[j:j + 1], g.nb[j:j + 1], torch.ones(1, dtype=torch.float64),
                                                   scale.cnl_sigma)) for j in range(k)]))
        reps = []
        for _ in range(min(n_boot, MAX_SET_BOOT) // 4 or 1):
            ra, rb_ = g.halves(scale.cnl_sigma, g.weights(rng, len(g.a)), g.weights(rng, len(g.b)))
            j = int(rng.integers(0, k))
            one = torch.ones(1, dtype=torch.float64)
            sa, sb = g._select(g.sa[j:j + 1], g.na[j:j + 1], one, scale.cnl_sigma), g._select(g.sb[j:j + 1], g.nb[j:j + 1], one,
                                                                                          scale.cnl_sigma)
            reps.append(ra.overlap(rb_) - sa.overlap(sb))
        eff6 = _est(st["overlap"].value - single, reps, g.n, g.n_groups, len(reps), seed)
        rb.effect("CNL Fig. 6", f"{ds} · overlap with {g.n // 2} vs {g.n // max(g.n_groups, 1)} samples per half",
                  paper_claim("cnl.fig6.converges"), eff6, bootstrap_p(reps), "bootstrap over groups",
                  differences=diffs[1:])
    if curves:
        fig = go.Figure()
        for ds, ests in curves.items():
            c = SensitivityCurve.from_estimates(SIGMAS, ests, "sigma", "split-half overlap")
            fig.add_trace(go.Scatter(x=list(c.x), y=list(c.value), mode="lines+markers", name=ds,
                                     error_y=dict(type="data", symmetric=False,
                                                  array=[h - v for h, v in zip(c.high, c.value)],
                                                  arrayminus=[v - lo for v, lo in zip(c.value, c.low)])))
        fig.update_layout(title="CNL σ sensitivity: split-half overlap at σ = 3, 6, 12 (95 % CI)", xaxis_title="σ",
                          yaxis_title="overlap", template="plotly_white", width=800, height=480)
        rb.figure(item, "cnl_sigma_sensitivity", fig)
    if conv.data:
        conv.update_layout(title="CNL Fig. 6: split-half overlap as the data grows", xaxis_title="samples per half",
                           yaxis_title="overlap", yaxis=dict(range=[0, 1.02]), template="plotly_white", width=800, height=480)
        rb.figure("CNL Fig. 6", "cnl_fig6_convergence", conv)
    return out_groups


def fig4(rb: RowBuilder, groups: dict[str, Groups], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """The located sets of every dataset (Fig. 4 / poster Fig. 3), their overlap matrix, the GSM8K–Emotion claim."""
    item = "CNL Fig. 4"
    claim = paper_claim("cnl.fig4.gsm8k-emotion")
    sets = {ds: g.pooled(scale.cnl_sigma) for ds, g in groups.items()}
    if sets:
        rb.figure(item, "cnl_fig4_located_neurons", located_sets_figure(sets, "CNL: located neurons per dataset"))
        names = list(sets)
        z = [[sets[a].overlap(sets[b]) for b in names] for a in names]
        fig = go.Figure(go.Heatmap(z=z, x=names, y=names, colorscale="Blues", texttemplate="%{z:.2f}"))
        fig.update_layout(title="CNL: overlap between the datasets' located neurons", template="plotly_white", width=600,
                          height=520, yaxis=dict(autorange="reversed"))
        rb.figure(item, "cnl_fig4_overlap_matrix", fig)
    if "gsm8k" not in sets or "emotion" not in sets or len(sets) < 3:
        rb.missing(item, "overlap(GSM8K, Emotion) − mean overlap of the other pairs",
                   "needs the GSM8K, Emotion and at least one more located dataset", claim=claim)
        return

    def stat(s: dict[str, NeuronSet]) -> float:
        others = [s[a].overlap(s[b]) for i, a in enumerate(s) for b in list(s)[i + 1:] if {a, b} != {"gsm8k", "emotion"}]
        return s["gsm8k"].overlap(s["emotion"]) - float(np.mean(others))

    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(min(n_boot, MAX_SET_BOOT) // 4 or 1):
        rs = {ds: g.pooled(scale.cnl_sigma, g.weights(rng, g.n_groups)) for ds, g in groups.items()}
        reps.append(stat(rs))
    n = sum(g.n for g in groups.values())
    est = _est(stat(sets), reps, n, sum(g.n_groups for g in groups.values()), len(reps), seed)
    rb.effect(item, "overlap(GSM8K, Emotion) − mean overlap of the other pairs", claim, est, bootstrap_p(reps),
              "bootstrap over groups", differences=["data: SVAMP/MBPP stand in for Meta_Math/Code25K"])


def _scores(res: Result | None) -> np.ndarray | None:
    return np.asarray(res.scores, dtype=float) if isinstance(res, TaskAccuracy) and res.scores else None


def table3(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """CNL Table 3 (erase at σ = 3, 6, 12) with located-vs-random tests and σ curves."""
    item = "CNL Table 3"
    claim = paper_claim("cnl.table3.located-vs-random")
    for ds in scale.cnl_eval_datasets:
        label = LABEL[ds]
        diffs = [rb.model_difference("cnl"), *([STAND_IN[ds]] if ds in STAND_IN else [])]
        out = get(f"cnl.erase.{ds}")
        base_pv = rb.paper_value("cnl", "Table 3", "accuracy", method="base", dataset=label)
        if out is None:
            rb.missing(item, f"{ds} · base accuracy", why(f"cnl.erase.{ds}"), base_pv)
            for s in SIGMAS:
                rb.missing(item, f"{ds} · σ={s:g} located − random", why(f"cnl.erase.{ds}"), claim=claim)
            continue
        base = _scores(out.get("base"))
        rb.value(item, f"{ds} · base accuracy", bootstrap_ci(base, n_boot=n_boot, seed=seed) if base is not None else None,
                 base_pv, differences=diffs)
        located_curve = []
        for s in SIGMAS:
            er, loc = out.get(f"sigma{s:g}"), _scores(out.get(f"sigma{s:g}_located"))
            if not isinstance(er, EraseResult) or loc is None:
                rb.missing(item, f"{ds} · σ={s:g} located − random",
                           "not computed: no neuron above mean + σ·std at this σ (empty located set)", claim=claim)
                continue
            tag = f"{ds} · σ={s:g} ({er.n_neurons} neurons)"
            le = bootstrap_ci(loc, n_boot=n_boot, seed=seed)
            located_curve.append(le)
            rb.value(item, f"{tag} located erased", le,
                     rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="located", dataset=label),
                     differences=diffs)
            rb.value(item, f"{tag} random erased (mean of {len(er.random_accuracies)} sets)",
                     bootstrap_ci(list(er.random_accuracies), n_boot=n_boot, seed=seed),
                     rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="random", dataset=label),
                     differences=diffs)
            test = located_vs_random(er.located_accuracy, er.random_accuracies, alternative="less",
                                     statistic="accuracy after erasing", min_draws=scale.min_null_draws)
            eff = bootstrap_ci(loc - test.null_mean, n_boot=n_boot, seed=seed)
            pl = rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="located", dataset=label)
            pr = rb.paper_value("cnl", "Table 3", "accuracy", sigma=f"{s:g}", method="random", dataset=label)
            paper = (pl.value - pr.value) / 100 if pl and pr else None
            rb.effect(item, f"{tag} located − random", claim, eff, test.p_value,
                      f"permutation vs {test.n_null} matched random sets", paper=paper,
                      paper_text=f"{pl.printed} − {pr.printed} % ({pl.model})" if pl and pr else "", differences=diffs)
        if len(located_curve) == len(SIGMAS):
            c = SensitivityCurve.from_estimates(SIGMAS, located_curve, "sigma", f"{ds} accuracy, located neurons erased")
            rb.figure(item, f"cnl_table3_sigma_{ds}", c.figure(f"CNL Table 3: {ds} accuracy after erasing vs σ"))


def table2(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig) -> None:
    """CNL Table 2 (enhance): accuracy per mode and epoch, located minus random."""
    item = "CNL Table 2"
    claim = paper_claim("cnl.table2.located-vs-random")
    sig = f"{scale.cnl_sigma:g}"
    for ds in scale.cnl_eval_datasets:
        label = LABEL[ds]
        diffs = [rb.model_difference("cnl"), *([STAND_IN[ds]] if ds in STAND_IN else [])]
        out = get(f"cnl.enhance.{ds}")
        res = out.get("enhance") if out else None
        if not isinstance(res, EnhanceResult):
            for e in scale.enhance_epochs:
                rb.missing(item, f"{ds} · epoch {e} located − random", why(f"cnl.enhance.{ds}"), claim=claim)
            continue
        binary = get_task(ds).kind != "code"  # 0/1 scores: Wilson and Newcombe intervals hold
        acc = {(_f(r, "mode"), _f(r, "epoch")): _f(r, "accuracy") for r in res.rows}
        for (mode, epoch), a in acc.items():
            k = int(round(a * res.n_eval))
            est = share_ci([1.0] * k + [0.0] * (res.n_eval - k)) if binary else \
                Estimate(a, np.nan, np.nan, n=res.n_eval, method="none")
            rb.value(item, f"{ds} · {MODE.get(mode, mode)} · epoch {epoch}", est,
                     rb.paper_value("cnl", "Table 2", "accuracy", sigma=sig, method=MODE.get(mode, mode), epoch=str(epoch),
                                    dataset=label), differences=diffs)
        for e in sorted({ep for _, ep in acc}):
            if ("located", e) not in acc or ("random", e) not in acc:
                continue
            if not binary:
                eff, p, test = Estimate(acc[("located", e)] - acc[("random", e)], np.nan, np.nan, n=res.n_eval), None, ""
            else:
                eff, p, test = proportion_diff(round(acc[("located", e)] * res.n_eval), res.n_eval,
                                               round(acc[("random", e)] * res.n_eval), res.n_eval)
            pl = rb.paper_value("cnl", "Table 2", "accuracy", sigma=sig, method="located", epoch=str(e), dataset=label)
            pr = rb.paper_value("cnl", "Table 2", "accuracy", sigma=sig, method="random", epoch=str(e), dataset=label)
            rb.effect(item, f"{ds} · epoch {e} located − random (1 random set, as the paper)", claim, eff, p, test,
                      paper=(pl.value - pr.value) / 100 if pl and pr else None, differences=diffs)
        rb.figure(item, f"cnl_table2_{ds}", res.figure())


def fig5(rb: RowBuilder, get: Get, why: Callable[[str], str]) -> None:
    """CNL Fig. 5: the cross-dataset erase matrix and the "own dataset" claim (no per-sample CI)."""
    item, claim = "CNL Fig. 5", paper_claim("cnl.fig5.own-dataset")
    out = get("cnl.cross")
    res = out.get("cross") if out else None
    if not isinstance(res, CrossResult):
        rb.missing(item, "erase Δ on own dataset − mean Δ on the others", why("cnl.cross"), claim=claim)
        return
    rb.figure(item, "cnl_fig5_erase_delta", res.matrix_figure("erase_delta"))
    rb.figure(item, "cnl_fig5_random_delta", res.matrix_figure("random_delta"))
    d = (res.erase_delta - res.random_delta).numpy()
    for i, a in enumerate(res.names):
        others = [d[i, j] for j in range(len(res.names)) if j != i]
        eff = Estimate(float(d[i, i] - np.mean(others)), np.nan, np.nan, n=len(res.names))
        rb.effect(item, f"{a} neurons · (erase − random) Δ on {a} − mean on the others", claim, eff, None,
                  "no per-sample scores in CrossResult", differences=[rb.model_difference("cnl")])


def cnl_report(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """Every CNL row and figure (see the module docstring)."""
    groups = table1(rb, get, why, scale, n_boot=n_boot, seed=seed)
    fig4(rb, groups, scale, n_boot=n_boot, seed=seed)
    table2(rb, get, why, scale)
    table3(rb, get, why, scale, n_boot=n_boot, seed=seed)
    fig5(rb, get, why)
    suite_report(rb, get, why)


__all__ = ["cnl_report", "table1", "table2", "table3", "fig4", "fig5", "Groups", "LABEL"]
