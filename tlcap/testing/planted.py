"""Planted ground truth: tiny GPT-2 models whose facts and capabilities sit where we put them.

A localization method is only as trustworthy as its answer on a model whose answer is known.
These builders take a random tiny GPT-2 (the exact GPT-2 BPE, like ``"gpt2-tiny"``) and wire,
by writing weights (:mod:`tlcap.testing.wiring`), chosen MLP neurons and one attention head to
carry

- **facts** (:func:`planted_fact_model`): ``"The capital of France is" → " Paris"`` through a
  mover head (layer ``head_layer``) that copies the subject to the last position and a few
  neurons of ``layer`` that turn it into the answer. Suppressing those neurons takes P(target)
  from about 0.9 to the random model's ~1e-5; random sets of the same size barely move it.
- **a capability** (:func:`planted_capability_model`): a toy sentiment task, ``"Review: the
  film was great. Sentiment:" → " positive"``, over many words and templates, carried for every
  prompt by the same set of neurons (half fire for positive words, half for negative).

``wired=False`` builds the same model (same seed, same random weights, same scaffold, same
``truth``) without the wiring: a method should find nothing there. Builds are seeded and
deterministic (the seed also picks the wired head, neurons and residual dimensions) and take
a fraction of a second once the tokenizer is cached. The global torch RNG is left as it was.

Example:
    >>> model, truth = planted_fact_model(seed=0)
    >>> truth.prompt, truth.target, truth.neurons.to_list(), truth.layer, truth.edges[0]
    ('The capital of France is', ' Paris', [[2, 11], [2, 34], [2, 182], [2, 233]], 2, ('input', 'a0.h2<k>'))
    >>> attr = tlcap.integrated_gradients(model, truth.prompt, truth.target)
    >>> attr.select(threshold=0.2) == truth.neurons
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tlcap.config import check_int
from tlcap.data.sample import Sample, TaskSamples
from tlcap.data.tasks import register_task
from tlcap.errors import InvalidConfigError
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.models.hand_weights import hand_weights
from tlcap.models.tiny import make_gpt2
from tlcap.testing import wiring as W

FACTS: tuple[tuple[str, str], ...] = (
    ("France", " Paris"), ("Italy", " Rome"), ("Japan", " Tokyo"), ("Germany", " Berlin"),
    ("Spain", " Madrid"), ("Egypt", " Cairo"), ("Greece", " Athens"), ("Poland", " Warsaw"),
)
FACT_TEMPLATE = "The capital of {} is"
# Other phrasings of the same query (the subject mid-prompt, after a space: the marked token).
PARAPHRASES = ("The capital city of {} is", "As everyone knows, the capital of {} is", "The seat of government of {} is")
CORRUPT_SUBJECT = "Canada"  # an unwired subject: the corrupted prompt of every fact
POSITIVE = ("great", "good", "wonderful", "excellent", "amazing", "lovely", "brilliant", "superb", "beautiful",
            "perfect", "fantastic", "delightful")
NEGATIVE = ("bad", "awful", "terrible", "horrible", "boring", "dull", "poor", "weak", "ugly", "dreadful",
            "painful", "stupid")
TEMPLATES = ("Review: the film was {}. Sentiment:", "Review: a {} movie. Sentiment:",
             "Review: the acting was {}. Sentiment:")
LABELS = (" positive", " negative")
CAPABILITY_TASK = "planted-sentiment"

# Wiring strengths (module docstring of tlcap.testing.wiring): measured to give P(target) ≈ 0.9.
_MOVE_GAIN = 0.2
_THRESHOLD = 2.5
_READOUT = 1.6
_LABEL_READOUT = 2.1


@dataclass(frozen=True)
class PlantedFact:
    """One wired fact.

    Attributes:
        prompt: ``template.format(subject)``.
        subject: The subject as written in the prompt (one token).
        target: The answer token (with its leading space).
        corrupt_prompt: The same template with an unwired subject (for EAP and patching).
        neurons: The neurons that write this fact's answer.
        paraphrases: Other phrasings of the query (:data:`PARAPHRASES`); the wiring answers them
            too, which makes them held-out prompts for a located set.
    """

    prompt: str
    subject: str
    target: str
    corrupt_prompt: str
    neurons: NeuronSet
    paraphrases: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlantedTruth:
    """What a planted fact model carries, and where.

    ``prompt``, ``subject``, ``target``, ``corrupt_prompt`` and ``neurons`` are those of the
    first fact; :attr:`facts` lists all of them.

    Attributes:
        facts: The wired facts.
        layer: The MLP layer of the wired neurons.
        head: ``(layer, head)`` of the mover head.
        edges: The planted circuit as graph edges ``(upstream, reader)`` in the naming of
            :mod:`tlcap.locate.circuits.graph`: the subject's embedding into the head's key and
            value, the head into the MLP, the MLP into the logits.
        wired: Whether the wiring is in the model (``False``: the same model without it).
        seed: The seed the model was built with.
    """

    facts: tuple[PlantedFact, ...]
    layer: int
    head: tuple[int, int]
    edges: tuple[tuple[str, str], ...]
    wired: bool
    seed: int

    @property
    def prompt(self) -> str:
        return self.facts[0].prompt

    @property
    def subject(self) -> str:
        return self.facts[0].subject

    @property
    def target(self) -> str:
        return self.facts[0].target

    @property
    def corrupt_prompt(self) -> str:
        return self.facts[0].corrupt_prompt

    @property
    def neurons(self) -> NeuronSet:
        return self.facts[0].neurons

    @property
    def paraphrases(self) -> tuple[str, ...]:
        return self.facts[0].paraphrases

    @property
    def all_neurons(self) -> NeuronSet:
        """The union of every fact's neurons."""
        out = self.facts[0].neurons
        for f in self.facts[1:]:
            out = out | f.neurons
        return out


