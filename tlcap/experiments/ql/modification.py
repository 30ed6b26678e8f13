"""Knowledge modification (QL §2.2 Table 2, §3.3 Table 3): erase / update KNs, score Rel/Gen/Loc/ΔPPL.

Metrics (QL §2.2, A.5): argmax accuracy of the edited query (Rel) and of its neighbor queries
(Gen), inverted (1 − acc) for erasure and measured against the new object o' for update; Loc =
share of unrelated prompts whose argmax is unchanged; Avg = mean(Rel, Gen, Loc);
ΔPPL = (PPL_a − PPL_b)/PPL_b on WikiText-2 text. Every edit is a reversible
:class:`~tlcap.intervene.weights.WeightEdit`, undone on every exit path.

Example:
    >>> mod = modification_experiment(model, locs, groups, operations=("erasure",))
    >>> mod.table()            # Table 2 layout
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from tqdm.auto import tqdm

from tlcap.data.wikitext import load_wikitext
from tlcap.errors import TargetTokenizationError
from tlcap.experiments.ql.config import ModificationConfig
from tlcap.experiments.ql.facts import FactKNs
from tlcap.intervene.update import update_neurons
from tlcap.intervene.weights import erase_neurons
from tlcap.metrics.perplexity import next_token_logits, perplexity
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result, frame
from tlcap.viz.ql import modification_bars, modification_table


@dataclass(frozen=True)
class EditRow:
    """One edit of :class:`ModificationResult`: (fact, edited query, operation, KN set) and its metrics."""

    fact: int
    relation: str
    subject: str
    object: str
    new_object: str | None
    group: str
    query: int
    operation: str
    set: str
    n_neurons: int
    rel: float
    gen: float
    loc: float
    avg: float
    ppl_before: float
    ppl_after: float
    dppl: float
    p_before: float
    p_after: float


@dataclass(frozen=True)
class ModificationResult(Result):
    """Rows per (fact, edited query, operation, KN set) with Rel/Gen/Loc/Avg/ΔPPL.

    Attributes:
        rows: One :class:`EditRow` (as a dict) per edit.
        lambda1: λ1 of the update.
        lambda2: λ2 of the update.
        ppl_before: Perplexity of the unedited model on the ΔPPL texts.
        groups: K_I / K_II of each fact.
        method: Localization method of the KNs.
        title: What the table reproduces (QL Table 2 or 3).
    """

    rows: tuple[dict, ...] = ()
    lambda1: float = 2.0
    lambda2: float = 2.0
    ppl_before: float = math.nan
    groups: tuple[str, ...] = ()
    method: str = "ig"
    title: str = "Knowledge modification (QL Table 2)"

    def to_frame(self) -> pd.DataFrame:
        """One :class:`EditRow` per edit."""
        return frame([EditRow(**r) for r in self.rows], EditRow)

    def table(self) -> pd.DataFrame:
        """Table 2/3 layout: mean Rel, Gen, Loc, Avg, ΔPPL by (operation, set, group)."""
        return modification_table(self.to_frame())

    def figure(self, title: str | None = None) -> go.Figure:
        """Bars of Rel/Gen/Loc/Avg per (set, group), one panel per operation."""
        return modification_bars(self.to_frame(), title or self.title)

    def own_prob_drop(self) -> float | None:
        """Mean drop of the edited query's own P(o) under local erasure (``None`` without such edits)."""
        df = self.to_frame()
        sub = df[(df.operation == "erasure") & (df.set == "local")]
        return float((sub.p_before - sub.p_after).mean()) if len(sub) else None

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` of ``tlcap ql modify`` / ``tlcap ql cas``."""
        return {
            "title": self.title, "method": self.method, "n_facts": len(self.groups), "groups": list(self.groups),
            "ppl_before": self.ppl_before, "lambda1": self.lambda1, "lambda2": self.lambda2,
            "table": self.table().to_dict("records"), "edits": [dict(r) for r in self.rows],
            "own_prob_drop_local_erasure": self.own_prob_drop(),
        }


def wikitext_sample(n_texts: int = 5, data_dir: Any = None, seed: int = 0) -> list[str]:
    """The first ``n_texts`` WikiText-2 paragraphs for ΔPPL (:func:`tlcap.data.load_wikitext`; ``seed`` unused)."""
    return load_wikitext(data_dir, n_texts=n_texts)


def _first_id(model: Model, prompt: str, target: str) -> int:
    return model.target_ids(prompt, target)[0]


def _pick_new_object(model: Model, fk: FactKNs, pool: Sequence[FactKNs]) -> str | None:
    """o' for Update: another fact's object (same relation first), single-token after every query."""
    cands = [f for f in pool if f.fact["relation"] == fk.fact["relation"]] + list(pool)
    for f in cands:
        o = f.fact["object"]
        if o == fk.fact["object"]:
            continue
        try:
            for q in fk.queries:
                model.target_ids(q, " " + o, single_token=True)
        except TargetTokenizationError:
            continue
        return o
    return None


def _chosen_sets(fk: FactKNs, i: int, sets_i: list[NeuronSet], cfg: ModificationConfig) -> dict[str, NeuronSet]:
    out: dict[str, NeuronSet] = {}
    for name in cfg.sets:
        if name == "local":
            out[name] = sets_i[i]
        elif name == "global":
            out[name] = fk.global_set()
        else:
            out[name] = fk.cas_set(cfg.beta1, cfg.beta2, cfg.cas_threshold)
    return out


def modification_experiment(
    model: Model,
    locs: Sequence[FactKNs],
    groups: Sequence[str],
    *,
    config: ModificationConfig | None = None,
    ppl_texts: Sequence[str] | None = None,
    title: str = "Knowledge modification (QL Table 2)",
    progress: bool = True,
    **overrides: Any,
) -> ModificationResult:
    """Erase / update the KNs' MLP weights and measure Rel, Gen, Loc and ΔPPL (QL §2.2, §3.3).

    Args:
        model: The model (edited in place, always restored).
        locs: Per-fact localizations.
        groups: ``"K_I"``/``"K_II"`` per fact.
        config: A :class:`ModificationConfig`.
        ppl_texts: Texts for ΔPPL (default the first ``n_ppl_texts`` WikiText-2 paragraphs).
        title: What the table reproduces (kept in the result).
        progress: Show a progress bar.
        **overrides: :class:`ModificationConfig` fields (``operations=("erasure",)``, ``lambda1=1``).

    Returns:
        A :class:`ModificationResult` with provenance; ``p_before``/``p_after`` give the edited
        query's probability of the original object.

    Example:
        >>> mod = modification_experiment(model, locs, groups, sets=("local",), edit_queries=1)
        >>> mod.table()
    """
    cfg = ModificationConfig.resolve(config, **overrides)
    texts = list(ppl_texts) if ppl_texts is not None else wikitext_sample(cfg.n_ppl_texts)
    ppl_b = perplexity(model, texts, cfg.ppl_max_tokens)
    rows: list[dict] = []
    loc_prompts = [fk.queries[0] for fk in locs]
    clean_loc = next_token_logits(model, loc_prompts).argmax(-1)
    n_edits = sum(min(fk.k, cfg.edit_queries or fk.k) for fk in locs) * len(cfg.operations) * len(cfg.sets)
    bar = tqdm(total=n_edits, desc="modification", disable=not progress)
    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        qs = fk.queries
        obj_id = _first_id(model, qs[0], fk.target)
        new_obj = _pick_new_object(model, fk, locs) if "update" in cfg.operations else None
        new_id = _first_id(model, qs[0], " " + new_obj) if new_obj else None
        others = [j for j in range(len(locs)) if j != fi][: cfg.n_locality]
        clean_q = next_token_logits(model, qs)
        sets_i = fk.sets()
        for i in range(min(fk.k, cfg.edit_queries or fk.k)):
            chosen = _chosen_sets(fk, i, sets_i, cfg)
            for op in cfg.operations:
                for sname, ns in chosen.items():
                    if op == "update" and new_id is None:
                        bar.update(1)
                        continue
                    edit = erase_neurons(model, ns) if op == "erasure" else update_neurons(
                        model, ns, obj_id, int(new_id), cfg.lambda1, cfg.lambda2)  # type: ignore[arg-type]
                    with edit:
                        lg = next_token_logits(model, qs)
                        ppl_a = perplexity(model, texts, cfg.ppl_max_tokens)
                        loc_pred = next_token_logits(model, [loc_prompts[j] for j in others]).argmax(-1) if others else None
                    pred = lg.argmax(-1)
                    nb = [j for j in range(fk.k) if j != i]
                    target = obj_id if op == "erasure" else int(new_id)  # type: ignore[arg-type]
                    rel = float(pred[i] == target)
                    gen = float(np.mean([float(pred[j] == target) for j in nb])) if nb else math.nan
                    if op == "erasure":
                        rel, gen = 1.0 - rel, 1.0 - gen
                    loc = float((loc_pred == clean_loc[others]).float().mean()) if loc_pred is not None else math.nan
                    vals = [v for v in (rel, gen, loc) if not math.isnan(v)]
                    rows.append(dataclasses.asdict(EditRow(
                        fact=fi, relation=fk.fact["relation"], subject=fk.fact["subject"], object=fk.fact["object"],
                        new_object=new_obj if op == "update" else None, group=grp, query=i, operation=op, set=sname,
                        n_neurons=len(ns), rel=rel, gen=gen, loc=loc, avg=float(np.mean(vals)) if vals else math.nan,
                        ppl_before=ppl_b, ppl_after=ppl_a, dppl=(ppl_a - ppl_b) / ppl_b,
                        p_before=float(clean_q[i].softmax(-1)[obj_id]), p_after=float(lg[i].softmax(-1)[obj_id]),
                    )))
                    bar.update(1)
    bar.close()
    method = locs[0].method if locs else "ig"
    prov = Provenance.collect(model, config={**cfg.to_dict(), "method": method})
    return ModificationResult(tuple(rows), cfg.lambda1, cfg.lambda2, ppl_b, tuple(groups), method, title, provenance=prov)


def cas_experiment(
    model: Model,
    locs: Sequence[FactKNs],
    groups: Sequence[str],
    *,
    config: ModificationConfig | None = None,
    **kwargs: Any,
) -> ModificationResult:
    """Consistency-Aware KN modification vs N_i and N_g (QL §3.3, Table 3).

    Args:
        model: The model (edited in place, always restored).
        locs: Per-fact localizations.
        groups: ``"K_I"``/``"K_II"`` per fact.
        config: A :class:`ModificationConfig` (``beta1``, ``beta2``, ``cas_threshold``; ``sets``
            defaults to local, global and cas).
        **kwargs: As :func:`modification_experiment` (config overrides, ``ppl_texts``, ``progress``).

    Returns:
        A :class:`ModificationResult` titled after Table 3.

    Example:
        >>> cas = cas_experiment(model, locs, groups, edit_queries=1)
        >>> cas.table()
    """
    if config is None and "sets" not in kwargs:
        kwargs["sets"] = ("local", "global", "cas")
    kwargs.setdefault("title", "Consistency-Aware KN modification (QL Table 3)")
    return modification_experiment(model, locs, groups, config=config, **kwargs)


__all__ = ["EditRow", "ModificationResult", "cas_experiment", "modification_experiment", "wikitext_sample"]
