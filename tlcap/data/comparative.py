"""Comparative pairs for the CNL decoupling experiment (paper §4.1).

Each pair shares a *main part*, an arithmetic problem such as ``"17+25=?"``, and puts it in two
*framings* that ask for different capabilities: framing 1 asks for the answer ("provide the
correct answer for 17+25=?", target ``" 42"``), framing 2 for Python code that computes it
("write Python code for 17+25=?", target ``" print(17+25)"``). The model is scored on each
framing's target; KN locates neurons per framing and the decoupling experiment compares them.

Main parts are drawn with a seed from three sources, round-robin:

- ``"template"``: two operands uniform in ``[1, max_operand]``;
- ``"gsm8k"`` / ``"svamp"``: two distinct numbers (in ``[1, max_operand]``) of one word problem of
  the bundled GSM8K train split / SVAMP, so the operands have the sizes real problems use;

and an operator from ``ops`` (``+``, ``-``, ``*``; for ``-`` the larger operand comes first, so
the result is not negative). Main parts are unique within a draw.

Example:
    >>> pairs = comparative_pairs(200, seed=0)
    >>> pairs[0].main, pairs[0].framing(1), pairs[0].framing(2)
    ('50-27=?', ('Provide the correct answer for 50-27=?\\nAnswer:', ' 23'),
     ('Write Python code for 50-27=?\\nCode:', ' print(50-27)'))
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tlcap.data.files import read_json_rows, write_json_rows
from tlcap.data.tasks import load_task
from tlcap.errors import DataFormatError, EmptyDatasetError, InvalidConfigError

SOURCES: tuple[str, ...] = ("template", "gsm8k", "svamp")
OPS: tuple[str, ...] = ("+", "-", "*")
_INT = re.compile(r"(?<![\d.,])\d+(?![\d.,]\d)")


@dataclass(frozen=True)
class Framing:
    """A task framing: prompt and target templates over ``{main}``, ``{a}``, ``{op}``, ``{b}``, ``{result}``."""

    name: str
    prompt: str
    target: str


DEFAULT_FRAMINGS: tuple[Framing, Framing] = (
    Framing("answer", "Provide the correct answer for {main}\nAnswer:", " {result}"),
    Framing("code", "Write Python code for {main}\nCode:", " print({a}{op}{b})"),
)


@dataclass(frozen=True)
class ComparativePair:
    """Two framings of one arithmetic main part.

    Attributes:
        main: The main part, e.g. ``"17+25=?"``.
        a, op, b, result: The problem and its answer.
        source: ``"template"``, ``"gsm8k"``, ``"svamp"`` or ``"user"``.
        uid: A stable identifier (``"gsm8k:12"``: the 12th pair, drawn from GSM8K).
        prompts: The prompt of framing 1 and of framing 2.
        targets: The target of framing 1 and of framing 2 (scored by teacher forcing).
    """

    main: str
    a: int
    op: str
    b: int
    result: int
    source: str
    uid: str
    prompts: tuple[str, str]
    targets: tuple[str, str]

    def framing(self, t: int) -> tuple[str, str]:
        """``(prompt, target)`` of framing ``t`` (1 or 2).

        Args:
            t: The framing number, 1 or 2.

        Returns:
            The prompt and target of that framing.
        """
        if t not in (1, 2):
            raise InvalidConfigError(f"framing must be 1 or 2, got {t!r}")
        return self.prompts[t - 1], self.targets[t - 1]

    def to_dict(self) -> dict[str, Any]:
        """The pair as a JSON-ready dict (a row of :func:`save_pairs`).

        Returns:
            The fields, ``prompts`` and ``targets`` as lists.
        """
        return {"main": self.main, "a": self.a, "op": self.op, "b": self.b, "result": self.result, "source": self.source,
                "uid": self.uid, "prompts": list(self.prompts), "targets": list(self.targets)}


def _result(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def make_pair(a: int, op: str, b: int, source: str = "user", uid: str = "",
              framings: Sequence[Framing] = DEFAULT_FRAMINGS) -> ComparativePair:
    """The pair of framings of ``a op b`` (``op`` one of ``+ - *``).

    Args:
        a: Left operand.
        op: ``"+"``, ``"-"`` or ``"*"``.
        b: Right operand.
        source: Where the problem came from (kept in the pair).
        uid: Identifier of the pair.
        framings: Prompt/target templates, formatted with ``main``, ``a``, ``op``, ``b`` and ``result``.

    Returns:
        The :class:`ComparativePair` with one prompt and target per framing.

    Raises:
        InvalidConfigError: an unknown ``op``.
    """
    if op not in OPS:
        raise InvalidConfigError(f"unknown operator {op!r} (--ops); choose one of: {', '.join(OPS)}")
    r = _result(a, op, b)
    main = f"{a}{op}{b}=?"
    fields = {"main": main, "a": a, "op": op, "b": b, "result": r}
    prompts = tuple(f.prompt.format(**fields) for f in framings)
    targets = tuple(f.target.format(**fields) for f in framings)
    return ComparativePair(main, a, op, b, r, source, uid, prompts, targets)  # type: ignore[arg-type]


def problem_numbers(text: str, max_operand: int) -> list[int]:
    """The distinct whole numbers in ``[1, max_operand]`` written in a word problem, in order.

    Args:
        text: The word problem.
        max_operand: Largest number kept.

    Returns:
        The numbers, each once, in order of first appearance.
    """
    out: list[int] = []
    for m in _INT.finditer(text):
        v = int(m.group())
        if 1 <= v <= max_operand and v not in out:
            out.append(v)
    return out


def _operand_stream(source: str, rng: random.Random, max_operand: int, seed: int) -> Iterator[tuple[int, int]]:
    if source == "template":
        while True:
            yield rng.randint(1, max_operand), rng.randint(1, max_operand)
    samples = load_task(source, None, "train", None, seed)  # seeded order of the bundled problems
    for s in samples:
        nums = problem_numbers(s.prompt, max_operand)
        if len(nums) >= 2:
            a, b = rng.sample(nums, 2)
            yield a, b


def check_pair_options(n: int, sources: Sequence[str], ops: Sequence[str], max_operand: int) -> None:
    """Validate the options of :func:`comparative_pairs` (names as the CLI spells them)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidConfigError(f"n (--n) must be >= 1, got {n!r}")
    if not sources:
        raise InvalidConfigError("sources (--sources) must name at least one of: " + ", ".join(SOURCES))
    for s in sources:
        if s not in SOURCES:
            raise InvalidConfigError(f"unknown source {s!r} (--sources); choose one of: {', '.join(SOURCES)}")
    if not ops:
        raise InvalidConfigError("ops (--ops) must name at least one of: " + ", ".join(OPS))
    for o in ops:
        if o not in OPS:
            raise InvalidConfigError(f"unknown operator {o!r} (--ops); choose one of: {', '.join(OPS)}")
    if isinstance(max_operand, bool) or not isinstance(max_operand, int) or max_operand < 2:
        raise InvalidConfigError(f"max_operand (--max-operand) must be >= 2, got {max_operand!r}")