@dataclass(frozen=True)
class PlantedCapability:
    """What a planted capability model carries, and where.

    Attributes:
        task: The registered task name (:func:`tlcap.data.tasks.get_task`; a ``choice`` task with
            :attr:`choices`), usable by :func:`tlcap.metrics.accuracy.task_accuracy` and the CNL
            experiments.
        samples: Every prompt of the task (:class:`~tlcap.data.sample.Sample`: prompt, answer,
            gold label, uid), in the form :func:`tlcap.attribution.dataset.score_dataset` takes.
        choices: The two labels.
        neurons: The neurons that carry the task (all prompts use them).
        layer: Their MLP layer.
        head: ``(layer, head)`` of the mover head.
        edges: The planted circuit as graph edges (see :class:`PlantedTruth`).
        wired: Whether the wiring is in the model.
        seed: The seed the model was built with.
    """

    task: str
    samples: TaskSamples
    choices: tuple[str, str]
    neurons: NeuronSet
    layer: int
    head: tuple[int, int]
    edges: tuple[tuple[str, str], ...]
    wired: bool
    seed: int


def _check_layout(n_layers: int, layer: int, head_layer: int) -> None:
    check_int("n_layers", n_layers, min=2, cli=None)
    check_int("layer", layer, min=1, max=n_layers - 1, cli=None)
    check_int("head_layer", head_layer, min=0, max=n_layers - 1, cli=None)
    if head_layer >= layer:
        raise InvalidConfigError(f"head_layer ({head_layer}) must be below layer ({layer}): the head moves the "
                                 "subject to the last position before the neurons read it")


def _base(seed: int, n_layers: int, kind: str, wired: bool) -> Model:
    with torch.random.fork_rng(devices=[]):
        model = make_gpt2("tiny", seed=seed, n_layers=n_layers)
    model.name = f"gpt2-planted-{kind}-{n_layers}l-seed{seed}{'' if wired else '-unwired'}"
    model.identity = f"tlcap.testing planted {kind} model, seed {seed}, {'wired' if wired else 'unwired'}"
    return model


def _token(model: Model, prompt: str, piece: str) -> int:
    """The id of ``piece`` as one token of ``prompt`` (it must be exactly one token there)."""
    span = model.subject_span(prompt, piece.strip())
    ids = model.encode(prompt)
    if span.end - span.start != 1:
        raise InvalidConfigError(f"{piece!r} is {span.end - span.start} tokens in {prompt!r}; planted subjects, words "
                                 "and targets must be single GPT-2 tokens")
    return int(ids[span.start])


def _target_id(model: Model, prompt: str, target: str) -> int:
    ids = model.target_ids(prompt, target)
    if len(ids) != 1:
        raise InvalidConfigError(f"target {target!r} is {len(ids)} tokens after {prompt!r}; use a one-token target")
    return int(ids[0])


def _circuit(head: tuple[int, int], layer: int) -> tuple[tuple[str, str], ...]:
    a = f"a{head[0]}.h{head[1]}"
    return (("input", f"{a}<k>"), ("input", f"{a}<v>"), (a, f"m{layer}"), (f"m{layer}", "logits"))


