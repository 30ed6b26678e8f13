"""``tlcap ql ...``: the Query Localization analyses (consistency, modify, mapping, synapses, cas).

Every command loads ParaRel facts, localizes each neighbor query's knowledge neurons with the
chosen method, splits the facts into K_I / K_II by CS2, runs its analysis and writes
``OUT/summary.json``, HTML + PNG figures, CSV tables and the saved result values.

Example:
    tlcap ql consistency --model smollm2-135m --relations P36,P103 \\
        --n-facts 4 --method ig --out runs/ql
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tlcap.cli import app
from tlcap.cli._common import load, out_dir, seed_everything, write_summary

ql_app = typer.Typer(help="Query Localization (QL paper): consistency, modification, query-KN mapping, synapses, CAS.",
                     no_args_is_help=True)
app.add_typer(ql_app, name="ql")

_MODEL = typer.Option("smollm2-135m", "--model", "-m", help="Model name (tlcap.load_model).")
_DATA = typer.Option(None, "--data-dir", "-d", help="Folder holding pararel/ (default: $TLCAP_DATA, else the ParaRel copy bundled with tlcap).")
_RELS = typer.Option("P36,P103", "--relations", "-r", help="Comma-separated ParaRel relations.")
_NF = typer.Option(4, "--n-facts", "-n", help="Total facts (round-robin over the relations).")
_METHOD = typer.Option("ig", "--method", help="ig | sig | amig (consistency also takes a comma list or 'all').")
_STEPS = typer.Option(20, "--steps", help="Riemann steps per layer (per word for SIG).")
_KN_T = typer.Option(0.2, "--kn-threshold", help="KNs of a query: score > t · max.")
_STATIC = typer.Option(0.1, "--static-threshold", help="CS2 threshold of the static K_I/K_II split (QL Table 4).")
_SPLIT = typer.Option("static", "--split", help="static | otsu: the split the headline numbers use.")
_KNOWN = typer.Option(10, "--known-top-k", help="Keep facts whose answer is in the model's top-k for every query (0: keep all).")
_MAXQ = typer.Option(4, "--max-queries", help="At most this many neighbor queries per fact.")
_OUT = typer.Option(Path("runs/ql"), "--out", "-o", help="Output folder.")
_SEED = typer.Option(0, "--seed")


def _prepare(model: str, data_dir: Path | None, relations: str, n_facts: int, known_top_k: int, max_queries: int, seed: int):
    from tlcap.data.pararel import load_pararel
    from tlcap.errors import EmptyDatasetError

    seed_everything(seed)
    m = load(model)
    rels = [r.strip() for r in relations.split(",") if r.strip()]
    if not rels:
        raise EmptyDatasetError("--relations is empty; give e.g. P36,P103")
    typer.echo(f"loading ParaRel facts {rels} ...", err=True)
    facts = load_pararel(data_dir, rels, n_facts, m, known_top_k=known_top_k or None, max_queries=max_queries or None)
    typer.echo(f"{len(facts)} facts, {sum(len(f.queries) for f in facts)} queries", err=True)
    return m, facts


def _methods(method: str) -> list[str]:
    from tlcap.attribution.methods import METHODS

    ms = list(METHODS) if method.strip() == "all" else [x.strip() for x in method.split(",") if x.strip()]
    bad = [x for x in ms if x not in METHODS]
    if bad or not ms:
        from tlcap.errors import TlcapError

        raise TlcapError(f"unknown method(s) {bad or method!r}; use ig, sig, amig, a comma list of them, or all")
    return ms


def _figs(out: Path, figs: dict[str, Any]) -> list[str]:
    from tlcap.viz import save_figure

    written = []
    for stem, fig in figs.items():
        written += [str(p.name) for p in save_figure(fig, out, stem)]
    return written


def _locs_and_groups(m, facts, method: str, steps: int, kn_threshold: float, static_threshold: float, split: str):
    from tlcap.experiments import ql

    locs = ql.localize_facts(m, facts, method, steps=steps, threshold=kn_threshold)
    groups, cons = ql.groups_for(locs, static_threshold, split)
    return locs, groups, cons


@ql_app.command("consistency")
def consistency(model: str = _MODEL, data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
                method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
                split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ, out: Path = _OUT, seed: int = _SEED) -> None:
    """KN-consistency CS1/CS2 per fact, K_I/K_II split, Welch's t-test (QL Table 1, Fig. 3)."""
    from tlcap.experiments import ql

    methods = _methods(method)
    o = out_dir(out)
    m, facts = _prepare(model, data_dir, relations, n_facts, known_top_k, max_queries, seed)
    locs = {me: ql.localize_facts(m, facts, me, steps=steps, threshold=kn_threshold) for me in methods}
    res = ql.consistency_analysis(locs, static_threshold, split)  # type: ignore[arg-type]
    res.save(o / "result")
    res.to_frame().to_csv(o / "facts.csv", index=False)
    res.table1().to_csv(o / "table1.csv")
    figs = {f"cs2_violin_{me}": res.violin(me) for me in methods}
    written = _figs(o, figs)
    summary = res.summary() | {"model": model, "relations": relations.split(","), "steps": steps, "kn_threshold": kn_threshold,
                               "seconds_per_fact": {me: sum(l.seconds for l in ls) / max(len(ls), 1) for me, ls in locs.items()},
                               "figures": written}
    write_summary(o, summary)


