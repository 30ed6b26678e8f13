"""Task scores with many neuron sets erased, batched: one forward pass scores many sets.

:func:`erased_scores` returns the score of every (set, item) pair — the per-item scores of
:func:`~tlcap.metrics.accuracy.task_accuracy` under :func:`~tlcap.intervene.weights.erase_neurons`
of each set — as a ``[n_sets, n_items]`` tensor. Rows of a batch are ``(set, item)`` pairs; row
``r`` zeroes its set's ``mlp_post`` activations at every position
(:class:`~tlcap.intervene.set_rows.SetFactors`), which is the same model as zeroing the neurons'
down-projection rows, so no weight is edited and every row sees its own set. What each task
kind computes, and no more:

- **choice** (Emotion, IMDB): the next-token logits at each row's last prompt token only (the
  unembedding runs on that position); with multi-token labels, teacher-forced rows per label and
  the logits at the label's positions. The label with the highest log-likelihood is the answer.
- **code** (MBPP): teacher-forced rows, logits at the reference tokens' positions only; the
  score is the share predicted as argmax (:data:`~tlcap.metrics.answers.CODE_TOKENS`).
- **number** (GSM8K, SVAMP): greedy generation with one row per set, the sets' masks applied at
  every step (the prompt's included), each row stopped at its own EOS / stop text; exact match. On a
  CPU one item at a time (its sets as rows); on an accelerator the ``(set, item)`` rows of several
  items share each decoding step (:func:`decode_batches`, a key/value budget of :data:`GEN_TOKENS`),
  and rows that have stopped leave the batch.

**Shared prefix.** The tokens every item starts with (Emotion's instruction) are run once per set
(their keys/values depend on the set, which acts at every position), cached, and continued by
every item of that set, so the items pay only for their own tokens.

Example:
    >>> from tlcap.data.tasks import load_task
    >>> shape = (model.n_layers, model.d_mlp)
    >>> located = NeuronSet.from_list([(0, 55), (1, 23)], shape=shape)
    >>> test = load_task("emotion", split="test", n=8)
    >>> sets = [NeuronSet((), shape), located, *(located.random_like(seed=k) for k in range(5))]
    >>> sc = erased_scores(model, "emotion", test, sets)
    >>> sc.scores.mean(1)            # accuracy of the unedited model, located erased, each random set
    tensor([0.1250, 0.2500, 0.1250, 0.1250, 0.1250, 0.1250, 0.1250], dtype=torch.float64)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.data.tasks import Sample, Task, encode_sample, get_task
from tlcap.errors import EmptyDatasetError, PromptTooLongError
from tlcap.intervene.set_rows import SetFactors
from tlcap.metrics.answers import CODE_TOKENS, cut_at_stops, extract_number, same_number
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model
from tlcap.models.generate import ends_generation
from tlcap.runtime.batching import device_shares, free_memory
from tlcap.runtime.device import one_pass_default

MIN_PREFIX = 4
"""Shortest common prefix worth caching per set (shorter ones are run with every row)."""
ROW_TOKENS = 4096
"""Tokens per forward call (rows × padded length): large matrix products, bounded memory."""
GEN_TOKENS = 2**16
"""Keys/values one batch of an accelerator's erased generation holds: rows × (longest prompt + new tokens) tokens
(:func:`decode_budget` caps it at half the free memory; LLaMA2-7B in bfloat16: 32 GiB)."""
LOGIT_BYTES = 2**28
"""Logits one call may hold (rows × read positions × vocabulary × 4 bytes)."""
STOPS = ("\n\n", "Question:")

Reduce = Callable[[Tensor, Tensor], Tensor]  # (logits [rows, k, V], item index of each row) -> [rows]


@dataclass(frozen=True)
class SetScores:
    """Per-item scores of a task with each of several neuron sets erased.

    Attributes:
        scores: ``[n_sets, n_items]`` per-item score (0/1 for choice and number tasks, the
            reference-token accuracy for code), float64.
        predictions: What each set's model answered, per item (label, number; ``""`` for code).
        golds: The gold answers of the scored items.
        items: Positions (in the given samples) of the scored items.
        n_skipped: Samples not scored (prompt beyond the context window).
        metric: How an item is scored (as :class:`~tlcap.metrics.accuracy.TaskAccuracy`).
        tokens: Tokens run through the model (every row's, each set's prefix once).
        seconds: Wall time.
    """

    scores: Float[Tensor, "set item"]
    predictions: tuple[tuple[str, ...], ...]
    golds: tuple[str, ...]
    items: tuple[int, ...]
    n_skipped: int
    metric: str
    tokens: int = 0
    seconds: float = 0.0

    @property
    def accuracy(self) -> Float[Tensor, " set"]:
        """Mean score of each set."""
        return self.scores.mean(1)


def common_prefix(seqs: Sequence[Sequence[int]], cap: int) -> int:
    """Length of the token prefix every sequence starts with, at most ``cap`` (0 when shorter than :data:`MIN_PREFIX`).

    Args:
        seqs: Token id sequences (at least one).
        cap: Longest prefix counted.

    Returns:
        The shared prefix length.
    """
    n = min(cap, *(len(s) for s in seqs))
    first = seqs[0]
    for s in seqs[1:]:
        k = 0
        while k < n and s[k] == first[k]:
            k += 1
        n = k
    return n if n >= MIN_PREFIX else 0


def _item_chunks(order: Sequence[int], lens: Sequence[int], k_reads: Sequence[int], n_sets: int,
                 width: int) -> list[list[int]]:
    """The items of each call of one set group: in length order, as many per call as the token and logit budgets
    allow (``lens``: each item's tokens after the shared prefix, ``k_reads``: its read positions)."""
    chunks: list[list[int]] = []
    c0 = 0
    while c0 < len(order):
        chunk = list(order[c0:c0 + 1])
        for i in order[c0 + 1:]:
            cand = [*chunk, i]
            rows_n = n_sets * len(cand)
            if (rows_n * max(lens[j] for j in cand) > ROW_TOKENS
                    or 4 * rows_n * max(k_reads[j] for j in cand) * width > LOGIT_BYTES):
                break
            chunk = cand
        c0 += len(chunk)
        chunks.append(chunk)
    return chunks


def _call_plan(seqs: Sequence[Sequence[int]], reads: Sequence[Sequence[int]], n_sets: int,
               width: int) -> tuple[int, list[tuple[int, int, list[list[int]]]]]:
    """The calls of :func:`teacher_forced`: ``(shared prefix length, [(first set, end set, item chunks)])``, one
    entry per set group (as many sets as one call of the longest item allows), one call per chunk after the group's
    prefix pass."""
    pre = common_prefix(seqs, min(r[0] for r in reads))
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    lens, k_reads = [len(q) - pre for q in seqs], [len(r) for r in reads]
    group = min(n_sets, max(1, min(ROW_TOKENS // max(lens), LOGIT_BYTES // (4 * max(k_reads) * width))))
    chunks: dict[int, list[list[int]]] = {}  # per group size (a full group and at most one shorter last one)
    plan = []
    for g0 in range(0, n_sets, group):
        g1 = min(n_sets, g0 + group)
        if g1 - g0 not in chunks:
            chunks[g1 - g0] = _item_chunks(order, lens, k_reads, g1 - g0, width)
        plan.append((g0, g1, chunks[g1 - g0]))
    return pre, plan


def teacher_forced_passes(seqs: Sequence[Sequence[int]], reads: Sequence[Sequence[int]], n_sets: int,
                          width: int) -> int:
    """Forward calls :func:`teacher_forced` makes for these sequences and ``n_sets`` sets (the cost model's count).

    Args:
        seqs: Token ids of each sequence.
        reads: Positions read in each sequence.
        n_sets: Number of sets.
        width: Vocabulary entries kept per read position (the model's ``d_vocab``).

    Returns:
        Per set group its shared-prefix pass (if any) and one call per item chunk, summed.

    Example:
        >>> teacher_forced_passes([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 7, 8]], [[5], [6]], n_sets=1, width=100)
        2
    """
    pre, plan = _call_plan(seqs, reads, n_sets, width)
    return sum((1 if pre else 0) + len(chunks) for _, _, chunks in plan)


def teacher_forced_rows(model: Model, task: Task, samples: Sequence[Sample],
                        code_tokens: int = CODE_TOKENS) -> tuple[list[list[int]], list[list[int]]]:
    """The ``(sequences, read positions)`` :func:`erased_scores` runs for a choice or code task.

    Args:
        model: The model (tokenizer, context window).
        task: A choice or code task.
        samples: The samples (those that do not fit are skipped, as :func:`scored_items` does).
        code_tokens: Reference tokens scored for code tasks.

    Returns:
        One sequence per scored item (choice tasks with multi-token labels: one per item and label) and the
        positions whose logits are read.
    """
    items = scored_items(model, task, samples, code_tokens)
    if task.kind == "code":
        _, seqs, reads = _code_rows(model, items, code_tokens)
        return seqs, reads
    _, seqs, reads, _ = _choice_rows(model, task, items)
    return seqs, reads


def _choice_rows(model: Model, t: Task, items: list[tuple[int, Sample, list[int]]]
                 ) -> tuple[list[list[list[int]]], list[list[int]], list[list[int]], list[list[int]]]:
    """``(label ids per item, sequences, reads, targets)`` of a choice task: one row per item (every label one
    token: its last prompt position read) or one teacher-forced row per (item, label)."""
    c_ids = [[encode_sample(model, Sample(s.prompt, c))[1] for c in t.choices] for _, s, _ in items]
    if all(len(c) == 1 for cs in c_ids for c in cs):
        return c_ids, [p for _, _, p in items], [[len(p) - 1] for _, _, p in items], []
    seqs, reads, tgt = [], [], []
    for (_, _, p), cs in zip(items, c_ids):
        for c in cs:
            seqs.append(p + c[:-1])
            reads.append(list(range(len(p) - 1, len(p) - 1 + len(c))))
            tgt.append(c)
    return c_ids, seqs, reads, tgt


def _code_rows(model: Model, items: list[tuple[int, Sample, list[int]]], code_tokens: int
               ) -> tuple[list[tuple[list[int], list[int]]], list[list[int]], list[list[int]]]:
    """``(prompt and reference ids per item, sequences, reads)`` of a code task (teacher-forced references)."""
    enc = [encode_sample(model, s, code_tokens) for _, s, _ in items]
    return enc, [p + t[:-1] for p, t in enc], [list(range(len(p) - 1, len(p) - 1 + len(t))) for p, t in enc]


def teacher_forced(
    model: Model, plan: SetFactors, seqs: Sequence[Sequence[int]], reads: Sequence[Sequence[int]], reduce: Reduce,
    *, logit_width: int | None = None, progress: bool = False, desc: str = "sets",
) -> tuple[Float[Tensor, "set seq"], int]:
    """``reduce`` of the logits at positions ``reads[i]`` of sequence ``i`` with each set of ``plan`` erased.

    Args:
        model: The model.
        plan: The sets (factor 0 at every position).
        seqs: Token ids of each sequence.
        reads: Positions read in each sequence (non-empty, increasing).
        reduce: ``(logits [rows, k, V], sequence index of each row) -> [rows]``; a row's reads are
            padded to ``k`` with its last one.
        logit_width: Vocabulary entries kept per position (for the memory bound; default the model's).
        progress: Progress bar over set groups.
        desc: Its label.

    Returns:
        ``([n_sets, n_seqs] float64 values, tokens run)``.
    """
    n, S = len(seqs), len(plan)
    pre, calls = _call_plan(seqs, reads, S, logit_width or model.d_vocab)
    out = torch.zeros(S, n, dtype=torch.float64)
    tokens = 0
    for g0, g1, chunks in tqdm(calls, desc=desc, disable=not progress, leave=False):
        sets = torch.arange(g0, g1)
        prefix = None
        if pre:
            with model.hooks(fwd=plan.hooks(model, sets)):
                prefix = model.prefix_cache(torch.tensor([list(seqs[0][:pre])], device=model.device).expand(len(sets), -1))
            tokens += pre * len(sets)
        for chunk in chunks:
            rows = [list(seqs[i][pre:]) for _ in range(len(sets)) for i in chunk]
            k = max(len(reads[i]) for i in chunk)
            pos = [[p - pre for p in reads[i]] + [reads[i][-1] - pre] * (k - len(reads[i])) for i in chunk]
            row_set = sets.repeat_interleave(len(chunk))
            batch = model.encode_batch(rows, side="right")
            logits = model.logits_at(batch, torch.tensor(pos * len(sets)), hooks=plan.hooks(model, row_set), prefix=prefix)
            vals = reduce(logits, torch.tensor(chunk * len(sets)))
            out[sets[:, None], torch.tensor(chunk)[None, :]] = vals.double().cpu().reshape(len(sets), len(chunk))
            tokens += sum(len(r) for r in rows)
    return out, tokens


def _choice(model: Model, t: Task, items: list[tuple[int, Sample, list[int]]], plan: SetFactors,
            progress: bool) -> tuple[Tensor, list[list[str]], int]:
    """Scores and predicted labels of a choice task (module docstring)."""
    c_ids, seqs, reads, tgt = _choice_rows(model, t, items)
    golds = torch.tensor([[float(c.strip() == s.gold.strip()) for c in t.choices] for _, s, _ in items])
    if not tgt:  # every label one token
        labels = torch.tensor([[c[0] for c in cs] for cs in c_ids])

        def pick(logits: Tensor, idx: Tensor) -> Tensor:
            lp = logits[:, 0].float().log_softmax(-1)
            return lp.gather(1, labels[idx].to(lp.device)).argmax(1).double()

        picks, tokens = teacher_forced(model, plan, seqs, reads, pick, progress=progress, desc=f"erased {t.name}")
        picks = picks.long()
    else:  # teacher-forced rows per (item, label): the label's total log-likelihood
        k = max(len(c) for c in tgt)
        targets = torch.tensor([c + [c[-1]] * (k - len(c)) for c in tgt])
        real = torch.tensor([[1.0] * len(c) + [0.0] * (k - len(c)) for c in tgt])

        def loglik(logits: Tensor, idx: Tensor) -> Tensor:
            lp = logits.float().log_softmax(-1)
            tok = lp.gather(2, targets[idx][:, : lp.shape[1], None].to(lp.device))[..., 0]
            return (tok * real[idx][:, : lp.shape[1]].to(tok.device)).sum(1).double()

        ll, tokens = teacher_forced(model, plan, seqs, reads, loglik, progress=progress, desc=f"erased {t.name}")
        picks = ll.reshape(len(plan), len(items), len(t.choices)).argmax(2)
    scores = golds[torch.arange(len(items))[None, :], picks].double()
    preds = [[t.choices[int(j)].strip() for j in row] for row in picks]
    return scores, preds, tokens


def _code(model: Model, items: list[tuple[int, Sample, list[int]]], plan: SetFactors, code_tokens: int,
          progress: bool) -> tuple[Tensor, list[list[str]], int]:
    enc, seqs, reads = _code_rows(model, items, code_tokens)
    k = max(len(t) for _, t in enc)
    targets = torch.tensor([t + [t[-1]] * (k - len(t)) for _, t in enc])
    real = torch.tensor([[1.0] * len(t) + [0.0] * (k - len(t)) for _, t in enc])

    def hits(logits: Tensor, idx: Tensor) -> Tensor:
        pred = logits.argmax(-1).cpu()
        m = real[idx][:, : pred.shape[1]]
        return ((pred == targets[idx][:, : pred.shape[1]]).double() * m).sum(1) / m.sum(1)

    scores, tokens = teacher_forced(model, plan, seqs, reads, hits, progress=progress, desc="erased code")
    return scores, [[""] * len(items) for _ in range(len(plan))], tokens


@torch.no_grad()
def _generate_rows(model: Model, plan: SetFactors, sets: Tensor, ids: list[int], max_new: int, stop_ids: set[int],
                   stop_text: Sequence[str]) -> tuple[list[list[int]], int]:
    """Greedy continuations of one prompt, one row per set of ``sets``, each cut where :meth:`Model.generate` stops.

    Every row keeps decoding until all rows have stopped (a stopped row's later tokens are dropped).
    """
    g = len(sets)
    fed: list[list[int]] = [[] for _ in range(g)]
    stop_at: list[int | None] = [None] * g
    tokens = 0
    with model.hooks(fwd=plan.hooks(model, sets)):
        cache = None
        if len(ids) > 1:
            cache = model.prefix_cache(torch.tensor([ids[:-1]], device=model.device).expand(g, -1)).expanded(g)
            tokens += (len(ids) - 1) * g
        for step in range(max_new):
            if cache is not None:
                last = [f[-1] for f in fed] if step else [ids[-1]] * g
                logits = model.forward(torch.tensor([[x] for x in last], device=model.device), past=cache)
                tokens += g
            else:
                logits = model.forward(torch.tensor([ids + f for f in fed], device=model.device))
                tokens += g * (len(ids) + step)
            for r, tok in enumerate(logits[:, -1].argmax(-1).tolist()):
                fed[r].append(int(tok))
                if stop_at[r] is None and ends_generation(model.decode, fed[r], stop_ids, stop_text):
                    stop_at[r] = step + 1
            if all(x is not None for x in stop_at):
                break
    return [f[:a] if a is not None else f for f, a in zip(fed, stop_at)], tokens


def decode_batches(lengths: Sequence[int], n_sets: int, max_new_tokens: int, budget: int) -> list[list[tuple[int, int]]]:
    """The ``(set, item)`` rows of each batch of an accelerator's erased generation: items in length order, each
    item's sets consecutive, as many rows per batch as ``rows · (longest prompt + max_new_tokens) <= budget``
    allows (at least one).

    Args:
        lengths: Tokens of each item's prompt.
        n_sets: Sets scored.
        max_new_tokens: Most tokens generated per row.
        budget: Keys/values one batch may hold, in tokens (:func:`decode_budget`).

    Returns:
        The batches, each a list of ``(set, item)``.

    Example:
        >>> decode_batches([3, 5], n_sets=2, max_new_tokens=3, budget=24)   # 3 rows of 8 tokens, then 1
        [[(0, 0), (1, 0), (0, 1)], [(1, 1)]]
    """
    order = sorted(range(len(lengths)), key=lambda j: lengths[j])
    batches: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    longest = 0
    for j in order:
        for k in range(n_sets):
            wide = max(longest, lengths[j])
            if cur and (len(cur) + 1) * (wide + max_new_tokens) > budget:
                batches.append(cur)
                cur, wide = [], lengths[j]
            cur.append((k, j))
            longest = wide
    if cur:
        batches.append(cur)
    return batches


def decode_budget(model: Model) -> int:
    """Keys/values, in tokens, one batch of :func:`decode_batches` holds on ``model``'s devices: :data:`GEN_TOKENS`,
    at most half the free memory of each device at its share of the layers.

    Args:
        model: The model (its layers' devices, key/value width and dtype).

    Returns:
        Tokens (at least 1).
    """
    per = 2 * model.n_layers * model.n_kv_heads * model.d_head * torch.empty((), dtype=model.dtype).element_size()
    cap = GEN_TOKENS
    for dev, share in device_shares(model).items():
        cap = min(cap, int(0.5 * free_memory(dev) / max(1.0, per * share)))
    return max(1, cap)


def _number(model: Model, t: Task, items: list[tuple[int, Sample, list[int]]], plan: SetFactors, max_new_tokens: int | None,
            progress: bool) -> tuple[Tensor, list[list[str]], int]:
    """Scores and predicted numbers of a number task (module docstring). On an accelerator the ``(set, item)`` rows of
    several items decode as one batch (:func:`decode_batches`; finished rows leave it); on a CPU one item at a time,
    its sets in groups of ``ROW_TOKENS // prompt`` rows (an item's scores then never depend on the other items)."""
    eos_id = model.special_token_id("eos")
    stop_ids = {int(eos_id)} if eos_id is not None else set()
    S = len(plan)
    max_new = max_new_tokens or t.max_new_tokens
    scores = torch.zeros(S, len(items), dtype=torch.float64)
    preds = [[""] * len(items) for _ in range(S)]
    tokens = 0

    def score(r: int, j: int, gen: list[int]) -> None:
        num = extract_number(cut_at_stops(model.decode(gen), STOPS))
        scores[r, j] = float(same_number(num, items[j][1].gold))
        preds[r][j] = num or ""

    lens = [len(p) for _, _, p in items]
    if one_pass_default(model) and model.decodes_rows(lens):
        for batch in tqdm(decode_batches(lens, S, max_new, decode_budget(model)), desc=f"erased {t.name}",
                          disable=not progress, leave=False):
            row_set = torch.tensor([k for k, _ in batch])
            d = model.decode_rows([items[j][2] for _, j in batch], max_new, sorted(stop_ids), STOPS, compact=True,
                                  row_hooks=lambda held, rs=row_set: plan.hooks(model, rs[held]))
            tokens += d.tokens_run
            for (k, j), gen in zip(batch, d.tokens):
                score(k, j, gen)
        return scores, preds, tokens
    group = min(S, max(1, ROW_TOKENS // max(lens)))
    bar = tqdm(total=len(items) * math.ceil(S / group), desc=f"erased {t.name}", disable=not progress, leave=False)
    for j, (_, _, p) in enumerate(items):
        for g0 in range(0, S, group):
            sets = torch.arange(g0, min(S, g0 + group))
            outs, n = _generate_rows(model, plan, sets, p, max_new, stop_ids, STOPS)
            tokens += n
            for r, gen in zip(sets.tolist(), outs):
                score(r, j, gen)
            bar.update(1)
    bar.close()
    return scores, preds, tokens


def scored_items(model: Model, task: Task, samples: Sequence[Sample],
                 code_tokens: int = CODE_TOKENS) -> list[tuple[int, Sample, list[int]]]:
    """``(position, sample, prompt ids)`` of the samples :func:`~tlcap.metrics.accuracy.task_accuracy` scores
    (the others do not fit the context window and are skipped).

    Args:
        model: The model (tokenizer, context window).
        task: The task (code tasks also need the reference answer to fit).
        samples: The samples.
        code_tokens: Reference tokens scored for code tasks.

    Returns:
        One tuple per sample that fits, ``position`` being its index in ``samples``.

    Raises:
        EmptyDatasetError: no sample fits.
    """
    items = []
    for i, s in enumerate(samples):
        try:
            ids = model.encode(s.prompt)
            if task.kind == "code":
                encode_sample(model, s, code_tokens)
        except PromptTooLongError:  # skipped and counted, as task_accuracy does
            continue
        items.append((i, s, ids))
    if not items:
        raise EmptyDatasetError(f"none of the {len(samples)} {task.name} samples fits the context window of {model.name}")
    return items


METRICS = {"number": "exact match (final number)", "choice": "label by likelihood", "code": "reference token accuracy"}


def erased_scores(
    model: Model,
    task: str | Task,
    samples: Sequence[Sample],
    sets: Sequence[NeuronSet],
    *,
    code_tokens: int = CODE_TOKENS,
    max_new_tokens: int | None = None,
    progress: bool = False,
) -> SetScores:
    """Per-item scores of ``task`` with each neuron set erased, many sets per forward pass (module docstring).

    Equal to ``task_accuracy(model, task, samples).scores`` inside ``erase_neurons(model, set)``
    for every set (up to float rounding of batched matrix products; tested).

    Args:
        model: The model (no weight is changed).
        task: Task name or :class:`~tlcap.data.tasks.Task`.
        samples: The evaluation samples.
        sets: The neuron sets; an empty set scores the unedited model.
        code_tokens: Reference tokens scored for code tasks.
        max_new_tokens: Generation budget for number tasks (default the task's).
        progress: Progress bars.

    Returns:
        A :class:`SetScores` (``scores[k, i]``: item ``i`` with set ``k`` erased).

    Raises:
        EmptyDatasetError: no samples, no sets, or no sample fits the context window.

    Example:
        >>> from tlcap.data.tasks import load_task
        >>> located = NeuronSet.from_list([(0, 55), (1, 23)], shape=(model.n_layers, model.d_mlp))
        >>> randoms = [located.random_like(seed=k) for k in range(3)]
        >>> sc = erased_scores(model, "emotion", load_task("emotion", split="test", n=8), [located, *randoms])
        >>> sc.accuracy          # [n_sets]
        tensor([0.2500, 0.1250, 0.1250, 0.1250], dtype=torch.float64)
    """
    t = get_task(task) if isinstance(task, str) else task
    if not samples:
        raise EmptyDatasetError(f"no samples to measure {t.name} accuracy on")
    if not sets:
        raise EmptyDatasetError("erased_scores needs at least one neuron set (an empty set scores the unedited model)")
    items = scored_items(model, t, samples, code_tokens)
    plan = SetFactors.of(model, sets, 0.0)
    t0 = time.perf_counter()
    if t.kind == "choice":
        scores, preds, tokens = _choice(model, t, items, plan, progress)
        golds = tuple(s.gold.strip() for _, s, _ in items)
    elif t.kind == "code":
        scores, preds, tokens = _code(model, items, plan, code_tokens, progress)
        golds = ("",) * len(items)
    else:
        scores, preds, tokens = _number(model, t, items, plan, max_new_tokens, progress)
        golds = tuple(s.gold for _, s, _ in items)
    return SetScores(scores, tuple(tuple(p) for p in preds), golds, tuple(i for i, _, _ in items),
                     len(samples) - len(items), METRICS[t.kind], tokens, time.perf_counter() - t0)


__all__ = ["SetScores", "common_prefix", "erased_scores", "scored_items", "teacher_forced", "decode_batches", "decode_budget",
           "MIN_PREFIX", "ROW_TOKENS", "GEN_TOKENS",
           "LOGIT_BYTES", "METRICS"]