def planted_fact_model(
    seed: int = 0,
    *,
    n_facts: int = 1,
    facts: Sequence[tuple[str, str]] | None = None,
    template: str = FACT_TEMPLATE,
    neurons_per_fact: int = 4,
    n_layers: int = 4,
    layer: int = 2,
    head_layer: int = 0,
    wired: bool = True,
) -> tuple[Model, PlantedTruth]:
    """A tiny GPT-2 in which chosen neurons and one head carry one or more facts.

    Args:
        seed: Seed of the random weights and of the choice of head, neurons and dimensions.
        n_facts: How many facts of :data:`FACTS` to wire (ignored when ``facts`` is given).
        facts: ``(subject, target)`` pairs, each a single GPT-2 token in ``template``.
        template: The prompt with ``{}`` where the subject goes.
        neurons_per_fact: Neurons wired per fact (each with a seeded weight in [0.7, 1.3]).
        n_layers: Layers of the model (d_model 64, 4 heads, d_mlp 256).
        layer: MLP layer of the wired neurons.
        head_layer: Layer of the mover head (below ``layer``).
        wired: ``False`` gives the same model and truth without the wiring.

    Returns:
        ``(model, truth)``: the :class:`~tlcap.models.Model` and a :class:`PlantedTruth`.

    Raises:
        InvalidConfigError: a layout that cannot be wired, or a subject/target that is not
            one token.
    """
    _check_layout(n_layers, layer, head_layer)
    pairs = tuple(facts) if facts is not None else FACTS[: check_int("n_facts", n_facts, min=1, max=len(FACTS), cli=None)]
    check_int("neurons_per_fact", neurons_per_fact, min=1, max=16, cli=None)
    if CORRUPT_SUBJECT in {s for s, _ in pairs} or not 1 <= len(pairs) <= 12:
        raise InvalidConfigError(f"wire 1 to 12 facts, none about {CORRUPT_SUBJECT!r} (the corrupted subject)")
    model = _base(seed, n_layers, "fact", wired)
    gen = torch.Generator().manual_seed(seed)
    dims = W.pick(gen, model.d_model, 2 + 3 * len(pairs))
    head = (head_layer, W.pick(gen, model.n_heads, 1)[0])
    ids = W.pick(gen, model.d_mlp, neurons_per_fact * len(pairs))
    weights = (0.7 + 0.6 * torch.rand(len(ids), generator=gen)).tolist()
    shape = (model.n_layers, model.d_mlp)
    out = []
    for f, (subject, target) in enumerate(pairs):
        mine = ids[f * neurons_per_fact:(f + 1) * neurons_per_fact]
        out.append(PlantedFact(template.format(subject), subject, target, template.format(CORRUPT_SUBJECT),
                               NeuronSet.from_list([(layer, j) for j in mine], shape),
                               tuple(p.format(subject) for p in PARAPHRASES)))
    hw = hand_weights(model)
    with torch.no_grad():
        W.scaffold(hw, dims[0])
        if wired:
            triples = [dims[2 + 3 * f: 5 + 3 * f] for f in range(len(pairs))]
            W.mover_head(hw, *head, key_dim=dims[1], copies=[(s, m) for s, m, _ in triples], gain=_MOVE_GAIN)
            for f, fact in enumerate(out):
                subj, moved, answer = triples[f]
                W.mark_token(hw, _token(model, fact.prompt, fact.subject), {dims[1]: 1.0, subj: 1.0})
                for j, (_, n) in enumerate(fact.neurons):
                    w = weights[f * neurons_per_fact + j]
                    W.gated_neuron(hw, layer, n, {moved: w}, {answer: 2.0 * w / neurons_per_fact}, _THRESHOLD)
                W.read_out(hw, _target_id(model, fact.prompt, fact.target), {answer: _READOUT})
    truth = PlantedTruth(tuple(out), layer, head, _circuit(head, layer), wired, seed)
    return model, truth


def capability_samples(words_pos: Sequence[str] = POSITIVE, words_neg: Sequence[str] = NEGATIVE,
                       templates: Sequence[str] = TEMPLATES) -> TaskSamples:
    """The prompts of the planted sentiment task: every template with every word.

    Args:
        words_pos: Words of the positive label.
        words_neg: Words of the negative label.
        templates: Prompt templates with one ``{}`` for the word.

    Returns:
        One :class:`Sample` per (template, word), uid ``"t<template>:<word>"``, answer its label.
    """
    out = []
    for t_i, tpl in enumerate(templates):
        for label, words in zip(LABELS, (words_pos, words_neg)):
            for w in words:
                out.append(Sample(tpl.format(w), label, gold=label, uid=f"t{t_i}:{w}", meta={"word": w}))
    return TaskSamples(out)