@ql_app.command("modify")
def modify(model: str = _MODEL, data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
           method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
           split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ,
           operations: str = typer.Option("erasure,update", help="erasure, update or both"),
           sets: str = typer.Option("local,global", help="local (N_i), global (∪N_j), cas"),
           edit_queries: int = typer.Option(0, help="Edit only the first n queries of each fact (0: all)."),
           lambda1: float = 2.0, lambda2: float = 2.0, out: Path = _OUT, seed: int = _SEED) -> None:
    """Erasure / update of N_i vs N_g: Rel, Gen, Loc, ΔPPL per K_I / K_II (QL Table 2)."""
    from tlcap.experiments import ql

    o = out_dir(out)
    m, facts = _prepare(model, data_dir, relations, n_facts, known_top_k, max_queries, seed)
    locs, groups, cons = _locs_and_groups(m, facts, _methods(method)[0], steps, kn_threshold, static_threshold, split)
    res = ql.modification_experiment(m, locs, groups, operations=operations.split(","), sets=sets.split(","),
                                     lambda1=lambda1, lambda2=lambda2, edit_queries=edit_queries or None)
    _write_modification(o, res, cons, "table2", model, method, "Knowledge modification (QL Table 2)")


def _write_modification(o: Path, res, cons, stem: str, model: str, method: str, title: str) -> None:
    res.save(o / "result")
    df = res.to_frame()
    df.to_csv(o / "edits.csv", index=False)
    table = res.table()
    table.to_csv(o / f"{stem}.csv", index=False)
    written = _figs(o, {stem: res.figure(title)})
    write_summary(o, {"model": model, "method": method, "n_facts": len(cons.groups()), "groups": cons.groups(),
                      "ppl_before": res.ppl_before, "lambda1": res.lambda1, "lambda2": res.lambda2,
                      "table": table.to_dict("records"), "edits": df.to_dict("records"), "figures": written,
                      "own_prob_drop_local_erasure": _own_drop(df)})


def _own_drop(df) -> float | None:  # noqa: ANN001
    sub = df[(df.operation == "erasure") & (df.set == "local")] if len(df) else df
    if not len(sub):
        return None
    return float((sub.p_before - sub.p_after).mean())