def comparative_pairs(
    n: int = 200,
    *,
    seed: int = 0,
    sources: Sequence[str] = SOURCES,
    ops: Sequence[str] = OPS,
    max_operand: int = 99,
    framings: Sequence[Framing] = DEFAULT_FRAMINGS,
) -> list[ComparativePair]:
    """``n`` seeded comparative pairs with unique main parts (module docstring).

    Args:
        n: Number of pairs.
        seed: Seed of every draw (same seed, same pairs).
        sources: Where main parts come from, taken round-robin: ``template``, ``gsm8k``, ``svamp``.
        ops: Operators drawn uniformly.
        max_operand: Largest operand.
        framings: The two framings (default: answer vs Python code).

    Returns:
        A list of :class:`ComparativePair`.

    Raises:
        InvalidConfigError: an invalid option.
        EmptyDatasetError: the sources cannot give ``n`` distinct main parts.

    Example:
        >>> [p.main for p in comparative_pairs(3, seed=1)]
        ['27+64=?', '4*50=?', '38+36=?']
    """
    check_pair_options(n, sources, ops, max_operand)
    if len(framings) != 2:
        raise InvalidConfigError(f"a comparative pair has exactly 2 framings, got {len(framings)}")
    rng = random.Random(seed)
    streams = {s: _operand_stream(s, random.Random(f"{seed}:{s}"), max_operand, seed) for s in dict.fromkeys(sources)}
    seen: set[str] = set()
    out: list[ComparativePair] = []
    active = list(streams)
    stale = 0
    while len(out) < n and active:
        src = active[len(out) % len(active)]
        try:
            a, b = next(streams[src])
        except StopIteration:
            active.remove(src)
            continue
        op = rng.choice(list(ops))
        if op == "-" and b > a:
            a, b = b, a
        pair = make_pair(a, op, b, src, f"{src}:{len(out)}", framings)
        if pair.main in seen:
            stale += 1
            if stale > 100 * n:
                break
            continue
        seen.add(pair.main)
        out.append(pair)
    if len(out) < n:
        raise EmptyDatasetError(f"only {len(out)} distinct main parts from {list(sources)} with operands <= {max_operand}; "
                                "raise --max-operand, add sources or ask for fewer pairs")
    return out


def load_pairs(path: str | Path, framings: Sequence[Framing] = DEFAULT_FRAMINGS) -> list[ComparativePair]:
    """Pairs from a JSON list of ``{"a": 17, "op": "+", "b": 25}`` (framings rebuilt from ``framings``)
    or of rows written by :func:`save_pairs` (kept as written).

    Args:
        path: The JSON file (a list, or ``{"pairs": [...]}``).
        framings: The framings used for rows without ``prompts``/``targets``.

    Returns:
        The pairs, in file order (``uid`` defaults to the row index).

    Raises:
        DataFormatError: not a non-empty list, or a row without integer ``a``/``b`` and a known ``op``.
    """
    path = Path(path)
    rows = read_json_rows(path, "pairs", missing=f"pairs file {path} not found")
    if not isinstance(rows, list) or not rows:
        raise DataFormatError(f"{path} must hold a non-empty list of pairs (or {{\"pairs\": [...]}})")
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not all(isinstance(r.get(k), int) for k in ("a", "b")) or r.get("op") not in OPS:
            raise DataFormatError(f"{path.name} pair #{i} needs integer 'a' and 'b' and an 'op' in {list(OPS)}")
        p = make_pair(r["a"], r["op"], r["b"], str(r.get("source", "user")), str(r.get("uid", i)), framings)
        if "prompts" in r and "targets" in r:
            p = ComparativePair(p.main, p.a, p.op, p.b, p.result, p.source, p.uid, tuple(r["prompts"]), tuple(r["targets"]))  # type: ignore[arg-type]
        out.append(p)
    return out


def save_pairs(pairs: Sequence[ComparativePair], path: str | Path) -> Path:
    """Write pairs as JSON readable by :func:`load_pairs`; returns the path.

    Args:
        pairs: The pairs to write.
        path: The JSON file (parent folders are created).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    return write_json_rows(path, "pairs", [p.to_dict() for p in pairs])


__all__ = ["DEFAULT_FRAMINGS", "OPS", "SOURCES", "ComparativePair", "Framing", "comparative_pairs", "load_pairs",
           "make_pair", "problem_numbers", "save_pairs"]
