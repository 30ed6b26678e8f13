"""Masked fine-tuning of MLP neurons (the CNL enhance experiment).

Only the weights *of chosen neurons* learn: for every MLP layer the neuron's row of the input
projections (``up``/``gate`` for Llama, ``c_fc`` column + bias for GPT-2) and its column of the
down projection. After each backward pass the gradients are multiplied by a 0/1 mask along the
neuron axis, so every other entry keeps its exact value (Adam without weight decay moves an
entry only if it ever had a non-zero gradient). The mask is applied to ``param.grad`` between
``backward()`` and ``step()`` — no hooks on the model.

Modes (CNL §5 Table 2):
- ``"located"``: train the given neurons (paper: 0.15 % of the neuron parameters).
- ``"random"``: pass ``neurons.random_like(seed)`` (same count per layer) with ``"located"``.
- ``"except"``: train every MLP neuron *except* the given ones, which keep their values. The
  paper's "w/o located" (the located neurons set to 0, the other 99.85 % of the neuron
  parameters tuned) is ``erase_neurons`` + ``"except"``: :func:`tlcap.experiments.cnl.tuned` with
  ``mode="wo_located"``. Attention and embeddings stay frozen in every mode, so the modes differ
  only in which neurons learn.

The loss is the mean NLL of the answer tokens under teacher forcing (prompt tokens are context
only), one sample per step, Adam (lr 1e-5 by default, as in the paper). Every touched parameter is
snapshotted first: the returned :class:`~tlcap.intervene.weights.WeightEdit` restores the
model exactly with ``.undo()``. When the trained neurons are few (at most :data:`SLICE_SHARE` of a
layer's, e.g. ``"located"``), Adam runs on their slices only and writes them back: the same weights
bit for bit as the full masked step (an entry whose gradient is always 0 never moves under Adam),
without touching the frozen neurons' moments and weights each step.

Half precision (``precision=``): in a bfloat16 model Adam's steps of about ``lr`` = 1e-5 are below half a
bfloat16 ulp of most weights (a weight of 0.02 has an ulp of 1.2e-4), so an Adam that keeps the weights and
moments in bfloat16 (``"param"``) rounds most updates away: on SmolLM2-135M in bfloat16, 8 steps of
``"located"`` fine-tuning moved 1.7 % of the trained entries (float32: 99.99 %). ``"compensated"`` (the default
for a bfloat16 or float16 model, ``"auto"``) keeps float32 Adam moments for the trained entries and a residual
per trained entry in the parameter's dtype holding what the weight's rounding lost (compensated summation): the
weight plus its residual follows float32 Adam to about 16 significant bits, for 10 bytes per trained entry
(residual, two float32 moments; the snapshot for the undo is kept in host memory, ``WeightEdit(host=True)``)
instead of 12 for float32 master weights. Each parameter steps as
soon as its gradient is complete in the backward pass and its gradient is freed there, so no full set of
gradients is ever held. On a float32 model ``"compensated"`` equals ``"param"`` bit for bit (tested).

Example:
    >>> from tlcap.data.tasks import load_task
    >>> from tlcap.metrics.accuracy import task_accuracy
    >>> train = load_task("emotion", split="train", n=4)
    >>> test = load_task("emotion", split="test", n=4)
    >>> neurons = NeuronSet(((0, 1), (1, 2)), shape=(model.n_layers, model.d_mlp))
    >>> w_out = model.mlp_out_weight(1).neuron_view().clone()
    >>> edit = masked_finetune(model, train, neurons, epochs=2, on_epoch=lambda e: print("epoch", e), progress=False)
    epoch 1
    epoch 2
    >>> edit.meta
    {'steps': 8, 'skipped': 0, 'precision': 'param'}
    >>> acc = task_accuracy(model, "emotion", test)
    >>> acc.task, len(acc.scores)
    ('emotion', 4)
    >>> torch.equal(model.mlp_out_weight(1).neuron_view()[2], w_out[2])     # neuron (1, 2) learned
    False
    >>> edit.undo()
    >>> torch.equal(model.mlp_out_weight(1).neuron_view(), w_out)            # restored exactly
    True
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Literal

import torch
from tqdm.auto import tqdm

from tlcap.config import check_float, check_int
from tlcap.data.sample import Sample
from tlcap.data.tasks import encode_sample
from tlcap.errors import EmptyDatasetError, EmptyNeuronSetError, PromptTooLongError, UnknownNameError, UnsupportedModelError
from tlcap.intervene.weights import WeightEdit
from tlcap.metrics.sets import NeuronSet
from tlcap.models.adapter import Model, WeightSlice

Mode = Literal["located", "except"]
Precision = Literal["auto", "param", "compensated"]
PRECISIONS: tuple[str, ...] = ("auto", "param", "compensated")
HALF = (torch.bfloat16, torch.float16)


def neuron_params(model: Model, neurons: NeuronSet, mode: Mode = "located") -> list[tuple[WeightSlice, torch.Tensor]]:
    """The MLP weight slices to train and their boolean masks (same shape as the parameter).

    Args:
        model: The model.
        neurons: The located (or random) neurons.
        mode: ``"located"`` trains ``neurons``; ``"except"`` trains all other neurons.

    Returns:
        ``(weight slice, mask)`` per trained MLP in/out weight of every layer with a trained neuron; the
        mask is ``d_mlp`` long along the parameter's neuron axis and 1 along the others (it broadcasts
        against the parameter and its gradient, and costs ``d_mlp`` bytes, not the parameter's size).

    Raises:
        UnknownNameError: ``mode`` is neither ``"located"`` nor ``"except"``.
    """
    if mode not in ("located", "except"):
        raise UnknownNameError.of("fine-tuning mode", mode, ("located", "except"))
    by_layer = neurons.by_layer()
    layers = sorted(by_layer) if mode == "located" else list(range(model.n_layers))
    out = []
    for l in layers:
        sel = torch.zeros(model.d_mlp, dtype=torch.bool)
        sel[by_layer.get(l, [])] = True
        if mode == "except":
            sel = ~sel
        if not sel.any():
            continue
        for ws in [model.mlp_out_weight(l), *model.mlp_in_weights(l)]:
            if ws.offloaded:  # its values enter the module around each forward only: no gradient would reach them
                raise UnsupportedModelError(
                    f"masked fine-tuning needs layer {l}'s MLP weights on a device, but they are offloaded (CPU/disk "
                    "device map); load the model split over GPUs only (n_devices=, or a device_map without cpu/disk)")
            shape = [1] * ws.param.ndim
            shape[ws.neuron_dim] = model.d_mlp
            out.append((ws, sel.reshape(shape).to(ws.param.device)))
    return out


def trained_params(
    plan: list[tuple[WeightSlice, torch.Tensor]],
) -> tuple[list[torch.nn.Parameter], dict[int, torch.Tensor], dict[int, int]]:
    """The distinct parameters of a :func:`neuron_params` plan, each one's trained-neuron mask (the union over the
    slices it holds) and its neuron axis, keyed by ``id(param)``.

    Args:
        plan: From :func:`neuron_params`.

    Returns:
        ``(parameters, masks, neuron axes)``.
    """
    params = list({id(ws.param): ws.param for ws, _ in plan}.values())
    masks: dict[int, torch.Tensor] = {}
    dims: dict[int, int] = {}
    for ws, m in plan:
        masks[id(ws.param)] = m if id(ws.param) not in masks else masks[id(ws.param)] | m
        dims[id(ws.param)] = ws.neuron_dim
    return params, masks, dims


def masked_finetune(
    model: Model,
    samples: Sequence[Sample],
    neurons: NeuronSet,
    *,
    mode: Mode = "located",
    epochs: int = 1,
    lr: float = 1e-5,
    max_answer_tokens: int | None = 16,
    seed: int = 0,
    on_epoch: Callable[[int], None] | None = None,
    edit: WeightEdit | None = None,
    precision: Precision = "auto",
    progress: bool = True,
    label: str | None = None,
) -> WeightEdit:
    """Fine-tune only the chosen neurons' MLP in/out weights (module docstring).

    Args:
        model: The model (edited in place; undo with the returned handle).
        samples: Training samples (prompt → answer).
        neurons: The located (or random) neurons.
        mode: ``"located"`` trains ``neurons``; ``"except"`` trains all other neurons.
        epochs: Passes over ``samples`` (shuffled with ``seed`` each epoch).
        lr: Adam learning rate (paper: 1e-5).
        max_answer_tokens: Answer tokens in the loss (None = all).
        seed: Shuffle seed.
        on_epoch: Called with the epoch number (1-based) after each epoch, e.g. to evaluate.
        edit: An existing :class:`WeightEdit` to record into (default a new one).
        precision: ``"param"`` (Adam in the parameters' dtype), ``"compensated"`` (float32 moments and a
            rounding residual per trained entry, module docstring) or ``"auto"`` (``"compensated"`` when a
            trained parameter is bfloat16 or float16, else ``"param"``).
        progress: Show a progress bar.
        label: What the progress bar calls this run (default ``mode``; :func:`tlcap.experiments.cnl.tuned` names
            the experiment's mode and random draw).

    Returns:
        The :class:`WeightEdit` holding the snapshots (``.undo()`` restores the weights);
        ``edit.meta`` records ``{"steps": ..., "skipped": ..., "precision": ...}`` (the precision used).

    Raises:
        InvalidConfigError: ``epochs < 1`` or ``lr <= 0``.
        UnknownNameError: an unknown ``precision``.
        EmptyNeuronSetError: ``mode="located"`` with no neurons.
        EmptyDatasetError: no training sample (or none that fits the context window).

    Any exception raised while training (or by ``on_epoch``) first restores every parameter this
    edit touched (with ``edit=`` given: everything recorded in it), then propagates.
    """
    check_int("epochs", epochs, min=1)
    check_float("lr", lr, gt=0)
    if precision not in PRECISIONS:
        raise UnknownNameError.of("fine-tuning precision", precision, PRECISIONS)
    if not samples:
        raise EmptyDatasetError("masked_finetune needs training samples")
    if mode == "located" and not len(neurons):
        raise EmptyNeuronSetError("the neuron set to fine-tune is empty (0 neurons); lower sigma or locate on more samples")
    plan = neuron_params(model, neurons, mode)
    encoded, skipped = [], 0
    for s in samples:
        try:
            encoded.append(encode_sample(model, s, max_answer_tokens))
        except PromptTooLongError:
            skipped += 1
    encoded = [(p, t) for p, t in encoded if t]
    if not encoded:
        raise EmptyDatasetError(f"none of the {len(samples)} training samples has answer tokens within the context window")
    edit = edit if edit is not None else WeightEdit(host=True)
    uniq, masks, dims = trained_params(plan)
    for p in uniq:
        edit.touch(p)
    if precision == "auto":
        precision = "compensated" if any(p.dtype in HALF for p in uniq) else "param"
    if precision == "compensated":
        scratch = _Scratch()  # one set of working buffers for every parameter's step
        steppers = [_CompensatedAdam(p, dims[id(p)], masks[id(p)], lr, scratch) for p in uniq]
        slices, opt = [], None
    else:
        steppers = []
        slices = _trained_slices(uniq, masks, dims)
        # one parameter at a time: the multi-tensor path allocates temporaries as large as every trained matrix at once
        opt = torch.optim.Adam([s.leaf for s in slices] if slices else uniq, lr=lr, foreach=False)
    rng = random.Random(seed)
    model.eval()
    steps = 0
    handles: list = []
    try:
        for p in uniq:
            p.requires_grad_(True)
        handles = [p.register_post_accumulate_grad_hook(st.hook) for p, st in zip(uniq, steppers)]
        for epoch in range(1, epochs + 1):
            order = list(range(len(encoded)))
            rng.shuffle(order)
            for k in tqdm(order, desc=f"finetune {label or mode} epoch {epoch}", disable=not progress, leave=False):
                p_ids, t_ids = encoded[k]
                toks = torch.tensor([p_ids + t_ids[:-1]], device=model.device)
                logits = model.logits(toks)[0, len(p_ids) - 1 :].float()
                loss = torch.nn.functional.cross_entropy(logits, torch.tensor(t_ids, device=model.device))
                if opt is None:  # each parameter steps in the backward pass, as its gradient completes
                    loss.backward()
                    steps += 1
                    continue
                opt.zero_grad(set_to_none=False)
                if slices:  # the optimiser holds the slices: the parameters' own gradients are cleared here
                    for p in uniq:
                        if p.grad is not None:
                            p.grad.zero_()
                loss.backward()
                if slices:  # Adam on the trained neurons' slices only: the same values, a fraction of the work
                    for sl in slices:
                        sl.step_grad()
                    opt.step()
                    for sl in slices:
                        sl.write_back()
                else:
                    for p in uniq:
                        if p.grad is not None:
                            p.grad.mul_(masks[id(p)])
                    opt.step()
                steps += 1
            if on_epoch is not None:
                for p in uniq:
                    p.requires_grad_(False)
                on_epoch(epoch)
                for p in uniq:
                    p.requires_grad_(True)
    except BaseException:
        _release(uniq, handles)
        edit.undo()
        raise
    _release(uniq, handles)
    edit.meta = {"steps": steps, "skipped": skipped, "precision": precision}
    return edit


def _release(params: list[torch.nn.Parameter], handles: list) -> None:
    for h in handles:
        h.remove()
    for p in params:
        p.requires_grad_(False)
        p.grad = None


SLICE_SHARE = 0.5
"""Adam runs on the trained neurons' slices (:class:`_Slice`) when they are at most this share of the neurons."""


class _Slice:
    """The trained neurons' slice of one parameter, as a leaf of its own for Adam.

    With the masked gradient, Adam never moves an entry whose gradient is always 0 (its moments stay 0, so its
    update is ``0 / (0 + eps) = 0``): running Adam on the trained neurons' slice and writing it back gives every
    entry the value the full masked step gives (Adam is elementwise), without reading and writing the moments,
    gradient and weights of the frozen neurons at every step — most of a step's memory traffic in ``"located"``
    mode (0.15 % of the neurons trained). Tested equal to the full masked step.
    """

    def __init__(self, param: torch.nn.Parameter, dim: int, idx: torch.Tensor) -> None:
        self.param, self.dim, self.idx = param, dim, idx
        self.leaf = param.detach().index_select(dim, idx).clone().requires_grad_(True)

    def step_grad(self) -> None:
        """The slice's gradient from the parameter's."""
        grad = self.param.grad
        self.leaf.grad = None if grad is None else grad.index_select(self.dim, self.idx)

    def write_back(self) -> None:
        """The slice's new values into the parameter."""
        with torch.no_grad():
            self.param.index_copy_(self.dim, self.idx, self.leaf.detach())


class _CompensatedAdam:
    """Adam (``torch.optim.Adam``'s single-tensor arithmetic, no weight decay) of one parameter's trained entries
    with float32 moments and a rounding residual in the parameter's dtype (``precision="compensated"``).

    The trained entries are the parameter's slice of trained neurons when they are at most :data:`SLICE_SHARE` of
    them, else the whole parameter with the mask applied to its gradient (a masked entry's moments stay 0, so it
    never moves). Each step computes ``w + r`` in float32, applies the Adam update, stores its rounding to the
    parameter's dtype as the weight and the remainder as ``r``. On a float32 parameter ``r`` stays 0 and the
    weights are ``torch.optim.Adam``'s bit for bit.
    """

    BETAS = (0.9, 0.999)
    EPS = 1e-8

    def __init__(self, param: torch.nn.Parameter, dim: int, mask: torch.Tensor, lr: float,
                 scratch: _Scratch | None = None) -> None:
        self.param, self.dim, self.lr = param, dim, lr
        self.scratch = scratch if scratch is not None else _Scratch()
        self.idx = _slice_index(mask, param.device)
        self.mask = None if self.idx is not None else mask
        part = self._read()
        self.residual = torch.zeros_like(part)
        self.exp_avg = torch.zeros_like(part, dtype=torch.float32)
        self.exp_avg_sq = torch.zeros_like(part, dtype=torch.float32)
        self.steps = 0

    def _read(self) -> torch.Tensor:
        data = self.param.detach()
        return data if self.idx is None else data.index_select(self.dim, self.idx)

    def hook(self, param: torch.Tensor) -> None:
        """Step with ``param.grad`` (complete) and free it: a post-accumulate-grad hook of the parameter."""
        grad, param.grad = param.grad, None
        if grad is not None:
            self.step(grad)

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        """One Adam step of the trained entries from the parameter's full gradient ``grad``."""
        # Elementwise and memory-bound ("except" mode at 7B: 4.3 B entries a step), so no pass over the entries is a
        # copy (the masked gradient is written in float32 at once, its 0/1 mask exact in any dtype; the weight is
        # rounded straight into the parameter, the residual computed from it), and the float32 working tensors are
        # :class:`_Scratch` buffers shared by every parameter's step, not fresh allocations (a CPU pays page faults
        # for each). Bit for bit the arithmetic of ``benchmarks/bench_compensated_adam.py``'s reference.
        shape = self.exp_avg.shape
        g = self.scratch.take("grad", shape, grad.device)
        if self.mask is not None:
            torch.mul(grad, self.mask, out=g)
        else:
            g.copy_(grad if self.idx is None else grad.index_select(self.dim, self.idx))
        self.steps += 1
        b1, b2 = self.BETAS
        self.exp_avg.lerp_(g, 1 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1**self.steps, 1 - b2**self.steps
        denom = torch.sqrt(self.exp_avg_sq, out=self.scratch.take("denom", shape, grad.device))
        denom.div_(bc2**0.5).add_(self.EPS)
        exact = self.scratch.take("exact", shape, grad.device)
        exact.copy_(self._read()).add_(self.residual)
        exact.addcdiv_(self.exp_avg, denom, value=-self.lr / bc1)
        if self.idx is None:
            self.param.data.copy_(exact)  # rounded to the parameter's dtype, as .to() rounds
            torch.sub(exact, self.param.data, out=self.residual)  # in float32, rounded to the residual's dtype
        else:
            new = exact.to(self.param.dtype, copy=True)
            torch.sub(exact, new, out=self.residual)
            self.param.data.index_copy_(self.dim, self.idx, new)


class _Scratch:
    """Float32 working buffers of :class:`_CompensatedAdam`'s steps, one per name and device, grown to the largest
    parameter that asks and shared by every parameter of a fine-tuning run (the steps run in the backward pass, one
    at a time on each device: autograd runs one thread per device, hence one buffer set per device)."""

    def __init__(self) -> None:
        self.buffers: dict[tuple[str, torch.device], torch.Tensor] = {}

    def take(self, name: str, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """The buffer ``name`` on ``device`` as a tensor of ``shape`` (its contents are left over from the last use)."""
        n = math.prod(shape)
        buf = self.buffers.get((name, device))
        if buf is None or buf.numel() < n:
            buf = self.buffers[(name, device)] = torch.empty(n, dtype=torch.float32, device=device)
        return buf[:n].view(shape)


def _trained_slices(params: list[torch.nn.Parameter], masks: dict[int, torch.Tensor],
                    dims: dict[int, int]) -> list[_Slice]:
    """One :class:`_Slice` per parameter when the trained neurons are at most :data:`SLICE_SHARE` of each; else
    none (the full masked step, e.g. ``"except"`` mode)."""
    sel = {id(p): _slice_index(masks[id(p)], p.device) for p in params}
    if any(i is None for i in sel.values()):
        return []
    return [_Slice(p, dims[id(p)], sel[id(p)]) for p in params]  # type: ignore[arg-type]


def _slice_index(mask: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """The trained neurons' indices when they are at most :data:`SLICE_SHARE` of the mask's (Adam then runs on their
    slice), else None (the whole parameter, gradient masked)."""
    sel = mask.flatten().nonzero()[:, 0]
    return sel.to(device) if len(sel) <= SLICE_SHARE * mask.numel() else None


def trained_fraction(model: Model, neurons: NeuronSet, mode: Mode = "located") -> float:
    """Share of all MLP-neuron parameters that ``mode`` trains (paper: 0.15 % located).

    Args:
        model: The model.
        neurons: The located (or random) neurons.
        mode: ``"located"`` or ``"except"`` (as :func:`masked_finetune`).

    Returns:
        Trained MLP-neuron parameters over all of them, in ``[0, 1]``.
    """
    n = sum(int(m.sum()) * ws.param.numel() // m.numel() for ws, m in neuron_params(model, neurons, mode))
    total = sum(ws.param.numel() for ws, _ in neuron_params(model, NeuronSet((), neurons.shape), "except"))
    return n / total


__all__ = ["PRECISIONS", "masked_finetune", "neuron_params", "trained_fraction", "trained_params"]
