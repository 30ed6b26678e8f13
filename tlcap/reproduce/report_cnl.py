"""The CNL paper's report rows and figures, from the outputs of :mod:`.cnl_stages`.

Statistics (see ``docs/reproduce.md``):

- **Table 1** (split-half overlap, IoU, neuron share): CIs from a cluster bootstrap over the
  scoring groups (groups of each half resampled with replacement, the located sets re-selected
  from the resampled sums), re-centred on the point estimate
  (:mod:`tlcap.metrics.selection_bootstrap`: the plain percentile and BCa intervals under-cover
  selection statistics). Located vs random: the overlap of the half-A set with the half-B set
  against its **exact** null — random sets with the half-B set's count per layer drawn from the
  whole layer (:mod:`tlcap.metrics.overlap_null`), two-sided.
- **Fig. 6** (convergence): overlap of the full halves minus the overlap of single groups,
  re-centred bootstrap over groups (p floor ``2/(B+1)``).
- **Fig. 4**: the GSM8K–Emotion overlap minus the mean overlap of the other *cross-capability*
  pairs (math: GSM8K, SVAMP; code: MBPP; sentiment: Emotion, IMDB — same-capability pairs, which
  the paper expects to overlap most, are left out), re-centred bootstrap over groups.
- **Tables 2, 3 and Fig. 5**: :mod:`tlcap.reproduce.report_cnl_interventions`.
- The evaluation suite (§3.1, §3.2, Fig. 2, §4, Table 4): :mod:`tlcap.reproduce.report_cnl_eval`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import plotly.graph_objects as go
import torch

from tlcap.attribution.dataset import DatasetScores, from_fixed
from tlcap.experiments.cnl import CNLLocation, located_sets_figure
from tlcap.locate.selection import sigma_mask
from tlcap.metrics import NeuronSet
from tlcap.metrics.effects import bootstrap_p_floor
from tlcap.metrics.estimate import Estimate
from tlcap.metrics.overlap_null import P_MIN, overlap_null
from tlcap.metrics.selection_bootstrap import recentred_estimate, recentred_p
from tlcap.metrics.sensitivity import SensitivityCurve
from tlcap.reproduce.registry import paper_claim
from tlcap.reproduce.report import RowBuilder
from tlcap.reproduce.report_cnl_eval import suite_report
from tlcap.reproduce.report_cnl_interventions import LABEL, STAND_IN, fig5, table2, table3
from tlcap.reproduce.scales import SIGMAS, ScaleConfig
from tlcap.results import Result

Get = Callable[[str], "dict[str, Result] | None"]
MAX_SET_BOOT = 2000
"""Resamples of a set-selection statistic (each re-selects the sets; p floor 2/2001 ≈ 0.001)."""
CAPABILITY = {"gsm8k": "math", "svamp": "math", "mbpp": "code", "emotion": "sentiment", "imdb": "sentiment"}
"""The capability each dataset stands for (Fig. 4 compares pairs of different capabilities only)."""


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
        """The located sets of half A and half B, from their (weighted) group sums.

        Args:
            sigma: Selection threshold: mean + σ·std of the scores.
            wa: Weight per group of half A (a bootstrap resample's counts; default: all 1).
            wb: Weight per group of half B (default: all 1).

        Returns:
            ``(set of half A, set of half B)``.
        """
        wa = torch.ones(len(self.a), dtype=torch.float64) if wa is None else wa
        wb = torch.ones(len(self.b), dtype=torch.float64) if wb is None else wb
        return self._select(self.sa, self.na, wa, sigma), self._select(self.sb, self.nb, wb, sigma)

    def pooled(self, sigma: float, w: torch.Tensor | None = None) -> NeuronSet:
        """The located set of both halves pooled.

        Args:
            sigma: Selection threshold: mean + σ·std of the scores.
            w: Weight per group, half A's groups first (default: all 1).

        Returns:
            The :class:`NeuronSet` selected from the pooled weighted sums.
        """
        sums, n = torch.cat([self.sa, self.sb]), torch.cat([self.na, self.nb])
        return self._select(sums, n, torch.ones(len(n), dtype=torch.float64) if w is None else w, sigma)

    def single(self, j: int, sigma: float) -> tuple[NeuronSet, NeuronSet]:
        """The sets of group j of each half alone.

        Args:
            j: The group index within each half.
            sigma: Selection threshold: mean + σ·std of the scores.

        Returns:
            ``(set of group j of half A, set of group j of half B)``.
        """
        one = torch.ones(1, dtype=torch.float64)
        return (self._select(self.sa[j:j + 1], self.na[j:j + 1], one, sigma),
                self._select(self.sb[j:j + 1], self.nb[j:j + 1], one, sigma))

    def weights(self, rng: np.random.Generator, k: int) -> torch.Tensor:
        """Bootstrap weights: how often each of ``k`` groups is drawn in ``k`` draws with replacement.

        Args:
            rng: The random generator.
            k: Number of groups.

        Returns:
            A float64 tensor of ``k`` counts summing to ``k``.
        """
        return torch.tensor(np.bincount(rng.integers(0, k, k), minlength=k), dtype=torch.float64)


def _split_stats(g: Groups, sigma: float, n_boot: int, seed: int) -> dict[str, Estimate]:
    a, b = g.halves(sigma)
    full = g.pooled(sigma)
    rng = np.random.default_rng(seed)
    reps: dict[str, list[float]] = {"overlap": [], "IoU": [], "neuron": []}
    B = min(n_boot, MAX_SET_BOOT)
    for _ in range(B):
        ra, rb = g.halves(sigma, g.weights(rng, len(g.a)), g.weights(rng, len(g.b)))
        reps["overlap"].append(ra.overlap(rb))
        reps["IoU"].append(ra.iou(rb))
        w = torch.cat([g.weights(rng, len(g.a)), g.weights(rng, len(g.b))])
        reps["neuron"].append(g.pooled(sigma, w).ratio())
    point = {"overlap": a.overlap(b), "IoU": a.iou(b), "neuron": full.ratio()}
    return {q: recentred_estimate(point[q], reps[q], n=g.n, n_groups=g.n_groups, seed=seed) for q in point}


def _overlap_vs_chance(rb: RowBuilder, item: str, ds: str, g: Groups, est: Estimate, sigma: float,
                       diffs: list[str]) -> None:
    """The located split-half overlap against its exact null (random sets from the whole layer)."""
    a, b = g.halves(sigma)
    null = overlap_null(a, b)
    p = null.p_value(a.overlap(b), "two-sided")
    mu = null.mean_overlap
    eff = Estimate(est.value - mu, est.low - mu, est.high - mu, n=est.n, n_groups=est.n_groups, method=est.method)
    rb.effect(item, f"{ds} · overlap − overlap expected by chance", paper_claim("cnl.table1.above-random"), eff, p,
              "exact null: random sets matched per layer, whole pool", p_floor=P_MIN, differences=diffs, n_unit="samples",
              control=f"chance overlap {mu:.3g} (95 % of random sets ≤ {null.quantile_overlap(0.95):.3g})")


def _convergence(rb: RowBuilder, ds: str, g: Groups, est: Estimate, sigma: float, n_boot: int, seed: int,
                 diffs: list[str]) -> None:
    """Fig. 6: overlap of the full halves minus the mean overlap of single groups.

    Each bootstrap replicate resamples the halves' groups and, independently, the k single-group overlaps whose mean
    is subtracted (the mean of k resampled ones: the spread of that mean, not of one group's overlap; resampled apart
    from the halves, which can only widen the interval when the two are positively correlated).
    """
    k = min(len(g.a), len(g.b))
    singles = np.array([sa.overlap(sb) for sa, sb in (g.single(j, sigma) for j in range(k))], dtype=float)
    single = float(singles.mean())
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(min(n_boot, MAX_SET_BOOT)):
        ra, rb_ = g.halves(sigma, g.weights(rng, len(g.a)), g.weights(rng, len(g.b)))
        reps.append(ra.overlap(rb_) - float(singles[rng.integers(0, k, k)].mean()))
    theta = est.value - single
    eff = recentred_estimate(theta, reps, n=g.n, n_groups=g.n_groups, seed=seed)
    rb.effect("CNL Fig. 6", f"{ds} · overlap with {g.n // 2} vs {g.n // max(g.n_groups, 1)} samples per half",
              paper_claim("cnl.fig6.converges"), eff, recentred_p(theta, reps), "re-centred bootstrap over groups",
              p_floor=bootstrap_p_floor(len(reps)), differences=diffs, n_unit="samples",
              control=f"single-group overlap {single:.3g}")


def table1(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int,
           seed: int) -> dict[str, Groups]:
    """CNL Table 1, its located-vs-chance rows, the σ curves and Fig. 6 (convergence).

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        scale: The scale's sizes (``cnl_datasets``, ``cnl_sigma``).
        n_boot: Bootstrap resamples (set-selection statistics use at most :data:`MAX_SET_BOOT`).
        seed: Seed of the bootstraps.

    Returns:
        The :class:`Groups` of every dataset whose ``cnl.locate`` stage has outputs (for :func:`fig4`).
    """
    item, out_groups = "CNL Table 1", {}
    curves: dict[str, list[Estimate]] = {}
    conv = go.Figure()
    for ds in scale.cnl_datasets:
        out = get(f"cnl.locate.{ds}")
        diffs = [*rb.model_difference("cnl"), *([STAND_IN[ds]] if ds in STAND_IN else [])]
        label = LABEL[ds]
        if out is None:
            for q in ("overlap", "IoU", "neuron"):
                rb.missing(item, f"{ds} · {q}", why(f"cnl.locate.{ds}"), rb.paper_value("cnl", "Table 1", q, dataset=label))
            rb.missing(item, f"{ds} · overlap − overlap expected by chance", why(f"cnl.locate.{ds}"),
                       claim=paper_claim("cnl.table1.above-random"))
            rb.missing("CNL Fig. 6", f"{ds} · convergence", why(f"cnl.locate.{ds}"), claim=paper_claim("cnl.fig6.converges"))
            continue
        g = Groups(out)
        out_groups[ds] = g
        st = _split_stats(g, scale.cnl_sigma, n_boot, seed)
        for q in ("overlap", "IoU", "neuron"):
            rb.value(item, f"{ds} · {q} (σ={scale.cnl_sigma:g}, n={g.n})", st[q],
                     rb.paper_value("cnl", "Table 1", q, dataset=label), differences=diffs, n_unit="samples")
        _overlap_vs_chance(rb, item, ds, g, st["overlap"], scale.cnl_sigma, diffs)
        curves[ds] = [_split_stats(g, s, n_boot // 4 or 1, seed)["overlap"] for s in SIGMAS]
        loc = out.get("location")
        if isinstance(loc, CNLLocation):
            df = loc.to_frame()
            if len(df):
                conv.add_trace(go.Scatter(x=df["n_half"], y=df["overlap"], mode="lines+markers", name=ds))
        _convergence(rb, ds, g, st["overlap"], scale.cnl_sigma, n_boot, seed, diffs)
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


def cross_capability_pairs(names: list[str]) -> list[tuple[str, str]]:
    """Unordered pairs of datasets that stand for different capabilities (:data:`CAPABILITY`).

    Args:
        names: Dataset names, in order.

    Returns:
        ``(a, b)`` pairs with ``a`` before ``b`` in ``names`` whose capabilities differ.
    """
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if CAPABILITY.get(a) != CAPABILITY.get(b)]


def fig4(rb: RowBuilder, groups: dict[str, Groups], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """The located sets of every dataset (Fig. 4 / poster Fig. 3), their overlap matrix, the GSM8K–Emotion claim.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        groups: The :class:`Groups` of each located dataset (from :func:`table1`).
        scale: The scale's sizes (``cnl_sigma``).
        n_boot: Bootstrap resamples (set-selection statistics use at most :data:`MAX_SET_BOOT`).
        seed: Seed of the bootstraps.
    """
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
    row = "overlap(GSM8K, Emotion) − mean overlap of the other cross-capability pairs"
    others = [p for p in cross_capability_pairs(list(sets)) if set(p) != {"gsm8k", "emotion"}]
    if "gsm8k" not in sets or "emotion" not in sets or not others:
        rb.missing(item, row, "needs GSM8K, Emotion and another pair of datasets of different capabilities", claim=claim)
        return

    def stat(s: dict[str, NeuronSet]) -> float:
        return s["gsm8k"].overlap(s["emotion"]) - float(np.mean([s[a].overlap(s[b]) for a, b in others]))

    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(min(n_boot, MAX_SET_BOOT)):
        rs = {ds: g.pooled(scale.cnl_sigma, g.weights(rng, g.n_groups)) for ds, g in groups.items()}
        reps.append(stat(rs))
    n = sum(g.n for g in groups.values())
    theta = stat(sets)
    est = recentred_estimate(theta, reps, n=n, n_groups=sum(g.n_groups for g in groups.values()), seed=seed)
    pairs = ", ".join(f"{a}–{b}" for a, b in others)
    rb.effect(item, row, claim, est, recentred_p(theta, reps), "re-centred bootstrap over groups",
              p_floor=bootstrap_p_floor(len(reps)), n_unit="samples",
              differences=["data: SVAMP/MBPP stand in for Meta_Math/Code25K"], control=f"other pairs: {pairs}")


def cnl_report(rb: RowBuilder, get: Get, why: Callable[[str], str], scale: ScaleConfig, *, n_boot: int, seed: int) -> None:
    """Every CNL row and figure (see the module docstring).

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
        scale: The scale's sizes.
        n_boot: Bootstrap resamples (set-selection statistics use at most :data:`MAX_SET_BOOT`).
        seed: Seed of the bootstraps.
    """
    groups = table1(rb, get, why, scale, n_boot=n_boot, seed=seed)
    fig4(rb, groups, scale, n_boot=n_boot, seed=seed)
    table2(rb, get, why, scale, n_boot=n_boot, seed=seed)
    table3(rb, get, why, scale, n_boot=n_boot, seed=seed)
    fig5(rb, get, why, n_boot=n_boot, seed=seed)
    suite_report(rb, get, why)


__all__ = ["cnl_report", "table1", "fig4", "Groups", "CAPABILITY", "cross_capability_pairs", "LABEL"]
