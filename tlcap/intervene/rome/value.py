"""ROME's key ``k*`` and value δ: the subject's keys, and the optimisation of δ (``compute_v``).

The value δ is added to the edited layer's MLP output at the subject's last token of every row
(:func:`tlcap.runtime.hooks.add_rows`): the prompt after each prefix, teacher-forced with the new
object's tokens, plus the KL "essence" prompt ``"{subject} is a"``. :func:`value_loss` is the
objective of one step; :func:`optimise_value` runs Adam on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.intervene.rome.config import RomeConfig
from tlcap.models.adapter import Model
from tlcap.runtime import hooks as H


def subject_last(model: Model, text: str, subject: str, start: int = 0, occurrence: int = 0, bos: bool = False) -> int:
    """Index (in ``model.encode(text, prepend_bos=bos)``) of the subject's last token, searching from ``start``.

    Args:
        model: The model.
        text: The text.
        subject: The subject as written in the text.
        start: Character index where the search begins (skip a prefix).
        occurrence: Which occurrence at or after ``start`` (0-based).
        bos: The text is encoded with the BOS first (the index moves by one).

    Returns:
        The token index.
    """
    return model.subject_span(text, subject, occurrence=occurrence, start=start, prepend_bos=bos).last


@torch.no_grad()
def subject_keys(
    model: Model,
    layer: int,
    texts: Sequence[str],
    subject: str,
    starts: Sequence[int],
    occurrence: int = 0,
    bos: bool = False,
) -> tuple[Float[Tensor, "n d_mlp"], Float[Tensor, "n d_model"]]:
    """``mlp_post`` (the key) and ``mlp_out`` (the value) at the subject's last token of each text.

    Args:
        model: The model.
        layer: The layer.
        texts: The texts (one batch, right-padded).
        subject: The subject as written in the texts.
        starts: Per text, the character index where the subject search begins.
        occurrence: Which occurrence at or after each start.
        bos: Prepend the model's BOS to each text.

    Returns:
        ``(keys, values)``.
    """
    keys, values = subject_keys_layers(model, [layer], texts, subject, starts, occurrence, bos)
    return keys[0], values[0]


@torch.no_grad()
def subject_keys_layers(
    model: Model,
    layers: Sequence[int],
    texts: Sequence[str],
    subject: str,
    starts: Sequence[int],
    occurrence: int = 0,
    bos: bool = False,
) -> tuple[Float[Tensor, "layer n d_mlp"], Float[Tensor, "layer n d_model"]]:
    """:func:`subject_keys` of several layers from one pass.

    Args:
        model, texts, subject, starts, occurrence, bos: As in :func:`subject_keys`.
        layers: The layers.

    Returns:
        ``(keys, values)``, layer-major.
    """
    look = torch.tensor([subject_last(model, t, subject, s, occurrence, bos) for t, s in zip(texts, starts)])
    names = [(model.hook_name("mlp_post", l), model.hook_name("mlp_out", l)) for l in layers]
    acts = model.record(model.encode_batch(list(texts), prepend_bos=bos), [n for pair in names for n in pair])
    r = torch.arange(len(texts))
    return (torch.stack([acts[k][r, look.to(acts[k].device)] for k, _ in names]),
            torch.stack([acts[v][r, look.to(acts[v].device)] for _, v in names]))


@dataclass(frozen=True)
class ValueRows:
    """The rows of the value optimisation (one right-padded batch).

    Attributes:
        tokens: The rewriting rows (prefix + prompt + new object's tokens but the last), then the
            KL rows.
        look: Per row, the subject's last token (where δ is added).
        target_rows, target_pos, target_ids: The teacher-forced new-object tokens: row, position
            whose logits predict it, and token id.
        n_rewrite: Rewriting rows (the KL rows follow them).
        n_target: Tokens of the new object.
    """

    tokens: Int[Tensor, "rows pos"]
    look: Int[Tensor, " rows"]
    target_rows: Int[Tensor, " n"]
    target_pos: Int[Tensor, " n"]
    target_ids: Int[Tensor, " n"]
    n_rewrite: int
    n_target: int


def value_rows(
    model: Model,
    prompt: str,
    subject: str,
    target_ids: Sequence[int],
    config: RomeConfig,
    occurrence: int = 0,
) -> ValueRows:
    """Build the rows of :func:`optimise_value` (ROME's rewriting prompts and KL prompt).

    Args:
        model: The model.
        prompt: The edited prompt.
        subject: The subject as written in the prompt.
        target_ids: The new object's token ids after the prompt.
        config: Prefixes and the KL prompt template.
        occurrence: Which occurrence of the subject in the prompt (``config.bos`` prepends the BOS
            to every row).

    Returns:
        The :class:`ValueRows`.
    """
    rows, look, tgt = [], [], []
    for r, p in enumerate(config.prefixes):
        text = p + prompt
        ids = model.encode(text, prepend_bos=config.bos)
        look.append(subject_last(model, text, subject, len(p), occurrence, config.bos))
        start = len(ids) - 1
        rows.append(ids + list(target_ids[:-1]))
        tgt += [(r, start + j, tid) for j, tid in enumerate(target_ids)]
    kl_text = config.kl_prompt.format(subject)
    rows.append(model.encode(kl_text, prepend_bos=config.bos))
    look.append(subject_last(model, kl_text, subject, 0, 0, config.bos))
    dev = model.device
    return ValueRows(
        tokens=model.encode_batch(rows).tokens,
        look=torch.tensor(look, device=dev),
        target_rows=torch.tensor([a for a, _, _ in tgt], device=dev),
        target_pos=torch.tensor([b for _, b, _ in tgt], device=dev),
        target_ids=torch.tensor([c for _, _, c in tgt], device=dev),
        n_rewrite=len(config.prefixes),
        n_target=len(target_ids),
    )


@dataclass(frozen=True)
class LossTerms:
    """The terms of one step's objective (scalars; ``total`` carries the gradient)."""

    total: Tensor
    nll: Tensor
    kl: Tensor
    weight_decay: Tensor


def kl_logprobs(logits: Float[Tensor, "rows pos d_vocab"], rows: ValueRows) -> Float[Tensor, "n_kl d_vocab"]:
    """Log-probabilities of the next token at the subject's last token of the KL rows.

    Args:
        logits: ``[rows, pos, d_vocab]`` logits of the value optimisation's batch.
        rows: The batch's rows (the KL rows follow the ``n_rewrite`` rewriting rows).

    Returns:
        ``[n_kl, d_vocab]`` float32 log-softmax of each KL row at its ``look`` position.
    """
    n = rows.n_rewrite
    kl_rows = torch.arange(n, rows.tokens.shape[0], device=logits.device)
    return logits[kl_rows, rows.look[n:]].float().log_softmax(-1)


def value_loss(
    logits: Float[Tensor, "rows pos d_vocab"],
    rows: ValueRows,
    kl_init: Float[Tensor, "n_kl d_vocab"],
    delta: Float[Tensor, " d_model"],
    v0_norm: float,
    config: RomeConfig,
) -> LossTerms:
    """The objective of one step of the value optimisation, exactly as ROME's ``compute_v``.

    ``total = nll + kl_factor · kl + weight_decay``, where (official code, ``rome/compute_v.py``):

    - ``nll``: per rewriting row, the new object's token log-probabilities summed and divided by
      the number of its tokens; then the mean over rows (``nll_loss_each.mean()``);
    - ``kl`` = KL(current ‖ init) of the next-token distribution at the subject's last token of
      the KL rows, mean over those rows. The official ``kl_div(kl_distr_init, kl_log_probs,
      log_target=True, reduction="batchmean")`` passes the *initial* log-probabilities as
      torch's ``input`` and the *current* ones as its ``target``; torch computes
      ``Σ target · (log target − input)``, i.e. ``Σ p_cur (log p_cur − log p_init)`` =
      KL(current ‖ init) — the direction of the paper's eq. 4, D_KL(P_G'[x|p'] ‖ P_G[x|p']);
    - ``weight_decay`` = ``wd · ‖δ‖ / ‖v₀‖²`` — the norm of δ, not its square, over the squared
      norm of the initial output (``v_weight_decay * (norm(delta) / norm(target_init) ** 2)``).

    Args:
        logits: Logits of the rows with δ added.
        rows: The :class:`ValueRows`.
        kl_init: KL rows' log-probabilities before any δ (step 0).
        delta: δ.
        v0_norm: ‖v₀‖, the layer's output at the subject's last token of the bare prompt.
        config: ``kl_factor`` and ``weight_decay``.

    Returns:
        The :class:`LossTerms` (``kl`` before its factor).
    """
    logp = logits[: rows.n_rewrite].float().log_softmax(-1)
    token_lp = logp[rows.target_rows, rows.target_pos, rows.target_ids]
    per_row = torch.zeros(rows.n_rewrite, device=logp.device).index_add(0, rows.target_rows, token_lp)
    nll = -(per_row / rows.n_target).mean()
    cur = kl_logprobs(logits, rows)
    kl = (cur.exp() * (cur - kl_init)).sum(-1).mean()  # KL(current ‖ init), batchmean over the KL rows
    wd = config.weight_decay * delta.norm() / max(v0_norm**2, 1e-12)
    return LossTerms(total=nll + config.kl_factor * kl + wd, nll=nll, kl=kl, weight_decay=wd)


@dataclass(frozen=True)
class ValueStep:
    """The objective's terms at one step (``kl`` before its factor)."""

    total: float
    nll: float
    kl: float
    weight_decay: float


def optimise_value(
    model: Model,
    layer: int,
    rows: ValueRows,
    v0: Float[Tensor, " d_model"],
    config: RomeConfig,
    progress: bool = False,
) -> tuple[Float[Tensor, " d_model"], list[ValueStep]]:
    """Optimise δ with Adam (ROME's ``compute_v``); returns δ and the objective at each step.

    As the official loop: at each of ``steps`` iterations the objective (:func:`value_loss`) is
    evaluated; the loop stops when the *total* loss is below ``stop_loss`` (before updating), and
    the last iteration only evaluates, so δ gets at most ``steps − 1`` Adam updates; after each
    update δ is projected into the ball ‖δ‖ ≤ ``clamp_norm_factor`` · ‖v₀‖.

    Args:
        model: The model (not modified: δ is added by a hook).
        layer: The edited layer.
        rows: From :func:`value_rows`.
        v0: The layer's output at the subject's last token of the bare prompt.
        config: The hyper-parameters.
        progress: Show a progress bar.

    Returns:
        ``(delta, steps)``: δ after the last update, and the objective's terms at every
        evaluated iteration (the last entry is the final δ's).
    """
    ((delta, steps),) = optimise_values(model, [layer], rows, v0[None], config, 1, progress=progress)
    return delta, steps


def optimise_values(
    model: Model,
    layers: Sequence[int],
    rows: ValueRows,
    v0s: Float[Tensor, "layer d_model"],
    config: RomeConfig,
    layers_per_pass: int,
    progress: bool = False,
) -> list[tuple[Float[Tensor, " d_model"], list[ValueStep]]]:
    """:func:`optimise_value` of the same rows at several layers, the layers' rows sharing passes.

    Layer ``j``'s copy of the rows gets its own δ_j at its own layer's ``mlp_out``; the copies never interact, so
    the summed objective's gradient for δ_j is that of layer ``j``'s objective alone, and each δ_j has its own Adam
    and the official loop's steps, stop and norm clamp (:func:`optimise_value`, which is this function for one
    layer). A layer whose loss is below ``stop_loss`` leaves the later passes. Equal to one layer at a time up to
    the float rounding of a batch (tested).

    Args:
        model: The model (not modified).
        layers: The edited layers (one edit each).
        rows: From :func:`value_rows` (the same for every layer).
        v0s: Each layer's output at the subject's last token of the bare prompt.
        config: The hyper-parameters.
        layers_per_pass: Layers whose rows one pass holds (the rest wait for the next pass of the same step).
        progress: Show a progress bar over the steps.

    Returns:
        Per layer, ``(delta, steps)`` as :func:`optimise_value` returns them.
    """
    n, L = rows.tokens.shape[0], len(layers)
    deltas = [torch.zeros(model.d_model, device=model.device, requires_grad=True) for _ in layers]
    opts = [torch.optim.Adam([d], lr=config.lr) for d in deltas]
    v0_norm = v0s.norm(dim=-1).tolist()  # as optimise_value's float(v0.norm()), in the model's dtype
    kl_init: list[Tensor | None] = [None] * L
    steps: list[list[ValueStep]] = [[] for _ in layers]
    active = list(range(L))
    look = rows.look.to(model.device)
    desc = f"ROME value (layer {layers[0]})" if L == 1 else f"ROME value ({L} layers)"
    for it in tqdm(range(config.steps), desc=desc, disable=not progress):
        going = []
        for c0 in range(0, len(active), max(1, layers_per_pass)):
            chunk = active[c0:c0 + max(1, layers_per_pass)]
            hooks = [(model.hook_name("mlp_out", layers[j]),
                      H.add_rows(torch.arange(t * n, (t + 1) * n, device=model.device), look, deltas[j]))
                     for t, j in enumerate(chunk)]
            logits = model.logits(rows.tokens.repeat(len(chunk), 1), hooks=hooks)
            terms = []
            for t, j in enumerate(chunk):
                lg = logits[t * n:(t + 1) * n]
                if kl_init[j] is None:
                    kl_init[j] = kl_logprobs(lg, rows).detach().clone()
                terms.append(value_loss(lg, rows, kl_init[j], deltas[j], v0_norm[j], config))  # type: ignore[arg-type]
            vals = torch.stack([torch.stack([x.total, x.nll, x.kl, x.weight_decay]) for x in terms]).detach().tolist()
            go = []
            for t, j in enumerate(chunk):
                steps[j].append(ValueStep(*(float(v) for v in vals[t])))
                if not (vals[t][0] < config.stop_loss or it == config.steps - 1):
                    go.append(t)
            if go:
                for t in go:
                    opts[chunk[t]].zero_grad()
                sum(terms[t].total for t in go).backward()  # type: ignore[union-attr]
                js = [chunk[t] for t in go]
                for j in js:
                    opts[j].step()
                with torch.no_grad():  # ‖δ‖ ≤ clamp·‖v₀‖ without a host read: ×min(1, max/‖δ‖), ×1 leaves δ as it is
                    norms = torch.stack([deltas[j].norm() for j in js])
                    cap = torch.tensor([config.clamp_norm_factor * v0_norm[j] for j in js], device=norms.device)
                    shrink = torch.where(norms > cap, cap / norms, torch.ones_like(norms))
                    for t, j in enumerate(js):
                        deltas[j].mul_(shrink[t])
            going += [chunk[t] for t in go]
        active = going
        if not active:
            break
    return [(d.detach(), s) for d, s in zip(deltas, steps)]


__all__ = ["LossTerms", "ValueRows", "ValueStep", "kl_logprobs", "optimise_value", "optimise_values", "subject_keys",
           "subject_keys_layers", "subject_last", "value_loss", "value_rows"]
