"""Knowledge modification (QL §2.2 Table 2, §3.3 Table 3): erase / update KNs, score Rel/Gen/Loc/ΔPPL.

Metrics (QL §2.2, A.5): argmax accuracy of the edited query (Rel) and of its neighbor queries
(Gen), inverted (1 − acc) for erasure and measured against the new object o' for update; Loc =
share of unrelated prompts (queries of facts of other relations with other objects, a seeded
sample) whose argmax is unchanged; Avg = mean(Rel, Gen, Loc); ΔPPL = (PPL_a − PPL_b)/PPL_b on
``n_ppl_texts`` random WikiText-2 paragraphs drawn per edited query (seeded) and shared by that
query's edits, so ΔPPL is paired across operations and KN sets. Every edit is a reversible
:class:`~tlcap.intervene.weights.WeightEdit`, undone on every exit path.

Only what the model knew is scored (``only_known=True``, default): a query is edited only when
the model answers it top-1 before the edit, and Gen counts only neighbors answered top-1;
with ``edit_queries=n`` the edited queries are the first n of the fact that the model answers
top-1 (not the first n queries), the unknown ones passed over are listed in ``skipped`` with the
reason. Facts of the group ``"excluded"`` (fewer than 3 queries, :func:`groups_for`) are not
edited (``skipped``, one row per operation and query slot). The new object o' of an update is drawn
(seeded) from the objects of the same relation that are one token after every query; a fact
with none is skipped with the reason. The Update rule is ``update_rule`` (default
``"activation"``, the literal eq. 2 is ``"paper"``; :mod:`tlcap.intervene.update`).

Example (the tiny random model answers no query top-1, hence ``only_known=False``; on a trained
model such as SmolLM2-135M keep the default):

    >>> from tlcap.data import load_pararel
    >>> from tlcap.experiments.ql import localize_facts
    >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
    >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
    >>> from tlcap.experiments.ql import groups_for
    >>> groups, _ = groups_for(locs, split="otsu")
    >>> mod = modification_experiment(model, locs, groups, operations=("erasure",), edit_queries=1,
    ...                               ppl_texts=wikitext_sample(2), only_known=False, progress=False)
    >>> mod.table()[["operation", "set", "group", "Rel", "Gen", "n"]]            # Table 2 layout
      operation     set group  Rel  Gen  n
    0   erasure   local  K_II  1.0  1.0  1
    1   erasure  global  K_II  1.0  1.0  1
    2   erasure   local   K_I  1.0  1.0  1
    3   erasure  global   K_I  1.0  1.0  1
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.data.wikitext import load_wikitext
from tlcap.errors import TargetTokenizationError
from tlcap.experiments.ql.config import EXCLUDED, ModificationConfig
from tlcap.experiments.ql.facts import FactKNs
from tlcap.experiments.ql.modification_result import EditRow, ModificationResult, SkipRow
from tlcap.intervene.set_rows import SetFactors
from tlcap.intervene.update import update_neurons, update_write
from tlcap.intervene.weights import erase_neurons
from tlcap.metrics.perplexity import perplexity
from tlcap.metrics.set_probs import edited_text_nll
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime import device as runtime_device
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site

EXCLUDED_REASON = "fewer than 3 queries (CS1 ≡ CS2): neither K_I nor K_II"


def wikitext_sample(n_texts: int = 5, data_dir: Any = None, seed: int = 0) -> list[str]:
    """``n_texts`` random WikiText-2 paragraphs (seeded) from :func:`tlcap.data.load_wikitext`.

    Args:
        n_texts: How many paragraphs.
        data_dir: WikiText-2 file or data folder (default: the bundled copy).
        seed: Seed of the draw.

    Returns:
        The paragraphs.
    """
    pool = load_wikitext(data_dir)
    return random.Random(seed).sample(pool, min(n_texts, len(pool)))


def _first_id(model: Model, prompt: str, target: str) -> int:
    return model.target_ids(prompt, target)[0]


@torch.no_grad()
def _query_and_locality_logits(model: Model, queries: Sequence[str], loc_prompts: Sequence[str], hooks: Any = (),
                               names: Sequence[str] = ()) -> tuple[Any, Any, Tensor | None]:
    """The queries' next-token logits and the locality prompts' argmax, from one right-padded pass of both.

    Args:
        model: The model.
        queries: The fact's queries.
        loc_prompts: The locality prompts.
        hooks: Row interventions of the pass (row ``r`` = prompt ``r`` of ``[*queries, *loc_prompts]``).
        names: Sites whose activations at each query's last token are kept (what the ``activation`` Update rule
            reads), from the same pass.

    Returns:
        ``([n_queries, d_vocab] logits, [n_loc] argmax ids or None without locality prompts,
        [n_queries, len(names), d] float32 activations or None without names)``.
    """
    toks = model.encode_batch([*queries, *loc_prompts])
    store: dict[str, Tensor] = {}
    last = toks.lengths[: len(queries)] - 1
    lg = model.last_logits(toks, hooks=[*hooks, *((n, H.record_at(store, n, last)) for n in names)]).float()
    acts = torch.stack([store[n] for n in names], dim=1).float() if names else None
    return lg[: len(queries)], lg[len(queries):].argmax(-1) if loc_prompts else None, acts


EDIT_ROWS = 1024
"""Rows (prompts) per pass of a fact's edits on an accelerator (:func:`_edit_query_rows`)."""


