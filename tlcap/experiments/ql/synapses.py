"""Dynamic KN selection (QL §3.2): predominance (Fig. 5), knowledge synapses (Fig. 6), heatmaps (Figs. 1/7/10).

For each query q_i of each fact: locate its synapses S (:func:`tlcap.locate.synapses.locate_synapses`)
and irrelevant synapses S_ir (a random query of a random fact of another relation, seeded, its
columns mapped onto the query's by token role: subject, relation, last; or a fixed prompt); enhance (×factor) /
suppress (×0) them at the ``attn_pattern`` site and measure ΔValue (mean |activation| of N_i at
the last position: gated-MLP activations can be negative) and ΔProb.

Example:
    >>> from tlcap.data import load_pararel
    >>> from tlcap.experiments.ql import localize_facts
    >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
    >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
    >>> from tlcap.experiments.ql import groups_for
    >>> groups, _ = groups_for(locs, split="otsu")
    >>> syn = synapse_experiment(model, locs, groups, progress=False)
    >>> len(syn.rows)
    24
    >>> table, figs = syn.table(), (syn.figure(), syn.predominance_figure(), syn.heatmap())
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.data.sample import DataWarning
from tlcap.experiments.ql.config import EXCLUDED, SynapseConfig
from tlcap.experiments.ql.facts import FactKNs
from tlcap.intervene.synapses import scale_synapses_rows
from tlcap.locate.synapses import (
    KnowledgeSynapses,
    attention_patterns,
    attention_patterns_many,
    locate_synapses,
    map_columns,
    most_attended_token,
    token_roles,
)
from tlcap.metrics.sets import NeuronSet
from tlcap.metrics.stats import predominance, relative_change
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import RowFields, frame, row_dict
from tlcap.runtime import device as runtime_device
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site
from tlcap.viz.heatmaps import activation_heatmap
from tlcap.viz.ql import enh_sup_table, predominance_violin, synapse_bars

DEFAULT_IRRELEVANT = "The weather today is"


@dataclass(frozen=True)
class SynapseEditRow:
    """One (fact, query, synapse set, operation) row of :class:`SynapseResult`."""

    fact: int
    relation: str
    subject: str
    group: str
    query: int
    synapses: str
    op: str
    source: str
    n_synapses: int
    value_before: float
    value_after: float
    dvalue: float
    p_before: float
    p_after: float
    dprob: float


@dataclass(frozen=True)
class PredominanceRow:
    """Predominance of one fact (QL eq. 4): its queries' most-attended tokens and P."""

    fact: int
    relation: str
    subject: str
    group: str
    tokens: tuple[str, ...]
    predominance: float


