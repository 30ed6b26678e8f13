"""Knowledge neurons for one fact (Dai et al. 2022): attribute, select, refine, verify by suppression.

Composed only of runtime pieces: :func:`integrated_gradients`, selection rules, activation
interventions, probability metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from tlcap.attribution.ig import NeuronAttribution, Rule, integrated_gradients
from tlcap.intervene.activations import enhance, suppress
from tlcap.locate.selection import refine, threshold_select, top_k_select
from tlcap.metrics.probs import target_prob
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.results import Result


@dataclass(frozen=True)
class KnowledgeNeurons(Result):
    """Located knowledge neurons of a fact and the effect of intervening on them.

    Attributes:
        scores: ``[n_prompts, n_layers, d_mlp]`` attribution per prompt (main prompt first).
        activations: ``[n_prompts, n_layers, d_mlp]`` clean activations at the last position.
        neurons: The located (refined) set.
        per_prompt: Located set of each prompt before refinement.
        effects: Relative probability changes (see :func:`locate_knowledge_neurons`).
    """

    scores: torch.Tensor
    activations: torch.Tensor
    neurons: NeuronSet
    per_prompt: tuple[NeuronSet, ...]
    prompts: tuple[str, ...]
    target: str
    target_prob: float
    completeness_rel_error: float
    effects: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """One row per located neuron with its score on every prompt."""
        rows = []
        for l, j in self.neurons:
            row = {"layer": l, "neuron": j}
            for i, p in enumerate(self.prompts):
                row[f"score_{i}"] = float(self.scores[i, l, j])
            rows.append(row)
        return pd.DataFrame(rows)

    def heatmap(self, **kwargs):  # noqa: ANN201
        """Mean attribution over prompts, located neurons ringed."""
        from tlcap.viz.heatmaps import neuron_heatmap

        kwargs.setdefault("title", f"Knowledge neurons: {self.prompts[0]!r} → {self.target!r}")
        return neuron_heatmap(self.scores.mean(0), highlight=self.neurons, score_name="IG attribution", **kwargs)

    def activation_heatmap(self, **kwargs):  # noqa: ANN201
        """Prompts × located neurons activation heatmap (QL paper Fig. 1 style)."""
        from tlcap.viz.heatmaps import activation_heatmap, activations_for, neuron_labels

        vals = activations_for(self.activations, self.neurons)
        labels = [p if len(p) < 48 else p[:45] + "..." for p in self.prompts]
        kwargs.setdefault("title", f"Activations of the located neurons ({self.target!r})")
        return activation_heatmap(vals, labels, neuron_labels(self.neurons), **kwargs)


def _rel_change(before: float, after: float) -> float:
    return (after - before) / before if before > 0 else float("nan")


def locate_knowledge_neurons(
    model: Model,
    prompt: str,
    target: str,
    paraphrases: Sequence[str] = (),
    *,
    steps: int = 20,
    rule: Rule = "midpoint",
    method: str = "ig",
    site: str = "mlp_post",
    threshold: float = 0.2,
    top_k: int | None = None,
    refine_p: float = 0.5,
    n_random: int = 10,
    seed: int = 0,
    progress: bool = True,
) -> KnowledgeNeurons:
    """Locate a fact's knowledge neurons and measure suppression/enhancement effects.

    Each prompt (the main one and its paraphrases) is attributed with integrated gradients and
    thresholded at ``threshold · max`` (Dai: 0.2); with paraphrases, neurons found in more than
    ``refine_p`` of the prompts are kept. The located set is then suppressed (0) and enhanced
    (×2) at the last position, and the same is done for ``n_random`` random sets with the same
    number of neurons per layer.

    Returns:
        A :class:`KnowledgeNeurons` whose ``effects`` holds the mean relative change of the
        target probability over the prompts: ``suppress_located``, ``suppress_random`` (mean
        over draws), ``enhance_located``, ``enhance_random`` and per-draw lists.
    """
    prompts = [prompt, *paraphrases]
    attrs: list[NeuronAttribution] = []
    for p in tqdm(prompts, desc="attributing prompts", disable=not progress):
        attrs.append(
            integrated_gradients(model, p, target, steps=steps, rule=rule, method=method, site=site, progress=progress)  # type: ignore[arg-type]
        )
    per_prompt = tuple(
        top_k_select(a.scores, top_k) if top_k is not None else threshold_select(a.scores, threshold) for a in attrs
    )
    located = refine(list(per_prompt), refine_p) if len(prompts) > 1 else per_prompt[0]
    base = [target_prob(model, p, target) for p in prompts]

    def mean_change(hooks_for) -> float:  # noqa: ANN001
        vals = [_rel_change(b, target_prob(model, p, target, hooks=hooks_for)) for p, b in zip(prompts, base)]
        return float(sum(vals) / len(vals))

    effects: dict = {
        "base_prob": base,
        "suppress_located": mean_change(suppress(model, located, site=site)),
        "enhance_located": mean_change(enhance(model, located, site=site)),
    }
    sup_r, enh_r = [], []
    for k in tqdm(range(n_random), desc="random controls", disable=not progress):
        r = located.random_like(seed=seed + k)
        sup_r.append(mean_change(suppress(model, r, site=site)))
        enh_r.append(mean_change(enhance(model, r, site=site)))
    effects.update(
        suppress_random=float(sum(sup_r) / max(len(sup_r), 1)),
        enhance_random=float(sum(enh_r) / max(len(enh_r), 1)),
        suppress_random_draws=sup_r,
        enhance_random_draws=enh_r,
    )
    comp = float(sum(a.completeness_rel_error for a in attrs) / len(attrs))
    return KnowledgeNeurons(
        scores=torch.stack([a.scores for a in attrs]),
        activations=torch.stack([a.activations[0] for a in attrs]),
        neurons=located,
        per_prompt=per_prompt,
        prompts=tuple(prompts),
        target=target,
        target_prob=attrs[0].target_prob,
        completeness_rel_error=comp,
        effects=effects,
        config=dict(steps=steps, rule=rule, method=method, site=site, threshold=threshold, top_k=top_k,
                    refine_p=refine_p, n_random=n_random, seed=seed, model=model.name),
    )
