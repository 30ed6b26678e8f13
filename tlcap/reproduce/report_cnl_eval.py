"""Report rows of the CNL evaluation suite (§3.1 fidelity, §3.2 reliability, Fig. 2, §4 decoupling, Table 4).

Every number comes from the public API of the ``tlcap.experiments.cnl_eval`` results of
:mod:`tlcap.reproduce.suite_stages` (``estimate``, ``kn_shares``, ``kc_stats``, ``rates``,
``records``); nothing is recomputed here. The paper's values are GPT-J's (§3) or the model §4 does
not name, so every row is *not comparable* on the model at least; what it adds is our number with
its CI beside the paper's.

- **Fidelity**: mean pairwise overlap over rewrites per method, bootstrap CI over facts.
- **Reliability**: shares of facts whose P(target) rises / falls when the KN activations are doubled
  / zeroed, located and matched random sets (CIs over facts; random: clustered by fact); the
  paper's "similar to random" claim as located − random (a no-difference claim, margin
  :data:`NO_DIFFERENCE_MARGIN`); KC recall@1 and parameter share; Fig. 2 as ROME efficacy at the
  traced layer − the other edited layers (paired over facts, same margin).
- **Decoupling**: ``C^{1,2}`` (CI over pairs), ``C^{1,1}``, ``C^{2,2}`` overlap-normalised (the
  printed formula's literal value is ~1e-4: see ``docs/statistics.md``).
- **Table 4**: Overlap, Neuron and IPP per method from :class:`~tlcap.experiments.cnl_eval.CompareResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tlcap.errors import TlcapError
from tlcap.experiments.cnl_eval import CompareResult, DecouplingResult, FidelityResult, ReliabilityResult
from tlcap.metrics.effects import paired_effect
from tlcap.metrics.estimate import Estimate, StatisticsError
from tlcap.metrics.permutation import p_floor
from tlcap.reproduce.items import paper_model
from tlcap.reproduce.registry import paper_claim, paper_values
from tlcap.reproduce.report import RowBuilder
from tlcap.results import Result

Get = Callable[[str], "dict[str, Result] | None"]
NO_DIFFERENCE_MARGIN = 0.10
"""Largest located − random difference (share of facts, edit efficacy) still read as "no difference"."""
DATA = "data: ParaRel rewrites, not the paper's (zsRE / its own)"
FID = {"KN": "kn", "ROME": "trace", "KC": "kc"}
T4 = {"Overlap": "overlap", "Neuron": "neuron", "IPP": "ipp"}
DIRECTION = {"up": "rise", "down": "fall"}


def _result(out: dict[str, Result] | None, cls: type) -> Result | None:
    res = next(iter(out.values()), None) if out else None
    return res if isinstance(res, cls) else None


def _label(v: object) -> str:
    return " · ".join([*(lab for _, lab in v.coords), v.quantity])  # type: ignore[attr-defined]


def _missing_all(rb: RowBuilder, item: str, why: str) -> None:
    for v in paper_values(paper="cnl", item=item):
        rb.missing(f"CNL {item}", f"{_label(v)} ({v.model})", why, v)


def _diffs(rb: RowBuilder, model: str, *extra: str) -> list[str]:
    same = paper_model(rb.our_model) == model
    return [*([] if same else [f"model: {rb.our_model} vs {model}"]), *extra]


def fidelity_rows(rb: RowBuilder, get: Get, why: Callable[[str], str]) -> None:
    """§3.1: the overlap over rewrites of KN, ROME (traced layers) and KC.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
    """
    res = _result(get("cnl.fidelity"), FidelityResult)
    if res is None:
        _missing_all(rb, "§3.1 fidelity", why("cnl.fidelity"))
        return
    item = "CNL §3.1 fidelity"
    for v in paper_values(paper="cnl", item="§3.1 fidelity"):
        method = FID[v.coord("method") or ""]
        row = f"{v.coord('method')} · {v.quantity} ({v.model})"
        try:
            if v.quantity == "overlap":
                est = res.estimate(method)
            elif v.quantity == "param_share":
                est = res.estimate(method, "param_share")
            else:  # neurons_per_sample
                est = res.estimate(method, "mean_size")
        except (KeyError, ValueError, TlcapError) as exc:
            rb.value(item, row, None, v, missing=f"not computed: {exc}")
            continue
        rb.value(item, row, est, v, scale=1.0 if v.unit == "count" else None, differences=_diffs(rb, v.model, DATA),
                 n_unit="facts")
    rb.figure(item, "cnl_fidelity", res.figure())


def reliability_rows(rb: RowBuilder, get: Get, why: Callable[[str], str]) -> None:
    """§3.2 (KN doubled / zeroed, KC recall) and Fig. 2 (ROME at every layer).

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
    """
    res = _result(get("cnl.reliability"), ReliabilityResult)
    fig2 = paper_claim("cnl.fig2.rome-any-layer")
    if res is None:
        _missing_all(rb, "§3.2 reliability", why("cnl.reliability"))
        rb.missing("CNL Fig. 2", "ROME efficacy: traced layer − other layers", why("cnl.reliability"), claim=fig2)
        return
    item = "CNL §3.2 reliability"
    shares = {op: res.kn_shares(op) if res.kn_rows else {} for op in ("double", "zero")}
    kc = res.kc_stats() if res.kc_rows else {}
    for v in paper_values(paper="cnl", item="§3.2 reliability"):
        if v.coord("method") == "KC":
            est = kc.get({"recall": "recall_at_1", "param_share": "param_share_recalled"}[v.quantity])
        else:
            est = shares[v.coord("manipulation") or ""].get(f"{v.coord('neurons')}_{DIRECTION[v.coord('direction') or '']}")
        unit = "facts" if v.coord("neurons") != "random" else "fact × random set pairs"
        rb.value(item, f"{_label(v)} ({v.model})", est, v, differences=_diffs(rb, v.model, DATA),
                 missing="not computed: no result for this part at this scale", n_unit=unit)
    claim = paper_claim("cnl.reliability.kn-vs-random")
    s = shares["double"]
    test = s.get("test")
    rb.effect(item, "double · share rising: located − matched random", claim, s.get("rise_located_minus_random"),
              test.p_value if test is not None else None,
              f"rank among {test.n_null} matched random sets" if test is not None else "",
              p_floor=p_floor(test.n_null, test.alternative) if test is not None else None,
              sided="two-sided" if test is None or test.alternative == "two-sided" else f"one-sided ({test.alternative})",
              paper=claim.value / 100 if claim.value is not None else None, margin=NO_DIFFERENCE_MARGIN,
              differences=_diffs(rb, "GPT-J-6B", DATA), n_unit="facts")
    rb.figure(item, "cnl_reliability", res.figure())
    loc, other = _rome_pairs(res)
    if not loc:
        rb.missing("CNL Fig. 2", "ROME efficacy: traced layer − other layers",
                   "not computed: no fact was edited at its traced layer and at another layer at this scale", claim=fig2)
        return
    eff = paired_effect(loc, other)
    p = eff.p_value
    rb.effect("CNL Fig. 2", "ROME efficacy: traced layer − other edited layers", fig2, eff.estimate,
              None if p is None or math.isnan(p) else p, f"{eff.test} over {len(loc)} facts", margin=NO_DIFFERENCE_MARGIN,
              differences=_diffs(rb, "GPT-J-6B", DATA, f"layers edited: {', '.join(map(str, res.rome_layers()))}"),
              n_unit="facts", no_ci=f"{len(loc)} fact(s) edited at the traced layer and at another: no test")
    rb.figure("CNL Fig. 2", "cnl_fig2_rome_layers", res.rome_figure())


def _rome_pairs(res: ReliabilityResult) -> tuple[list[float], list[float]]:
    """Per fact edited at its traced layer and at another: efficacy there and the mean over the others."""
    rows = res.rome_records()
    loc, other = [], []
    for f in sorted({r.fact for r in rows if r.located}):
        mine = [r for r in rows if r.fact == f]
        rest = [float(r.efficacy) for r in mine if not r.located]
        if rest:
            loc.append(float(next(r.efficacy for r in mine if r.located)))
            other.append(float(np.mean(rest)))
    return loc, other


def decoupling_rows(rb: RowBuilder, get: Get, why: Callable[[str], str]) -> None:
    """§4: the coincidence rates, overlap-normalised, C^{1,2} with its CI over pairs.

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
    """
    res = _result(get("cnl.decoupling"), DecouplingResult)
    if res is None:
        _missing_all(rb, "§4 decoupling", why("cnl.decoupling"))
        return
    r = res.rates()
    try:
        c12 = r.c12_ci("overlap")
    except StatisticsError:
        c12 = Estimate(r.c12_overlap, math.nan, math.nan, n=r.n)
    ours = {"C12": c12, "C11": Estimate(r.c11_overlap, math.nan, math.nan, n=r.n, method="none"),
            "C22": Estimate(r.c22_overlap, math.nan, math.nan, n=r.n, method="none")}
    why_no_ci = "one set intersected over all pairs (⋂_k N_k): a single number, not a mean over pairs"
    for v in paper_values(paper="cnl", item="§4 decoupling"):
        rb.value("CNL §4 decoupling", f"{v.quantity} overlap-normalised ({r.n} pairs)", ours[v.quantity], v,
                 differences=[f"model: {rb.our_model}; the paper names none", "quantity: overlap-normalised; the printed "
                              "formula (share of all L·J neurons) gives ~1e-4", "data: generated comparative pairs"],
                 n_unit="pairs", no_ci=why_no_ci if v.quantity != "C12" else "")
    rb.figure("CNL §4 decoupling", "cnl_decoupling", res.figure())


def _table4_sizes(get: Get, method: str, quantity: str) -> tuple[int | None, str, str]:
    """``(n, what n counts, why no CI)`` of one Table 4 cell, from the results the cell rests on."""
    fid = _result(get("cnl.fidelity"), FidelityResult)
    rel = _result(get("cnl.reliability"), ReliabilityResult)
    fm = {"kn": "kn", "rome": "trace", "kc": "kc"}.get(method)
    try:
        if method != "cnl" and quantity in ("overlap", "neuron") and fid is not None:
            est = fid.estimate(fm) if quantity == "overlap" else fid.estimate(fm, "param_share")
            return est.n, "facts", ""
        if method in ("kn", "kc") and quantity == "ipp" and rel is not None:
            est = rel.kn_ipp("double") if method == "kn" else rel.kc_ipp()
            return est.n, "facts", ""
        if method == "rome" and quantity == "ipp" and rel is not None:
            n = len({r.fact for r in rel.rome_records() if r.located})
            return n, "facts", f"{n} fact(s) edited at the traced layer: the IPP's CI needs per-fact efficacies of both"
    except (KeyError, ValueError, TlcapError):
        pass
    if method == "cnl":
        why = {"overlap": "one split-half overlap (its CI over groups is in CNL Table 1)",
               "neuron": "a count of located neurons (its CI over groups is in CNL Table 1)",
               "ipp": "one located accuracy against the random sets' best: no resampling unit"}[quantity]
        return None, "", why
    return None, "", ""


def table4_rows(rb: RowBuilder, get: Get, why: Callable[[str], str]) -> None:
    """Table 4: Overlap, Neuron (% of parameters) and IPP of KN, ROME, KC and CNL (n and CI reasons per cell).

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
    """
    res = _result(get("cnl.compare"), CompareResult)
    if res is None:
        _missing_all(rb, "Table 4", why("cnl.compare"))
        return
    rows = {r.method: r for r in res.records()}
    for v in paper_values(paper="cnl", item="Table 4"):
        method = (v.coord("method") or "").lower()
        r, q = rows[method], T4[v.quantity]
        n, unit, no_ci = _table4_sizes(get, method, q)
        est = Estimate(getattr(r, q), getattr(r, q + "_low"), getattr(r, q + "_high"), n=n or 0)
        missing = f"not computed: {r.note}" if r.note else "not computed"
        extra = [DATA] if method != "cnl" else ["data: the dataset and σ of cnl.compare's config"]
        rb.value("CNL Table 4", f"{v.coord('method')} · {v.quantity} ({v.model})", None if math.isnan(est.value) else est,
                 v, differences=_diffs(rb, v.model, *extra), missing=missing, n_unit=unit, no_ci=no_ci)
    rb.figure("CNL Table 4", "cnl_table4", res.figure())


def suite_report(rb: RowBuilder, get: Get, why: Callable[[str], str]) -> None:
    """Every row of the CNL evaluation suite (module docstring).

    Args:
        rb: The report's row builder; rows and figures are added to it.
        get: ``get(stage name)``: the stage's outputs, or ``None`` when it did not compute or load.
        why: ``why(stage name)``: why a stage has no outputs (the reason of the rows it leaves missing).
    """
    fidelity_rows(rb, get, why)
    reliability_rows(rb, get, why)
    decoupling_rows(rb, get, why)
    table4_rows(rb, get, why)


__all__ = ["suite_report", "fidelity_rows", "reliability_rows", "decoupling_rows", "table4_rows", "NO_DIFFERENCE_MARGIN"]
