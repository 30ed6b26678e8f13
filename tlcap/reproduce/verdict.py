"""The one-word verdict of a report row: ``agrees`` / ``disagrees`` / ``not comparable``, with its reason.

The rule (suggested in ``docs/statistics.md``, implemented here):

- A **value** row compares a number with the paper's (an overlap, a share, an accuracy):
  *agrees* when the paper's value (± half a unit of its last printed digit) lies inside our 95 %
  CI, *disagrees* when the CI excludes it. When the model, the data or the quantity differ from
  the paper's, the number cannot be compared: *not comparable*, naming what differs (and, for
  information, whether the paper's value falls inside our CI).
- An **effect** row compares the sign of an effect (located minus random, K_I minus K_II, ...):
  *agrees* when our effect has the paper's sign with p < 0.05; *disagrees* when it has the
  opposite sign with p < 0.05, or when it is not significant although our CI excludes the
  paper's effect size; otherwise *not comparable* (the interval holds both 0 and the paper's
  effect: too few samples to tell). A difference of model or data does not prevent comparing a
  direction, so it is named in the reason but does not decide the verdict. When the paper gives
  no effect size (a figure without numbers), a non-significant effect is *not comparable*.
- A **no-difference** claim (``sign=0``, e.g. "editing other layers works as well") *agrees*
  when the effect is not significant and the CI lies within ``±margin``, *disagrees* when it is
  significant, else *not comparable*.
- A row without our number (a stage that did not run, a pending experiment) or without a CI
  (n = 1) is *not comparable*, with the reason.

Example:
    >>> v = verdict(ours=Estimate(0.42, 0.35, 0.50, n=120), paper=0.44, paper_rounding=0.005)
    >>> v.word, v.reason
    ('agrees', "the paper's 0.44 lies inside our 95 % CI [0.35, 0.5] (n=120)")
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tlcap.metrics.estimate import Estimate, StatisticsError

AGREES, DISAGREES, NOT_COMPARABLE = "agrees", "disagrees", "not comparable"
WORDS = (AGREES, DISAGREES, NOT_COMPARABLE)
ALPHA = 0.05


@dataclass(frozen=True)
class Verdict:
    """A verdict word and its one-sentence reason."""

    word: str
    reason: str

    def __str__(self) -> str:
        return f"{self.word} ({self.reason})"


def _num(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def _ci(ours: Estimate) -> str:
    lvl = round(100 * ours.level)
    size = f"n={ours.n}" if ours.n_groups is None else f"n={ours.n}, {ours.n_groups} groups"
    return f"our {lvl} % CI [{ours.low:.3g}, {ours.high:.3g}] ({size})"


def _inside(ours: Estimate, x: float, rounding: float) -> bool:
    return ours.has_interval and ours.low - rounding <= x <= ours.high + rounding


def verdict(
    ours: Estimate | None,
    paper: float | None = None,
    *,
    kind: str = "value",
    sign: int | None = None,
    p_value: float | None = None,
    differences: Sequence[str] = (),
    paper_rounding: float = 0.0,
    margin: float | None = None,
    missing: str = "not computed",
    alpha: float = ALPHA,
) -> Verdict:
    """The verdict of one report row (module docstring).

    Args:
        ours: Our estimate with its CI (``None`` when not computed).
        paper: The paper's number on ``ours``'s scale (``None`` when the paper prints none).
        kind: ``"value"`` (compare the number) or ``"effect"`` (compare the sign).
        sign: For effects, the paper's sign: ``+1``, ``-1``, or ``0`` for a no-difference claim.
        p_value: For effects, our p-value of the effect (permutation or t-test), two-sided or in
            the paper's direction.
        differences: What differs from the paper's setting (``"model: SmolLM2-135M vs GPT-2"``).
        paper_rounding: Half a unit of the paper's last printed digit, on ``ours``'s scale.
        margin: For ``sign=0``: the largest effect still called "no difference".
        missing: Why ``ours`` is ``None`` (the reason printed).
        alpha: Significance level.

    Returns:
        A :class:`Verdict`.

    Raises:
        StatisticsError: an unknown ``kind``, or an effect without ``sign``.
    """
    if kind not in ("value", "effect"):
        raise StatisticsError(f"kind must be 'value' or 'effect', got {kind!r}")
    if kind == "effect" and sign not in (-1, 0, 1):
        raise StatisticsError(f"an effect row needs sign +1, -1 or 0, got {sign!r}")
    diff = "; ".join(differences)
    if ours is None or math.isnan(ours.value):
        return Verdict(NOT_COMPARABLE, missing)
    if not ours.has_interval:
        return Verdict(NOT_COMPARABLE, f"no CI (n={ours.n}): one observation says nothing about spread")
    if kind == "value":
        if paper is None:
            return Verdict(NOT_COMPARABLE, "the paper prints no number for this row")
        inside = _inside(ours, paper, paper_rounding)
        where = "inside" if inside else "outside"
        if differences:
            return Verdict(NOT_COMPARABLE, f"{diff} (the paper's {_num(paper)} lies {where} {_ci(ours)})")
        return Verdict(AGREES if inside else DISAGREES, f"the paper's {_num(paper)} lies {where} {_ci(ours)}")
    # ------------------------------------------------------------------ effects
    setting = f"; {diff}" if differences else ""
    p = math.nan if p_value is None else float(p_value)
    significant = not math.isnan(p) and p < alpha
    ptxt = "no p-value" if math.isnan(p) else f"p = {p:.3g}"
    if sign == 0:
        if significant:
            return Verdict(DISAGREES, f"the paper reports no difference; ours is {_num(ours.value)} ({ptxt}){setting}")
        if margin is not None and -margin <= ours.low and ours.high <= margin:
            return Verdict(AGREES, f"no significant difference ({ptxt}); {_ci(ours)} lies within ±{_num(margin)}{setting}")
        return Verdict(NOT_COMPARABLE, f"not significant ({ptxt}) but {_ci(ours)} is too wide to show equivalence{setting}")
    observed = 1 if ours.value > 0 else -1 if ours.value < 0 else 0
    if significant and observed == sign:
        return Verdict(AGREES, f"the paper's sign ({'+' if sign > 0 else '−'}) with {ptxt}, {_ci(ours)}{setting}")
    if significant and observed == -sign:
        return Verdict(DISAGREES, f"the opposite sign of the paper's with {ptxt}, {_ci(ours)}{setting}")
    if paper is not None and not _inside(ours, paper, paper_rounding):
        return Verdict(DISAGREES, f"not significant ({ptxt}) and the paper's effect {_num(paper)} lies outside "
                                  f"{_ci(ours)}{setting}")
    if paper is None:
        return Verdict(NOT_COMPARABLE, f"not significant ({ptxt}), {_ci(ours)}; the paper prints no effect size{setting}")
    return Verdict(NOT_COMPARABLE, f"not significant ({ptxt}): {_ci(ours)} holds both 0 and the paper's "
                                   f"{_num(paper)} (too few samples to tell){setting}")


__all__ = ["Verdict", "verdict", "AGREES", "DISAGREES", "NOT_COMPARABLE", "WORDS", "ALPHA"]
