"""Edge scores of many prompts, each its own: the prompts share the scoring passes.

:func:`~tlcap.locate.circuits.edge_attribution` on a :class:`~tlcap.locate.circuits.CircuitDataset`
returns the *mean* of the per-item scores; the CNL evaluation (a circuit per rewrite of a fact)
needs each item's own matrix. :func:`edge_attribution_items` runs the same batched passes
(right-padded items, :func:`~tlcap.locate.circuits.task.make_items_task`) and keeps every item's
scores (:func:`~tlcap.locate.circuits.scoring.batch_scores` with ``per_item``). Rows are independent
and padding adds nothing, so each item's scores equal :func:`edge_attribution` of that prompt alone
up to float rounding (tested). Zero and corrupted-prompt ablations only: a mean ablation is fitted
on the data it sees, so a batch's mean is not one item's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tlcap.config import check_int
from tlcap.errors import InvalidConfigError
from tlcap.locate.circuits.ablation import ablation_source
from tlcap.locate.circuits.config import EAPConfig, check_circuit_inputs
from tlcap.locate.circuits.eap import EdgeScores
from tlcap.locate.circuits.graph import EdgeGraph
from tlcap.locate.circuits.run import CircuitRun
from tlcap.locate.circuits.scoring import batch_scores
from tlcap.locate.circuits.task import CircuitItem, make_items_task
from tlcap.models import Model
from tlcap.provenance import Provenance


def edge_attribution_items(
    model: Model,
    items: Sequence[tuple[str, str] | tuple[str, str, str | None]],
    *,
    config: EAPConfig | None = None,
    items_per_pass: int = 8,
    **overrides: Any,
) -> list[EdgeScores]:
    """:func:`~tlcap.locate.circuits.edge_attribution` of every ``(prompt, target[, corrupt_prompt])`` item.

    Args:
        model: The model.
        items: ``(prompt, target)`` (zero ablation) or ``(prompt, target, corrupt_prompt)`` per item; all
            items with a corrupted prompt or none.
        config: An :class:`EAPConfig` (``steps``, ``metric``, ``direction``; ``ablation`` ``zero`` or
            ``corrupt``, resolved as for one prompt).
        items_per_pass: Items whose rows share a pass, ``>= 1`` (exact: results do not depend on it).
        **overrides: :class:`EAPConfig` fields overriding ``config``.

    Returns:
        One :class:`EdgeScores` per item, in order.

    Raises:
        InvalidConfigError: an invalid option or item, a mean ablation, or items mixing zero and
            corrupted-prompt ablation.

    Example:
        >>> per = edge_attribution_items(model, [("The capital of France is", " Paris"),
        ...                                      ("France's capital city is", " Paris")], steps=5)
        >>> [s.prompt for s in per]
        ['The capital of France is', "France's capital city is"]
        >>> [s.select(top_n=20).summary()["n_edges"] for s in per]     # 20 selected, dead ends pruned
        [13, 18]
    """
    check_int("items_per_pass", items_per_pass, min=1, cli=None)
    base = EAPConfig.resolve(config, **overrides)
    cfgs = [check_circuit_inputs(it[0], it[1], it[2] if len(it) > 2 else None, None, base) for it in items]  # type: ignore[misc]
    ablations = {c.ablation for c in cfgs}
    if len(ablations) > 1 or not ablations <= {"zero", "corrupt"}:
        raise InvalidConfigError(f"edge_attribution_items takes zero or corrupted-prompt ablation, one for every item; "
                                 f"got {sorted(str(a) for a in ablations)}")
    cfg = cfgs[0] if cfgs else base
    graph = EdgeGraph.from_model(model)
    source = ablation_source(str(cfg.ablation))
    prov = Provenance.collect(model, config=cfg, seed=cfg.seed)
    out: list[EdgeScores] = []
    for s in range(0, len(items), items_per_pass):
        chunk = items[s:s + items_per_pass]
        task = make_items_task(model, [CircuitItem(it[0], it[1], it[2] if len(it) > 2 else None) for it in chunk],  # type: ignore[misc]
                               cfg.metric)
        b = batch_scores(model, graph, task, cfg, source, per_item=True)
        for i, it in enumerate(chunk):
            run = CircuitRun(
                model_name=model.name, prompt=it[0], target=it[1], corrupt_prompt=it[2] if len(it) > 2 else None,  # type: ignore[misc]
                metric=cfg.metric, method="eap" if cfg.steps == 1 else "eap-ig", steps=cfg.steps, direction=cfg.direction,
                clean_metric=float(b.clean_metric[i]), corrupt_metric=float(b.ablated_metric[i]),
                ablation=str(cfg.ablation), config=cfg.to_dict())
            out.append(EdgeScores(scores=b.scores[i].float(), valid=graph.valid_mask(), graph=graph, run=run,
                                  provenance=prov))
    return out


__all__ = ["edge_attribution_items"]
