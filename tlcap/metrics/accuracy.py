"""Task accuracy for the CNL datasets (documented choices).

- **Math (GSM8K, SVAMP; kind ``number``)**: greedy decoding from the prompt for at most
  ``task.max_new_tokens`` tokens (GSM8K 96, SVAMP 32), stopped at a blank line, at
  ``"Question:"`` or at EOS. The predicted number is the one after ``"The answer is"`` (the
  format of our answer strings) or after ``####``, else the last number in the generation.
  Exact match with the gold number (as floats, commas removed).
- **Sentiment (Emotion, IMDB; kind ``choice``)**: the label whose answer string has the
  highest total log-likelihood after the prompt (one forward pass when every label is a single
  token, as for SmolLM2 and GPT-2). No generation, no parsing.
- **Code (MBPP; kind ``code``)**: reference-solution token accuracy — teacher-forced, the share
  of the reference solution's first ``code_tokens`` (64) tokens that the model predicts as its
  argmax. Model-written code is never executed.

All functions take ``hooks`` (activation interventions) and see weight edits already applied
to the model, so the same call measures base, erased and fine-tuned models. On an accelerator
:func:`task_accuracy` without ``hooks`` runs the samples as rows of a few passes: a number task's
:data:`GEN_ROWS` prompts per generation batch, a choice or code task's teacher-forced rows as
:func:`~tlcap.metrics.set_scores.erased_scores` runs them (the shared prompt prefix once); on a CPU
one sample at a time. A sample whose prompt
does not fit the context window is skipped and counted (``TaskAccuracy.n_skipped``), never
scored. ``TaskAccuracy.summary()`` reports what the model predicted and the share of the most
frequent gold label: a model that answers one label for everything scores exactly that share
(SmolLM2-135M on Emotion, see ``docs/cnl.md``).

Example:
    >>> from tlcap.data.tasks import load_task
    >>> acc = task_accuracy(model, "emotion", load_task("emotion", split="test", n=8))
    >>> acc.accuracy, acc.n_skipped                # the tiny random model: 1 of 8 right
    (0.125, 0)
    >>> acc.predictions[:3], acc.golds[:3]
    (('love', 'love', 'love'), ('joy', 'anger', 'sadness'))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.data.tasks import Sample, Task, encode_sample, get_task
from tlcap.errors import EmptyDatasetError, PromptTooLongError
from tlcap.metrics.answers import CODE_TOKENS, cut_at_stops, extract_number, same_number
from tlcap.metrics.set_scores import erased_scores
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import HookList, Model
from tlcap.results import Result
from tlcap.rows import frame
from tlcap.runtime import device as runtime_device
from tlcap.viz.cnl import accuracy_figure


@dataclass(frozen=True)
class AccuracyRow:
    """One row of :meth:`TaskAccuracy.to_frame`: a scored sample."""

    sample: int
    score: float
    prediction: str
    gold: str


@dataclass(frozen=True)
class TaskAccuracy(Result):
    """Accuracy of a model on a list of samples.

    Attributes:
        task: Task name.
        metric: How a sample is scored (see the module docstring).
        accuracy: Mean of ``scores`` (over the scored samples).
        scores: Per-sample score (1/0 for math and choice tasks, token accuracy for code).
        predictions: What the model answered (number, label, or "" for code).
        golds: The gold answers.
        n_skipped: Samples not scored because the prompt does not fit the context window.
    """

    task: str
    metric: str
    accuracy: float
    scores: tuple[float, ...] = ()
    predictions: tuple[str, ...] = ()
    golds: tuple[str, ...] = ()
    meta: dict = field(default_factory=dict)
    n_skipped: int = 0

    @property
    def n(self) -> int:
        return len(self.scores)

    @property
    def majority_share(self) -> float:
        """Share of the most frequent gold answer: the accuracy of a constant predictor (choice tasks)."""
        if not self.golds or not any(self.golds):
            return float("nan")
        return Counter(self.golds).most_common(1)[0][1] / len(self.golds)

    def summary(self) -> dict[str, Any]:
        """Accuracy, counts, and what the model predicted vs the gold labels.

        Returns:
            A JSON-ready dict (prediction and gold counts skip empty strings).
        """
        return {
            "task": self.task, "metric": self.metric, "accuracy": self.accuracy, "n": self.n, "n_skipped": self.n_skipped,
            "majority_share": self.majority_share, "prediction_counts": dict(Counter(p for p in self.predictions if p)),
            "gold_counts": dict(Counter(g for g in self.golds if g)),
        }

    def to_frame(self) -> pd.DataFrame:
        """One :class:`AccuracyRow` per scored sample.

        Returns:
            A DataFrame of :class:`AccuracyRow` (index, score, prediction, gold).
        """
        return frame([AccuracyRow(i, float(s), p, g) for i, (s, p, g) in
                      enumerate(zip(self.scores, self.predictions, self.golds))], AccuracyRow)

    def figure(self) -> go.Figure:
        """Predicted vs gold label counts.

        Returns:
            The plotly figure.
        """
        return accuracy_figure(Counter(p for p in self.predictions if p), Counter(g for g in self.golds if g),
                               title=f"{self.task}: accuracy {self.accuracy:.3f} ({self.metric}, n={self.n})")


def greedy_generate(
    model: Model,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 32,
    hooks: HookList = (),
    stop_ids: Sequence[int] = (),
    stop_text: Sequence[str] = (),
    use_cache: bool = True,
) -> list[int]:
    """Greedy continuation of ``prompt_ids`` (new token ids only): :meth:`tlcap.models.Model.generate`.

    With ``use_cache`` the prompt is encoded once into a key/value cache and every step feeds
    only the newest token; ``use_cache=False`` re-runs the whole sequence each step (the
    reference the cached path is tested against).

    Args:
        model: The model.
        prompt_ids: Token ids of the prompt.
        max_new_tokens: Most tokens generated.
        hooks: Activation interventions applied at every step.
        stop_ids: Token ids that end the generation.
        stop_text: Strings that end the generation once decoded.
        use_cache: Use a key/value cache.

    Returns:
        The generated token ids (without the prompt).
    """
    return model.generate(prompt_ids, max_new_tokens, hooks, stop_ids, stop_text, use_cache)


@torch.no_grad()
def choice_logprobs(model: Model, prompt: str, choices: Sequence[str], hooks: HookList = ()) -> Tensor:
    """Total log-likelihood of each choice string after ``prompt``: ``[n_choices]``.

    Args:
        model: The model.
        prompt: The prompt.
        choices: The choice strings (tokenized in context, as :func:`tlcap.data.tasks.encode_sample`).
        hooks: Activation interventions applied during scoring.

    Returns:
        ``[n_choices]`` float32 log-likelihoods on the CPU.
    """
    p_ids = model.encode(prompt)
    c_ids = [encode_sample(model, Sample(prompt, c))[1] for c in choices]
    if all(len(c) == 1 for c in c_ids):
        logp = model.last_logits(torch.tensor([p_ids], device=model.device), hooks=hooks)[0].float().log_softmax(-1)
        return torch.stack([logp[c[0]] for c in c_ids]).cpu()
    out = []
    for c in c_ids:
        toks = torch.tensor([p_ids + c[:-1]], device=model.device)
        logp = model.logits(toks, hooks=hooks)[0, len(p_ids) - 1 :].float().log_softmax(-1)
        out.append(logp[torch.arange(len(c)), torch.tensor(c)].sum())
    return torch.stack(out).cpu()


@torch.no_grad()
def reference_token_accuracy(model: Model, sample: Sample, max_tokens: int = CODE_TOKENS, hooks: HookList = ()) -> float:
    """Share of the reference answer's first ``max_tokens`` tokens predicted as argmax (teacher forcing).

    Args:
        model: The model.
        sample: The sample (its ``answer`` is the reference).
        max_tokens: Reference tokens scored.
        hooks: Activation interventions applied during scoring.

    Returns:
        The share in ``[0, 1]``.
    """
    p_ids, t_ids = encode_sample(model, sample, max_tokens)
    toks: Int[Tensor, "1 pos"] = torch.tensor([p_ids + t_ids[:-1]], device=model.device)
    pred = model.logits(toks, hooks=hooks)[0, len(p_ids) - 1 :].argmax(-1).cpu()
    return float((pred == torch.tensor(t_ids)).float().mean())


def task_accuracy(
    model: Model,
    task: str | Task,
    samples: Sequence[Sample],
    hooks: HookList = (),
    max_new_tokens: int | None = None,
    code_tokens: int = CODE_TOKENS,
    progress: bool = False,
) -> TaskAccuracy:
    """Accuracy of ``model`` (with ``hooks``) on ``samples`` of ``task`` (module docstring).

    Args:
        model: The model (weight edits in effect are measured too).
        task: Task name or :class:`Task`.
        samples: Samples from :func:`tlcap.data.tasks.load_task`.
        hooks: Activation interventions applied during scoring.
        max_new_tokens: Generation budget for math tasks (default the task's).
        code_tokens: Reference tokens scored for code tasks.
        progress: Show a progress bar.

    Returns:
        A :class:`TaskAccuracy` (samples whose prompt does not fit the context are counted in ``n_skipped``).

    Raises:
        EmptyDatasetError: no samples.
    """
    t = get_task(task) if isinstance(task, str) else task
    if not samples:
        raise EmptyDatasetError(f"no samples to measure {t.name} accuracy on")
    as_rows = not hooks and runtime_device.one_pass_default(model)  # the accelerator's batched paths
    if as_rows and t.kind != "number":
        return _teacher_forced_accuracy(model, t, samples, code_tokens, progress)
    scores: list[float] = []
    preds: list[str] = []
    golds: list[str] = []
    eos_id = model.special_token_id("eos")
    eos = [eos_id] if eos_id is not None else []
    stops = ("\n\n", "Question:")
    skipped = 0
    gens = (_generations(model, samples, max_new_tokens or t.max_new_tokens, eos, stops)
            if as_rows and t.kind == "number" and model.continues_rows else None)
    for i, s in enumerate(tqdm(samples, desc=f"accuracy {t.name}", disable=not progress, leave=False)):
        if gens is not None and gens[i] is None:  # its prompt does not fit the context window
            skipped += 1
            continue
        try:
            score, pred, gold = (_number_score(model, gens[i] or [], s, stops) if gens is not None  # generated above
                                 else _score_one(model, t, s, hooks, max_new_tokens, code_tokens, eos, stops))
        except PromptTooLongError:
            skipped += 1
            continue
        scores.append(score)
        preds.append(pred)
        golds.append(gold)
    if not scores:
        raise EmptyDatasetError(f"none of the {len(samples)} {t.name} samples fits the context window of {model.name}")
    metric = {"number": "exact match (final number)", "choice": "label by likelihood", "code": "reference token accuracy"}[t.kind]
    return TaskAccuracy(t.name, metric, sum(scores) / len(scores), tuple(scores), tuple(preds), tuple(golds),
                        n_skipped=skipped)


def _teacher_forced_accuracy(model: Model, t: Task, samples: Sequence[Sample], code_tokens: int,
                             progress: bool = False) -> TaskAccuracy:
    """:func:`task_accuracy` of a choice or code task with the samples as rows of a few right-padded passes (an
    accelerator's path): :func:`~tlcap.metrics.set_scores.erased_scores` with one empty set (their shared prompt
    prefix run once, up to :data:`~tlcap.metrics.set_scores.ROW_TOKENS` tokens per pass); the same scores as one
    sample at a time up to the float rounding of a batch."""
    sc = erased_scores(model, t, samples, [NeuronSet((), (model.n_layers, model.d_mlp))], code_tokens=code_tokens,
                       progress=progress)
    scores = tuple(sc.scores[0].tolist())
    return TaskAccuracy(t.name, sc.metric, sum(scores) / len(scores), scores, sc.predictions[0], sc.golds,
                        n_skipped=sc.n_skipped)


def _score_one(
    model: Model, t: Task, s: Sample, hooks: HookList, max_new_tokens: int | None, code_tokens: int, eos: list[int],
    stops: tuple[str, ...],
) -> tuple[float, str, str]:
    """``(score, prediction, gold)`` of one sample (see the module docstring)."""
    if t.kind == "number":
        gen = greedy_generate(model, model.encode(s.prompt), max_new_tokens or t.max_new_tokens, hooks, eos, stops)
        return _number_score(model, gen, s, stops)
    if t.kind == "choice":
        lp = choice_logprobs(model, s.prompt, t.choices, hooks)
        pick = t.choices[int(lp.argmax())]
        return float(pick.strip() == s.gold.strip()), pick.strip(), s.gold.strip()
    return reference_token_accuracy(model, s, code_tokens, hooks), "", ""


GEN_ROWS = 16
"""Samples of a number task generated as rows of one batch on an accelerator (:meth:`Model.generate_many`)."""


def _number_score(model: Model, gen: list[int], s: Sample, stops: tuple[str, ...]) -> tuple[float, str, str]:
    """``(exact match, predicted number, gold)`` of a generation."""
    num = extract_number(cut_at_stops(model.decode(gen), stops))
    return float(same_number(num, s.gold)), num or "", s.gold


def _generations(model: Model, samples: Sequence[Sample], max_new: int, eos: list[int],
                 stops: tuple[str, ...]) -> list[list[int] | None]:
    """Each sample's greedy generation (``None``: its prompt does not fit), :data:`GEN_ROWS` prompts of similar
    length per batch; each equals the sample's own :func:`greedy_generate` up to the float rounding of a batch."""
    ids: list[list[int] | None] = []
    for s in samples:
        try:
            ids.append(model.encode(s.prompt))
        except PromptTooLongError:
            ids.append(None)
    order = sorted((i for i, p in enumerate(ids) if p is not None), key=lambda i: len(ids[i] or []))
    out: list[list[int] | None] = [None] * len(samples)
    for a in range(0, len(order), GEN_ROWS):
        part = order[a:a + GEN_ROWS]
        for i, g in zip(part, model.generate_many([ids[i] or [] for i in part], max_new, eos, stops)):
            out[i] = g
    return out


__all__ = [
    "TaskAccuracy", "AccuracyRow", "task_accuracy", "greedy_generate", "extract_number", "choice_logprobs",
    "reference_token_accuracy",
]
