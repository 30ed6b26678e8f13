"""Key second moments ``C = E[k kᵀ]`` of MLP neurons on a text sample (ROME's ``mom2``).

The keys are the down projection's inputs (``mlp_post``) at every token of a WikiText-2
sample, split into windows of ``seq_len`` tokens. Statistics of every requested layer come
from the same forward passes, which stop after the highest requested layer
(:meth:`tlcap.models.Model.record`). Results are cached on disk under
``tlcap.models.cache_dir()/rome_cov/<model>-<fingerprint>/`` keyed by layer, number of tokens
and window length, so an edit pays for them once.

ROME uses 100,000 Wikipedia tokens; the default here is 8,192 WikiText-2 tokens (a few CPU
seconds on SmolLM2), made well-conditioned by a relative ridge when inverted
(:func:`solve_key`). Pass ``n_tokens=100_000`` for ROME's setting.

Example (``cache=False`` here: nothing is written to the disk cache):
    >>> C = key_covariance(model, [1], n_tokens=512, cache=False)[1]     # [d_mlp, d_mlp]
    >>> tuple(C.shape), C.dtype, torch.allclose(C, C.T)
    ((256, 256), torch.float32, True)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from jaxtyping import Float
from safetensors.torch import load_file, save_file
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.data.wikitext import load_wikitext
from tlcap.errors import EmptyDatasetError
from tlcap.models.adapter import Model
from tlcap.models.paths import model_cache_dir, model_fingerprint


def covariance_path(model: Model, layer: int, n_tokens: int, seq_len: int) -> Path:
    """Where :func:`key_covariance` caches the covariance of ``layer`` for this sample size.

    Args:
        model: The model.
        layer: The layer.
        n_tokens: Tokens in the sample.
        seq_len: Window length.

    Returns:
        The ``.safetensors`` path under ``tlcap.models.cache_dir()/rome_cov``.
    """
    return model_cache_dir(model, "rome_cov") / f"L{layer}_n{n_tokens}_s{seq_len}.safetensors"


def _token_windows(model: Model, texts: Sequence[str], n_tokens: int, seq_len: int) -> Tensor:
    ids: list[int] = []
    for t in texts:
        ids.extend(model.encode(t + "\n", prepend_bos=False, check_length=False))
        if len(ids) >= n_tokens:
            break
    n = (min(len(ids), n_tokens) // seq_len) * seq_len
    if n == 0:
        raise EmptyDatasetError(
            f"the text sample has {len(ids)} tokens, fewer than one window of {seq_len}; give more text or a "
            "smaller seq_len"
        )
    return torch.tensor(ids[:n], dtype=torch.long, device=model.device).reshape(-1, seq_len)


@torch.no_grad()
def key_covariance(
    model: Model,
    layers: Sequence[int],
    n_tokens: int = 8192,
    seq_len: int = 128,
    texts: Sequence[str] | None = None,
    batch_size: int = 8,
    cache: bool = True,
    progress: bool = False,
) -> dict[int, Float[Tensor, "d_mlp d_mlp"]]:
    """Uncentred second moment of ``mlp_post`` keys per layer, from cache or computed.

    Args:
        model: The model.
        layers: Layers to return.
        n_tokens: Tokens in the sample (rounded down to whole windows).
        seq_len: Window length.
        texts: Text sample; default WikiText-2 (:func:`tlcap.data.wikitext.load_wikitext`).
        batch_size: Windows per forward pass.
        cache: Read/write the on-disk cache (only for the default text sample).
        progress: Show a progress bar.

    Returns:
        Layer → ``C = E[k kᵀ]`` (float32).

    Raises:
        EmptyDatasetError: the text sample is shorter than one window.

    Example:
        >>> covs = key_covariance(model, [0, 1], n_tokens=512, seq_len=128, cache=False)
        >>> sorted(covs), tuple(covs[0].shape)
        ([0, 1], (256, 256))
    """
    layers = sorted({int(l) for l in layers})
    out: dict[int, Tensor] = {}
    use_cache = cache and texts is None
    missing = []
    for l in layers:
        p = covariance_path(model, l, n_tokens, seq_len)
        if use_cache and p.exists():
            out[l] = load_file(str(p))["mom2"].to(model.device)
        else:
            missing.append(l)
    if not missing:
        return out
    if texts is None:
        texts = load_wikitext()
    windows = _token_windows(model, texts, n_tokens, seq_len)
    names = {l: model.hook_name("mlp_post", l) for l in missing}
    sums = {l: torch.zeros(model.d_mlp, model.d_mlp, dtype=torch.float64, device=model.device) for l in missing}
    count = 0
    for b0 in tqdm(range(0, windows.shape[0], batch_size), desc="key covariance", disable=not progress):
        batch = windows[b0 : b0 + batch_size]
        store = model.record(batch, list(names.values()))  # stops after the highest layer's keys
        for l in missing:
            k = store[names[l]].reshape(-1, model.d_mlp).double()
            sums[l] += k.T @ k
        count += batch.numel()
    for l in missing:
        c = (sums[l] / count).float()
        out[l] = c
        if use_cache:
            p = covariance_path(model, l, n_tokens, seq_len)
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")  # written whole, then renamed into place
            save_file({"mom2": c.cpu().contiguous(), "count": torch.tensor(count)}, str(tmp))
            os.replace(tmp, p)
    return out


def solve_key(
    cov: Float[Tensor, "d_mlp d_mlp"], key: Float[Tensor, " d_mlp"], reg: float = 1e-2
) -> Float[Tensor, " d_mlp"]:
    """``(C + λI)⁻¹ k`` with ``λ = reg × mean(diag C)`` (a relative ridge; ``reg=0`` is ROME's exact inverse).

    Args:
        cov: The key second moment ``C``.
        key: ``k*``.
        reg: Relative ridge.

    Returns:
        ``u`` (unnormalised; the update ``δ uᵀ / (uᵀk)`` does not depend on its scale).
    """
    c = cov.double()
    lam = reg * float(torch.diagonal(c).mean())
    eye = torch.eye(c.shape[0], dtype=c.dtype, device=c.device)
    return torch.linalg.solve(c + lam * eye, key.double()).to(key.dtype)


__all__ = ["covariance_path", "key_covariance", "model_fingerprint", "solve_key"]