@torch.no_grad()
def _edit_query_rows(model: Model, plan: SetFactors, queries: Sequence[str],
                     loc_prompts: Sequence[str]) -> list[tuple[Any, Any]]:
    """Every edit of a fact as rows: per edit ``(query logits, locality argmax)``.

    Set 0 of ``plan`` is the unedited model (an empty set), set ``k ≥ 1`` edit ``k``: an erasure (its ``mlp_post``
    zeroed at every position) or an Update (its write added to ``mlp_out``), the models the weight edits make
    (module ``set_rows``). The queries with the locality prompts of every edit — of all the fact's edited queries —
    are rows of right-padded passes of at most :data:`EDIT_ROWS` rows, instead of a weight edit and a pass per edit;
    each value equals the weight edit's up to float rounding (tested).
    """
    E, n = len(plan) - 1, len(queries) + len(loc_prompts)
    per = max(1, EDIT_ROWS // n)
    out: list[tuple[Any, Any]] = []
    for e0 in range(1, E + 1, per):
        sets = list(range(e0, min(E + 1, e0 + per)))
        rows = torch.tensor(sets).repeat_interleave(n)  # edit-major: edit k's queries, then its prompts
        lg, _, _ = _query_and_locality_logits(model, [*queries, *loc_prompts] * len(sets), [], plan.hooks(model, rows))
        out += [(lg[j * n:j * n + len(queries)], lg[j * n + len(queries):(j + 1) * n].argmax(-1) if loc_prompts else None)
                for j in range(len(sets))]
    return out


def _rows_plan(model: Model, specs: Sequence[tuple[int, str, str, NeuronSet]], writes: Sequence[Any],
               ks: Sequence[int]) -> SetFactors:
    """The edits ``specs[k]`` (``(query, operation, set name, neurons)``, Update writes in ``writes[k]``) for ``k`` in
    ``ks`` as the sets of a :class:`SetFactors`: set 0 the unedited model, set ``j + 1`` edit ``ks[j]``."""
    return SetFactors.of(model, [NeuronSet((), (model.n_layers, model.d_mlp)), *(specs[k][3] for k in ks)],
                         [1.0, *(0.0 if specs[k][1] == "erasure" else 1.0 for k in ks)], [None, *(writes[k] for k in ks)])


def _edit_ppl_rows(model: Model, plan: SetFactors, texts: Sequence[str], max_tokens: int) -> list[float]:
    """The ΔPPL texts' perplexity of the unedited model (set 0) and of every edit of ``plan``, as rows
    (:func:`edited_text_nll`): one call for a query's edits, which share their texts."""
    nll, cnt = edited_text_nll(model, texts, plan, max_tokens)  # perplexity of set k: exp(Σ nll[k] / Σ count)
    return [math.exp(float(nll[k].sum()) / max(float(cnt.sum()), 1.0)) for k in range(len(plan))]


def _pick_new_object(model: Model, fk: FactKNs, candidates: Sequence[str], rng: random.Random) -> str | None:
    """o' for Update: a random (seeded) other object of the same relation, one token after every query."""
    cands = [o for o in dict.fromkeys(candidates) if o != fk.fact.object]
    rng.shuffle(cands)
    for o in cands:
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
    new_objects: Mapping[str, Sequence[str]] | None = None,
    title: str = "Knowledge modification (QL Table 2)",
    progress: bool = True,
    **overrides: Any,
) -> ModificationResult:
    """Erase / update the KNs' MLP weights and measure Rel, Gen, Loc and ΔPPL (QL §2.2, §3.3).

    Args:
        model: The model (edited in place, always restored).
        locs: Per-fact localizations.
        groups: ``"K_I"``/``"K_II"`` per fact; facts labelled ``"excluded"`` (fewer than 3 queries,
            :func:`groups_for`) are not edited (listed in ``skipped``).
        config: A :class:`ModificationConfig`.
        ppl_texts: Pool of texts for ΔPPL (default all WikiText-2 paragraphs); ``n_ppl_texts``
            of them are drawn per edited query (seeded by seed, fact and query) and shared by
            that query's edits (erasure / update × each KN set), so their ΔPPL are paired and
            the unedited perplexity is computed once per query.
        new_objects: Extra candidates for o' per relation (e.g. every object of the relation in
            ParaRel, :func:`tlcap.data.pararel.relation_objects`); the objects of ``locs`` of the
            same relation are always candidates.
        title: What the table reproduces (kept in the result).
        progress: Show a progress bar.
        **overrides: :class:`ModificationConfig` fields (``operations=("erasure",)``, ``lambda1=1``).

    Returns:
        A :class:`ModificationResult` with provenance; ``p_before``/``p_after`` give the edited
        query's probability of the original object, ``p_new_*`` of o'; ``skipped`` lists the
        edits left out and why.

    Example:
        >>> from tlcap.data import load_pararel
        >>> from tlcap.experiments.ql import localize_facts
        >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
        >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
        >>> from tlcap.experiments.ql import groups_for
        >>> groups, _ = groups_for(locs, split="otsu")
        >>> mod = modification_experiment(model, locs, groups, sets=("local",), edit_queries=1,
        ...                               ppl_texts=wikitext_sample(2), only_known=False, progress=False)
        >>> mod.table()[["operation", "rule", "set", "group", "Avg", "mean |KN|"]]
          operation        rule    set group  Avg  mean |KN|
        0   erasure     erasure  local  K_II  1.0       51.0
        1    update  activation  local  K_II  0.0       51.0
        2   erasure     erasure  local   K_I  1.0       52.0
        3    update  activation  local   K_I  0.0       52.0
    """
    cfg = ModificationConfig.resolve(config, **overrides)
    pool = list(ppl_texts) if ppl_texts is not None else load_wikitext()
    ppl_cache: dict[tuple[int, ...], float] = {}

    def texts_for_query(fi: int, qi: int) -> tuple[list[str], tuple[int, ...]]:
        """The query's ΔPPL texts (a seeded draw per fact and query) and their indices in the pool."""
        rng = random.Random(f"{cfg.seed}:ppl:{fi}:{qi}")
        idx = tuple(sorted(rng.sample(range(len(pool)), min(cfg.n_ppl_texts, len(pool)))))
        return [pool[j] for j in idx], idx

    def unedited_ppl(texts: list[str], idx: tuple[int, ...]) -> float:
        """The unedited perplexity on the texts (once per draw)."""
        if idx not in ppl_cache:
            ppl_cache[idx] = perplexity(model, texts, cfg.ppl_max_tokens)
        return ppl_cache[idx]

    by_rel: dict[str, list[str]] = {}
    for fk in locs:
        by_rel.setdefault(fk.fact.relation, []).append(fk.fact.object)
    if new_objects is not None:
        for rel, objs in new_objects.items():
            by_rel[rel] = list(by_rel.get(rel, [])) + list(objs)
    site = get_site("mlp_post")
    post_names = [site.hook_name(l) for l in range(model.n_layers)]
    rows: list[EditRow] = []
    skipped: list[SkipRow] = []
    n_edits = sum(min(fk.k, cfg.edit_queries or fk.k) for fk in locs) * len(cfg.operations) * len(cfg.sets)
    bar = tqdm(total=n_edits, desc="modification", disable=not progress)

    def skip(fi: int, fk: FactKNs, i: int, op: str, reason: str) -> None:
        skipped.append(SkipRow(fi, fk.fact.relation, fk.fact.subject, i, op, reason))

    for fi, (fk, grp) in enumerate(zip(locs, groups)):
        qs = fk.queries
        n_edit = min(fk.k, cfg.edit_queries or fk.k)
        if grp == EXCLUDED:  # fewer than 3 queries (CS1 ≡ CS2): neither K_I nor K_II
            for i, op in itertools.product(range(n_edit), cfg.operations):
                skip(fi, fk, i, op, EXCLUDED_REASON)
            bar.update(n_edit * len(cfg.operations) * len(cfg.sets))
            continue
        obj_id = _first_id(model, qs[0], fk.target)
        new_obj = _pick_new_object(model, fk, by_rel.get(fk.fact.relation, []), random.Random(f"{cfg.seed}:{fi}")) \
            if "update" in cfg.operations else None
        new_id = _first_id(model, qs[0], " " + new_obj) if new_obj else None
        others = [j for j, o in enumerate(locs) if o.fact.relation != fk.fact.relation
                  and o.fact.object != fk.fact.object]
        others = random.Random(f"{cfg.seed}:loc:{fi}").sample(others, min(cfg.n_locality, len(others)))
        loc_prompts = [locs[j].queries[0] for j in others]
        clean_q, clean_loc, acts_q = _query_and_locality_logits(model, qs, loc_prompts, names=post_names)
        known = (clean_q.argmax(-1) == obj_id).tolist()
        sets_i = fk.sets()
        edited = [i for i, k in enumerate(known) if k or not cfg.only_known][:n_edit]  # the first n_edit known
        for i in range(fk.k):
            if i in edited or (i > max(edited, default=-1) and len(edited) == n_edit):
                continue
            for op in cfg.operations:  # passed over on the way to the first n_edit known queries
                skip(fi, fk, i, op, "not answered top-1 before the edit")
        bar.update((n_edit - len(edited)) * len(cfg.operations) * len(cfg.sets))
        ops = [op for op in cfg.operations if op != "update" or new_id is not None]
        chosen_of = {i: _chosen_sets(fk, i, sets_i, cfg) for i in edited}
        acts_of = {i: acts_q[i].cpu() if acts_q is not None and "update" in ops and cfg.update_rule == "activation"
                   else None for i in edited}
        texts_of = {i: texts_for_query(fi, i) for i in edited}  # shared by a query's edits: paired ΔPPL
        rowed: dict[tuple[int, str, str], tuple[Any, Any, float]] = {}
        if runtime_device.one_pass_default(model):  # on an accelerator: the fact's edits as rows (module docstring)
            specs = [(i, op, name, ns) for i in edited for op in ops if op == "erasure" or not model.post_norm_blocks
                     for name, ns in chosen_of[i].items()]
            writes = [None if op == "erasure" else update_write(
                model, ns, obj_id, int(new_id), cfg.lambda1, cfg.lambda2,  # type: ignore[arg-type]
                rule=cfg.update_rule, activations=acts_of[i], size=cfg.update_size) for i, op, _, ns in specs]
            if specs:  # every edited query's edits share the query passes
                q_rows = _edit_query_rows(model, _rows_plan(model, specs, writes, range(len(specs))), qs, loc_prompts)
            for i in edited:  # the ΔPPL texts are the query's own: one call per edited query, its edits as rows
                mine = [k for k, spec in enumerate(specs) if spec[0] == i]
                if not mine:
                    continue
                texts, idx = texts_of[i]
                ppl = _edit_ppl_rows(model, _rows_plan(model, specs, writes, mine), texts, cfg.ppl_max_tokens)
                ppl_cache.setdefault(idx, ppl[0])
                for j, k in enumerate(mine):
                    rowed[(i, specs[k][1], specs[k][2])] = (*q_rows[k], ppl[j + 1])
        for i in edited:
            chosen = chosen_of[i]
            texts, idx = texts_of[i]
            acts = acts_of[i]
            for op in cfg.operations:
                if op not in ops:
                    skip(fi, fk, i, op, "no other single-token object of the same relation")
                    bar.update(len(chosen))
                    continue
                for sname, ns in chosen.items():
                    ppl_b = unedited_ppl(texts, idx)
                    if (i, op, sname) in rowed:
                        lg, loc_pred, ppl_a = rowed[(i, op, sname)]
                    else:
                        edit = erase_neurons(model, ns) if op == "erasure" else update_neurons(
                            model, ns, obj_id, int(new_id), cfg.lambda1, cfg.lambda2,  # type: ignore[arg-type]
                            rule=cfg.update_rule, activations=acts, size=cfg.update_size)
                        with edit:
                            lg, loc_pred, _ = _query_and_locality_logits(model, qs, loc_prompts)
                            ppl_a = perplexity(model, texts, cfg.ppl_max_tokens)
                    pred = lg.argmax(-1)
                    nb = [j for j in range(fk.k) if j != i and (known[j] or not cfg.only_known)]
                    target = obj_id if op == "erasure" else int(new_id)  # type: ignore[arg-type]
                    rel = float(pred[i] == target)
                    gen = float(np.mean([float(pred[j] == target) for j in nb])) if nb else math.nan
                    if op == "erasure":
                        rel, gen = 1.0 - rel, (1.0 - gen if nb else math.nan)
                    loc = float((loc_pred == clean_loc).float().mean()) if loc_pred is not None else math.nan
                    vals = [v for v in (rel, gen, loc) if not math.isnan(v)]
                    p_new_b = float(clean_q[i].softmax(-1)[new_id]) if new_id is not None else math.nan
                    p_new_a = float(lg[i].softmax(-1)[new_id]) if new_id is not None else math.nan
                    gap_b = float(clean_q[i].max() - clean_q[i, new_id]) if new_id is not None else math.nan
                    gap_a = float(lg[i].max() - lg[i, new_id]) if new_id is not None else math.nan
                    rows.append(EditRow(
                        fact=fi, relation=fk.fact.relation, subject=fk.fact.subject, object=fk.fact.object,
                        new_object=new_obj if op == "update" else None, group=grp, query=i, operation=op, set=sname,
                        n_neurons=len(ns), rel=rel, gen=gen, loc=loc, avg=float(np.mean(vals)) if vals else math.nan,
                        ppl_before=ppl_b, ppl_after=ppl_a, dppl=(ppl_a - ppl_b) / ppl_b,
                        p_before=float(clean_q[i].softmax(-1)[obj_id]), p_after=float(lg[i].softmax(-1)[obj_id]),
                        p_new_before=p_new_b, p_new_after=p_new_a,
                        rule=cfg.update_rule if op == "update" else "erasure", gap_new_before=gap_b, gap_new_after=gap_a,
                    ))
                    bar.update(1)
    bar.close()
    method = locs[0].method if locs else "ig"
    prov = Provenance.collect(model, config={**cfg.to_dict(), "method": method})
    ppl_b = float(np.mean(list(ppl_cache.values()))) if ppl_cache else math.nan
    return ModificationResult(tuple(rows), cfg.lambda1, cfg.lambda2, ppl_b, tuple(groups), method, title,
                              cfg.update_rule, tuple(skipped), cfg.update_size, provenance=prov)


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
        >>> from tlcap.data import load_pararel
        >>> from tlcap.experiments.ql import localize_facts
        >>> facts = load_pararel(None, ["P17"], n_facts=2, model=model, known_top_k=5000, max_queries=3, progress=False)
        >>> locs = localize_facts(model, facts, "ig", steps=2, progress=False)
        >>> from tlcap.experiments.ql import groups_for
        >>> groups, _ = groups_for(locs, split="otsu")
        >>> cas = cas_experiment(model, locs, groups, edit_queries=1, ppl_texts=wikitext_sample(2), only_known=False,
        ...                      progress=False)
        >>> cas.table()[["operation", "set", "group", "Avg", "mean |KN|"]]
           operation     set group  Avg  mean |KN|
        0    erasure   local  K_II  1.0       51.0
        1    erasure  global  K_II  1.0      103.0
        2    erasure     cas  K_II  1.0       16.0
        3     update   local  K_II  0.0       51.0
        4     update  global  K_II  0.0      103.0
        5     update     cas  K_II  0.0       16.0
        6    erasure   local   K_I  1.0       52.0
        7    erasure  global   K_I  1.0       71.0
        8    erasure     cas   K_I  1.0       21.0
        9     update   local   K_I  0.0       52.0
        10    update  global   K_I  0.0       71.0
        11    update     cas   K_I  0.0       21.0
    """
    if config is None and "sets" not in kwargs:
        kwargs["sets"] = ("local", "global", "cas")
    kwargs.setdefault("title", "Consistency-Aware KN modification (QL Table 3)")
    return modification_experiment(model, locs, groups, config=config, **kwargs)


__all__ = ["EditRow", "ModificationResult", "SkipRow", "cas_experiment", "modification_experiment", "wikitext_sample"]
