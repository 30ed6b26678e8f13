"""``EAPConfig``: the settings of a knowledge-circuit run (scoring, selection, evaluation).

One frozen, validated value carries what defines a circuit: how edges are scored (EAP or
EAP-IG steps, metric, ablation, direction), how the circuit is selected (top-n or threshold,
pruning), and how it is evaluated (the size sweep and the random control's seed).
:func:`~tlcap.locate.circuits.edge_attribution` and
:func:`~tlcap.locate.circuits.knowledge_circuit` take it as ``config=`` plus keyword overrides
of its fields, so an invalid value fails at construction, before any model load or forward
pass. :func:`check_circuit_inputs` checks the strings of a task (prompt, target, corrupted
prompt and answer) against the config the same way.

Example:
    >>> from tlcap.locate.circuits import edge_attribution
    >>> cfg = EAPConfig(steps=5, top_n=300)
    >>> scores = edge_attribution(model, "The capital of France is", " Paris",
    ...                           "The capital of Italy is", config=cfg)
    >>> scores.method, scores.steps
    ('eap-ig', 5)
    >>> EAPConfig(top_n=0)
    Traceback (most recent call last):
    ...
    tlcap.errors.InvalidConfigError: top_n (--top-n) must be >= 1, got 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tlcap.config import Config, check_bool, check_choice, check_float, check_int, check_sequence, check_str
from tlcap.errors import InvalidConfigError, UnknownNameError
from tlcap.runtime.batching import parse_memory

METRICS: tuple[str, ...] = ("nll", "logit_diff")
ABLATIONS: tuple[str, ...] = ("corrupt", "zero", "mean", "mean-positional")
DIRECTIONS: tuple[str, ...] = ("noising", "denoising")
DEFAULT_TOP_N = 300
DEFAULT_TOP_NODES = 30  # nodes kept by a node-granularity dataset circuit without --top-n
GRANULARITIES: tuple[str, ...] = ("edge", "node", "neuron")


def check_node_selection(granularity: str, greedy: bool) -> None:
    """Refuse ``--greedy`` with a node-granularity dataset circuit (greedy grows edges, not nodes).

    Args:
        granularity: ``"edge"`` or ``"node"``.
        greedy: Whether greedy selection was asked for.
    """
    if granularity == "node" and greedy:
        raise InvalidConfigError("--greedy grows an edge circuit from the logits; with --granularity node the circuit "
                                 "is the --top-n nodes by |node score|: drop --greedy")


@dataclass(frozen=True)
class EAPConfig(Config):
    """Settings of edge attribution patching and of the circuit built from its scores.

    Attributes:
        steps: Gradient evaluations of EAP-IG (``--ig-steps``), ``>= 1``; 1 is plain EAP.
        metric: ``nll`` (MatchNLL of the target, teacher-forced mean over its tokens) or
            ``logit_diff`` (``logit(target) - logit(corrupted answer)``; ``logit-diff`` is
            accepted and stored as ``logit_diff``).
        ablation: What replaces a non-circuit edge's upstream output: ``corrupt`` (the
            corrupted prompt's run), ``zero``, ``mean`` (the node's output averaged over the
            dataset's clean prompts and positions) or ``mean-positional`` (averaged per
            position); ``None`` = ``corrupt`` when a corrupted prompt is given, else ``zero``
            (the functions store the resolved value).
        direction: ``noising`` (gradient on the clean run; default) or ``denoising`` (on the
            corrupted run, TransformerLens' convention; needs ``ablation="corrupt"`` for EAP).
        top_n: Keep the ``top_n`` edges by ``|score|``, ``>= 1``. ``None`` with no
            ``threshold``: :data:`DEFAULT_TOP_N` (300).
        threshold: Keep the edges with ``|score| > threshold`` instead, ``> 0``.
        prune: Drop dead edges after selection (:func:`~tlcap.locate.circuits.prune_dead`).
        sweep: Evaluate circuits of several sizes (:func:`~tlcap.locate.circuits.size_sweep`)
            in :func:`~tlcap.locate.circuits.knowledge_circuit`.
        sweep_sizes: The sweep's top-n values, each ``>= 0`` (0 = the fully ablated run);
            ``None`` = 10 log-spaced sizes from 10 to every edge.
        seed: Seed of the random control circuits, ``>= 0``.
        eval_batch: Circuits evaluated per forward pass, ``>= 1`` (exact: results do not
            depend on it).
        batch_size: Dataset items per pass (dataset circuits), ``>= 1``, or ``"auto"`` (the
            default): the most items whose estimated memory fits ``max_memory``, at most 8 on a
            CPU, halved and rerun on out-of-memory (:func:`dataset_batch_size`). Exact: scores do
            not depend on it; memory grows with it, not with the dataset.
        max_memory: Memory budget of ``batch_size="auto"`` (bytes or ``"8GiB"``); ``None`` = free memory.
        greedy: Select circuits greedily from the logits backwards (each step adds the
            highest-``|score|`` edge into a node already in the circuit) instead of the global
            top-n (:func:`~tlcap.locate.circuits.greedy_order`).
    """

    steps: int = 1
    metric: str = "nll"
    ablation: str | None = None
    direction: str = "noising"
    top_n: int | None = None
    threshold: float | None = None
    prune: bool = True
    sweep: bool = True
    sweep_sizes: Sequence[int] | None = None
    seed: int = 0
    eval_batch: int = 8
    batch_size: int | str = "auto"
    max_memory: int | str | None = None
    greedy: bool = False

    def validate(self) -> None:
        check_int("steps", self.steps, min=1, cli="--ig-steps")
        metric = self.metric.replace("-", "_") if isinstance(self.metric, str) else self.metric
        if metric not in METRICS:
            raise UnknownNameError.of("metric", self.metric, ("nll", "logit-diff"), option="--metric")
        self._set("metric", metric)
        if self.ablation is not None:
            check_choice("ablation", self.ablation, ABLATIONS, cli=None)
        check_choice("direction", self.direction, DIRECTIONS, cli=None)
        if self.top_n is not None:
            check_int("top_n", self.top_n, min=1)
        if self.threshold is not None:
            check_float("threshold", self.threshold, gt=0)
        if self.top_n is not None and self.threshold is not None:
            raise InvalidConfigError("give --top-n or --threshold, not both")
        check_bool("prune", self.prune, cli=None)
        check_bool("sweep", self.sweep, cli="--no-sweep")
        if self.sweep_sizes is not None:
            self._set("sweep_sizes", check_sequence(
                "sweep_sizes", self.sweep_sizes, min_len=1, cli="--sweep",
                item=lambda n, x: check_int(n, x, min=0, cli="--sweep"),
            ))
        check_int("seed", self.seed, min=0)
        check_int("eval_batch", self.eval_batch, min=1, cli=None)
        if self.batch_size != "auto":
            check_int("batch_size", self.batch_size, min=1)
        if self.max_memory is not None:
            parse_memory(self.max_memory)
        check_bool("greedy", self.greedy, cli="--greedy")

    @property
    def selection(self) -> tuple[str, float]:
        """``("top_n", n)`` or ``("threshold", t)``: the selection rule in effect."""
        if self.threshold is not None:
            return "threshold", self.threshold
        return "top_n", self.top_n if self.top_n is not None else DEFAULT_TOP_N


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"10,30,100"`` → ``(10, 30, 100)`` (the ``--sweep`` option).

    Args:
        text: Comma-separated integers.

    Returns:
        The sizes, in the order given.

    Raises:
        InvalidConfigError: an item that is not an integer (``--sweep 10,abc``).
    """
    items = [s.strip() for s in text.split(",")]
    try:
        return tuple(int(s) for s in items)
    except ValueError:
        bad = next(s for s in items if not s.lstrip("-").isdigit())
        raise InvalidConfigError(
            f"--sweep must be comma-separated integers (e.g. 10,30,100), got {text!r} ({bad!r} is not an integer)"
        ) from None


def _check_prompt_end(name: str, prompt: str, target: str) -> None:
    """Refuse a prompt ending in a space or tab: the space belongs to the answer's first token.

    ``"The capital of France is " + " Paris"`` tokenizes the space as a token of its own and
    scores a different answer (issue 15: P 0.77 -> 0.01 with no warning).
    """
    if prompt[-1] in " \t":
        option = "--" + name.replace("_", "-")
        stripped = prompt.rstrip(" \t")
        fix = target if target[:1].isspace() else " " + target.lstrip()
        raise InvalidConfigError(
            f"{name} ({option}) {prompt!r} ends with whitespace, which belongs to the answer's first token; "
            f"end it at the last word ({stripped!r}) and start the answer with the space ({fix!r})"
        )


def check_circuit_inputs(
    prompt: str,
    target: str,
    corrupt_prompt: str | None,
    corrupt_target: str | None,
    config: EAPConfig,
) -> EAPConfig:
    """Check a circuit task's strings against ``config`` before any model load.

    Args:
        prompt: Clean prompt.
        target: Answer of the clean prompt.
        corrupt_prompt: Corrupted prompt, or ``None``.
        corrupt_target: Answer of the corrupted prompt (for ``metric="logit_diff"``), or ``None``.
        config: The run's config.

    Returns:
        ``config`` with ``ablation`` resolved (``corrupt`` when a corrupted prompt is given,
        else ``zero``).

    Raises:
        InvalidConfigError: an empty string, a prompt ending in a space or tab, a corrupted
            prompt equal to the clean one, an
            ablation that does not match the corrupted prompt, or a corrupted answer missing
            for (or given without) ``metric="logit_diff"``.
    """
    check_str("prompt", prompt)
    check_str("target", target)
    _check_prompt_end("prompt", prompt, target)
    if corrupt_prompt is not None:
        check_str("corrupt_prompt", corrupt_prompt)
        _check_prompt_end("corrupt_prompt", corrupt_prompt, corrupt_target or target)
        if corrupt_prompt == prompt:
            raise InvalidConfigError(
                "the corrupted prompt (--corrupt-prompt) is the clean prompt: every edge score would be 0; "
                "give the same relation with another subject (e.g. 'The capital of Italy is')"
            )
    if corrupt_target is not None:
        check_str("corrupt_target", corrupt_target)
    ablation = config.ablation or ("corrupt" if corrupt_prompt is not None else "zero")
    if ablation == "corrupt" and corrupt_prompt is None:
        raise InvalidConfigError(
            "ablation 'corrupt' needs a corrupted prompt: give --corrupt-prompt (same relation, another subject "
            "of the same token length) or use --zero-ablate"
        )
    if ablation == "zero" and corrupt_prompt is not None:
        raise InvalidConfigError("give --corrupt-prompt or --zero-ablate, not both")
    if config.metric == "logit_diff" and corrupt_target is None:
        raise InvalidConfigError(
            "--metric logit-diff needs --corrupt-target (the corrupted prompt's answer, e.g. ' Rome')"
        )
    if config.metric != "logit_diff" and corrupt_target is not None:
        raise InvalidConfigError(
            "--corrupt-target is only used by --metric logit-diff; drop it or add --metric logit-diff"
        )
    if config.direction == "denoising" and config.steps == 1 and ablation != "corrupt":
        raise InvalidConfigError(
            "direction 'denoising' takes the gradient on the corrupted run: it needs a corrupted prompt "
            "(or steps > 1, where both directions give the same scores up to sign)"
        )
    return config if config.ablation == ablation else config.replace(ablation=ablation)


__all__ = [
    "check_node_selection",
    "ABLATIONS", "DEFAULT_TOP_N", "DEFAULT_TOP_NODES", "DIRECTIONS", "EAPConfig", "GRANULARITIES", "METRICS",
    "check_circuit_inputs", "parse_sizes",
]
