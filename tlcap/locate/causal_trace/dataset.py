"""Dataset mode: the average indirect effect over many facts, by ROME's token classes (Fig. 2)."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.config import check_int
from tlcap.errors import EmptyDatasetError, InvalidConfigError, UnknownNameError
from tlcap.locate.causal_trace.config import KINDS, TraceConfig
from tlcap.locate.causal_trace.engine import trace_result
from tlcap.locate.causal_trace.facts import trace_setups
from tlcap.locate.causal_trace.setup import noise_level, prepare_traces
from tlcap.locate.subjects import SubjectWarning
from tlcap.models.adapter import Model
from tlcap.provenance import Provenance
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.viz.trace import average_effect_heatmap, average_effect_lines

TOKEN_CLASSES: tuple[str, ...] = (
    "first subject", "middle subject", "last subject", "first subsequent", "further", "last",
)


def token_classes(n_tokens: int, subject_range: tuple[int, int]) -> dict[str, list[int]]:
    """Token positions of each ROME token class for a prompt of ``n_tokens``.

    first / middle / last subject token, the first token after the subject, further tokens,
    and the last token. A one-token subject is both first and last subject token; a class the
    prompt does not have is empty (and left out of that class's average).

    Args:
        n_tokens: Tokens in the prompt.
        subject_range: ``[start, end)`` of the subject.

    Returns:
        Class → token positions, in :data:`TOKEN_CLASSES` order.
    """
    s0, s1 = subject_range
    last = n_tokens - 1
    return {
        "first subject": [s0],
        "middle subject": list(range(s0 + 1, s1 - 1)),
        "last subject": [s1 - 1],
        "first subsequent": [s1] if s1 < last else [],
        "further": list(range(s1 + 1, last)),
        "last": [last],
    }


@dataclass(frozen=True)
class DatasetEffectRow:
    """One row of :meth:`DatasetTrace.to_frame`: the average effect of one (kind, class, layer)."""

    kind: str
    token_class: str
    layer: int
    effect: float
    n_facts: int


@dataclass(frozen=True)
class DatasetTrace(Result):
    """Average indirect effect over facts, by token class (ROME Figure 2 style).

    Attributes:
        effects: ``[kind, class, layer]`` mean indirect effect (facts lacking a class skip it).
        counts: ``[class]`` number of facts contributing to each class.
        clean_prob / corrupted_prob: Means over facts.
        n_facts: Facts traced.
        kinds, layers, classes: The axes of ``effects``.
        window, samples, noise_std, bos: The settings of the traces.
        n_subject_at_start: Facts whose subject starts the prompt (position 0, the attention
            sink; 0 with ``bos``).
        prompts: The facts' prompts.
        top_layers: Per fact, its top-k MLP layers (at the last subject token).
        seconds: Wall time.
        model_name: ``Model.name``.
    """

    effects: Float[Tensor, "kind cls layer"]
    counts: Int[Tensor, " cls"]
    clean_prob: float
    corrupted_prob: float
    n_facts: int = 0
    kinds: tuple[str, ...] = KINDS
    layers: tuple[int, ...] = ()
    classes: tuple[str, ...] = TOKEN_CLASSES
    window: int = 10
    samples: int = 10
    noise_std: float = 0.0
    bos: bool = False
    n_subject_at_start: int = 0
    prompts: tuple[str, ...] = ()
    top_layers: tuple[tuple[int, ...], ...] = ()
    seconds: float = 0.0
    model_name: str = ""

    def effect(self, kind: str) -> Float[Tensor, "cls layer"]:
        """Average effects of one kind, ``[class, layer]``.

        Args:
            kind: A traced kind (``"resid"``, ``"mlp"`` or ``"attn"``).

        Returns:
            The ``[class, layer]`` average indirect effects, classes in :data:`TOKEN_CLASSES` order.

        Raises:
            UnknownNameError: ``kind`` was not traced.
        """
        if kind not in self.kinds:
            raise UnknownNameError.of("traced kind", kind, self.kinds)
        return self.effects[self.kinds.index(kind)]

    def to_frame(self) -> pd.DataFrame:
        """One :class:`DatasetEffectRow` per (kind, token class, layer).

        Returns:
            A DataFrame of :class:`DatasetEffectRow` (kinds, then classes, then layers), with each class's token count.
        """
        rows = [
            DatasetEffectRow(kind, cls, int(layer), float(self.effects[ki, ci, li]), int(self.counts[ci]))
            for ki, kind in enumerate(self.kinds)
            for ci, cls in enumerate(self.classes)
            for li, layer in enumerate(self.layers)
        ]
        return frame(rows, DatasetEffectRow)

    def figure(self, title: str | None = None) -> go.Figure:
        """Average-indirect-effect heatmaps (class × layer) per kind.

        Args:
            title: Figure title (default: the number of facts and the clean / corrupted probabilities).

        Returns:
            A plotly figure, one heatmap per traced kind.
        """
        return average_effect_heatmap(
            {k: self.effect(k).float().numpy() for k in self.kinds}, self.classes, self.counts.tolist(), self.layers,
            title=title or (f"Average indirect effect over {self.n_facts} facts "
                            f"(clean p={self.clean_prob:.3f}, corrupted p={self.corrupted_prob:.3f})"),
        )

    def line_figure(self, token_class: str = "last subject") -> go.Figure:
        """Average indirect effect by layer at one token class, one line per kind.

        Args:
            token_class: One of :data:`TOKEN_CLASSES`.

        Returns:
            A plotly line figure over the traced layers.

        Raises:
            UnknownNameError: an unknown token class.
        """
        if token_class not in self.classes:
            raise UnknownNameError.of("token class", token_class, self.classes)
        ci = self.classes.index(token_class)
        return average_effect_lines(
            {k: self.effect(k)[ci].tolist() for k in self.kinds}, self.layers,
            title=f"Average indirect effect at the {token_class} token ({self.n_facts} facts)",
        )

    def summary(self) -> dict[str, Any]:
        """The ``tlcap trace --dataset`` summary: average effects per kind and class, counts.

        Returns:
            A JSON-ready dict (``average_effects`` maps each kind to its ``[class][layer]`` lists).
        """
        return {
            "model": self.model_name, "mode": "dataset",
            "n_facts": self.n_facts, "clean_prob": self.clean_prob, "corrupted_prob": self.corrupted_prob,
            "kinds": list(self.kinds), "layers": list(self.layers), "classes": list(self.classes),
            "counts": self.counts.tolist(),
            "average_effects": {k: self.effect(k).tolist() for k in self.kinds},
            "top_layers": [list(t) for t in self.top_layers], "window": self.window, "samples": self.samples,
            "noise_std": self.noise_std, "bos": self.bos, "n_subject_at_start": self.n_subject_at_start,
            "seconds": self.seconds,
        }


def trace_dataset(
    model: Model,
    facts: Iterable[dict[str, Any]],
    *,
    config: TraceConfig | None = None,
    progress: bool = False,
    fact_batch: int = 16,
    **overrides: Any,
) -> DatasetTrace:
    """Average indirect effect over many facts, grouped by token class.

    Each fact is traced as :func:`causal_trace` traces it (noise seed ``seed + index``, one ν for the
    whole dataset: with ``noise_from="subjects"`` the std of these facts' subject embeddings, as
    ROME), the cells of ``fact_batch`` facts sharing batches (:func:`trace_setups`); per fact the
    class's tokens are averaged, then the facts having that class. Facts whose subject starts the
    prompt without a BOS are counted and warned about once.

    Args:
        model: The model.
        facts: Dicts with ``prompt`` and ``subject`` (and ``target``/``attribute`` for
            ``use_attribute``).
        config: A :class:`TraceConfig` (default: its defaults).
        progress: Show a progress bar over the facts.
        fact_batch: Facts whose cells share batches (exact: results do not depend on it), ``>= 1``.
        **overrides: :class:`TraceConfig` fields overriding ``config``.

    Returns:
        A :class:`DatasetTrace` with provenance.

    Raises:
        EmptyDatasetError: no facts.

    Example:
        >>> from tlcap.data import load_known_facts
        >>> ds = trace_dataset(model, load_known_facts(n=4), samples=3, bos=True)
        >>> ds.summary()["n_facts"], ds.summary()["classes"]
        (4, ['first subject', 'middle subject', 'last subject', 'first subsequent', 'further', 'last'])
        >>> fig = ds.figure()                                   # fig.show() in a notebook
    """
    t0 = time.perf_counter()
    cfg = TraceConfig.resolve(config, **overrides)
    check_int("fact_batch", fact_batch, min=1, cli=None)
    if cfg.tokens != "all":
        raise InvalidConfigError(f"tokens (--tokens) {cfg.tokens!r}: dataset mode averages every token class; "
                                 "leave --tokens at all")
    layers_t = cfg.check_layers(model.n_layers, model.name)
    facts = list(facts)
    if not facts:
        raise EmptyDatasetError("trace_dataset got no facts; give at least one fact (prompt and subject)")
    nu = noise_level(model, cfg, [f["subject"] for f in facts])
    kinds = tuple(cfg.kinds)
    sums = torch.zeros(len(kinds), len(TOKEN_CLASSES), len(layers_t), dtype=torch.float64)
    counts = torch.zeros(len(TOKEN_CLASSES), dtype=torch.long)
    clean, corrupt, prompts, tops = [], [], [], []
    at_start = 0
    bar = tqdm(total=len(facts), desc="trace dataset", disable=not progress)
    for s in range(0, len(facts), fact_batch):  # the cells of a window of facts share batches
        window = range(s, min(s + fact_batch, len(facts)))
        items = [(facts[i]["prompt"], facts[i]["subject"], _target(facts[i]) if cfg.use_attribute else None)
                 for i in window]  # each fact its own noise seed; on an accelerator set up in two padded passes
        setups = prepare_traces(model, items, config=cfg.replace(noise_std=nu), warn=False,
                                seeds=[cfg.seed + i for i in window])
        t_w = time.perf_counter()
        scores = trace_setups(setups)
        share = (time.perf_counter() - t_w) / len(setups)
        for st, sc in zip(setups, scores):
            tr = trace_result(st, sc, share)
            at_start += tr.subject_at_start
            eff = tr.indirect_effect.double()
            for ci, pos in enumerate(token_classes(len(tr.tokens), tr.subject_range).values()):
                if pos:
                    sums[:, ci] += eff[:, pos].mean(1)
                    counts[ci] += 1
            clean.append(tr.clean_prob)
            corrupt.append(tr.corrupted_prob)
            prompts.append(st.prompt)
            tops.append(tuple(tr.top_layers(cfg.top_k)))
            bar.update(1)
    bar.close()
    if at_start:
        warnings.warn(
            f"{at_start} of {len(facts)} facts have the subject at the start of the prompt (position 0, the model's "
            "attention sink): noising it also corrupts what every later token attends to; pass bos=True (--bos) to "
            "prepend the BOS token",
            SubjectWarning, stacklevel=2,
        )
    effects = (sums / counts.clamp(min=1)[None, :, None]).float()
    effects[:, counts == 0] = float("nan")
    return DatasetTrace(
        effects=effects, counts=counts, clean_prob=float(sum(clean) / len(clean)),
        corrupted_prob=float(sum(corrupt) / len(corrupt)), n_facts=len(facts), kinds=kinds, layers=layers_t,
        window=cfg.window, samples=cfg.samples, noise_std=float(nu), bos=cfg.bos, n_subject_at_start=at_start,
        prompts=tuple(prompts), top_layers=tuple(tops),
        seconds=time.perf_counter() - t0, model_name=model.name,
        provenance=Provenance.collect(model, config=cfg, seed=cfg.seed),
    )


def _target(fact: dict) -> str | None:
    """A fact's answer (``target``, else its ``attribute`` with a leading space; ``None``: the clean top token)."""
    return fact.get("target") or (" " + fact["attribute"].strip() if fact.get("attribute") else None)


__all__ = ["DatasetEffectRow", "DatasetTrace", "TOKEN_CLASSES", "token_classes", "trace_dataset"]
