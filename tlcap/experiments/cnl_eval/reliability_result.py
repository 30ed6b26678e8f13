"""The reliability experiment's result: typed rows, shares with CIs, random-set tests, IPPs.

Units: facts are independent (Wilson intervals for located shares); rows of random sets are
clustered by fact (cluster bootstrap); located-vs-random p-values use every random draw as one
"random set per fact" (draw d of every fact), so a draw's statistic is comparable with the
located set's (:func:`tlcap.metrics.located_vs_random`, at least 20 draws).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from tlcap.experiments.cnl_eval.reliability_rows import KCRow, KNRow, RomeRow, StatRow
from tlcap.experiments.cnl_eval.results import CI_NOTE, PAPER, est_dict, nan_row
from tlcap.metrics.bootstrap import bootstrap_ci, paired_difference_ci
from tlcap.metrics.estimate import Estimate, TooFewSamplesError
from tlcap.metrics.localization import ipp_ci
from tlcap.metrics.permutation import MIN_NULL_DRAWS, RandomControlTest, located_vs_random
from tlcap.metrics.shares import share_ci
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.cnl_eval import layer_curves, paper_bars, paper_panels

OPS = {"double": "enhanced_prob", "zero": "suppressed_prob"}


def _mean_ci(values: list[float]) -> Estimate:
    """Bootstrap mean over the finite values (NaN: a fact without paraphrases / neighbours);
    an all-NaN estimate when none is finite."""
    x = np.asarray(values, dtype=float)
    if not np.isfinite(x).any():
        return Estimate(np.nan, np.nan, np.nan, n=0)
    return bootstrap_ci(x, nan_policy="omit")


def _test(observed: float, null: list[float], alternative: str, name: str) -> RandomControlTest | None:
    try:
        return located_vs_random(observed, null, alternative=alternative, statistic=name)  # type: ignore[arg-type]
    except TooFewSamplesError:
        return None


@dataclass(frozen=True)
class ReliabilityResult(Result):
    """The reliability experiment (:func:`tlcap.experiments.cnl_eval.reliability`).

    Attributes:
        kn_rows, rome_rows, kc_rows: :class:`KNRow`, :class:`RomeRow`, :class:`KCRow` tuples.
        parts: The parts run.
        n_facts: Facts in the dataset.
        n_layers: The model's layers.
        model_name: The model.
        config: :class:`ReliabilityConfig` as a dict.
        method_seconds: Seconds spent per method.
        wall_seconds: Seconds of the whole run (summed over resumed runs).
    """

    kn_rows: tuple[tuple[Any, ...], ...] = ()
    rome_rows: tuple[tuple[Any, ...], ...] = ()
    kc_rows: tuple[tuple[Any, ...], ...] = ()
    parts: tuple[str, ...] = ()
    n_facts: int = 0
    n_layers: int = 0
    model_name: str = ""
    config: dict = field(default_factory=dict)
    method_seconds: dict = field(default_factory=dict)
    wall_seconds: float = 0.0

    # ------------------------------------------------------------------ rows
    def kn_records(self) -> list[KNRow]:
        """The KN rows as :class:`KNRow` records (missing values as NaN).

        Returns:
            One :class:`KNRow` per (fact, set, draw): the located set and each matched random draw.
        """
        return [KNRow(*nan_row(r)) for r in self.kn_rows]

    def rome_records(self) -> list[RomeRow]:
        """The ROME rows as :class:`RomeRow` records (missing values as NaN).

        Returns:
            One :class:`RomeRow` per (fact, edited layer).
        """
        return [RomeRow(*nan_row(r)) for r in self.rome_rows]

    def kc_records(self) -> list[KCRow]:
        """The knowledge-circuit rows as :class:`KCRow` records (missing values as NaN).

        Returns:
            One :class:`KCRow` per (fact, set, draw): the located circuit and each random circuit.
        """
        return [KCRow(*nan_row(r)) for r in self.kc_rows]

    def _kn_arrays(self, op: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Located ``(base, after)`` per fact and random ``(base, after)`` as ``(draws, facts)``."""
        rows = self.kn_records()
        loc = [r for r in rows if r.set == "located"]
        col = OPS[op]
        facts = [r.fact for r in loc]
        draws = sorted({r.draw for r in rows if r.set == "random"})
        rnd = {(r.fact, r.draw): r for r in rows if r.set == "random"}
        lb = np.array([r.base_prob for r in loc])
        la = np.array([getattr(r, col) for r in loc])
        rb = np.array([[rnd[f, d].base_prob for f in facts] for d in draws]).reshape(len(draws), len(facts))
        ra = np.array([[getattr(rnd[f, d], col) for f in facts] for d in draws]).reshape(len(draws), len(facts))
        return lb, la, rb, ra

    # ------------------------------------------------------------------ KN
    def kn_shares(self, op: str = "double") -> dict[str, Any]:
        """Shares of facts whose P(target) rises / falls, located vs random, with CIs and a test.

        Args:
            op: ``"double"`` (×enhance_factor) or ``"zero"`` (×suppress_factor).

        Returns:
            :class:`Estimate` per key: ``located_rise`` / ``located_fall`` (Wilson), ``random_rise`` / ``random_fall``
            (clustered by fact), ``rise_located_minus_random`` / ``fall_located_minus_random`` (paired; ``None``
            without random draws), and ``test``: the :class:`RandomControlTest` of the event ``op`` should cause
            (``None`` with fewer than ``MIN_NULL_DRAWS`` draws; absent without random draws).
        """
        lb, la, rb, ra = self._kn_arrays(op)
        n, d = len(lb), rb.shape[0]
        groups = np.tile(np.arange(n), d)
        out: dict[str, Any] = {}
        for ev, sign in (("rise", 1), ("fall", -1)):
            loc_ev = sign * (la - lb) > 0
            rnd_ev = sign * (ra - rb) > 0
            out[f"located_{ev}"] = share_ci(loc_ev)
            out[f"random_{ev}"] = share_ci(rnd_ev.reshape(-1), groups=groups) if d else None
            out[f"{ev}_located_minus_random"] = paired_difference_ci(loc_ev.astype(float), rnd_ev.mean(0)) if d else None
            want = "rise" if op == "double" else "fall"
            if ev == want and d:
                # two-sided: the paper's claim is "similar to random" (sign 0), refuted by a difference either way
                out["test"] = _test(float(loc_ev.mean()), [float(x) for x in rnd_ev.mean(1)], "two-sided",
                                    f"share of facts whose P(target) {'rises' if ev == 'rise' else 'falls'} ({op})")
        return out

    def kn_ipp(self, op: str = "double", min_draws: int = 5) -> Estimate:
        """IPP of KN: mean P(target) with the located set manipulated − the best random draw's.

        For ``"zero"`` a lower probability is the stronger effect (``higher_is_better=False``).

        Args:
            op: ``"double"`` or ``"zero"``.
            min_draws: The fewest random draws accepted.

        Returns:
            The IPP with its bootstrap interval over facts.
        """
        _, la, _, ra = self._kn_arrays(op)
        return ipp_ci(la, ra, higher_is_better=(op == "double"), min_draws=min_draws)

    # ------------------------------------------------------------------ ROME
    def rome_layers(self) -> list[int]:
        """The layers of the per-layer table: the configured ``rome_layers`` (a traced layer added
        for one fact is left out: it holds only the facts traced there), else every edited layer.

        Returns:
            The layers, ascending.
        """
        edited = {r.layer for r in self.rome_records()}
        listed = self.config.get("rome_layers")
        return sorted(edited & set(listed)) if listed else sorted(edited)

    def rome_by_layer(self) -> dict[str, list[Estimate]]:
        """Per edited layer: efficacy (Wilson), paraphrase and specificity (bootstrap means) over facts.

        Returns:
            ``{"efficacy", "paraphrase", "specificity"}``: one :class:`Estimate` per layer of :meth:`rome_layers`.
        """
        rows = self.rome_records()
        out: dict[str, list[Estimate]] = {"efficacy": [], "paraphrase": [], "specificity": []}
        for l in self.rome_layers():
            at = [r for r in rows if r.layer == l]
            out["efficacy"].append(share_ci([r.efficacy for r in at]))
            out["paraphrase"].append(_mean_ci([r.paraphrase for r in at]))
            out["specificity"].append(_mean_ci([r.specificity for r in at]))
        return out

    def rome_located_vs_other(self, metric: str = "efficacy") -> dict[str, Estimate] | None:
        """``metric`` at the traced layer vs the mean over the other edited layers, paired over facts.

        Args:
            metric: A :class:`RomeRow` metric: ``"efficacy"``, ``"paraphrase"`` or ``"specificity"``.

        Returns:
            Bootstrap estimates ``located``, ``other_layers`` and their paired difference ``located_minus_other``
            over the facts where both are finite; ``None`` when no fact has a traced layer or a finite pair.
        """
        rows = self.rome_records()
        facts = sorted({r.fact for r in rows if r.located})
        if not facts:
            return None
        loc = [float(next(getattr(r, metric) for r in rows if r.fact == f and r.located)) for f in facts]
        other = [float(np.mean([getattr(r, metric) for r in rows if r.fact == f and not r.located])) for f in facts]
        keep = [k for k in range(len(facts)) if np.isfinite(loc[k]) and np.isfinite(other[k])]
        if not keep:
            return None
        loc, other = [loc[k] for k in keep], [other[k] for k in keep]
        return {"located": bootstrap_ci(loc), "other_layers": bootstrap_ci(other),
                "located_minus_other": paired_difference_ci(loc, other)}

    @property
    def n_random(self) -> int:
        """Matched random neuron sets per fact the run drew (``config["kn"]["n_random"]``; results saved
        before the configs were nested: ``config["n_random"]``); 0 when the config does not say."""
        kn = self.config.get("kn")
        return int(kn.get("n_random", 0) if isinstance(kn, dict) else self.config.get("n_random", 0))

    def rome_ipp(self, n_draws: int | None = None, seed: int = 0, metric: str = "efficacy") -> Estimate | None:
        """IPP of ROME: ``metric`` at the traced layer − the best of ``n_draws`` draws of one random
        other layer per fact (seeded).

        Args:
            n_draws: Random draws (default :attr:`n_random`, else 20).
            seed: Seed of the draws.
            metric: A :class:`RomeRow` metric (``"efficacy"``, ``"paraphrase"``, ``"specificity"``).

        Returns:
            The IPP with its bootstrap interval over facts; ``None`` when no fact was edited at another layer
            than its traced one.
        """
        rows = self.rome_records()
        by = {(r.fact, r.layer): float(getattr(r, metric)) for r in rows}
        others = {f: sorted(l for (g, l) in by if g == f and not any(r.located and r.layer == l and r.fact == f for r in rows))
                  for f in {r.fact for r in rows if r.located}}
        # A fact edited only at its traced layer has no other layer to draw: it cannot enter the IPP.
        facts = sorted(f for f, ls in others.items() if ls)
        if not facts:
            return None
        n_draws = n_draws or self.n_random or 20
        rng = random.Random(seed)
        loc = [next(float(getattr(r, metric)) for r in rows if r.fact == f and r.located) for f in facts]
        draws = [[by[f, rng.choice(others[f])] for f in facts] for _ in range(n_draws)]
        return ipp_ci(loc, draws)

    def traced_counts(self) -> list[int]:
        """How many facts were traced to each layer (index = layer).

        Returns:
            ``n_layers`` counts of facts per traced layer.
        """
        counts = [0] * self.n_layers
        for f in {(r.fact, r.traced_layer) for r in self.rome_records()}:
            counts[f[1]] += 1
        return counts

    # ------------------------------------------------------------------ KC
    def kc_stats(self) -> dict[str, Any]:
        """Recall (circuit alone ranks the target first), hit@10, parameter share; random circuits; test.

        Returns:
            :class:`Estimate` per key: ``recall_at_1``, ``hit_at_10`` (Wilson), ``param_share``, ``n_edges`` and
            ``param_share_recalled`` (bootstrap; ``None`` when no circuit recalls), and with random circuits
            ``random_recall_at_1`` and ``test`` (a two-sided :class:`RandomControlTest` of recall@1 against the
            random draws, ``None`` with too few draws).
        """
        rows = self.kc_records()
        loc = [r for r in rows if r.set == "located"]
        rnd = [r for r in rows if r.set == "random"]
        out: dict[str, Any] = {"recall_at_1": share_ci([r.hit_at_1 for r in loc]),
                               "hit_at_10": share_ci([r.hit_at_10 for r in loc]),
                               "param_share": bootstrap_ci([r.param_share for r in loc]),
                               "n_edges": bootstrap_ci([r.n_edges for r in loc])}
        rec = [r.param_share for r in loc if r.hit_at_1]
        out["param_share_recalled"] = bootstrap_ci(rec) if rec else None
        if rnd:
            out["random_recall_at_1"] = share_ci([r.hit_at_1 for r in rnd], groups=[r.fact for r in rnd])
            draws = sorted({r.draw for r in rnd})
            null = [float(np.mean([r.hit_at_1 for r in rnd if r.draw == d])) for d in draws]
            out["test"] = _test(float(np.mean([r.hit_at_1 for r in loc])), null, "two-sided", "recall@1 of the circuit alone")
        return out

    def kc_ipp(self, min_draws: int = 5) -> Estimate:
        """IPP of KC: recall@1 of the circuits − the best random draw's (as many random edges).

        Args:
            min_draws: The fewest random draws accepted.

        Returns:
            The IPP with its bootstrap interval over facts.
        """
        rows = self.kc_records()
        loc = [r for r in rows if r.set == "located"]
        facts = [r.fact for r in loc]
        draws = sorted({r.draw for r in rows if r.set == "random"})
        rnd = {(r.fact, r.draw): float(r.hit_at_1) for r in rows if r.set == "random"}
        return ipp_ci([float(r.hit_at_1) for r in loc], [[rnd[f, d] for f in facts] for d in draws], min_draws=min_draws)

    # ------------------------------------------------------------------ contract
    def _stats(self) -> list[StatRow]:
        out: list[StatRow] = []

        def add(part: str, name: str, est: Estimate | None, paper: float | None = None) -> None:
            if est is not None:
                out.append(StatRow(part, name, est.value, est.low, est.high, est.n, np.nan if paper is None else paper))

        if "kn" in self.parts and self.kn_rows:
            for op in ("double", "zero"):
                s = self.kn_shares(op)
                for ev in ("rise", "fall"):
                    add("kn", f"{op}: located {ev}", s[f"located_{ev}"], PAPER[f"kn_{op}_located"][ev])
                    add("kn", f"{op}: random {ev}", s[f"random_{ev}"], PAPER[f"kn_{op}_random"][ev])
        if "rome" in self.parts and self.rome_rows:
            for l, e in zip(self.rome_layers(), self.rome_by_layer()["efficacy"]):
                add("rome", f"efficacy at layer {l}", e)
            lo = self.rome_located_vs_other()
            if lo:
                add("rome", "efficacy at the traced layer", lo["located"])
                add("rome", "efficacy at the other layers", lo["other_layers"])
        if "kc" in self.parts and self.kc_rows:
            k = self.kc_stats()
            add("kc", "recall@1", k["recall_at_1"], PAPER["kc_recall_at_1"])
            add("kc", "random circuit recall@1", k.get("random_recall_at_1"))
            add("kc", "param share (blocks)", k["param_share"], PAPER["kc_param_share_fidelity"])
            add("kc", "param share of recalled circuits", k["param_share_recalled"], PAPER["kc_param_share_recalled"])
        return out

    def summary(self) -> dict[str, Any]:
        """Every statistic with its CI and the paper's value; tests against matched random sets.

        Returns:
            A JSON-safe dict: model, facts, parts, config and timings, then per run part (``kn``, ``rome``, ``kc``)
            its estimates (value, CI, n) with the paper's value where it reports one.
        """
        out: dict[str, Any] = {"model": self.model_name, "n_facts": self.n_facts, "parts": list(self.parts), "ci": CI_NOTE,
                               "wall_seconds": self.wall_seconds, "method_seconds": dict(self.method_seconds),
                               "config": dict(self.config)}
        if "kn" in self.parts and self.kn_rows:
            out["kn"] = {}
            for op in ("double", "zero"):
                s = self.kn_shares(op)
                out["kn"][op] = {k: (v.summary() if v is not None else None) for k, v in s.items()}
                for ev in ("rise", "fall"):
                    out["kn"][op][f"located_{ev}"]["paper"] = PAPER[f"kn_{op}_located"][ev]
                    if s[f"random_{ev}"] is not None:
                        out["kn"][op][f"random_{ev}"]["paper"] = PAPER[f"kn_{op}_random"][ev]
            n_neurons = [r.n_neurons for r in self.kn_records() if r.set == "located"]
            out["kn"]["n_neurons"] = est_dict(bootstrap_ci(n_neurons), PAPER["kn_located_neurons_per_sample"])
        if "rome" in self.parts and self.rome_rows:
            by = self.rome_by_layer()
            out["rome"] = {"layers": self.rome_layers(), "traced_layer_counts": self.traced_counts(),
                           **{k: [e.summary() for e in v] for k, v in by.items()}}
            for m in ("efficacy", "paraphrase", "specificity"):
                lo = self.rome_located_vs_other(m)
                out["rome"][f"{m}_located_vs_other"] = {k: v.summary() for k, v in lo.items()} if lo else None
        if "kc" in self.parts and self.kc_rows:
            k = self.kc_stats()
            out["kc"] = {n: (v.summary() if v is not None else None) for n, v in k.items()}
            out["kc"]["recall_at_1"]["paper"] = PAPER["kc_recall_at_1"]
            out["kc"]["param_share"]["paper"] = PAPER["kc_param_share_fidelity"]
            if out["kc"]["param_share_recalled"] is not None:
                out["kc"]["param_share_recalled"]["paper"] = PAPER["kc_param_share_recalled"]
        return out

    def to_frame(self) -> pd.DataFrame:
        """One :class:`StatRow` per headline statistic (value, CI, n, the paper's value).

        Returns:
            A DataFrame of :class:`StatRow` (part, statistic, value, CI, n, paper).
        """
        return frame(self._stats(), StatRow)

    def kn_frame(self) -> pd.DataFrame:
        """The KN rows as a table.

        Returns:
            A DataFrame of :meth:`kn_records` (:class:`KNRow` columns).
        """
        return frame(self.kn_records(), KNRow)

    def rome_frame(self) -> pd.DataFrame:
        """The ROME rows as a table.

        Returns:
            A DataFrame of :meth:`rome_records` (:class:`RomeRow` columns).
        """
        return frame(self.rome_records(), RomeRow)

    def kc_frame(self) -> pd.DataFrame:
        """The knowledge-circuit rows as a table.

        Returns:
            A DataFrame of :meth:`kc_records` (:class:`KCRow` columns).
        """
        return frame(self.kc_records(), KCRow)

    def figure(self) -> go.Figure:
        """KN: shares of facts whose P(target) rises / falls, located vs matched random, beside the paper.

        Returns:
            The Plotly figure: one panel per operation (double, zero).
        """
        panels = {}
        for op, title in (("double", "double the activations"), ("zero", "zero the activations")):
            if not self.kn_rows:
                break
            s = self.kn_shares(op)
            labels, ests, paper = [], [], []
            for ev in ("rise", "fall"):
                for kind in ("located", "random"):
                    labels.append(f"{kind} {ev}s")
                    ests.append(s[f"{kind}_{ev}"])
                    paper.append(PAPER[f"kn_{op}_{kind}"][ev])
            panels[title] = (labels, [e.value for e in ests], [e.low for e in ests], [e.high for e in ests], paper)
        return paper_panels(panels, title=f"KN reliability ({self.model_name}, {self.n_facts} facts): share of facts "
                                          "whose P(target) rises / falls")

    def rome_figure(self) -> go.Figure:
        """ROME at every layer: efficacy / paraphrase / specificity (CI bands), traced layers as bars.

        Returns:
            The Plotly figure over the layers of :meth:`rome_layers`.
        """
        by = self.rome_by_layer()
        series = {k: ([e.value for e in v], [e.low for e in v], [e.high for e in v]) for k, v in by.items()}
        counts = self.traced_counts()
        layers = self.rome_layers()
        which = "every layer" if layers == list(range(self.n_layers)) else f"{len(layers)} of {self.n_layers} layers"
        hidden = sum(counts) - sum(counts[l] for l in layers)  # facts traced to a layer the table leaves out
        note = f"; {hidden} facts traced to unlisted layers" if hidden else ""
        n_facts = len({r.fact for r in self.rome_records()})
        return layer_curves(layers, series, marks=[counts[l] for l in layers],
                            title=f"ROME edits at {which} ({self.model_name}, {n_facts} facts; bars: facts traced to the "
                                  f"layer{note})")

    def kc_figure(self) -> go.Figure:
        """KC: recall@1 of circuits alone vs random circuits, parameter share, beside the paper.

        Returns:
            The Plotly bar chart with CIs.
        """
        k = self.kc_stats()
        names = ["recall@1", "random circuit recall@1", "param share", "param share (recalled)"]
        ests = [k["recall_at_1"], k.get("random_recall_at_1"), k["param_share"], k["param_share_recalled"]]
        nan = float("nan")
        return paper_bars(names, [e.value if e else nan for e in ests], [e.low if e else nan for e in ests],
                          [e.high if e else nan for e in ests],
                          paper=[PAPER["kc_recall_at_1"], None, PAPER["kc_param_share_fidelity"],
                                 PAPER["kc_param_share_recalled"]],
                          title=f"Knowledge circuits alone ({self.model_name}, {self.n_facts} facts)")


__all__ = ["KCRow", "KNRow", "MIN_NULL_DRAWS", "ReliabilityResult", "RomeRow", "StatRow"]
