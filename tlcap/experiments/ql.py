"""Query Localization (Chen et al.): every analysis of the paper on the shared hook runtime.

Pipeline (each step a function returning a value; the CLI ``tlcap ql ...`` composes them)::

    facts = load_pararel(...)                             # facts with neighbor queries
    locs = localize_facts(model, facts, method="ig")      # per-query scores and KN sets N_i
    cons = consistency_analysis({"ig": locs})             # CS1/CS2, K_I/K_II, Welch t-test  (Table 1, Fig. 3)
    mod = modification_experiment(model, locs, groups)    # erasure / update of N_i vs N_g   (Table 2)
    qkm = query_kn_mapping(model, locs, groups)           # enhance/suppress N_i vs neighbors (Fig. 4)
    syn = synapse_experiment(model, locs, groups)         # predominance, knowledge synapses (Figs. 5, 6, 7, 10)
    cas = cas_experiment(model, locs, groups)             # Consistency-Aware KN modification (Table 3)

Decisions (see docs/ql.md):
- KNs of one query: ``score > t · max`` with t = 0.2 (Dai et al.); every method shares it.
- K_I / K_II: CS2 > threshold is K_I. Static threshold 0.1 (QL Table 4) or Otsu's.
- Predominance and synapses use *column* sums ``Σ_r A[r, c]`` (attention a token receives): the
  row sums of a softmax pattern are all 1, so eq. 4's ``argmax_r Σ_c`` is read as the column
  argmax, matching eq. 6. Position 0 is an attention sink in GPT-2/SmolLM2 (it receives ~80%
  of the mass in every head); ``skip_first=True`` (default) leaves it out of predominance and
  synapses, so the synapses are the *content* tokens a head focuses on. τ is eq. 5 as written.
- Synapse intervention: the selected pattern columns are multiplied by 2 (enhance) or 0
  (suppress) at the ``attn_pattern`` site, without renormalising the rows.
- ΔValue uses the mean |activation| of the query's KNs at the last position (gated-MLP
  activations can be negative; the paper's GPT-2 GELU activations are mostly positive).
- Update edits the down-projection column (value vector) of each KN:
  ``W[:, p] ← W[:, p] − λ1·E(o) + λ2·E(o')`` with E the input embedding of the first token of
  the object and o' the object of another fact of the same relation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.attribution.methods import localize
from tlcap.data.pararel import Fact
from tlcap.data.wikitext import load_wikitext
from tlcap.intervene.activations import enhance, suppress
from tlcap.intervene.weights import WeightEdit, erase_neurons
from tlcap.locate.selection import threshold_select
from tlcap.metrics.sets import NeuronSet
from tlcap.metrics.stats import (
    consistency_aware_scores,
    cs1,
    cs2,
    otsu_threshold,
    predominance,
    refined_set,
    relative_change,
    split_groups,
    welch_t_test,
)
from tlcap.models.adapter import HookList, Model
from tlcap.results import Result
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site

STATIC_THRESHOLD = 0.1
KN_THRESHOLD = 0.2


# ============================================================== localization of facts
@dataclass(frozen=True)
class FactKNs(Result):
    """One fact's per-query attribution scores and knowledge-neuron sets.

    Attributes:
        scores: ``[k, n_layers, d_mlp]`` scores of the k neighbor queries.
        probs: Clean target probability per query.
        fact: The fact as a dict (relation, subject, object, queries, uuid).
        method: ``ig``, ``sig`` or ``amig``.
        threshold: KN selection ``score > threshold · max`` per query.
    """

    scores: Tensor
    probs: tuple[float, ...] = ()
    fact: dict = field(default_factory=dict)
    method: str = "ig"
    threshold: float = KN_THRESHOLD
    seconds: float = 0.0

    @property
    def queries(self) -> list[str]:
        return list(self.fact["queries"])

    @property
    def target(self) -> str:
        return " " + self.fact["object"]

    @property
    def k(self) -> int:
        return int(self.scores.shape[0])

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.scores.shape[1]), int(self.scores.shape[2]))

    def sets(self) -> list[NeuronSet]:
        """The KN set N_i of every query."""
        return [threshold_select(self.scores[i], self.threshold) for i in range(self.k)]

    def global_set(self) -> NeuronSet:
        """N_g = ∪_j N_j."""
        out = NeuronSet((), self.shape)
        for s in self.sets():
            out = out | s
        return out

    def neighbor_sets(self, i: int) -> dict[str, NeuronSet]:
        """QL eq. 3: union, intersection and refine (count > 1) over the neighbors j ≠ i."""
        others = [s for j, s in enumerate(self.sets()) if j != i]
        union = NeuronSet((), self.shape)
        for s in others:
            union = union | s
        inter = others[0] if others else NeuronSet((), self.shape)
        for s in others[1:]:
            inter = inter & s
        ref = refined_set(others, 2) if others else NeuronSet((), self.shape)
        return {"union": union, "intersection": inter, "refine": ref}

    def cas_set(self, beta1: float = 0.7, beta2: float = 0.3, t: float = 0.3) -> NeuronSet:
        """Consistency-Aware KNs: CAS > t · max(CAS) (QL eq. 7)."""
        return threshold_select(consistency_aware_scores(self.scores, beta1, beta2), t)

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for i, s in enumerate(self.sets()):
            rows.append({"query": self.queries[i], "prob": self.probs[i] if self.probs else math.nan, "n_kns": len(s)})
        return pd.DataFrame(rows)


def localize_facts(
    model: Model,
    facts: Sequence[Fact],
    method: str = "ig",
    *,
    steps: int = 20,
    threshold: float = KN_THRESHOLD,
    layers: Sequence[int] | None = None,
    progress: bool = True,
) -> list[FactKNs]:
    """Attribute every neighbor query of every fact with ``method`` (ig, sig, amig).

    Example:
        >>> locs = localize_facts(model, facts, "ig", steps=10)
        >>> locs[0].sets()
    """
    import time

    out = []
    total = sum(len(f.queries) for f in facts)
    bar = tqdm(total=total, desc=f"{method} attribution", disable=not progress)
    for f in facts:
        t0 = time.perf_counter()
        scores, probs = [], []
        for q in f.queries:
            a = localize(model, q, f.target, method=method, steps=steps, layers=layers)  # type: ignore[arg-type]
            scores.append(a.scores)
            probs.append(a.target_prob)
            bar.update(1)
        out.append(FactKNs(torch.stack(scores), tuple(probs), f.to_dict(), method, threshold, time.perf_counter() - t0))
    bar.close()
    return out


# ============================================================== consistency (Table 1, Fig. 3)
@dataclass(frozen=True)
class ConsistencyResult(Result):
    """KN-consistency of every fact under one or more localization methods.

    Attributes:
        rows: One dict per (method, fact): relation, subject, object, method, cs1, cs2, sizes,
            union, intersection, group_static, group_otsu.
        methods: Methods in order (the first one is the headline).
        static_threshold: The static CS2 threshold.
        otsu_thresholds: Otsu's threshold per method.
        split: Which threshold defines ``group`` (``"static"`` or ``"otsu"``).
    """

    rows: tuple[dict, ...] = ()
    methods: tuple[str, ...] = ("ig",)
    static_threshold: float = STATIC_THRESHOLD
    otsu_thresholds: dict = field(default_factory=dict)
    split: str = "static"

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def threshold(self, method: str | None = None, split: str | None = None) -> float:
        split = split or self.split
        m = method or self.methods[0]
        return self.static_threshold if split == "static" else float(self.otsu_thresholds[m])

    def groups(self, method: str | None = None, split: str | None = None) -> list[str]:
        """K_I / K_II per fact (in fact order) under ``method`` and ``split``."""
        m = method or self.methods[0]
        col = f"group_{split or self.split}"
        return [r[col] for r in self.rows if r["method"] == m]

    def stats(self, method: str | None = None, split: str | None = None) -> dict[str, float]:
        """R/S of K_I and K_II, Welch's t and p (one cell block of Table 1)."""
        m = method or self.methods[0]
        df = self.to_frame()
        df = df[df.method == m]
        g = df[f"group_{split or self.split}"]
        c1, c2 = df.cs2[g == "K_I"], df.cs2[g == "K_II"]
        t, p = welch_t_test(c1, c2)
        n = max(len(df), 1)
        return {
            "threshold": self.threshold(m, split),
            "k1_ratio": len(c1) / n, "k2_ratio": len(c2) / n,
            "mean_cs2_k1": float(c1.mean()) if len(c1) else math.nan,
            "mean_cs2_k2": float(c2.mean()) if len(c2) else math.nan,
            "mean_cs1": float(df.cs1.mean()) if len(df) else math.nan,
            "mean_cs2": float(df.cs2.mean()) if len(df) else math.nan,
            "welch_t": t, "welch_p": p,
        }

    def k2_all_methods(self, split: str | None = None) -> float:
        """Share of facts that are K_II under every method (Table 1's ∩:II)."""
        per = [self.groups(m, split) for m in self.methods]
        n = len(per[0]) if per else 0
        if n == 0:
            return math.nan
        return sum(all(p[i] == "K_II" for p in per) for i in range(n)) / n

    def table1(self) -> pd.DataFrame:
        """Table 1 layout: rows St/Ot, columns (method, R:I, S:I, R:II, S:II, t) and ∩:II."""
        from tlcap.viz.ql import table1_frame

        return table1_frame(self)

    def violin(self, method: str | None = None):  # noqa: ANN201
        """CS2 per relation (QL Fig. 3) with the static threshold drawn."""
        from tlcap.viz.ql import cs2_violin

        return cs2_violin(self, method)

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` of ``tlcap ql consistency``."""
        m0 = self.methods[0]
        head = self.stats(m0)
        facts = []
        df = self.to_frame()
        for r in df[df.method == m0].to_dict("records"):
            facts.append({k: r[k] for k in ("relation", "subject", "object", "cs1", "cs2")} | {
                "group": r[f"group_{self.split}"], "n_queries": r["n_queries"], "kn_sizes": r["kn_sizes"],
                "union": r["union"], "intersection": r["intersection"]})
        per_method = {m: {s: self.stats(m, s) for s in ("static", "otsu")} for m in self.methods}
        return {
            "n_facts": len(facts), "method": m0, "methods": list(self.methods), "split": self.split,
            **head,
            "static_threshold": self.static_threshold, "otsu_threshold": self.otsu_thresholds.get(m0),
            "k2_all_methods": {s: self.k2_all_methods(s) for s in ("static", "otsu")},
            "per_method": per_method,
            "facts": facts,
        }


def consistency_analysis(
    locs: Mapping[str, Sequence[FactKNs]],
    static_threshold: float = STATIC_THRESHOLD,
    split: Literal["static", "otsu"] = "static",
) -> ConsistencyResult:
    """CS1/CS2 for every fact and method, K_I/K_II splits and Welch's t-test (QL §2.1).

    Args:
        locs: ``{method: [FactKNs per fact]}`` (same facts, same order for every method).
        static_threshold: CS2 threshold of the static split (QL Table 4: 0.1).
        split: Which split the headline numbers use.
    """
    if split not in ("static", "otsu"):
        raise ValueError("split must be 'static' or 'otsu'")
    rows: list[dict] = []
    otsu: dict[str, float] = {}
    for m, fl in locs.items():
        vals = []
        block = []
        for fk in fl:
            sets = fk.sets()
            c1, c2 = cs1(sets), cs2(sets)
            vals.append(c2)
            union = NeuronSet((), fk.shape)
            for s in sets:
                union = union | s
            inter = sets[0]
            for s in sets[1:]:
                inter = inter & s
            block.append({
                "method": m, "relation": fk.fact["relation"], "subject": fk.fact["subject"],
                "object": fk.fact["object"], "n_queries": fk.k, "cs1": c1, "cs2": c2,
                "kn_sizes": [len(s) for s in sets], "union": len(union), "intersection": len(inter),
                "mean_prob": float(np.mean(fk.probs)) if fk.probs else math.nan,
            })
        th = otsu_threshold(vals) if vals else math.nan
        otsu[m] = th
        for r, gs, go in zip(block, split_groups(vals, static_threshold), split_groups(vals, th)):
            r["group_static"], r["group_otsu"] = gs, go
        rows.extend(block)
    return ConsistencyResult(tuple(rows), tuple(locs), static_threshold, otsu, split)


# ============================================================== evaluation helpers
@torch.no_grad()
def last_logits(model: Model, prompts: Sequence[str], hooks: HookList = ()) -> Float[Tensor, "n d_vocab"]:
    """Last-position logits of each prompt (one forward pass per prompt: lengths differ)."""
    out = []
    for p in prompts:
        out.append(model.last_logits(model.to_tokens(p), hooks=hooks)[0].float())
    return torch.stack(out) if out else torch.zeros(0, model.d_vocab)


def _first_id(model: Model, prompt: str, target: str) -> int:
    return model.target_ids(prompt, target)[0]


def wikitext_sample(n_texts: int = 5, data_dir: str | Path | None = None, seed: int = 0) -> list[str]:
    """The first ``n_texts`` WikiText-2 paragraphs for ΔPPL (:func:`tlcap.data.load_wikitext`; ``seed`` unused)."""
    return load_wikitext(data_dir, n_texts=n_texts)


@torch.no_grad()
def perplexity(model: Model, texts: Sequence[str], max_tokens: int = 128) -> float:
    """exp(mean next-token NLL) over the texts, each truncated to ``max_tokens`` tokens."""
    nll, n = 0.0, 0
    for t in texts:
        ids = model.encode(t, prepend_bos=False, max_tokens=min(max_tokens, model.n_ctx), check_length=False)
        if len(ids) < 2:
            continue
        toks = torch.tensor([ids], device=model.device)
        logp = model.logits(toks)[0, :-1].float().log_softmax(-1)
        tgt = toks[0, 1:]
        nll -= float(logp[torch.arange(len(tgt)), tgt].sum())
        n += len(tgt)
    return math.exp(nll / max(n, 1))


def update_neurons(model: Model, neurons: NeuronSet, old_id: int, new_id: int, lambda1: float = 2.0, lambda2: float = 2.0) -> WeightEdit:
    """QL eq. 2 (Update): each KN's value vector ``W[:, p] += −λ1·E(o) + λ2·E(o')`` (reversible)."""
    E = model.W_E.detach()
    delta = (-lambda1 * E[old_id] + lambda2 * E[new_id]).float()
    edit = WeightEdit()

    def fn(e: WeightEdit) -> None:
        for l, idx in neurons.by_layer().items():
            ws = model.mlp_out_weight(l)
            view = e.touch(ws.param).movedim(ws.neuron_dim, 0)
            ix = torch.tensor(idx, dtype=torch.long)
            view[ix] = view[ix] + delta.to(view.dtype)[None]

    return edit.apply(fn)


# ============================================================== modification (Table 2, Table 3)
@dataclass(frozen=True)
class ModificationResult(Result):
    """Rows per (fact, edited query, operation, KN set) with Rel/Gen/Loc/Avg/ΔPPL."""

    rows: tuple[dict, ...] = ()
    lambda1: float = 2.0
    lambda2: float = 2.0
    ppl_before: float = math.nan

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def table(self) -> pd.DataFrame:
        """Table 2/3 layout: mean Rel, Gen, Loc, Avg, ΔPPL by (operation, set, group)."""
        from tlcap.viz.ql import modification_table

        return modification_table(self.to_frame())

    def figure(self, title: str = "Knowledge modification"):  # noqa: ANN201
        from tlcap.viz.ql import modification_bars

        return modification_bars(self.to_frame(), title)


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
        except Exception:  # noqa: BLE001 - tokenization
            continue
        return o
    return None


def modification_experiment(
    model: Model,
    locs: Sequence[FactKNs],
    groups: Sequence[str],
    *,
    operations: Sequence[str] = ("erasure", "update"),
    sets: Sequence[str] = ("local", "global"),
    lambda1: float = 2.0,
    lambda2: float = 2.0,
    edit_queries: int | None = None,
    n_locality: int = 5,
    ppl_texts: Sequence[str] | None = None,
    ppl_max_tokens: int = 128,
    cas_params: tuple[float, float, float] = (0.7, 0.3, 0.3),
    progress: bool = True,
) -> ModificationResult:
    """Erase / update the KNs' MLP weights and measure Rel, Gen, Loc and ΔPPL (QL §2.2, §3.3).

    Args:
        model: The model (edited in place, always restored).
        locs: Per-fact localizations.
        groups: ``"K_I"``/``"K_II"`` per fact.
        operations: ``"erasure"`` (weights → 0) and/or ``"update"`` (λ1, λ2).
        sets: ``"local"`` (N_i), ``"global"`` (N_g = ∪N_j), ``"cas"`` (Consistency-Aware KNs).
        edit_queries: Edit only the first n queries of each fact (default all).
        n_locality: Unrelated facts (other facts' first query) for locality.
        ppl_texts: Texts for ΔPPL (default 5 WikiText-2 paragraphs).
        ppl_max_tokens: Tokens per text.
        cas_params: (β1, β2, t) of the CAS selection.

    Metrics (QL §2.2, A.5): argmax accuracy of the edited query (Rel) and its neighbors (Gen),
    inverted (1 − acc) for erasure and measured against o' for update; Loc = share of unrelated
    queries whose argmax is unchanged; Avg = mean(Rel, Gen, Loc); ΔPPL = (PPL_a − PPL_b)/PPL_b.
    ``p_before``/``p_after`` give the edited query's probability of the original object.
    """
    texts = list(ppl_texts) if ppl_texts is not None else wikitext_sample(5)
    ppl_b = perplexity(model, texts, ppl_max_tokens)
    rows: list[dict] = []
    # clean predictions of every fact's first query (locality pool)
    loc_prompts = [fk.queries[0] for fk in locs]
    clean_loc = last_logits(model, loc_prompts).argmax(-1)
    n_edits = sum(min(fk.k, edit_queries or fk.k) for fk in locs) * len(operations) * len(sets)
    bar = tqdm(total=n_edits, desc="modification", disable=not progress)
    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        qs = fk.queries
        obj_id = _first_id(model, qs[0], fk.target)
        new_obj = _pick_new_object(model, fk, locs) if "update" in operations else None
        new_id = _first_id(model, qs[0], " " + new_obj) if new_obj else None
        others = [j for j in range(len(locs)) if j != fi][:n_locality]
        clean_q = last_logits(model, qs)
        sets_i = fk.sets()
        for i in range(min(fk.k, edit_queries or fk.k)):
            chosen: dict[str, NeuronSet] = {}
            for sname in sets:
                if sname == "local":
                    chosen[sname] = sets_i[i]
                elif sname == "global":
                    chosen[sname] = fk.global_set()
                elif sname == "cas":
                    chosen[sname] = fk.cas_set(*cas_params)
                else:
                    raise ValueError(f"unknown KN set {sname!r}; use local, global or cas")
            for op in operations:
                for sname, ns in chosen.items():
                    if op == "update" and new_id is None:
                        bar.update(1)
                        continue
                    if op == "erasure":
                        edit = erase_neurons(model, ns)
                    elif op == "update":
                        edit = update_neurons(model, ns, obj_id, int(new_id), lambda1, lambda2)
                    else:
                        raise ValueError(f"unknown operation {op!r}; use erasure or update")
                    with edit:
                        lg = last_logits(model, qs)
                        pred = lg.argmax(-1)
                        ppl_a = perplexity(model, texts, ppl_max_tokens)
                        loc_pred = last_logits(model, [loc_prompts[j] for j in others]).argmax(-1) if others else None
                    p_b = float(clean_q[i].softmax(-1)[obj_id])
                    p_a = float(lg[i].softmax(-1)[obj_id])
                    nb = [j for j in range(fk.k) if j != i]
                    if op == "erasure":
                        rel = 1.0 - float(pred[i] == obj_id)
                        gen = 1.0 - float(np.mean([float(pred[j] == obj_id) for j in nb])) if nb else math.nan
                    else:
                        rel = float(pred[i] == new_id)
                        gen = float(np.mean([float(pred[j] == new_id) for j in nb])) if nb else math.nan
                    loc = float((loc_pred == clean_loc[others]).float().mean()) if others else math.nan
                    vals = [v for v in (rel, gen, loc) if not math.isnan(v)]
                    rows.append({
                        "fact": fi, "relation": fk.fact["relation"], "subject": fk.fact["subject"],
                        "object": fk.fact["object"], "new_object": new_obj if op == "update" else None,
                        "group": grp, "query": i, "operation": op, "set": sname, "n_neurons": len(ns),
                        "rel": rel, "gen": gen, "loc": loc, "avg": float(np.mean(vals)) if vals else math.nan,
                        "ppl_before": ppl_b, "ppl_after": ppl_a, "dppl": (ppl_a - ppl_b) / ppl_b,
                        "p_before": p_b, "p_after": p_a,
                    })
                    bar.update(1)
    bar.close()
    return ModificationResult(tuple(rows), lambda1, lambda2, ppl_b)


def cas_experiment(model: Model, locs: Sequence[FactKNs], groups: Sequence[str], *, beta1: float = 0.7, beta2: float = 0.3,
                   t: float = 0.3, **kwargs: Any) -> ModificationResult:
    """Consistency-Aware KN modification vs N_i and N_g (QL §3.3, Table 3)."""
    kwargs.setdefault("sets", ("local", "global", "cas"))
    return modification_experiment(model, locs, groups, cas_params=(beta1, beta2, t), **kwargs)


# ============================================================== query-KN mapping (Fig. 4)
@dataclass(frozen=True)
class MappingResult(Result):
    """ΔProb of enhancing / suppressing N_i vs the neighbor sets (QL §3.1)."""

    rows: tuple[dict, ...] = ()
    factor: float = 2.0

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def table(self) -> pd.DataFrame:
        """Mean ΔProb by (group, set) with Enh, Sup and Avg columns (Fig. 4 numbers)."""
        from tlcap.viz.ql import enh_sup_table

        return enh_sup_table(self.to_frame(), "set", "dprob", order=["self", "union", "intersection", "refine"])

    def figure(self):  # noqa: ANN201
        from tlcap.viz.ql import enh_sup_bars

        return enh_sup_bars(self.table(), "set", "ΔProb", "Query-KN mapping: ΔProb of N_i vs neighbor KNs (QL Fig. 4)")


@torch.no_grad()
def query_kn_mapping(model: Model, locs: Sequence[FactKNs], groups: Sequence[str], *, factor: float = 2.0,
                     pos: Any = "last", progress: bool = True) -> MappingResult:
    """Enhance (×factor) / suppress (×0) N_i or its neighbor sets; ΔProb = ±(P_a − P_b)/P_b."""
    rows: list[dict] = []
    bar = tqdm(total=sum(fk.k for fk in locs), desc="query-KN mapping", disable=not progress)
    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        sets_i = fk.sets()
        for i, q in enumerate(fk.queries):
            tid = _first_id(model, q, fk.target)
            p_b = float(last_logits(model, [q])[0].softmax(-1)[tid])
            cand = {"self": sets_i[i], **fk.neighbor_sets(i)}
            for sname, ns in cand.items():
                for op, hooks, sign in (("enh", enhance(model, ns, factor, pos=pos), 1.0), ("sup", suppress(model, ns, pos=pos), -1.0)):
                    p_a = float(last_logits(model, [q], hooks)[0].softmax(-1)[tid])
                    rows.append({"fact": fi, "relation": fk.fact["relation"], "subject": fk.fact["subject"], "group": grp,
                                 "query": i, "set": sname, "op": op, "n_neurons": len(ns), "p_before": p_b, "p_after": p_a,
                                 "dprob": relative_change(p_a, p_b, sign)})
            bar.update(1)
    bar.close()
    return MappingResult(tuple(rows), factor)


# ============================================================== attention: predominance, synapses
@torch.no_grad()
def attention_patterns(model: Model, prompt: str, hooks: HookList = ()) -> Float[Tensor, "layer head q k"]:
    """All layers' attention patterns for ``prompt`` (the ``attn_pattern`` site)."""
    site = get_site("attn_pattern")
    names = [site.hook_name(l) for l in range(model.n_layers)]
    _, cache = model.run_with_cache(model.to_tokens(prompt), names, hooks=hooks)
    return torch.stack([cache[n][0] for n in names]).float()


def most_attended_token(model: Model, prompt: str, skip_first: bool = True) -> tuple[int, str]:
    """t_i of QL eq. 4: the position whose column of the layer/head-mean pattern has the most mass."""
    A = attention_patterns(model, prompt).mean((0, 1))  # [q, k]
    col = A.sum(0)
    if skip_first and col.numel() > 1:
        col = col.clone()
        col[0] = -math.inf
    c = int(col.argmax())
    ids = model.encode(prompt)
    return c, model.to_str_tokens([ids[c]])[0]


@dataclass(frozen=True)
class KnowledgeSynapses(Result):
    """Knowledge synapses of one query: ``(column c, layer l, head h)`` with ``Σ_r A[r, c] > τ``.

    Attributes:
        mask: ``[n_layers, n_heads, n_tokens]`` True at synapses.
        col_mass: ``[n_layers, n_heads, n_tokens]`` Σ_r A^{l,h}[r, c].
        tau: τ = α · (1/LH) Σ_{l,h,r,c} A (QL eq. 5).
    """

    mask: Tensor
    col_mass: Tensor
    tau: float = 0.0
    alpha: float = 0.3
    prompt: str = ""
    tokens: tuple[str, ...] = ()
    skip_first: bool = True

    def __len__(self) -> int:
        return int(self.mask.sum())

    def mask_for(self, n_tokens: int) -> Bool[Tensor, "layer head k"]:
        """The mask cropped / zero-padded to a prompt of ``n_tokens`` (to apply another query's synapses)."""
        L, Hh, C = self.mask.shape
        out = torch.zeros(L, Hh, n_tokens, dtype=torch.bool)
        c = min(C, n_tokens)
        out[..., :c] = self.mask[..., :c]
        return out

    def hooks(self, factor: float, n_tokens: int | None = None) -> HookList:
        """Hooks scaling the synapses' pattern columns by ``factor`` (0 suppresses, 2 enhances)."""
        m = self.mask if n_tokens is None else self.mask_for(n_tokens)
        return synapse_hooks(m, factor)

    def to_frame(self) -> pd.DataFrame:
        idx = self.mask.nonzero().tolist()
        return pd.DataFrame([{"layer": l, "head": h, "column": c, "token": self.tokens[c] if c < len(self.tokens) else "",
                              "mass": float(self.col_mass[l, h, c])} for l, h, c in idx])


def synapse_mask(patterns: Float[Tensor, "layer head q k"], alpha: float = 0.3, skip_first: bool = True) -> tuple[Tensor, Tensor, float]:
    """QL eqs. 5–6 on a stack of patterns → (mask [L, H, C], column mass [L, H, C], τ)."""
    col = patterns.sum(-2)  # [L, H, C]
    tau = alpha * float(patterns.sum((-1, -2)).mean())
    mask = col > tau
    if skip_first:
        mask[..., 0] = False
    return mask, col, tau


def synapse_hooks(mask: Bool[Tensor, "layer head k"], factor: float) -> HookList:
    """``attn_pattern`` hooks multiplying the masked key columns of each (layer, head) by ``factor``."""
    site = get_site("attn_pattern")
    out = []
    for l in range(mask.shape[0]):
        if mask[l].any():
            out.append((site.hook_name(l), H.scale_where(mask[l][:, None, :], factor)))
    return out


def locate_synapses(model: Model, prompt: str, alpha: float = 0.3, skip_first: bool = True) -> KnowledgeSynapses:
    """Knowledge synapses of ``prompt`` (QL eqs. 5–6; ``skip_first`` drops the attention sink)."""
    A = attention_patterns(model, prompt)
    mask, col, tau = synapse_mask(A, alpha, skip_first)
    toks = tuple(model.to_str_tokens(model.encode(prompt)))
    return KnowledgeSynapses(mask, col, tau, alpha, prompt, toks, skip_first)


@torch.no_grad()
def _kn_value_prob(model: Model, prompt: str, tid: int, kns: NeuronSet, hooks: HookList = ()) -> tuple[float, float, Tensor]:
    """(mean |activation| of the KNs at the last position, P(target), all last-pos activations [L, d])."""
    site = get_site("mlp_post")
    names = [site.hook_name(l) for l in range(model.n_layers)]
    acts, logits = model.last_position_activations(model.to_tokens(prompt), names, hooks=hooks)
    acts, logits = acts[0].float(), logits[0].float()
    v = float(acts[kns.mask()].abs().mean()) if len(kns) else math.nan
    return v, float(logits.softmax(-1)[tid]), acts


@dataclass(frozen=True)
class SynapseResult(Result):
    """Dynamic KN selection: predominance per fact and ΔValue / ΔProb of synapse edits."""

    rows: tuple[dict, ...] = ()
    predominance: tuple[dict, ...] = ()
    heatmap_values: Tensor | None = None
    heatmap_rows: tuple[str, ...] = ()
    heatmap_cols: tuple[str, ...] = ()
    alpha: float = 0.3
    factor: float = 2.0

    def to_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.rows))

    def predominance_frame(self) -> pd.DataFrame:
        return pd.DataFrame(list(self.predominance))

    def table(self) -> pd.DataFrame:
        """Mean ΔValue and ΔProb by (group, synapses) with Enh/Sup/Avg (Fig. 6 numbers)."""
        from tlcap.viz.ql import enh_sup_table

        df = self.to_frame()
        a = enh_sup_table(df, "synapses", "dvalue", order=["self", "irrelevant"]).assign(metric="ΔValue")
        b = enh_sup_table(df, "synapses", "dprob", order=["self", "irrelevant"]).assign(metric="ΔProb")
        return pd.concat([a, b], ignore_index=True)

    def figure(self):  # noqa: ANN201
        from tlcap.viz.ql import synapse_bars

        return synapse_bars(self.table())

    def predominance_figure(self):  # noqa: ANN201
        from tlcap.viz.ql import predominance_violin

        return predominance_violin(self.predominance_frame())

    def heatmap(self):  # noqa: ANN201
        """KN activations before / after suppressing / enhancing the synapses (Figs. 1, 7, 10)."""
        from tlcap.viz.heatmaps import activation_heatmap

        if self.heatmap_values is None:
            raise ValueError("no heatmap recorded")
        return activation_heatmap(self.heatmap_values, list(self.heatmap_rows), list(self.heatmap_cols),
                                  title="KN activations: none / suppressed / enhanced knowledge synapses")


def synapse_experiment(
    model: Model,
    locs: Sequence[FactKNs],
    groups: Sequence[str],
    *,
    alpha: float = 0.3,
    factor: float = 2.0,
    skip_first: bool = True,
    irrelevant_prompt: str | None = None,
    heatmap_fact: int = 0,
    heatmap_max_cols: int = 40,
    progress: bool = True,
) -> SynapseResult:
    """Predominance (Fig. 5) and knowledge-synapse manipulation (Fig. 6, heatmaps Figs. 1/7/10).

    For each query q_i of each fact: locate its synapses S; the irrelevant synapses S_ir are those
    of the same-index query of the next fact (another relation when possible), or of
    ``irrelevant_prompt``; enhance (×factor) / suppress (×0) them via the ``attn_pattern`` site and
    measure ΔValue (mean |activation| of N_i at the last position) and ΔProb.
    """
    rows: list[dict] = []
    pred: list[dict] = []
    heat_vals: list[Tensor] = []
    heat_rows: list[str] = []
    heat_cols: list[str] = []
    bar = tqdm(total=sum(fk.k for fk in locs), desc="knowledge synapses", disable=not progress)
    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        toks_i = [most_attended_token(model, q, skip_first)[1] for q in fk.queries]
        pred.append({"fact": fi, "relation": fk.fact["relation"], "subject": fk.fact["subject"], "group": grp,
                     "tokens": toks_i, "predominance": predominance(toks_i)})
        # the irrelevant fact: prefer another relation
        others = [j for j in range(len(locs)) if j != fi]
        other_rel = [j for j in others if locs[j].fact["relation"] != fk.fact["relation"]]
        jj = (other_rel or others or [None])[0]
        sets_i = fk.sets()
        union = fk.global_set()
        if fi == heatmap_fact and len(union):
            order = fk.scores.max(0).values[union.mask()].argsort(descending=True)[:heatmap_max_cols]
            cols_n = [union.neurons[int(o)] for o in order]
            heat_cols = [f"L{l}.{j}" for l, j in cols_n]
        for i, q in enumerate(fk.queries):
            n_tok = len(model.encode(q))
            tid = _first_id(model, q, fk.target)
            syn = locate_synapses(model, q, alpha, skip_first)
            if irrelevant_prompt is not None or jj is None:
                ir = locate_synapses(model, irrelevant_prompt or "The weather today is", alpha, skip_first)
            else:
                oq = locs[jj].queries[i % locs[jj].k]
                ir = locate_synapses(model, oq, alpha, skip_first)
            v_b, p_b, acts_b = _kn_value_prob(model, q, tid, sets_i[i])
            if fi == heatmap_fact and heat_cols:
                idx_l = [int(c[1:].split(".")[0]) for c in heat_cols]
                idx_j = [int(c.split(".")[1]) for c in heat_cols]
                heat_vals.append(acts_b[idx_l, idx_j])
                heat_rows.append(f"q{i} none")
            for sname, S in (("self", syn), ("irrelevant", ir)):
                for op, f, sign in (("enh", factor, 1.0), ("sup", 0.0, -1.0)):
                    hooks = S.hooks(f, n_tok)
                    v_a, p_a, acts_a = _kn_value_prob(model, q, tid, sets_i[i], hooks)
                    rows.append({"fact": fi, "relation": fk.fact["relation"], "subject": fk.fact["subject"], "group": grp,
                                 "query": i, "synapses": sname, "op": op, "n_synapses": int(S.mask_for(n_tok).sum()),
                                 "value_before": v_b, "value_after": v_a, "dvalue": relative_change(v_a, v_b, sign),
                                 "p_before": p_b, "p_after": p_a, "dprob": relative_change(p_a, p_b, sign)})
                    if fi == heatmap_fact and heat_cols and sname == "self":
                        heat_vals.append(acts_a[idx_l, idx_j])
                        heat_rows.append(f"q{i} {'suppressed' if op == 'sup' else 'enhanced'}")
            bar.update(1)
    bar.close()
    hv = torch.stack(heat_vals) if heat_vals else None
    return SynapseResult(tuple(rows), tuple(pred), hv, tuple(heat_rows), tuple(heat_cols), alpha, factor)


# ============================================================== grouping helper
def groups_for(locs: Sequence[FactKNs], static_threshold: float = STATIC_THRESHOLD, split: str = "static") -> tuple[list[str], ConsistencyResult]:
    """K_I / K_II of each fact from its own KN sets (static threshold or Otsu)."""
    method = locs[0].method if locs else "ig"
    cons = consistency_analysis({method: locs}, static_threshold, split)  # type: ignore[arg-type]
    return cons.groups(method, split), cons
