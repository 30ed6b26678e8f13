"""Slow, obviously-correct reference implementations (for tests and benchmark baselines)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from tlcap.attribution.quadrature import quadrature
from tlcap.models.adapter import Model
from tlcap.runtime import hooks as H
from tlcap.runtime.sites import get_site


def reference_ig(
    model: Model,
    prompt: str,
    target: str,
    *,
    layers: Sequence[int] | None = None,
    steps: int = 20,
    rule: str = "midpoint",
    site: str = "mlp_post",
    batched_steps: bool = False,
) -> Float[Tensor, "layer d_mlp"]:
    """IG with a plain per-layer, per-step loop over the full sequence (no prefix reuse).

    The obviously-correct baseline every fast path is tested against: for each target token,
    layer and quadrature point, one full-sequence forward/backward with the layer's last-position
    neurons set to α · w̄.

    Args:
        model: The model.
        prompt: The query.
        target: The answer string (teacher-forced when it is several tokens).
        layers: Layers to score (default all).
        steps: Quadrature size m.
        rule: Quadrature rule (:func:`tlcap.attribution.quadrature`).
        site: Neuron site.
        batched_steps: Put the points of one layer in one batch (the usual per-layer loop of
            public implementations); otherwise one forward/backward per point.

    Returns:
        ``[n_layers, d_mlp]`` scores averaged over target tokens (zeros for unscored layers).

    Example:
        >>> from tlcap.attribution import integrated_gradients
        >>> slow = reference_ig(model, "The capital of France is", " Paris", steps=6, rule="left")
        >>> fast = integrated_gradients(model, "The capital of France is", " Paris", steps=6, rule="left")
        >>> tuple(slow.shape), torch.allclose(slow, fast.scores, rtol=1e-4, atol=1e-9)
        ((2, 256), True)
    """
    p_ids = model.encode(prompt)
    t_ids = model.target_ids(prompt, target)
    layer_list = list(range(model.n_layers)) if layers is None else list(layers)
    alphas, weights = quadrature(steps, rule)
    s = get_site(site)
    out = torch.zeros(len(t_ids), model.n_layers, model.d_mlp, dtype=torch.float64)
    for t, tid in enumerate(t_ids):
        toks = torch.tensor([p_ids + t_ids[:t]], device=model.device)
        for l in layer_list:
            name = s.hook_name(l)
            store: dict[str, Tensor] = {}
            with torch.no_grad():
                model.logits(toks, hooks=[(name, H.record(store, "a"))])
            w_bar = store["a"][0, -1]
            grads = torch.zeros(model.d_mlp, dtype=torch.float64)
            n_points = len(alphas)
            chunks = [list(range(n_points))] if batched_steps else [[k] for k in range(n_points)]
            for ks in chunks:
                a = alphas[ks].to(w_bar.dtype)
                leaf = (a[:, None] * w_bar[None]).requires_grad_(True)
                logits = model.logits(toks.expand(len(ks), -1), hooks=[(name, H.replace_rows(slice(None), -1, leaf))])
                p = logits[:, -1].float().softmax(-1)[:, tid]
                (g,) = torch.autograd.grad(p.sum(), leaf)
                grads += (g.double() * weights[ks, None]).sum(0)
            out[t, l] = w_bar.double() * grads
    return out.mean(0).float()