def planted_capability_model(
    seed: int = 0,
    *,
    code_dims: int = 6,
    n_layers: int = 4,
    layer: int = 2,
    head_layer: int = 0,
    wired: bool = True,
    templates: Sequence[str] = TEMPLATES,
) -> tuple[Model, PlantedCapability]:
    """A tiny GPT-2 in which ``2 * code_dims`` neurons carry a whole toy sentiment task.

    Each sentiment word is marked with a code ``± p + 0.35 ε_w`` on ``code_dims`` residual
    dimensions (``p`` a seeded ±1 pattern, ``ε_w`` the word's own variation); the mover head copies
    it to the last position; neuron pairs ``(k, +)``/``(k, −)`` pass its positive and negative
    parts (a soft threshold) to answer dimensions, which the labels' unembeddings read along ``±p``.
    Every prompt uses the same neurons: half of them for positive words, half for negative.

    Args:
        seed: Seed of the random weights, the codes and the choice of head, neurons and dimensions.
        code_dims: Dimensions of the word code, even (``2 * code_dims`` neurons carry the task).
        n_layers, layer, head_layer: As in :func:`planted_fact_model`.
        wired: ``False`` gives the same model and truth without the wiring.
        templates: Review templates with ``{}`` for the word.

    Returns:
        ``(model, truth)``; ``truth.task`` is registered (``register_task``) as a choice task.
    """
    _check_layout(n_layers, layer, head_layer)
    m = check_int("code_dims", code_dims, min=2, max=12, cli=None)
    if m % 2:
        raise InvalidConfigError(f"code_dims must be even (a pattern with as many +1 as -1), got {m}")
    model = _base(seed, n_layers, "capability", wired)
    gen = torch.Generator().manual_seed(seed)
    dims = W.pick(gen, model.d_model, 2 + 3 * m)
    head = (head_layer, W.pick(gen, model.n_heads, 1)[0])
    ids = W.pick(gen, model.d_mlp, 2 * m)
    # A balanced pattern (as many +1 as -1): LayerNorm's mean subtraction then adds nothing to
    # the label logits, which read ±p.
    p = torch.tensor([1.0 if i < m // 2 else -1.0 for i in range(m)])[torch.randperm(m, generator=gen)] / m**0.5
    samples = capability_samples(templates=templates)
    neurons = NeuronSet.from_list([(layer, j) for j in ids], (model.n_layers, model.d_mlp))
    code, moved, answer = dims[2:2 + m], dims[2 + m:2 + 2 * m], dims[2 + 2 * m:]
    hw = hand_weights(model)
    with torch.no_grad():
        W.scaffold(hw, dims[0])
        if wired:
            W.mover_head(hw, *head, key_dim=dims[1], copies=list(zip(code, moved)), gain=2 * _MOVE_GAIN)
            marked: set[str] = set()
            for s in samples:
                word = s.meta["word"]
                if word in marked:
                    continue
                marked.add(word)
                eps = torch.randn(m, generator=torch.Generator().manual_seed(seed * 7919 + hash_word(word)))
                eps = eps - (eps @ p) * p
                v = (1.0 if s.answer == LABELS[0] else -1.0) * p + 0.35 * eps / eps.norm().clamp_min(1e-6)
                W.mark_token(hw, _token(model, s.prompt, word), {dims[1]: 1.0, **dict(zip(code, v.tolist()))})
            for k in range(m):
                for sign, n in ((1.0, ids[2 * k]), (-1.0, ids[2 * k + 1])):
                    W.gated_neuron(hw, layer, n, {moved[k]: sign}, {answer[k]: sign * 1.5 / m**0.5}, 0.5)
            for label, sign in zip(LABELS, (1.0, -1.0)):
                readout = dict(zip(answer, (sign * _LABEL_READOUT * p).tolist()))
                W.read_out(hw, _target_id(model, samples[0].prompt, label), readout)
    register_task(CAPABILITY_TASK, lambda data_dir, split: capability_samples(templates=templates), kind="choice",
                  choices=LABELS, template=templates[0], description="planted toy sentiment (tlcap.testing)",
                  overwrite=True)
    return model, PlantedCapability(CAPABILITY_TASK, samples, LABELS, neurons, layer, head, _circuit(head, layer),
                                    wired, seed)


def hash_word(word: str) -> int:
    """A stable small integer of ``word`` (Python's ``hash`` of a string changes between runs).

    Args:
        word: The word.

    Returns:
        ``sum((i + 1) * ord(c))`` over its characters.
    """
    return sum((i + 1) * ord(c) for i, c in enumerate(word))


__all__ = [
    "FACTS", "FACT_TEMPLATE", "PARAPHRASES", "CORRUPT_SUBJECT", "POSITIVE", "NEGATIVE", "TEMPLATES", "LABELS", "CAPABILITY_TASK",
    "PlantedFact", "PlantedTruth", "PlantedCapability", "planted_fact_model", "planted_capability_model",
    "capability_samples", "hash_word",
]
