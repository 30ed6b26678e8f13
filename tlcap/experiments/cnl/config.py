"""Configs of the CNL experiments: frozen, validated at construction (before any forward pass).

- :class:`CNLConfig` — locating: the attribution settings (:class:`IGConfig`), the σ-mask
  (``sigma``, ``spread``), answer truncation, the convergence ladder and the split seed.
- :class:`EraseConfig` — erase: random draws and their seed.
- :class:`EnhanceConfig` — enhance: epochs, evaluation epochs, learning rate, modes.
- :class:`CrossConfig` — cross-dataset: random draws, and the enhance settings with which
  dataset's training data is used (``train_on``).

Example:
    >>> cfg = CNLConfig(sigma=6, ig=IGConfig(method="joint"))
    >>> cfg = CNLConfig.resolve(None, sigma=6, method="joint", steps=10)   # IG fields reach cfg.ig
    >>> cfg.sigma, cfg.ig.method, cfg.ig.steps
    (6.0, 'joint', 10)
    >>> CNLConfig(sigma=0)
    Traceback (most recent call last):
    ...
    tlcap.errors.InvalidConfigError: sigma (--sigma) must be > 0, got 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tlcap.attribution.config import IGConfig
from tlcap.config import Config, check_bool, check_choice, check_float, check_int, check_sequence
from tlcap.errors import CNLWarning, InvalidConfigError

SPREADS = ("std", "var")


ENHANCE_MODES = ("located", "random", "wo_located", "except_frozen")
"""``located``: train the located neurons; ``random``: as many random neurons (same count per
layer); ``wo_located``: the paper's "W/o located" — the located neurons are erased (set to 0) and
every other neuron is trained; ``except_frozen``: every other neuron is trained while the located
ones keep their original values (tlcap before 0.2; not the paper's)."""
TRAIN_ON = ("source", "target")


def check_sigmas(sigmas: Any, option: str = "--sigma") -> tuple[float, ...]:
    """A non-empty list of distinct σ > 0 (σ ≤ 0 would select every neuron).

    Args:
        sigmas: The σ values asked for (a sequence).
        option: The CLI option named in error messages.

    Returns:
        The σ values as floats, in the given order.
    """
    return check_sequence("sigma", sigmas, min_len=1, unique=True, cli=option,
                          item=lambda n, x: check_float(n, x, gt=0, cli=option))


def _modes(modes: Any) -> tuple[str, ...]:
    return check_sequence("modes", modes, min_len=1, unique=True,
                          item=lambda n, x: check_choice("mode", x, ENHANCE_MODES, cli="--modes"))


@dataclass(frozen=True)
class CNLConfig(Config):
    """Settings of :func:`~tlcap.experiments.cnl.cnl_locate` (the options of ``tlcap cnl locate``).

    Attributes:
        ig: Attribution settings (steps S = 20 as in the paper, rule, ``method`` ``ig`` /
            ``joint`` / ``grad_x_act``, layers, batch size).
        sigma: σ of the mask ``|score − mean| > σ · spread``, ``> 0`` (paper: 3, 6, 12).
        spread: ``std`` (default) or ``var`` (the paper's literal text).
        max_answer_tokens: Answer tokens scored per sample (the first ones), ``>= 1``.
        convergence_points: Points of the convergence ladder per half, ``>= 1``.
        seed: Seed of the split into halves, ``>= 0``.
    """

    ig: IGConfig = field(default_factory=IGConfig)
    sigma: float = 3.0
    spread: str = "std"
    max_answer_tokens: int = 8
    convergence_points: int = 4
    seed: int = 0

    def validate(self) -> None:
        if not isinstance(self.ig, IGConfig):
            raise InvalidConfigError(f"ig must be an IGConfig, got {type(self.ig).__name__}")
        self._set("sigma", check_float("sigma", self.sigma, gt=0))
        check_choice("spread", self.spread, SPREADS)
        check_int("max_answer_tokens", self.max_answer_tokens, min=1)
        check_int("convergence_points", self.convergence_points, min=1)
        check_int("seed", self.seed, min=0)


@dataclass(frozen=True)
class EraseConfig(Config):
    """Settings of :func:`~tlcap.experiments.cnl.erase_effect` and ``erase_sweep``.

    Attributes:
        n_random: Random neuron sets (same count per layer, excluding the located ones) whose
            erasure is the baseline, ``>= 0`` (0: no baseline; its numbers are then absent).
        seed: Seed of the random draws, ``>= 0``.
        include_input: Also zero the erased neurons' input weights (default: only their
            down-projection rows, the paper's erase).
        batched: Score many sets per forward pass, each batch row with its own set's activations
            zeroed (:func:`tlcap.metrics.set_scores.erased_scores`; the same numbers as erasing
            the weights); ``False``: one set at a time with weight edits (the reference).
        ppl_texts: WikiText-2 test paragraphs of the perplexity control (0: no control).
        ppl_n_random: Random sets (the first ones) whose perplexity is measured too.
        ppl_max_tokens: Tokens per paragraph of the control.
    """

    n_random: int = 3
    seed: int = 0
    include_input: bool = False
    batched: bool = True
    ppl_texts: int = 0
    ppl_n_random: int = 20
    ppl_max_tokens: int = 128

    def validate(self) -> None:
        check_int("n_random", self.n_random, min=0)
        check_int("seed", self.seed, min=0)
        check_bool("include_input", self.include_input, cli=None)
        check_bool("batched", self.batched, cli=None)
        check_int("ppl_texts", self.ppl_texts, min=0)
        check_int("ppl_n_random", self.ppl_n_random, min=0)
        check_int("ppl_max_tokens", self.ppl_max_tokens, min=2)


@dataclass(frozen=True)
class EnhanceConfig(Config):
    """Settings of :func:`~tlcap.experiments.cnl.enhance_effect` (CNL Table 2).

    Attributes:
        epochs: Fine-tuning epochs, ``>= 1``.
        eval_epochs: Epochs after which held-out accuracy is measured (each in ``1..epochs``);
            ``None``: 1, 5 and 10 where ``<= epochs``, and the last epoch.
        lr: Adam learning rate, ``> 0`` (paper: 1e-5).
        modes: Which neurons learn, from ``located``, ``random``, ``wo_located`` (the paper's
            "W/o located": located neurons erased, every other neuron trained) and
            ``except_frozen`` (others trained, located ones kept; not the paper's).
        max_answer_tokens: Answer tokens in the loss, ``>= 1``.
        seed: Seed of the random neurons and the sample order, ``>= 0``.
        n_random: Random sets fine-tuned in mode ``random``, ``>= 1`` (the paper: 1). Set ``k`` is drawn with
            seed ``seed + k`` (set 0 is the paper's one) and trained on the same samples in the same order; with
            two or more, located − random can be tested against random sets in general, not only against the one
            drawn (:func:`~tlcap.metrics.effects.random_draws_effect`).
    """

    epochs: int = 10
    eval_epochs: Sequence[int] | None = None
    lr: float = 1e-5
    modes: Sequence[str] = ("located", "random", "wo_located")
    max_answer_tokens: int = 16
    seed: int = 0
    n_random: int = 1

    def validate(self) -> None:
        epochs = check_int("epochs", self.epochs, min=1)
        if self.eval_epochs is not None:
            self._set("eval_epochs", check_sequence(
                "eval_epochs", self.eval_epochs, min_len=1, unique=True,
                item=lambda n, x: check_int(n, x, min=1, max=epochs, cli="--eval-epochs")))
        self._set("lr", check_float("lr", self.lr, gt=0))
        self._set("modes", _modes(self.modes))
        check_int("max_answer_tokens", self.max_answer_tokens, min=1)
        check_int("seed", self.seed, min=0)
        check_int("n_random", self.n_random, min=1)

    @property
    def evaluated_epochs(self) -> tuple[int, ...]:
        """``eval_epochs``, or by default 1, 5 and 10 where ``<= epochs`` and the last epoch."""
        if self.eval_epochs is not None:
            return tuple(self.eval_epochs)
        return tuple(sorted({e for e in (1, 5, 10) if e <= self.epochs} | {self.epochs}))


@dataclass(frozen=True)
class CrossConfig(Config):
    """Settings of :func:`~tlcap.experiments.cnl.cross_dataset`.

    Attributes:
        n_random: Random draws for the erase baseline, ``>= 0``.
        seed: Seed, ``>= 0``.
        train_on: With enhance: ``source`` (the paper's App. G: fine-tune dataset A's neurons on
            A's training data, evaluate on every B) or ``target`` (A's neurons trained on B's
            training data; not the paper's experiment).
        epochs: Fine-tuning epochs, ``>= 1``.
        lr: Adam learning rate, ``> 0``.
        modes: Enhance modes compared (see :class:`EnhanceConfig`).
        max_answer_tokens: Answer tokens in the loss, ``>= 1``.
    """

    n_random: int = 3
    seed: int = 0
    train_on: str = "source"
    epochs: int = 1
    lr: float = 1e-5
    modes: Sequence[str] = ("located", "random", "wo_located")
    max_answer_tokens: int = 16

    def validate(self) -> None:
        check_int("n_random", self.n_random, min=0)
        check_int("seed", self.seed, min=0)
        check_choice("train_on", self.train_on, TRAIN_ON)
        check_int("epochs", self.epochs, min=1)
        self._set("lr", check_float("lr", self.lr, gt=0))
        self._set("modes", _modes(self.modes))
        check_int("max_answer_tokens", self.max_answer_tokens, min=1)


__all__ = [
    "CNLWarning", "CNLConfig", "EraseConfig", "EnhanceConfig", "CrossConfig", "ENHANCE_MODES", "SPREADS", "TRAIN_ON",
    "check_sigmas",
]
