"""Two-word fixed-point numbers: float scores summed exactly as int64 integers.

Each per-sample score tensor is split into ``hi = floor(x · 2^20)`` and
``lo = round(frac · 2^42)`` (quantum 2^-62 ≈ 2e-19). Integer addition is associative, so sums
over shards, torchrun ranks, resumed runs or chunks are bit-identical whatever the order.

Example:
    >>> a, b = torch.tensor([[0.1, -2.5]]), torch.tensor([[1e-9, 3.0]])     # [layer, d_mlp] scores
    >>> s = to_fixed(a) + to_fixed(b)
    >>> from_fixed(s)  # ≈ a + b (float64), the same for to_fixed(b) + to_fixed(a)
    tensor([[0.1000, 0.5000]], dtype=torch.float64)
    >>> torch.equal(from_fixed(to_fixed(b) + to_fixed(a)), from_fixed(s))
    True
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int64
from torch import Tensor

from tlcap.errors import TlcapError

HI_BITS = 20
LO_BITS = 42
FIXED_POINT_BITS = HI_BITS + LO_BITS


def to_fixed(x: Float[Tensor, "layer d_mlp"]) -> Int64[Tensor, "2 layer d_mlp"]:
    """Two-word fixed point of ``x`` (quantum 2^-62), exactly summable as integers.

    ``hi = floor(x · 2^20)`` and ``lo = round(frac · 2^42)``, so ``x ≈ hi/2^20 + lo/2^62``.
    Integer sums of ``hi`` and ``lo`` do not overflow for ~2 million samples of |x| < 2^40.

    Args:
        x: Scores (any float dtype).

    Returns:
        ``[2, *x.shape]`` int64 words.

    Raises:
        TlcapError: a score that is not finite or too large.
    """
    y = x.double() * float(2**HI_BITS)
    if not torch.isfinite(y).all() or y.abs().max() > 2**52:
        raise TlcapError("an attribution score is not finite or too large for fixed-point accumulation")
    hi = torch.floor(y)
    lo = ((y - hi) * float(2**LO_BITS)).round()
    return torch.stack([hi, lo]).to(torch.int64)


def from_fixed(s: Int64[Tensor, "2 layer d_mlp"]) -> Float[Tensor, "layer d_mlp"]:
    """The float64 value of summed :func:`to_fixed` words.

    Args:
        s: Summed words.

    Returns:
        Their float64 value.
    """
    return s[0].double() / float(2**HI_BITS) + s[1].double() / float(2**FIXED_POINT_BITS)


__all__ = ["to_fixed", "from_fixed", "HI_BITS", "LO_BITS", "FIXED_POINT_BITS"]
