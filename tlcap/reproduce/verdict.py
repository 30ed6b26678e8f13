"""The one-word verdict of a report row, with its reason (every branch is in ``docs/reproduce.md``).

Words:

- ``agrees`` / ``disagrees`` — the row decides: a value inside / outside our CI on the paper's own
  setting, or an effect significant after multiplicity adjustment with the paper's / the
  opposite sign.
- ``undecided`` — the row was tested but the evidence does not decide: not significant after
  adjustment, an equivalence CI wider than the margin, too few samples, or a Monte-Carlo p-value
  whose floor lies above the adjusted level. The reason gives the minimum detectable effect.
- ``not comparable`` — a value measured on another model, other data or another quantity than the
  paper's (the reason names the difference and the model that would make it comparable), or a row
  without our number.
- ``descriptive`` — our number is shown without a test: the paper prints no number or claim for it,
  or the claim is true by construction on the data that defines it.

The rules:

- **value** rows (a number against the paper's): *agrees* when the paper's value (± half its last
  printed digit) lies in our 95 % CI and that CI lies within ±:data:`VALUE_TOLERANCE` (25 %) of
  the paper's value (so the agreement is informative: a value that far off would have been
  told apart), *undecided* when it lies in a wider CI, *disagrees* when outside — only when the
  setting is the paper's (model, data, quantity). Otherwise *not comparable*.
- **effect** rows (a sign the paper asserts; ``sign=±1``) are judged on the Benjamini–Hochberg
  adjusted p-value (two-sided unless the row says why not): *agrees* when ``p_adj ≤ α`` with the
  paper's sign, *disagrees* when ``p_adj ≤ α`` with the opposite sign (BH's own rule: a raw p at
  the critical level is a discovery). A non-significant effect *disagrees* only when the setting
  is the paper's and the test of "our effect equals the paper's size" rejects it after the same
  adjustment; else it is *undecided*. On another model the paper's effect size is a yardstick
  for power, never a target. A row whose p-value floor lies above the level a discovery needed
  says so (it could not have decided), and its power is 0.
- **no-difference** claims (``sign=0``), an equivalence judgement on a margin fixed before any
  run: *agrees* when the CI lies within ``±margin``, *disagrees* when the difference is
  significant after adjustment and the CI lies wholly outside ``±margin``, else *undecided* (a
  significant difference that may still be inside the margin is not evidence against "no
  difference"). Where the paper's own difference exceeds the margin the reason says so.

Example:
    >>> v = verdict(Estimate(0.42, 0.35, 0.50, n=120), paper=0.44, paper_rounding=0.005)
    >>> v.word, v.reason
    ('agrees', "the paper's 0.44 lies inside our 95 % CI [0.35, 0.5] (n=120), within ±25 %")
    >>> verdict(Estimate(-0.2, -0.3, -0.1, n=200), kind="effect", sign=-1, p_adjusted=0.003).word
    'agrees'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tlcap.metrics.estimate import Estimate, StatisticsError
from tlcap.metrics.power import POWER

AGREES, DISAGREES, UNDECIDED, NOT_COMPARABLE, DESCRIPTIVE = (
    "agrees", "disagrees", "undecided", "not comparable", "descriptive")
WORDS = (AGREES, DISAGREES, UNDECIDED, NOT_COMPARABLE, DESCRIPTIVE)
KINDS = ("value", "effect", "control", "descriptive")
ALPHA = 0.05
VALUE_TOLERANCE = 0.25
"""A value row agrees only when our CI lies within ± this fraction of the paper's value (or ± its rounding)."""


@dataclass(frozen=True)
class Verdict:
    """A verdict word and its one-sentence reason."""

    word: str
    reason: str

    def __str__(self) -> str:
        return f"{self.word} ({self.reason})"