@dataclass(frozen=True)
class SynapseResult(RowFields, Result):
    """Dynamic KN selection: predominance per fact and ΔValue / ΔProb of synapse edits.

    Attributes:
        rows: One :class:`SynapseEditRow` per (fact, query, synapses, op).
        predominance: One :class:`PredominanceRow` per fact.
        heatmap_values: ``[n_rows, n_kns]`` KN activations of one fact (none / suppressed /
            enhanced synapses per query), or ``None``.
        heatmap_rows: Row labels of the heatmap.
        heatmap_cols: Column labels (``L{layer}.{neuron}``).
        alpha: α of the synapse threshold.
        factor: Enhancement factor.
        groups: K_I / K_II of each fact.
        method: Localization method of the KNs.
    """

    _row_types: ClassVar[dict[str, type]] = {"rows": SynapseEditRow, "predominance": PredominanceRow}

    rows: tuple[SynapseEditRow, ...] = ()
    predominance: tuple[PredominanceRow, ...] = ()
    heatmap_values: Float[Tensor, "hrow hcol"] | None = None
    heatmap_rows: tuple[str, ...] = ()
    heatmap_cols: tuple[str, ...] = ()
    alpha: float = 0.3
    factor: float = 2.0
    groups: tuple[str, ...] = ()
    method: str = "ig"

    def to_frame(self) -> pd.DataFrame:
        """One :class:`SynapseEditRow` per (fact, query, synapses, operation).

        Returns:
            A DataFrame of :class:`SynapseEditRow`.
        """
        return frame(self.rows, SynapseEditRow)

    def predominance_frame(self) -> pd.DataFrame:
        """One :class:`PredominanceRow` per fact.

        Returns:
            A DataFrame of :class:`PredominanceRow`.
        """
        return frame(self.predominance, PredominanceRow)

    def table(self) -> pd.DataFrame:
        """Mean ΔValue and ΔProb by (group, synapses) with Enh/Sup/Avg (Fig. 6 numbers).

        Returns:
            A DataFrame: one block per metric (``ΔValue``, ``ΔProb``; column ``metric``) of self / irrelevant
            synapses by group.
        """
        df = self.to_frame()
        a = enh_sup_table(df, "synapses", "dvalue", order=["self", "irrelevant"]).assign(metric="ΔValue")
        b = enh_sup_table(df, "synapses", "dprob", order=["self", "irrelevant"]).assign(metric="ΔProb")
        return pd.concat([a, b], ignore_index=True)

    def figure(self) -> go.Figure:
        """QL Fig. 6: ΔValue and ΔProb of self vs irrelevant synapses, per group.

        Returns:
            The Plotly bar chart of :meth:`table`.
        """
        return synapse_bars(self.table())

    def predominance_figure(self) -> go.Figure:
        """QL Fig. 5: the distribution of the predominance score P per group.

        Returns:
            The Plotly violin figure of :meth:`predominance_frame`.
        """
        return predominance_violin(self.predominance_frame())

    def heatmap(self) -> go.Figure:
        """KN activations before / after suppressing / enhancing the synapses (Figs. 1, 7, 10).

        Returns:
            The Plotly heatmap (empty when no activations were recorded).
        """
        vals = self.heatmap_values if self.heatmap_values is not None else torch.zeros(0, 0)
        return activation_heatmap(vals, list(self.heatmap_rows), list(self.heatmap_cols),
                                  title="KN activations: none / suppressed / enhanced knowledge synapses")

    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` of ``tlcap ql synapses``.

        Returns:
            A JSON-safe dict: method, facts and groups, ``alpha`` and ``factor``, mean predominance (``None``
            without facts), the predominance rows, :meth:`table` and every edit row.
        """
        pdf = self.predominance_frame()
        return {"method": self.method, "n_facts": len(self.groups), "groups": list(self.groups), "alpha": self.alpha,
                "factor": self.factor, "mean_predominance": float(pdf.predominance.mean()) if len(pdf) else None,
                "predominance": [row_dict(r) for r in self.predominance], "table": self.table().to_dict("records"),
                "rows": [row_dict(r) for r in self.rows]}


SYN_ROWS = 320
"""Rows (a query's unedited run and its four synapse edits, of several queries and facts) per padded pass on an
accelerator (:func:`_kn_value_probs`)."""

PATTERN_ROWS = 64
"""Queries (of several facts) whose attention patterns one padded pass records on an accelerator."""


@torch.no_grad()
def _kn_value_probs(model: Model, jobs: Sequence[tuple[str, int, NeuronSet, Sequence[Tensor | None], Sequence[float]]],
                    rows: int | None = None,
                    keep: Sequence[bool] | None = None) -> list[list[tuple[float, float, Tensor | None]]]:
    """Per query and row: the KN value (mean |activation| of the query's KN set at the last position), P(target)
    and the ``[layer, d_mlp]`` activations under the row's synapse edit, the rows of every query in right-padded
    passes of up to ``rows`` rows (one query: one pass of its own rows, no padding).

    ``jobs``: per query ``(prompt, target id, KN set, masks, factors)`` (a ``None`` mask: the unedited row);
    ``rows`` default :data:`SYN_ROWS`; ``keep``: per query, whether its rows' activations are returned (``None`` in
    their place otherwise: a pass's activations are not held past it; default all). Each row's synapse mask covers
    its own prompt's keys (padded with ``False``), its neurons and logits are read at its own last token, and the
    padding after a prompt reaches none of its positions (causal attention): each row equals its run alone with
    ``scale_synapses(mask, factor)`` up to the float rounding of a batch (tested).
    """
    site = get_site("mlp_post")
    names = [site.hook_name(l) for l in range(model.n_layers)]
    ids = [model.encode(job[0]) for job in jobs]
    flat = [(j, r) for j, job in enumerate(jobs) for r in range(len(job[3]))]
    out: list[list[tuple[float, float, Tensor | None]]] = [[] for _ in jobs]
    step = max(1, int(SYN_ROWS if rows is None else rows))
    for r0 in range(0, len(flat), step):
        chunk = flat[r0:r0 + step]
        batch = model.encode_batch([ids[j] for j, _ in chunk])
        width = batch.tokens.shape[1]
        masks = [None if (mk := jobs[j][3][r]) is None else torch.nn.functional.pad(mk, (0, width - mk.shape[-1]))
                 for j, r in chunk]
        store: dict[str, Tensor] = {}
        hooks = [*scale_synapses_rows(masks, [float(jobs[j][4][r]) for j, r in chunk]),
                 *((n, H.record_at(store, n, batch.last_positions)) for n in names)]
        logits = model.last_logits(batch, hooks=hooks)
        acts = torch.stack([store[n].to(logits.device) for n in names], 1).float()  # [rows, layer, d_mlp]
        tid = torch.tensor([int(jobs[j][1]) for j, _ in chunk], device=logits.device)
        probs = logits.float().softmax(-1).gather(-1, tid[:, None])[:, 0]
        vals = torch.stack([acts[k][jobs[j][2].mask().to(acts.device)].abs().mean() if len(jobs[j][2])
                            else torch.tensor(math.nan, device=acts.device) for k, (j, _) in enumerate(chunk)])
        for k, ((j, _), v, p) in enumerate(zip(chunk, vals.tolist(), probs.tolist())):  # one copy per pass
            out[j].append((v, p, acts[k].clone() if keep is None or keep[j] else None))
    return out


def _irrelevant(model: Model, locs: Sequence[FactKNs], fi: int, i: int, cfg: SynapseConfig,
                roles_i: tuple[str, ...], cache: dict[str, KnowledgeSynapses] | None = None) -> tuple[str, Tensor]:
    """S_ir for query i of fact fi, mapped onto the query's columns by token role.

    The source is a random (seeded) query of a random fact of another relation (another fact
    when every fact shares the relation; ``irrelevant_prompt`` when set or no other fact exists).
    ``cache`` holds the synapses of prompts already located (an experiment's queries), filled on a miss.
    """
    rng = random.Random(f"{cfg.seed}:{fi}:{i}")
    others = [j for j in range(len(locs)) if j != fi]
    other_rel = [j for j in others if locs[j].fact.relation != locs[fi].fact.relation]
    pool = other_rel or others
    if others and not other_rel and cfg.irrelevant_prompt is None:
        warnings.warn(f"every fact shares relation {locs[fi].fact.relation}: the irrelevant synapses S_ir come "
                      "from another fact of the same relation (pass facts of several relations for the paper's "
                      "control)", DataWarning, stacklevel=2)
    if cfg.irrelevant_prompt is not None or not pool:
        prompt, subject = cfg.irrelevant_prompt or DEFAULT_IRRELEVANT, None
    else:
        jj = rng.choice(pool)
        prompt, subject = rng.choice(locs[jj].queries), locs[jj].fact.subject
    ks = cache.get(prompt) if cache is not None else None
    if ks is None:
        ks = locate_synapses(model, prompt, cfg.alpha, cfg.skip_first)
        if cache is not None:
            cache[prompt] = ks
    return prompt, map_columns(ks.mask, token_roles(model, prompt, subject), roles_i, cfg.skip_first)


def synapse_experiment(
    model: Model,
    locs: Sequence[FactKNs],
    groups: Sequence[str],
    *,
    config: SynapseConfig | None = None,
    progress: bool = True,
    **overrides: Any,
) -> SynapseResult:
    """Predominance (Fig. 5) and knowledge-synapse manipulation (Fig. 6, heatmaps Figs. 1/7/10).

    Args:
        model: The model.
        locs: Per-fact localizations.
        groups: ``"K_I"``/``"K_II"`` per fact; facts labelled ``"excluded"`` (fewer than 3 queries,
            :func:`groups_for`) are skipped.
        config: A :class:`SynapseConfig`.
        progress: Show a progress bar.
        **overrides: :class:`SynapseConfig` fields (``alpha=0.2``, ``skip_first=False``).

    Returns:
        A :class:`SynapseResult` with provenance.

    Example:
        >>> from tlcap.data import load_pararel
        >>> from tlcap.experiments.ql import localize_facts
        >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
        >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
        >>> from tlcap.experiments.ql import groups_for
        >>> groups, _ = groups_for(locs, split="otsu")
        >>> syn = synapse_experiment(model, locs, groups, alpha=0.3, progress=False)
        >>> {r.n_synapses for r in syn.rows}    # the flat attention of a random model: no weight above τ = 0.3·n
        {0}
        >>> syn = synapse_experiment(model, locs, groups, alpha=0.1, progress=False)
        >>> syn.table().round(3)                # 23-24 synapses per query at α = 0.1
          group    synapses    Enh    Sup    Avg  metric
        0   K_I        self -0.002  0.006  0.002  ΔValue
        1   K_I  irrelevant -0.003  0.005  0.001  ΔValue
        2  K_II        self -0.001  0.006  0.003  ΔValue
        3  K_II  irrelevant -0.000  0.007  0.003  ΔValue
        4   K_I        self  0.037  0.032  0.034   ΔProb
        5   K_I  irrelevant  0.034  0.029  0.031   ΔProb
        6  K_II        self  0.015  0.018  0.016   ΔProb
        7  K_II  irrelevant  0.016  0.020  0.018   ΔProb

    Raises:
        UnsupportedModelError: the model's attention pattern cannot be edited (GPT-J on
            TransformerLens 4.x, :attr:`tlcap.models.Model.attention_internals_patchable`).
    """
    model.require_patchable_attention("scaling knowledge synapses (attention-pattern columns)")
    cfg = SynapseConfig.resolve(config, **overrides)
    rows: list[SynapseEditRow] = []
    pred: list[PredominanceRow] = []
    heat_vals: list[Tensor] = []
    heat_rows: list[str] = []
    heat_cols: list[str] = []
    bar = tqdm(total=sum(fk.k for fk in locs), desc="knowledge synapses", disable=not progress)
    # every query's attention patterns first (eq. 4's most attended token and its synapses), so S_ir, another
    # query's synapses, is read from `syn`; PATTERN_ROWS queries of several facts per padded pass on an accelerator
    rows_path = runtime_device.one_pass_default(model)  # an accelerator: queries of several facts share passes
    syn: dict[str, KnowledgeSynapses] = {}
    most: dict[int, list[str]] = {}
    asked = [(fi, q) for fi, (fk, grp) in enumerate(zip(locs, groups)) if grp != EXCLUDED for q in fk.queries]
    pats: list[Tensor] = []
    if rows_path:
        for s in range(0, len(asked), PATTERN_ROWS):
            pats += attention_patterns_many(model, [q for _, q in asked[s:s + PATTERN_ROWS]])
    else:
        pats = [attention_patterns(model, q) for _, q in asked]
    for (fi, q), a in zip(asked, pats):
        most.setdefault(fi, []).append(most_attended_token(model, q, cfg.skip_first, patterns=a)[1])
        syn.setdefault(q, locate_synapses(model, q, cfg.alpha, cfg.skip_first, patterns=a))
    del pats
    # every query's edits (self and irrelevant synapses, enhanced and suppressed), then their runs: on an
    # accelerator the rows of many queries in shared passes, on a CPU one pass per query
    plans: list[tuple[int, int, list[tuple[str, str, Tensor, str, float, float]]]] = []
    jobs = []
    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        if grp == EXCLUDED:
            continue
        sets_i = fk.sets()
        for i, q in enumerate(fk.queries):
            n_tok = len(model.encode(q))
            tid = model.target_ids(q, fk.target)[0]
            ir_prompt, ir_mask = _irrelevant(model, locs, fi, i, cfg, token_roles(model, q, fk.fact.subject), syn)
            edits = [(sname, src, mask, op, f, sign)
                     for sname, src, mask in (("self", q, syn[q].mask_for(n_tok)), ("irrelevant", ir_prompt, ir_mask))
                     for op, f, sign in (("enh", cfg.factor, 1.0), ("sup", 0.0, -1.0))]
            plans.append((fi, i, edits))
            # the unedited run and the four edits, each a row of the query (scale_synapses_rows)
            jobs.append((q, tid, sets_i[i], [None] + [e[2] for e in edits], [1.0] + [e[4] for e in edits]))
    hf = heatmap_fact_of(locs, groups, cfg.heatmap_fact)
    keep = [fi == hf for fi, _, _ in plans]  # activations: the heatmap fact's only
    if rows_path:
        results = _kn_value_probs(model, jobs, keep=keep)
        bar.update(len(jobs))
    else:
        results = []
        for job, k in zip(jobs, keep):
            results += _kn_value_probs(model, [job], keep=[k])
            bar.update(1)
    by_query = {(fi, i): (edits, runs) for (fi, i, edits), runs in zip(plans, results)}
    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        if grp == EXCLUDED:  # fewer than 3 queries (CS1 ≡ CS2): neither K_I nor K_II
            bar.update(fk.k)
            continue
        toks_i = most[fi]
        pred.append(PredominanceRow(fi, fk.fact.relation, fk.fact.subject, grp, tuple(toks_i), predominance(toks_i)))
        union = fk.global_set()
        idx_l: list[int] = []
        idx_j: list[int] = []
        if fi == hf and len(union):
            order = fk.scores.max(0).values[union.mask()].argsort(descending=True)[: cfg.heatmap_max_cols]
            cols_n = [union.neurons[int(o)] for o in order]
            heat_cols = [f"L{l}.{j}" for l, j in cols_n]
            idx_l, idx_j = [l for l, _ in cols_n], [j for _, j in cols_n]
        for i in range(fk.k):
            edits, runs = by_query[(fi, i)]
            v_b, p_b, acts_b = runs[0]
            if idx_l and acts_b is not None:
                heat_vals.append(acts_b[idx_l, idx_j])
                heat_rows.append(f"q{i} none")
            for (sname, src, mask, op, _f, sign), (v_a, p_a, acts_a) in zip(edits, runs[1:]):
                rows.append(SynapseEditRow(
                    fact=fi, relation=fk.fact.relation, subject=fk.fact.subject, group=grp, query=i,
                    synapses=sname, op=op, source=src, n_synapses=int(mask.sum()), value_before=v_b,
                    value_after=v_a, dvalue=relative_change(v_a, v_b, sign), p_before=p_b, p_after=p_a,
                    dprob=relative_change(p_a, p_b, sign)))
                if idx_l and sname == "self" and acts_a is not None:
                    heat_vals.append(acts_a[idx_l, idx_j])
                    heat_rows.append(f"q{i} {'suppressed' if op == 'sup' else 'enhanced'}")
    bar.close()
    hv = torch.stack(heat_vals) if heat_vals else None
    method = locs[0].method if locs else "ig"
    prov = Provenance.collect(model, config={**cfg.to_dict(), "method": method, "heatmap_fact_drawn": hf})
    return SynapseResult(tuple(rows), tuple(pred), hv, tuple(heat_rows), tuple(heat_cols), cfg.alpha, cfg.factor,
                         tuple(groups), method, provenance=prov)


def heatmap_fact_of(locs: Sequence[Any], groups: Sequence[str], asked: int | None) -> int | None:
    """The fact whose KN activations the heatmap draws: ``asked``, or the first fact in K_I / K_II with knowledge neurons.

    Args:
        locs: The facts' localizations (:class:`FactKNs`; anything with ``global_set()``).
        groups: Each fact's group (``EXCLUDED``: fewer than 3 queries, no rows).
        asked: ``SynapseConfig.heatmap_fact`` (``None``: the first such fact).

    Returns:
        The fact's index, or ``None`` when no fact has rows and neurons (no heatmap is drawn).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> sets = [NS(global_set=lambda n=n: [0] * n) for n in (3, 0, 2)]
        >>> heatmap_fact_of(sets, ["excluded", "K_I", "K_II"], None), heatmap_fact_of(sets, ["K_I"] * 3, 1)
        (2, 1)
    """
    if asked is not None:
        return int(asked)
    return next((fi for fi, (fk, grp) in enumerate(zip(locs, groups)) if grp != EXCLUDED and len(fk.global_set())), None)


__all__ = ["PATTERN_ROWS", "heatmap_fact_of", "SYN_ROWS", "PredominanceRow",
           "SynapseEditRow", "SynapseResult", "synapse_experiment"]
