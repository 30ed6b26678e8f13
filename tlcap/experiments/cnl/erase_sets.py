"""The per-item scores behind CNL erase: the unedited model, the located set and every random set.

:func:`erase_sets` scores ``[base,] located, random_0 .. random_{R-1}`` (random set ``k`` is
``neurons.random_like(seed=seed + k)``: same count per layer, never a located neuron) on every
evaluation item, and — with ``ppl_texts > 0`` — the WikiText-2 perplexity control: the summed NLL
of each text for the unedited model, the located set and the first ``ppl_n_random`` random sets
(the same sets as the accuracy's, so the two pair per set).

Two engines give the same numbers (tested): ``batched=True`` (default) scores many sets per
forward pass (:func:`tlcap.metrics.set_scores.erased_scores`,
:func:`tlcap.metrics.set_probs.erased_text_nll`); ``batched=False`` erases one set at a time with
:func:`~tlcap.intervene.weights.erase_neurons` (the reference). The sets run in chunks of
``checkpoint_every``; with a ``checkpoint_dir`` each finished chunk is saved, and a rerun resumes
after the last one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.data.tasks import Sample, get_task
from tlcap.data.wikitext import load_wikitext
from tlcap.experiments.cnl.config import EraseConfig
from tlcap.experiments.cnl_eval.common import ItemCheckpoint, fingerprint, neuron_ids
from tlcap.intervene.weights import erase_neurons
from tlcap.metrics.accuracy import task_accuracy
from tlcap.metrics.perplexity import text_nll
from tlcap.metrics.set_probs import erased_text_nll
from tlcap.metrics.set_scores import METRICS, erased_scores, scored_items
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.runtime.run_control import RunControl

CHUNK_SETS = 25
"""Sets per chunk (a checkpoint) when the run control names no ``checkpoint_every``."""
WIKITEXT = "WikiText-2 raw test split (tlcap/data/bundled/wikitext2), paragraphs of >= 100 characters, in file order"


@dataclass(frozen=True)
class ErasedSets:
    """Per-item scores of every erased set and the perplexity control (module docstring).

    Attributes:
        base: ``[item]`` scores of the unedited model (``None`` when not computed).
        located: ``[item]`` scores with the located set erased.
        random: ``[random, item]`` scores with each random set erased.
        seeds: Seed of each random set.
        located_predictions: What the located-erased model answered per item.
        golds: Gold answers of the scored items.
        items: Positions of the scored items in the samples.
        n_skipped: Samples not scored (context window).
        metric: How an item is scored.
        ppl_nll: ``[2 + ppl_random, text]`` summed NLL per text: unedited, located, random sets
            (``None`` without the control).
        ppl_count: ``[text]`` predicted tokens per text.
        ppl_texts: The texts' source and sizes.
        tokens: Tokens run (batched engine).
        seconds: Wall time of this run (resumed chunks not included).
    """

    base: Tensor | None
    located: Tensor
    random: Tensor
    seeds: tuple[int, ...]
    located_predictions: tuple[str, ...]
    golds: tuple[str, ...]
    items: tuple[int, ...]
    n_skipped: int
    metric: str
    ppl_nll: Tensor | None = None
    ppl_count: Tensor | None = None
    ppl_texts: dict | None = None
    tokens: int = 0
    seconds: float = 0.0


def _slow_scores(model: Model, task: str, samples: Sequence[Sample], sets: Sequence[NeuronSet],
                 include_input: bool) -> tuple[list[list[float]], list[tuple[str, ...]]]:
    scores, preds = [], []
    for s in sets:
        with erase_neurons(model, s, include_input=include_input):
            acc = task_accuracy(model, task, samples)
        scores.append(list(acc.scores))
        preds.append(acc.predictions)
    return scores, preds


def _slow_nll(model: Model, texts: Sequence[str], sets: Sequence[NeuronSet], max_tokens: int,
              include_input: bool) -> tuple[Float[Tensor, "set text"], Float[Tensor, " text"]]:
    rows, cnt = [], torch.zeros(len(texts), dtype=torch.float64)
    for s in sets:
        with erase_neurons(model, s, include_input=include_input):
            nll, cnt = text_nll(model, texts, max_tokens)
        rows.append(nll)
    return torch.stack(rows), cnt


def erase_sets(
    model: Model,
    task: str,
    samples: Sequence[Sample],
    neurons: NeuronSet,
    cfg: EraseConfig,
    *,
    base: bool = True,
    run: RunControl | None = None,
) -> ErasedSets:
    """Score the base model, the located set and ``cfg.n_random`` random sets erased (module docstring).

    Args:
        model: The model (weights restored exactly on every exit with ``batched=False``; never
            edited otherwise).
        task: The evaluated task.
        samples: Evaluation samples.
        neurons: The located set (non-empty).
        cfg: The :class:`EraseConfig` (``n_random``, ``seed``, ``include_input``, ``batched``, ``ppl_*``).
        base: Also score the unedited model (as set 0 of the batch).
        run: ``checkpoint_dir`` (where finished chunks of sets are saved), ``checkpoint_every`` (sets
            per chunk, default 25), ``resume`` and ``progress``
            (:class:`~tlcap.runtime.run_control.RunControl`; default: no checkpoints, no bars).

    Returns:
        An :class:`ErasedSets`.

    Raises:
        CheckpointMismatchError: ``checkpoint_dir`` holds a run of other inputs or settings.
    """
    rc = RunControl.resolve(run) if run is not None else RunControl(progress=False)
    every, progress = rc.every(CHUNK_SETS), rc.progress
    t = get_task(task)
    items = scored_items(model, t, samples)
    seeds = tuple(cfg.seed + k for k in range(cfg.n_random))
    shape = (model.n_layers, model.d_mlp)
    sets = ([NeuronSet((), shape)] if base else []) + [neurons] + [neurons.random_like(seed=s) for s in seeds]
    ck = ItemCheckpoint(rc.checkpoint_dir, fingerprint("erase_sets", cfg.to_dict(), model.name, base, task,
                                                    [[s.prompt, s.answer, s.gold] for s in samples], neuron_ids(neurons)),
                        every=1, resume=rc.resume)
    chunks = [list(range(k, min(len(sets), k + every))) for k in range(0, len(sets), every)]
    texts = load_wikitext(n_texts=cfg.ppl_texts) if cfg.ppl_texts else []
    ppl_sets = sets[: (1 if base else 0) + 1 + min(cfg.ppl_n_random, cfg.n_random)]
    tokens, seconds = 0, 0.0
    with ck.saving():
        for c in range(ck.done, len(chunks) + (1 if texts else 0)):
            if c < len(chunks):
                part = [sets[k] for k in chunks[c]]
                if cfg.batched:
                    sc = erased_scores(model, t, samples, part, progress=progress)
                    tokens, seconds = tokens + sc.tokens, seconds + sc.seconds
                    rows, preds = sc.scores.tolist(), [list(p) for p in sc.predictions]
                else:
                    rows, preds = _slow_scores(model, task, samples, part, cfg.include_input)
                loc = chunks[c].index(1 if base else 0) if (1 if base else 0) in chunks[c] else None
                ck.add({"scores": rows, "located_predictions": None if loc is None else list(preds[loc])})
            else:
                if cfg.batched:
                    nll, cnt = erased_text_nll(model, texts, ppl_sets, cfg.ppl_max_tokens)
                else:
                    nll, cnt = _slow_nll(model, texts, ppl_sets, cfg.ppl_max_tokens, cfg.include_input)
                if not base:  # the control always carries the unedited model's perplexity
                    b, _ = erased_text_nll(model, texts, [NeuronSet((), shape)], cfg.ppl_max_tokens) if cfg.batched \
                        else _slow_nll(model, texts, [NeuronSet((), shape)], cfg.ppl_max_tokens, False)
                    nll = torch.cat([b, nll])
                ck.add({"ppl_nll": nll.tolist(), "ppl_count": cnt.tolist()})
    done = ck.items
    all_rows = torch.tensor([r for it in done[: len(chunks)] for r in it["scores"]], dtype=torch.float64)
    located_predictions = next(it["located_predictions"] for it in done[: len(chunks)] if it["located_predictions"] is not None)
    off = 1 if base else 0
    ppl = done[len(chunks)] if texts else None
    return ErasedSets(
        base=all_rows[0] if base else None, located=all_rows[off], random=all_rows[off + 1:].reshape(cfg.n_random, len(items)),
        seeds=seeds, located_predictions=tuple(located_predictions),
        golds=tuple({"choice": s.gold.strip(), "number": s.gold}.get(t.kind, "") for _, s, _ in items),
        items=tuple(i for i, _, _ in items), n_skipped=len(samples) - len(items), metric=METRICS[t.kind],
        ppl_nll=None if ppl is None else torch.tensor(ppl["ppl_nll"], dtype=torch.float64),
        ppl_count=None if ppl is None else torch.tensor(ppl["ppl_count"], dtype=torch.float64),
        ppl_texts=None if ppl is None else {"source": WIKITEXT, "n_texts": len(texts), "max_tokens": cfg.ppl_max_tokens,
                                            "n_random": len(ppl_sets) - off - 1},
        tokens=tokens, seconds=seconds,
    )


__all__ = ["ErasedSets", "erase_sets", "WIKITEXT", "CHUNK_SETS"]
