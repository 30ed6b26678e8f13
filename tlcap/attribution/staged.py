"""Exact IG rows run as staged rows: each row joins the forward pass at the layer it scales.

The rows of a round (:func:`tlcap.attribution.grouped.run_rows`) scale layer ``l`` of a unit at one
quadrature node each; below ``l`` such a row is the unit's clean run. Here a batch holds rows of every
layer at once (:meth:`tlcap.models.Model.continue_staged`): rows are grouped into *pieces* of ``W``
consecutive rows of one unit (sorted by layer), a piece joins at the ``resid_pre`` site of its first
row's layer from the unit's recorded clean residual stream (``Unit.states``), and each row's neurons are
set at its layer's hook. So every row runs only the layers from its own (or, within a piece, its
piece's first) layer up, in one forward and one backward pass per batch, instead of every layer from a
layer group's lowest one, one pass per group. The results are those of the one-unit-at-a-time runs up
to float rounding (tested on every family).

The width ``W`` is chosen per batch by :func:`choose_width`, which weighs the layers each piece runs
(rows, padding positions, rows that wait in a piece for their layer) against the piece's copy of its
prefix's keys/values (a prefix copy per piece and layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from tlcap.attribution.config import IGConfig
from tlcap.attribution.quadrature import quadrature
from tlcap.models.adapter import Model, PaddedPrefix
from tlcap.models.staged_rows import Staging
from tlcap.models.unembedding import target_prob, target_probs

PIECE_WEIGHT = 1.0
"""Multiplier of a piece's own cost (its prefix copy) in :func:`choose_width` against the rows' layers (1.0: the
compute model below; a device where many narrow pieces cost more than modelled wants more)."""


def staged_applies(model: Model, hook_names: Sequence[str]) -> bool:
    """Whether the rows of these hooks can run staged (a TransformerBridge that packs rows).

    Args:
        model: The model.
        hook_names: The hooks whose activations the rows set.

    Returns:
        True when :func:`run_staged` can run these rows.
    """
    return model.continues_rows and model.staged_rows_apply([(n, _set_rows(None, None)) for n in hook_names])


def _candidates(counts: list[int], per_layer: list[int]) -> list[int]:
    """Piece widths worth trying: multiples and halves of the rows per (unit, layer), powers of two."""
    top = max(counts)
    cand = {top}
    for k in set(per_layer):
        cand.update(k * j for j in range(1, 9))
        cand.update(-(-k // j) for j in (2, 3, 4))
    cand.update(2 ** j for j in range(2, 12))
    return sorted(c for c in cand if 1 <= c <= top)


def choose_width(model: Model, seg_layers: Sequence[Tensor], seg_prefix: Sequence[int],
                 per_layer: list[int]) -> int:
    """The piece width of a batch with the lowest estimated cost.

    A piece of width ``W`` joining at layer ``j`` runs ``n_layers - j`` layers at
    ``W · (1 + (n + W) / (6 d_model))`` (its positions; the attention over ``n + W`` keys) plus ``n · κ``
    for its copy of the ``n``-token prefix (``κ``: a key/value position's bytes against a position's
    kept activations).

    Args:
        model: The model (shapes).
        seg_layers: Per context of the batch, the model layer of each of its rows (ascending).
        seg_prefix: Per context, its prefix length.
        per_layer: Rows per (unit, layer) in the batch (candidate widths).

    Returns:
        The piece width (rows per piece), among the candidate widths, of the lowest estimated cost.
    """
    L, d = model.n_layers, model.d_model
    kappa = 2 * model.n_kv_heads * model.d_head / (12 * d + 4 * model.d_mlp)
    R = max(len(x) for x in seg_layers)
    lay = torch.full((len(seg_layers), R), L, dtype=torch.float64)
    for c, x in enumerate(seg_layers):
        lay[c, : len(x)] = x.double()
    counts = torch.tensor([len(x) for x in seg_layers], dtype=torch.float64)
    n = torch.tensor([float(v) for v in seg_prefix], dtype=torch.float64)
    best, best_w = float("inf"), R
    for w in _candidates([len(x) for x in seg_layers], per_layer):
        starts = torch.arange(0, R, w)
        valid = starts[None, :] < counts[:, None]
        depth = (L - lay[:, starts]) * valid
        per_piece = w * (1 + (n + w) / (6 * d)) + n * kappa * PIECE_WEIGHT
        cost = float((depth * per_piece[:, None]).sum())
        if cost < best - 1e-9:
            best, best_w = cost, w
    return int(best_w)


def run_staged(model: Model, units: Sequence[Any], prefix: PaddedPrefix, hook_names: Sequence[str],
               layers: Sequence[int], cfg: IGConfig, batch_rows: int, steps: Int[Tensor, "unit layer"],
               with_base: bool | Sequence[bool]) -> tuple[Float[Tensor, "unit layer d"], Float[Tensor, "unit layer"]]:
    """:func:`tlcap.attribution.grouped.run_rows` with staged rows (module docstring).

    Rows are laid out layer-major (layers ascending, then units) and cut into batches of ``batch_rows``
    consecutive rows, so a batch that cannot hold every row runs as few layers as the split allows.

    Args:
        model: The model (a TransformerBridge that packs rows, :func:`staged_applies`).
        units: The units (:func:`tlcap.attribution.grouped.make_units`).
        prefix: Their prefixes.
        hook_names: The neuron site's hook of each scored layer.
        layers: The scored layers.
        cfg: The settings (``rule``).
        batch_rows: Rows per batch.
        steps: ``[units, layers]`` quadrature nodes per layer (0: skipped).
        with_base: Also run each layer's baseline row (``p_base``): for every unit, or per unit.

    Returns:
        ``(attr, p_base)``: ``[units, layers, d]`` attribution (zero where skipped; on the units' device) and
        ``[units, layers]`` P(target) at the baseline (NaN where not computed; CPU), float64.
    """
    n_u, n_li = steps.shape
    wb = [bool(with_base)] * n_u if isinstance(with_base, bool) else [bool(b) for b in with_base]
    W_ = torch.stack([u.w_bar for u in units])
    B_ = torch.stack([u.base for u in units])
    D = W_ - B_
    dev = W_.device
    grad_acc = torch.zeros(n_u * n_li, W_.shape[-1], dtype=torch.float64, device=dev)
    p_base = torch.full((n_u, n_li), float("nan"), dtype=torch.float64, device=dev)  # to the host once, at the end
    rules = {int(m): quadrature(int(m), cfg.rule) for m in steps.unique().tolist() if m > 0}
    zero_first = {m: bool(a[0] == 0.0) for m, (a, _) in rules.items()}  # α = 0 is the baseline row itself
    st = steps.tolist()
    ru, rl, ra, rw, rb = [], [], [], [], []
    clean_row: dict[int, int] = {}  # unit -> its one row at α = 1 (the clean run), where the rule has that node
    also: dict[int, list[tuple[int, float]]] = {}  # unit -> (layer, weight) whose α = 1 gradient that row gives
    for i in sorted(range(n_li), key=lambda i: int(layers[i])):
        for g in range(n_u):
            m = int(st[g][i])
            if m == 0:
                continue
            a, w = rules[m]
            al, wl = a.tolist(), w.tolist()
            if al[-1] == 1.0 and g in clean_row:  # the clean run's gradient at this layer: from the unit's clean row
                also.setdefault(g, []).append((i, wl[-1]))
                al, wl = al[:-1], wl[:-1]
            elif al[-1] == 1.0:
                clean_row[g] = len(ru) + len(al) - 1
            extra = int(wb[g] and not zero_first[m])
            ru += [g] * (len(al) + extra)
            rl += [i] * (len(al) + extra)
            ra += al + [0.0] * extra
            rw += wl + [0.0] * extra
            rb += ([wb[g]] + [False] * (len(al) - 1) if zero_first[m] else [False] * len(al)) + [True] * extra
    plan = _Plan(model, units, prefix, hook_names, layers, W_.dtype, B_, D, torch.stack([u.states for u in units]))
    u_all, l_all = np.asarray(ru, dtype=np.int64), np.asarray(rl, dtype=np.int64)
    for s in range(0, len(ru), batch_rows):
        sl = slice(s, s + batch_rows)
        extras = {r - s: also[g] for g, r in clean_row.items() if s <= r < s + batch_rows and g in also}
        probs, grad, add = plan.batch(u_all[sl], l_all[sl], torch.tensor(ra[sl], dtype=torch.float64), extras)
        dest = torch.from_numpy(u_all[sl] * n_li + l_all[sl]).to(dev)
        grad_acc.index_add_(0, dest, grad.double() * torch.tensor(rw[sl], dtype=torch.float64, device=dev)[:, None])
        for (r, i, wt), gr in add:
            grad_acc[int(u_all[s + r]) * n_li + i] += gr.double() * wt
        idx = np.nonzero(np.asarray(rb[sl]))[0]
        if len(idx):
            at = (torch.from_numpy(u_all[sl][idx]).to(dev), torch.from_numpy(l_all[sl][idx]).to(dev))
            p_base[at] = probs[torch.from_numpy(idx).to(probs.device)].double().to(dev)
    return D.double() * grad_acc.view(n_u, n_li, -1), p_base.cpu()  # attr stays on the device (grouped.run_rows)


class _Plan:
    """What every batch of a round shares: the units, their prefix, values and recorded states."""

    def __init__(self, model: Model, units: Sequence[Any], prefix: PaddedPrefix, hook_names: Sequence[str],
                 layers: Sequence[int], dtype: torch.dtype, B_: Tensor, D: Tensor, states: Tensor) -> None:
        self.model, self.prefix, self.hook_names, self.dtype = model, prefix, hook_names, dtype
        self.B, self.D, self.states = B_, D, states
        self.layer = np.asarray([int(l) for l in layers], dtype=np.int64)
        self.rows = np.asarray([u.row for u in units], dtype=np.int64)
        self.lengths = np.asarray([len(u.context) - 1 for u in units], dtype=np.int64)
        self.last = np.asarray([u.context[-1] for u in units], dtype=np.int64)
        self.tids = np.asarray([u.target_id for u in units], dtype=np.int64)

    def batch(self, u_: np.ndarray, l_: np.ndarray, a_: Tensor, extras: dict[int, list[tuple[int, float]]]
              ) -> tuple[Tensor, Tensor, list[tuple[tuple[int, int, float], Tensor]]]:
        """One staged batch of rows in layer-major order: ``(P(target) per row, d P / d values per row, extra)``.

        ``extras[r] = [(layer index, weight), ...]``: row ``r`` (a unit's row at α = 1, the clean run) also
        gives the clean run's gradient at those higher layers, through a zero added there (``extra``: one
        ``((r, layer index, weight), gradient)`` each).
        """
        model, dev = self.model, self.B.device
        by_unit = np.argsort(u_, kind="stable")  # each unit's rows, layers ascending: the packed order
        us, lay = u_[by_unit], self.layer[l_[by_unit]]
        starts = np.flatnonzero(np.r_[True, us[1:] != us[:-1]])
        ends = np.r_[starts[1:], len(us)]
        ctx_units = us[starts]
        runs = np.flatnonzero(np.r_[True, (us[1:] != us[:-1]) | (l_[by_unit][1:] != l_[by_unit][:-1])])
        per_layer = np.diff(np.r_[runs, len(us)]).tolist()
        width = choose_width(model, [torch.from_numpy(lay[a:b]) for a, b in zip(starts, ends)],
                             self.lengths[ctx_units].tolist(), per_layer)
        p_ctx, p_first, p_fill = [], [], []
        for c, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
            for f in range(a, b, width):
                p_ctx.append(c)
                p_first.append(f)
                p_fill.append(min(width, b - f))
        p_first_a = np.asarray(p_first, dtype=np.int64)
        join = lay[p_first_a]
        srt = np.argsort(join, kind="stable")
        fill = np.asarray(p_fill, dtype=np.int64)[srt]
        staging = Staging(torch.from_numpy(np.asarray(p_ctx, dtype=np.int64)[srt]), torch.from_numpy(join[srt]),
                          torch.from_numpy(fill), width)
        flat_sorted = np.empty(len(us), dtype=np.int64)  # packed position of each row (in by_unit order)
        for pi, (f0, k) in enumerate(zip(p_first_a[srt].tolist(), fill.tolist())):
            flat_sorted[f0:f0 + k] = pi * width + np.arange(k)
        flat = np.empty_like(flat_sorted)
        flat[by_unit] = flat_sorted  # ... in batch (layer-major) order
        piece_units = ctx_units[np.asarray(p_ctx, dtype=np.int64)[srt]]
        piece_states = self.states[torch.from_numpy(piece_units), torch.from_numpy(l_[by_unit][p_first_a[srt]])]
        ut, lt = torch.from_numpy(u_).to(dev), torch.from_numpy(l_).to(dev)
        vals = (self.B[ut, lt].float() + a_.to(dev, torch.float32)[:, None] * self.D[ut, lt].float()).to(self.dtype)
        bounds = np.flatnonzero(np.r_[True, l_[1:] != l_[:-1]]).tolist() + [len(l_)]
        leaves, hooks = [], {}
        flat_d = torch.from_numpy(flat).to(dev)
        for a, b in zip(bounds[:-1], bounds[1:]):  # layer-major: each layer's rows are one slice
            leaf = vals[a:b].detach().requires_grad_(True)
            leaves.append(leaf)
            hooks[int(l_[a])] = (flat_d[a:b], leaf, None, None)
        add_keys, n_set = [], len(leaves)
        for r, lst in extras.items():
            for i, wt in lst:
                zero = torch.zeros(1, self.D.shape[-1], dtype=self.dtype, device=dev, requires_grad=True)
                leaves.append(zero)
                add_keys.append((r, i, wt))
                idx, lf, a_idx, a_val = hooks.get(i, (None, None, None, None))
                pos = flat_d[r:r + 1]
                hooks[i] = (idx, lf, pos if a_idx is None else torch.cat([a_idx, pos]),
                            zero if a_val is None else torch.cat([a_val, zero]))
        fwd = [(self.hook_names[i], _set_rows(*hooks[i])) for i in sorted(hooks, key=lambda i: int(self.layer[i]))]
        keep_order = np.argsort(flat, kind="stable")  # logits come in packed order: batch row of each logits row
        row_out = torch.from_numpy(np.argsort(keep_order, kind="stable"))  # and logits row of each batch row
        tids = torch.from_numpy(self.tids[u_[keep_order]]).to(dev)
        with torch.enable_grad():
            normed = model.continue_staged(self.prefix, torch.from_numpy(self.rows[ctx_units]),
                                           torch.from_numpy(self.lengths[ctx_units]), torch.from_numpy(self.last[ctx_units]),
                                           staging, piece_states, hooks=fwd, normed=True)
            probs = target_probs(model, normed, tids)
            grads = torch.autograd.grad(probs.sum(), leaves)
        return (probs.detach()[row_out.to(probs.device)], torch.cat(grads[:n_set]),
                [(k, g[0]) for k, g in zip(add_keys, grads[n_set:])])


def _set_rows(idx: Tensor | None, leaf: Tensor | None, add_idx: Tensor | None = None,
              add: Tensor | None = None) -> Any:
    """Hook: the packed positions ``idx`` take the values ``leaf``, and ``add`` (zeros) is added at ``add_idx``
    (a copy; gradients flow to ``leaf`` and ``add``)."""

    def hook(act: Tensor, hook: Any = None) -> Tensor:
        flat = act.flatten(0, 1)
        if idx is not None and leaf is not None:
            flat = flat.index_copy(0, idx.to(act.device), leaf.to(act.device, act.dtype))
        if add_idx is not None and add is not None:
            flat = flat.index_add(0, add_idx.to(act.device), add.to(act.device, act.dtype))
        return flat.view_as(act)

    return hook


__all__ = ["choose_width", "run_staged", "staged_applies", "target_prob"]
