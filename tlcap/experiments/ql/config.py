"""Configs of the Query Localization analyses: frozen, validated at construction.

- :class:`QLConfig` — attribution (an :class:`~tlcap.attribution.config.IGConfig`), KN selection
  and the K_I / K_II split: what :func:`localize_facts` and :func:`consistency_analysis` need.
- :class:`ModificationConfig` — erasure / update / CAS edits and their metrics (Tables 2, 3).
- :class:`MappingConfig` — query-KN mapping (Fig. 4).
- :class:`SynapseConfig` — knowledge synapses and predominance (Figs. 5, 6, 7).

Every field's CLI option is ``--`` + its name with ``_`` → ``-`` (``tlcap ql ...``); the
attribution fields are the ``IGConfig`` ones (``--steps``).

Example:
    >>> cfg = QLConfig(ig=IGConfig(steps=10), split="otsu")
    >>> cfg.ig.steps, cfg.split
    (10, 'otsu')
    >>> cfg.replace(kn_threshold=1.5)
    Traceback (most recent call last):
    ...
    tlcap.errors.InvalidConfigError: kn_threshold (--kn-threshold) must be in (0, 1], got 1.5
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tlcap.attribution.amig import WORDS
from tlcap.attribution.config import IGConfig
from tlcap.config import Config, check_bool, check_choice, check_float, check_int, check_nested, check_sequence, check_str
from tlcap.intervene.update import UPDATE_RULES
from tlcap.locate.selection import AMIG_TAU, SELECTIONS

SPLITS: tuple[str, ...] = ("static", "otsu")
OPERATIONS: tuple[str, ...] = ("erasure", "update")
KN_SETS: tuple[str, ...] = ("local", "global", "cas")
STATIC_THRESHOLD = 0.1
KN_THRESHOLD = 0.2
EXCLUDED = "excluded"
"""Group label of a fact with fewer than 3 queries (CS1 ≡ CS2): neither K_I nor K_II; every analysis skips it."""
GROUPS: tuple[str, ...] = ("K_I", "K_II", EXCLUDED)


@dataclass(frozen=True)
class QLConfig(Config):
    """Attribution, knowledge-neuron selection and the K_I / K_II split.

    Attributes:
        ig: Settings of the localization method (steps, quadrature rule, ...);
            ``steps`` is per layer (per word for SIG).
        kn_threshold: ``t`` of the relative rule ``score > t · max``, in ``(0, 1]`` (Dai: 0.2).
        selection: KNs of one query: ``"own"`` (default: each method's published rule — IG and
            SIG ``score > t · max``, AMIG eq. 19 ``score > amig_tau``) or ``"relative"``
            (``score > t · max`` for every method); :func:`tlcap.locate.selection.method_select`.
        amig_tau: τ of AMIG's eq. 19 on eq. 18-normalised scores, ``> 0`` (the paper prints none).
        amig_words: AMIG's words: ``"all"`` (eq. 18, default) or ``"last"`` (the last word only).
        static_threshold: CS2 threshold of the static split, in ``[0, 1]`` (QL Table 4: 0.1).
        split: ``"static"`` or ``"otsu"``: the split the headline numbers use.
    """

    ig: IGConfig = field(default_factory=IGConfig)
    kn_threshold: float = KN_THRESHOLD
    selection: str = "own"
    amig_tau: float = AMIG_TAU
    amig_words: str = "all"
    static_threshold: float = STATIC_THRESHOLD
    split: str = "static"

    def validate(self) -> None:
        check_nested(self, ig=IGConfig)
        check_float("kn_threshold", self.kn_threshold, gt=0, le=1)
        check_choice("selection", self.selection, SELECTIONS)
        check_float("amig_tau", self.amig_tau, gt=0)
        check_choice("amig_words", self.amig_words, WORDS)
        check_float("static_threshold", self.static_threshold, ge=0, le=1)
        check_choice("split", self.split, SPLITS)


def _check_names(name: str, value: Any, choices: tuple[str, ...], what: str) -> tuple[str, ...]:
    return check_sequence(name, list(value), min_len=1, unique=True,
                          item=lambda n, x: check_choice(what, x, choices, cli=f"--{name}"))


@dataclass(frozen=True)
class ModificationConfig(Config):
    """Settings of the knowledge-modification experiments (QL §2.2 Table 2, §3.3 Table 3).

    Attributes:
        operations: ``"erasure"`` (weights → 0) and/or ``"update"`` (eq. 2).
        sets: KN sets edited: ``"local"`` (N_i), ``"global"`` (N_g = ∪N_j), ``"cas"`` (eq. 7).
        lambda1: Update weight of the old object's embedding (paper: 2), ``>= 0``.
        lambda2: Update weight of the new object's embedding (paper: 2), ``>= 0``.
        edit_queries: Edit n queries of each fact (``None``: all), ``>= 1``: the first n the model
            answers top-1 with ``only_known`` (else the first n).
        n_locality: Unrelated prompts scored for locality, ``>= 0``.
        n_ppl_texts: WikiText-2 paragraphs for ΔPPL, ``>= 1``.
        ppl_max_tokens: Tokens per ΔPPL text, ``>= 2``.
        beta1: CAS weight of the mean score (paper: 0.7).
        beta2: CAS weight of the score's spread (paper: 0.3).
        cas_threshold: CAS KNs: ``CAS > cas_threshold · max``, in ``(0, 1]`` (paper: 0.3).
        update_rule: ``"activation"`` (default: each KN's change follows the sign and size of
            its activation at the query) or ``"paper"`` (eq. 2 as printed);
            :mod:`tlcap.intervene.update`.
        update_size: ``update_rule="activation"``: the write added at the query in units of the
            KNs' own output there (default 1: as large as what they write now), ``> 0``.
        only_known: Edit and score only queries the model answers top-1 before the edit (Gen
            over such neighbors); ``False`` edits every query.
        seed: Seed of the draws (o', locality prompts, ΔPPL texts), ``>= 0``.
    """

    operations: tuple[str, ...] = OPERATIONS
    sets: tuple[str, ...] = ("local", "global")
    lambda1: float = 2.0
    lambda2: float = 2.0
    edit_queries: int | None = None
    n_locality: int = 5
    n_ppl_texts: int = 5
    ppl_max_tokens: int = 128
    beta1: float = 0.7
    beta2: float = 0.3
    cas_threshold: float = 0.3
    update_rule: str = "activation"
    update_size: float = 1.0
    only_known: bool = True
    seed: int = 0

    def validate(self) -> None:
        self._set("operations", _check_names("operations", self.operations, OPERATIONS, "operation"))
        self._set("sets", _check_names("sets", self.sets, KN_SETS, "KN set"))
        check_float("lambda1", self.lambda1, ge=0)
        check_float("lambda2", self.lambda2, ge=0)
        if self.edit_queries is not None:
            check_int("edit_queries", self.edit_queries, min=1)
        check_int("n_locality", self.n_locality, min=0)
        check_int("n_ppl_texts", self.n_ppl_texts, min=1)
        check_int("ppl_max_tokens", self.ppl_max_tokens, min=2)
        check_float("beta1", self.beta1, ge=0)
        check_float("beta2", self.beta2, ge=0)
        check_float("cas_threshold", self.cas_threshold, gt=0, le=1)
        check_choice("update_rule", self.update_rule, UPDATE_RULES, cli="--rule")
        check_float("update_size", self.update_size, gt=0, cli="--update-size")
        check_bool("only_known", self.only_known, cli="--all-queries")
        check_int("seed", self.seed, min=0)


@dataclass(frozen=True)
class MappingConfig(Config):
    """Settings of the query-KN mapping demonstration (QL §3.1, Fig. 4).

    Attributes:
        factor: Enhancement factor of the KN activations (suppression sets them to 0), ``>= 0``.
    """

    factor: float = 2.0

    def validate(self) -> None:
        check_float("factor", self.factor, ge=0)


@dataclass(frozen=True)
class SynapseConfig(Config):
    """Settings of the dynamic-KN-selection experiments (QL §3.2, Figs. 5, 6, 7/10).

    Attributes:
        alpha: α of the synapse threshold τ (eq. 5; paper: 0.3), ``> 0``.
        factor: Enhancement factor of the synapses' attention (suppression: 0), ``>= 0``.
        skip_first: Leave position 0 (the attention sink) out of predominance and synapses.
        irrelevant_prompt: Take the irrelevant synapses S_ir from this prompt instead of
            another fact's query (``None``: another fact).
        heatmap_fact: Fact whose KN activations are drawn (Figs. 1, 7, 10), ``>= 0``; ``None`` (default): the
            first fact in K_I or K_II with knowledge neurons (an excluded fact has no rows to draw).
        heatmap_max_cols: Most KNs in that heatmap, ``>= 1``.
        seed: Seed of the irrelevant fact and query drawn for each query, ``>= 0``.
    """

    alpha: float = 0.3
    factor: float = 2.0
    skip_first: bool = True
    irrelevant_prompt: str | None = None
    heatmap_fact: int | None = None
    heatmap_max_cols: int = 40
    seed: int = 0

    def validate(self) -> None:
        check_float("alpha", self.alpha, gt=0)
        check_float("factor", self.factor, ge=0)
        check_bool("skip_first", self.skip_first, cli="--keep-first")
        if self.irrelevant_prompt is not None:
            check_str("irrelevant_prompt", self.irrelevant_prompt, cli=None)
        if self.heatmap_fact is not None:
            check_int("heatmap_fact", self.heatmap_fact, min=0, cli=None)
        check_int("heatmap_max_cols", self.heatmap_max_cols, min=1, cli=None)
        check_int("seed", self.seed, min=0)


__all__ = [
    "EXCLUDED", "GROUPS", "KN_SETS", "KN_THRESHOLD", "OPERATIONS", "SPLITS", "STATIC_THRESHOLD",
    "MappingConfig", "ModificationConfig", "QLConfig", "SynapseConfig",
]
