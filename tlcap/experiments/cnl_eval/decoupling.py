"""Decoupling (CNL paper §4.1): KN on comparative pairs — one main part, two framings.

For every :class:`~tlcap.data.comparative.ComparativePair` KN locates a neuron set on framing 1
("give the correct answer for 17+25=?", target ``" 42"``) and on framing 2 ("write Python code
for 17+25=?", target ``" print(17+25)"``, teacher-forced over its tokens). The coincidence rates
``C^{1,2}`` (between the framings of a pair) and ``C^{1,1}``, ``C^{2,2}`` (neurons common to all
samples of a framing) come from :func:`tlcap.metrics.coincidence_rates`, literal as the poster
prints them (shares of all ``L·J`` neurons) and overlap-normalised / IoU. Paper: 15.6 / 7.3 /
8.6 %.

Beside ``C^{1,2}``, a **cross-pair reference**: the same overlap between framing 1 of pair ``k``
and framing 2 of pair ``k+1`` (another main part), so "the framings of one problem share x %"
can be read against what two unrelated prompts of the two framings share.

Example:
    >>> import tempfile
    >>> from tlcap.data.comparative import comparative_pairs
    >>> res = decoupling(model, comparative_pairs(2, seed=0), steps=2, 
    ...                  run=RunControl(checkpoint_dir=tempfile.mkdtemp(), progress=False))
    >>> res.summary()["c12"]["overlap"]["text"]
    '0.164 [0.15, 0.17] (n=2)'
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from tlcap.config import Config, check_int, check_nested
from tlcap.data.comparative import ComparativePair
from tlcap.errors import EmptyDatasetError
from tlcap.experiments.cnl_eval.common import ItemCheckpoint, OnItem, Stopwatch, fingerprint, kn_neurons_facts, neuron_ids
from tlcap.experiments.cnl_eval.decoupling_result import DecouplingResult
from tlcap.experiments.knowledge_neurons import KNConfig
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.runtime.run_control import RunControl


@dataclass(frozen=True)
class DecouplingConfig(Config):
    """Settings of :func:`decoupling` (the options of ``tlcap cnl decouple``).

    Attributes:
        kn: KN attribution (``kn.ig``) and selection (``Attr > kn.threshold · max``, Dai's 0.2, or
            the ``kn.top_k`` best) (:class:`~tlcap.experiments.knowledge_neurons.KNConfig`; flat
            overrides such as ``steps=5`` or ``top_k=20`` reach it).
    """

    kn: KNConfig = field(default_factory=KNConfig)

    def validate(self) -> None:
        check_nested(self, kn=KNConfig)


PAIR_WINDOW = 8
"""Comparative pairs located at once by default (:func:`decoupling`'s ``fact_batch``)."""


def _pair_items(model: Model, pairs: Sequence[ComparativePair], cfg: DecouplingConfig) -> list[dict[str, Any]]:
    """Each pair's two located sets: the KN rows of every framing of every pair share batches."""
    sw, t0 = Stopwatch(), time.perf_counter()
    with sw("kn"):
        found = kn_neurons_facts(model, [p.framing(t) for p in pairs for t in (1, 2)], cfg.kn)
    seconds = {k: v / len(pairs) for k, v in sw.seconds.items()}
    wall = (time.perf_counter() - t0) / len(pairs)
    return [{"sets": [list(neuron_ids(ns)) for ns, _ in found[2 * j:2 * j + 2]],
             "probs": [float(p) for _, p in found[2 * j:2 * j + 2]], "seconds": seconds, "wall": wall}
            for j in range(len(pairs))]


def decoupling(
    model: Model,
    pairs: Sequence[ComparativePair],
    *,
    config: DecouplingConfig | None = None,
    run: RunControl | None = None,
    on_item: OnItem | None = None,
    fact_batch: int | None = None,
    **overrides: Any,
) -> DecouplingResult:
    """The decoupling experiment over comparative pairs (module docstring).

    Args:
        model: The model.
        pairs: Comparative pairs (:func:`tlcap.data.comparative.comparative_pairs` or
            :func:`~tlcap.data.comparative.load_pairs`).
        config: A :class:`DecouplingConfig`.
        run: The streamed checkpoint (``checkpoint_dir``; a rerun with the same folder, inputs and settings
            resumes after the last saved item; ``checkpoint_every`` default 10), ``resume`` and the progress
            bar (:class:`~tlcap.runtime.run_control.RunControl`).
        on_item: Called with each pair's position before it is added (its window was located together).
        fact_batch: Pairs located at once (the KN rows of their prompts share batches; default
            :data:`PAIR_WINDOW`); exact, results do not depend on it. Seconds are each window's time split
            evenly over its pairs.
        **overrides: :class:`DecouplingConfig` fields.

    Returns:
        A :class:`DecouplingResult` (per-pair located sets, coincidence rates with CIs).

    Raises:
        EmptyDatasetError: no pairs.
        CheckpointMismatchError: ``run.checkpoint_dir`` holds another run's checkpoint.

    Example:
        >>> from tlcap.data.comparative import comparative_pairs
        >>> res = decoupling(model, comparative_pairs(2), top_k=20, steps=2, run=RunControl(progress=False))
        >>> res.rates().c12_overlap
        0.05
    """
    cfg = DecouplingConfig.resolve(config, **overrides)
    rc = RunControl.resolve(run)
    fact_batch = check_int("fact_batch", PAIR_WINDOW if fact_batch is None else fact_batch, min=1, cli=None)
    if not pairs:
        raise EmptyDatasetError("decoupling needs at least one comparative pair")
    ck = ItemCheckpoint(rc.checkpoint_dir, fingerprint("decoupling", cfg.to_dict(), model.name, [p.to_dict() for p in pairs]),
                        rc.every(10), rc.resume)
    bar = tqdm(total=len(pairs), initial=ck.done, desc="decoupling", unit="pair", disable=not rc.progress)
    with ck.saving():  # items done so far are saved on every exit, Ctrl-C included
        for s in range(ck.done, len(pairs), fact_batch):  # a window of pairs located at once, saved pair by pair
            window = list(range(s, min(s + fact_batch, len(pairs))))
            items = _pair_items(model, [pairs[i] for i in window], cfg)
            for i, item in zip(window, items):
                if on_item is not None:
                    on_item(i)
                ck.add(item)
                bar.update(1)
    bar.close()
    sw = Stopwatch()
    for it in ck.items:
        sw.add(it["seconds"])
    return DecouplingResult(
        pairs=tuple((p.uid, p.source, p.main, p.prompts[0], p.targets[0], p.prompts[1], p.targets[1]) for p in pairs),
        sets1=tuple(tuple(it["sets"][0]) for it in ck.items), sets2=tuple(tuple(it["sets"][1]) for it in ck.items),
        probs1=tuple(it["probs"][0] for it in ck.items), probs2=tuple(it["probs"][1] for it in ck.items),
        n_layers=model.n_layers, d_mlp=model.d_mlp, model_name=model.name, config=cfg.to_dict(),
        method_seconds=sw.seconds, wall_seconds=sum(it["wall"] for it in ck.items),
        provenance=Provenance.collect(model, config=cfg),
    )


__all__ = ["DecouplingConfig", "decoupling"]