@ql_app.command("cas")
def cas(model: str = _MODEL, data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
        method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
        split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ,
        operations: str = typer.Option("erasure,update"), edit_queries: int = typer.Option(0),
        beta1: float = 0.7, beta2: float = 0.3, cas_threshold: float = 0.3, out: Path = _OUT, seed: int = _SEED) -> None:
    """Consistency-Aware KN modification vs N_i and N_g (QL Table 3)."""
    from tlcap.experiments import ql

    o = out_dir(out)
    m, facts = _prepare(model, data_dir, relations, n_facts, known_top_k, max_queries, seed)
    locs, groups, cons = _locs_and_groups(m, facts, _methods(method)[0], steps, kn_threshold, static_threshold, split)
    res = ql.cas_experiment(m, locs, groups, beta1=beta1, beta2=beta2, t=cas_threshold, operations=operations.split(","),
                            edit_queries=edit_queries or None)
    _write_modification(o, res, cons, "table3", model, method, "Consistency-Aware KN modification (QL Table 3)")


@ql_app.command("mapping")
def mapping(model: str = _MODEL, data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
            method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
            split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ,
            factor: float = typer.Option(2.0, help="Enhancement factor."), out: Path = _OUT, seed: int = _SEED) -> None:
    """Query-KN mapping: enhance / suppress N_i vs union / intersection / refine of neighbors (QL Fig. 4)."""
    from tlcap.experiments import ql

    o = out_dir(out)
    m, facts = _prepare(model, data_dir, relations, n_facts, known_top_k, max_queries, seed)
    locs, groups, cons = _locs_and_groups(m, facts, _methods(method)[0], steps, kn_threshold, static_threshold, split)
    res = ql.query_kn_mapping(m, locs, groups, factor=factor)
    res.save(o / "result")
    res.to_frame().to_csv(o / "mapping.csv", index=False)
    table = res.table()
    table.to_csv(o / "fig4.csv", index=False)
    written = _figs(o, {"fig4_query_kn_mapping": res.figure()})
    write_summary(o, {"model": model, "method": method, "n_facts": len(facts), "groups": groups,
                      "table": table.to_dict("records"), "rows": res.to_frame().to_dict("records"), "figures": written})


@ql_app.command("synapses")
def synapses(model: str = _MODEL, data_dir: Path | None = _DATA, relations: str = _RELS, n_facts: int = _NF,
             method: str = _METHOD, steps: int = _STEPS, kn_threshold: float = _KN_T, static_threshold: float = _STATIC,
             split: str = _SPLIT, known_top_k: int = _KNOWN, max_queries: int = _MAXQ,
             alpha: float = typer.Option(0.3, help="Synapse scaling factor α (τ = α · mean attention mass)."),
             factor: float = typer.Option(2.0, help="Enhancement factor of synapse attention."),
             keep_first: bool = typer.Option(False, help="Keep position 0 (the attention sink) as a synapse candidate."),
             out: Path = _OUT, seed: int = _SEED) -> None:
    """Dynamic KN selection: predominance (Fig. 5), knowledge synapses (Fig. 6), KN heatmaps (Figs. 1/7/10)."""
    from tlcap.experiments import ql

    o = out_dir(out)
    m, facts = _prepare(model, data_dir, relations, n_facts, known_top_k, max_queries, seed)
    locs, groups, cons = _locs_and_groups(m, facts, _methods(method)[0], steps, kn_threshold, static_threshold, split)
    res = ql.synapse_experiment(m, locs, groups, alpha=alpha, factor=factor, skip_first=not keep_first)
    res.save(o / "result")
    res.to_frame().to_csv(o / "synapses.csv", index=False)
    table = res.table()
    table.to_csv(o / "fig6.csv", index=False)
    figs = {"fig6_synapses": res.figure(), "fig5_predominance": res.predominance_figure()}
    if res.heatmap_values is not None:
        figs["fig7_kn_activations"] = res.heatmap()
    written = _figs(o, figs)
    pdf = res.predominance_frame()
    write_summary(o, {"model": model, "method": method, "n_facts": len(facts), "groups": groups, "alpha": alpha,
                      "mean_predominance": float(pdf.predominance.mean()) if len(pdf) else None,
                      "predominance": pdf.to_dict("records"), "table": table.to_dict("records"),
                      "rows": res.to_frame().to_dict("records"), "figures": written})