def _num(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def _p(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


def _ci(ours: Estimate) -> str:
    lvl = round(100 * ours.level)
    size = f"n={ours.n}" if ours.n_groups is None else f"n={ours.n}, {ours.n_groups} groups"
    if ours.method == "null quantiles":  # not a CI: the spread of our value minus each matched random set's
        return f"ours minus each random set, middle {lvl} % [{ours.low:.3g}, {ours.high:.3g}] ({size})"
    return f"our {lvl} % CI [{ours.low:.3g}, {ours.high:.3g}] ({size})"


def _inside(ours: Estimate, x: float, rounding: float) -> bool:
    return ours.has_interval and ours.low - rounding <= x <= ours.high + rounding


def _power_text(mde: float | None, power: float | None, paper: float | None) -> str:
    parts = []
    if mde is not None and not math.isnan(mde):
        parts.append(f"smallest effect detectable at {round(100 * POWER)} % power: {_num(mde)}")
    if paper is not None and power is not None and not math.isnan(power):
        parts.append(f"power against the paper's {_num(paper)}: {power:.0%}")
    return "; ".join(parts)


def verdict(
    ours: Estimate | None,
    paper: float | None = None,
    *,
    kind: str = "value",
    sign: int | None = None,
    p_adjusted: float | None = None,
    p_floor: float | None = None,
    alpha: float = ALPHA,
    alpha_adjusted: float | None = None,
    differences: Sequence[str] = (),
    comparable_on: str = "",
    paper_rounding: float = 0.0,
    margin: float | None = None,
    mde: float | None = None,
    power: float | None = None,
    p_paper_size: float | None = None,
    missing: str = "not computed",
    no_ci: str = "",
    descriptive: str = "",
) -> Verdict:
    """The verdict of one report row (module docstring).

    Args:
        ours: Our estimate with its CI (``None`` when not computed).
        paper: The paper's number (value rows) or effect size (effect rows) on ``ours``'s scale.
        kind: ``"value"``, ``"effect"``, ``"control"`` (a matched control: no paper claim) or
            ``"descriptive"``.
        sign: For effects, the paper's sign: ``+1``, ``-1``, or ``0`` for a no-difference claim.
        p_adjusted: The row's Benjamini–Hochberg adjusted p-value.
        p_floor: The smallest p-value the row's test can give (Monte-Carlo and exact tests).
        alpha: The false discovery rate.
        alpha_adjusted: The raw-p level a discovery needed in this report (for the floor check).
        differences: What differs from the paper's setting (``"model: SmolLM2-135M vs GPT-2"``).
        comparable_on: Which model(s) would make a value row comparable (named in the reason).
        paper_rounding: Half a unit of the paper's last printed digit, on ``ours``'s scale.
        margin: For ``sign=0``: the largest effect still called "no difference".
        mde: The row's minimum detectable effect (80 % power, adjusted level).
        power: The row's power against the paper's effect size.
        p_paper_size: The adjusted p-value of "our effect equals the paper's effect size" (only on
            the paper's own setting).
        missing: Why ``ours`` is ``None``.
        no_ci: Why a value has no CI (the reason printed; a default one otherwise).
        descriptive: Why a row is descriptive (with ``kind="descriptive"``).

    Returns:
        A :class:`Verdict`.

    Raises:
        StatisticsError: an unknown ``kind``, or an effect without ``sign``.
    """
    if kind not in KINDS:
        raise StatisticsError(f"kind must be one of {KINDS}, got {kind!r}")
    if kind == "effect" and sign not in (-1, 0, 1):
        raise StatisticsError(f"an effect row needs sign +1, -1 or 0, got {sign!r}")
    diff = "; ".join(differences)
    if ours is None or math.isnan(ours.value):
        return Verdict(NOT_COMPARABLE, missing)
    if kind == "descriptive":
        return Verdict(DESCRIPTIVE, descriptive or "our number, shown without a test")
    if kind == "value":
        if paper is None:
            return Verdict(DESCRIPTIVE, "the paper prints no number for this row")
        if differences:
            where = ""
            if ours.has_interval:
                where = f" (the paper's {_num(paper)} lies {'inside' if _inside(ours, paper, paper_rounding) else 'outside'} " \
                        f"{_ci(ours)})"
            on = f"; comparable on {comparable_on}" if comparable_on else ""
            return Verdict(NOT_COMPARABLE, f"{diff}{on}{where}")
        if not ours.has_interval:
            return Verdict(UNDECIDED, no_ci or f"no CI (n={ours.n}): nothing to compare the paper's {_num(paper)} with")
        inside = _inside(ours, paper, paper_rounding)
        if not inside:
            return Verdict(DISAGREES, f"the paper's {_num(paper)} lies outside {_ci(ours)}")
        tol = max(VALUE_TOLERANCE * abs(paper), paper_rounding)
        if ours.low < paper - tol or ours.high > paper + tol:
            return Verdict(UNDECIDED, f"the paper's {_num(paper)} lies inside {_ci(ours)}, but the CI is wider than "
                                      f"±{round(100 * VALUE_TOLERANCE)} % of it (±{_num(tol)}): too wide to agree")
        return Verdict(AGREES, f"the paper's {_num(paper)} lies inside {_ci(ours)}, within ±{round(100 * VALUE_TOLERANCE)} %")
    # ------------------------------------------------------------------ effects and controls
    setting = f"; {diff}" if differences else ""
    p = math.nan if p_adjusted is None else float(p_adjusted)
    if math.isnan(p):
        why = no_ci or "no test could be run"
        return Verdict(UNDECIDED if kind == "effect" else DESCRIPTIVE, f"{why}{setting}")
    significant = p <= alpha
    ptxt = f"adjusted p = {_p(p)}"
    floor_txt = ""
    if p_floor is not None and alpha_adjusted is not None and not math.isnan(p_floor) and p_floor > alpha_adjusted:
        floor_txt = (f"; its p-value cannot fall below {_p(p_floor)}, above the {_p(alpha_adjusted)} a discovery needed "
                     "in this report (more random sets would resolve it)")
    ci = _ci(ours) if ours.has_interval else f"no CI (n={ours.n})"
    pw = _power_text(mde, power, paper)
    pw = f"; {pw}" if pw else ""
    if kind == "control":
        direction = "above" if ours.value > 0 else "below" if ours.value < 0 else "equal to"
        if significant:
            what = f"significantly {direction} the matched control"
        elif floor_txt:  # the test cannot resolve it: "not different" would read as evidence of no difference
            what = f"not resolved against the matched control (our value is {direction} it)"
        else:
            what = "not significantly different from the matched control"
        return Verdict(DESCRIPTIVE, f"control, no paper claim: {what} ({ptxt}), {ci}{floor_txt}")
    if sign == 0:
        gap = ""
        if margin is not None and paper is not None and abs(paper) > margin:
            gap = f"; the paper's own difference, {_num(paper)}, is outside ±{_num(margin)} itself"
        if margin is None:
            if significant:
                return Verdict(DISAGREES, f"the paper reports no difference; ours is {_num(ours.value)} ({ptxt}), {ci}{setting}")
            return Verdict(UNDECIDED, f"not significant ({ptxt}), {ci}, and no margin fixed for \"no difference\""
                                      f"{pw}{floor_txt}{setting}")
        inside = ours.has_interval and -margin <= ours.low and ours.high <= margin
        outside = ours.has_interval and (ours.low > margin or ours.high < -margin)
        if inside:
            return Verdict(AGREES, f"{ci} lies within ±{_num(margin)} ({ptxt}){gap}{setting}")
        if significant and outside:
            return Verdict(DISAGREES, f"the paper reports no difference; ours is {_num(ours.value)} ({ptxt}) and {ci} lies "
                                      f"wholly outside ±{_num(margin)}{gap}{setting}")
        if significant:
            return Verdict(UNDECIDED, f"a significant difference ({ptxt}) but {ci} reaches within ±{_num(margin)}: "
                                      f"not shown to exceed the margin{gap}{setting}")
        return Verdict(UNDECIDED, f"not significant ({ptxt}) but {ci} is too wide to show a difference within "
                                  f"±{_num(margin)}{pw}{floor_txt}{gap}{setting}")
    observed = 1 if ours.value > 0 else -1 if ours.value < 0 else 0
    if significant and observed == sign:
        return Verdict(AGREES, f"the paper's sign ({'+' if sign > 0 else '−'}) with {ptxt}, {ci}{setting}")
    if significant and observed == -sign:
        return Verdict(DISAGREES, f"the opposite sign of the paper's with {ptxt}, {ci}{setting}")
    if not differences and paper is not None and p_paper_size is not None and p_paper_size < alpha:
        return Verdict(DISAGREES, f"not significant ({ptxt}), and the paper's effect {_num(paper)} is rejected "
                                  f"(adjusted p = {_p(p_paper_size)}), {ci}{pw}")
    return Verdict(UNDECIDED, f"not significant ({ptxt}), {ci}{pw}{floor_txt}{setting}")


def significant_share(words: Sequence[str]) -> float:
    """Share of ``agrees`` + ``disagrees`` among verdict words (for calibration checks).

    Args:
        words: Verdict words, one per row.

    Returns:
        A fraction in ``[0, 1]`` (0 for no words).
    """
    return sum(w in (AGREES, DISAGREES) for w in words) / max(len(words), 1)


__all__ = ["Verdict", "verdict", "significant_share", "AGREES", "DISAGREES", "UNDECIDED", "NOT_COMPARABLE",
           "DESCRIPTIVE", "WORDS", "KINDS", "ALPHA", "VALUE_TOLERANCE"]
