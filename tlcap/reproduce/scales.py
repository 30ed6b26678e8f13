"""Sizes of every stage at each scale: ``smoke``, ``cpu``, ``full`` (one table, :func:`sizes_frame`).

- ``smoke``: seconds per stage on a tiny model, a few minutes for SmolLM2-135M on a 2-core CPU;
  it checks that every stage runs and every table has rows, not the papers' findings.
- ``cpu``: about 4–5 hours of stage time on a 2-core CPU (predict it with ``--dry-run``) with sizes chosen
  for statistical power: QL on ≥ 100 facts over ≥ 8 relations, CNL locating on ≥ 200 samples
  per dataset, 200 matched random sets for every "located vs random" p-value (two-sided floor 2/201), the
  perplexity control's included.
- ``full``: the papers' sizes (CNL §5.3: 1600 GSM8K, 2400 Emotion, 1200 Code25K → MBPP's 974,
  700 Meta_Math → SVAMP, 800 IMDB; all ParaRel facts) for a GPU or ``torchrun``.

Every field is a knob of one stage family; the stages read their sizes from here and nowhere
else, so the table in ``docs/reproduce.md`` is the whole story.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tlcap.attribution.config import IGConfig
from tlcap.config import Config, check_choice, check_float, check_int, check_nested, check_sequence
from tlcap.data.pararel import KNOWN_POLICIES
from tlcap.errors import UnknownNameError
from tlcap.metrics.permutation import MIN_NULL_DRAWS

CNL_DATASETS = ("gsm8k", "svamp", "mbpp", "emotion", "imdb")
SIGMAS = (3.0, 6.0, 12.0)


@dataclass(frozen=True)
class ScaleConfig(Config):
    """Sizes of one scale.

    Attributes:
        name: ``smoke``, ``cpu`` or ``full``.
        cnl_datasets: Datasets located (paper's Meta_Math → SVAMP, Code25K → MBPP).
        cnl_locate_n: Samples located per dataset (train split), ``None`` = the whole split.
        cnl_ig: CNL scoring's attribution settings: ``steps`` S (CNL: 20) and the quadrature ``rule``
            (``docs/kn.md``; the paper's sum: ``cnl``).
        cnl_max_answer_tokens: Answer tokens scored per sample.
        cnl_groups: Scoring groups per dataset (clusters of the bootstrap; half of them per split half).
        cnl_sigma: σ of the located set used by Tables 1, 2, Figs. 4–6 (the paper's default reading: 3).
        cnl_eval_n: Held-out samples for erase (per dataset; code datasets: ``cnl_eval_n_code``). ``cpu``: 128,
            sized for power (issue 24): at 64 the Emotion Table 3 rows had 52 / 49 / 12 % power against the
            paper's σ = 3 / 6 / 12 effects; at their variance σ = 3 and σ = 6 reach 80 % at 116 and 125 items,
            σ = 12 (the paper's −7.2 pp) would need ≈ 545 (over the 2-hour budget; its row says so).
        cnl_eval_n_code: Held-out samples for erase on a code dataset (MBPP: each is scored over its prompt and
            64 reference tokens, about 5× an Emotion sample's tokens).
        cnl_eval_datasets: Datasets erased / enhanced (Table 2 and 3 use GSM8K, Emotion, Code25K).
        cnl_eval_facts: Facts of the CNL evaluation suite (fidelity, reliability; issue 11).
        cnl_eval_pairs: Comparative pairs of the decoupling experiment.
        cnl_eval_known_top_k: Keep rewrites the model answers within its top-k (``None`` = no filter).
        cnl_eval_rewrites: Rewrites per fact (the paper: 5).
        cnl_eval_ig: KN attribution of the evaluation suite (fidelity, reliability, decoupling): ``steps``
            (KN: 20) and ``rule`` (``docs/kn.md``).
        cnl_eval_trace_samples: Noise draws of causal tracing (ROME: 10).
        cnl_eval_kc_top_n: Edges of a knowledge circuit.
        cnl_eval_kc_steps: EAP-IG steps of a knowledge circuit (1 = plain EAP).
        cnl_eval_rome_layers: Layers ROME edits in reliability / Fig. 2 (``None`` = every layer; at least two:
            Fig. 2 compares the traced layer with the others).
        cnl_eval_rome_facts: Facts ROME edits (the first ones; ``None`` = all).
        cnl_eval_rome_steps: ROME value-optimisation steps (ROME: 20).
        n_random: Matched random sets per located-vs-random comparison (≥ 20 for a p-value; ``smoke``: ≥ 5,
            the fewest draws an IPP takes; ``cpu``: 200, scored many sets per forward pass): CNL erase
            (per σ), the reliability KN sets and KC circuits per fact.
        cnl_ppl_texts: WikiText-2 test paragraphs of the perplexity control beside every CNL erase.
        cnl_ppl_n_random: Random sets (the erase's first ones) whose perplexity the control measures.
        enhance_train_n: Training samples for enhance.
        enhance_eval_n: Held-out samples for enhance.
        enhance_epochs: Epochs evaluated (the paper: 1, 5, 10).
        enhance_n_random: Random sets fine-tuned per enhance dataset (the paper: 1, which makes the located −
            random test conditional on that one draw; ``cpu`` and ``full``: 5, the located set tested against
            random sets in general, :func:`~tlcap.metrics.effects.random_draws_effect`; ``smoke``: 2).
        cross_eval_n: Held-out samples per dataset for the cross-dataset matrix.
        cross_n_random: Random draws per cell of the cross-dataset matrix.
        ql_relations: ParaRel relations (``()`` = all bundled).
        ql_n_facts: Facts (round-robin over the relations).
        ql_max_queries: Neighbor queries per fact (``None`` = all), the ones IG attributes.
        ql_known_top_k: Keep facts the model answers within its top-k (``None`` = no filter).
        ql_known_policy: Which queries must be known: ``"all"`` (of the first ``ql_max_queries``
            patterns) or ``"any"`` (the known ones among all patterns are kept, up to ``ql_max_queries``);
            :class:`~tlcap.data.pararel.ParaRelConfig`.
        ql_min_queries: Fewest queries a fact keeps after the known filter (3: no fact with CS1 ≡ CS2).
        ql_ig: QL attribution settings: ``steps`` (QL: m = 20; per word for SIG) and ``rule`` (``docs/kn.md``).
        ql_sig_facts: Facts attributed with SIG (its cost is one IG per prompt token), the first ones.
        ql_amig_facts: Facts attributed with AMIG (eq. 18: one IG per word of the query, on its
            prefix, so about n(n+1)/2 IG rows for n words), the first ones.
        ql_sig_amig_queries: Queries SIG and AMIG attribute per fact, the first ones (``None`` = all
            of the fact's; IG attributes all).
        ql_edit_queries: Queries edited per fact in Tables 2–3 (``None`` = all), the first ones the model
            answers top-1.
        ql_analysis_queries: Each fact's first queries that Tables 2–3 and Figs. 4–7 use, K_I / K_II split
            included (``None`` = all that IG attributed); the others stay out of those analyses.
        ql_thresholds: Grid of the CS2-threshold sensitivity curves.
        n_boot: Bootstrap resamples of every CI.
    """

    name: str = "smoke"
    cnl_datasets: tuple[str, ...] = CNL_DATASETS
    cnl_locate_n: int | None = 4
    cnl_ig: IGConfig = field(default_factory=lambda: IGConfig(steps=2))
    cnl_max_answer_tokens: int = 1
    cnl_groups: int = 4
    cnl_sigma: float = 3.0
    cnl_eval_n: int = 2
    cnl_eval_n_code: int = 2
    cnl_eval_datasets: tuple[str, ...] = ("emotion", "mbpp")
    cnl_eval_facts: int = 2
    cnl_eval_pairs: int = 2
    cnl_eval_known_top_k: int | None = None
    cnl_eval_rewrites: int = 2
    cnl_eval_ig: IGConfig = field(default_factory=lambda: IGConfig(steps=1))
    cnl_eval_trace_samples: int = 1
    cnl_eval_kc_top_n: int = 50
    cnl_eval_kc_steps: int = 1
    cnl_eval_rome_layers: tuple[int, ...] | None = (0, 1)
    cnl_eval_rome_facts: int | None = 1
    cnl_eval_rome_steps: int = 2
    n_random: int = 5
    cnl_ppl_texts: int = 2
    cnl_ppl_n_random: int = 2
    enhance_train_n: int = 2
    enhance_eval_n: int = 2
    enhance_epochs: tuple[int, ...] = (1,)
    enhance_n_random: int = 2
    cross_eval_n: int = 1
    cross_n_random: int = 1
    ql_relations: tuple[str, ...] = ("P36", "P37")
    ql_n_facts: int | None = 3
    ql_max_queries: int | None = 3
    ql_known_top_k: int | None = None
    ql_known_policy: str = "all"
    ql_min_queries: int = 3
    ql_ig: IGConfig = field(default_factory=lambda: IGConfig(steps=2))
    ql_sig_facts: int | None = 1
    ql_amig_facts: int | None = 1
    ql_sig_amig_queries: int | None = None
    ql_edit_queries: int | None = 1
    ql_analysis_queries: int | None = None
    ql_thresholds: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5)
    n_boot: int = 1000

    @property
    def min_null_draws(self) -> int:
        """Random sets a permutation test of this scale asks for.

        Returns:
            20 (:data:`MIN_NULL_DRAWS`), or ``n_random`` where a scale draws fewer (``smoke``).
        """
        return min(MIN_NULL_DRAWS, self.n_random)

    def validate(self) -> None:
        check_choice("name", self.name, SCALE_NAMES, cli="--scale")
        self._set("cnl_datasets", check_sequence("cnl_datasets", self.cnl_datasets, min_len=1, cli=None,
                                                 item=lambda n, x: check_choice(n, x, CNL_DATASETS, cli=None)))
        self._set("cnl_eval_datasets", check_sequence("cnl_eval_datasets", self.cnl_eval_datasets, cli=None,
                                                      item=lambda n, x: check_choice(n, x, CNL_DATASETS, cli=None)))
        check_nested(self, cnl_ig=IGConfig, cnl_eval_ig=IGConfig, ql_ig=IGConfig)
        for f in ("cnl_max_answer_tokens", "cnl_eval_facts", "cnl_eval_pairs", "cnl_eval_n", "cnl_eval_n_code",
                  "enhance_train_n",
                  "cnl_eval_trace_samples", "cnl_eval_kc_top_n", "cnl_eval_kc_steps", "cnl_eval_rome_steps",
                  "enhance_eval_n", "cross_eval_n",
                  "cross_n_random", "n_boot"):
            check_int(f, getattr(self, f), min=1, cli=None)
        check_int("cnl_groups", self.cnl_groups, min=2, cli=None)
        check_int("enhance_n_random", self.enhance_n_random, min=1, cli=None)
        check_int("n_random", self.n_random, min=5 if self.name == "smoke" else 20, cli=None)
        check_int("cnl_ppl_texts", self.cnl_ppl_texts, min=0, cli=None)
        check_int("cnl_ppl_n_random", self.cnl_ppl_n_random, min=0, cli=None)
        check_int("cnl_eval_rewrites", self.cnl_eval_rewrites, min=2, cli=None)
        if self.cnl_eval_rome_layers is not None:
            self._set("cnl_eval_rome_layers", check_sequence("cnl_eval_rome_layers", self.cnl_eval_rome_layers, min_len=2,
                                                             cli=None, item=lambda n, x: check_int(n, x, min=0, cli=None)))
        for f in ("cnl_locate_n", "cnl_eval_known_top_k", "cnl_eval_rome_facts", "ql_n_facts", "ql_max_queries",
                  "ql_known_top_k", "ql_sig_facts", "ql_amig_facts", "ql_sig_amig_queries",
                  "ql_edit_queries"):
            if getattr(self, f) is not None:
                check_int(f, getattr(self, f), min=1, cli=None)
        if self.ql_analysis_queries is not None:
            check_int("ql_analysis_queries", self.ql_analysis_queries, min=3, cli=None)
        if self.cnl_locate_n is not None and self.cnl_locate_n < self.cnl_groups:
            check_int("cnl_locate_n", self.cnl_locate_n, min=self.cnl_groups, cli=None)
        check_choice("ql_known_policy", self.ql_known_policy, KNOWN_POLICIES, cli=None)
        check_int("ql_min_queries", self.ql_min_queries, min=2, cli=None)
        if self.ql_max_queries is not None and self.ql_max_queries < self.ql_min_queries:
            check_int("ql_max_queries", self.ql_max_queries, min=self.ql_min_queries, cli=None)
        check_float("cnl_sigma", self.cnl_sigma, gt=0, cli=None)
        self._set("enhance_epochs", check_sequence("enhance_epochs", self.enhance_epochs, min_len=1, unique=True, cli=None,
                                                   item=lambda n, x: check_int(n, x, min=1, cli=None)))
        self._set("ql_relations", tuple(check_sequence("ql_relations", self.ql_relations, cli=None)))
        self._set("ql_thresholds", check_sequence("ql_thresholds", self.ql_thresholds, min_len=2, cli=None,
                                                  item=lambda n, x: check_float(n, x, ge=0, le=1, cli=None)))


SCALE_NAMES = ("smoke", "cpu", "full")

# Relations with >= 4 patterns where SmolLM2-135M has >= 4 queries in its top-10 for most facts (survey of the
# first 16 facts of 23 relations, issue 24): P37, P364, P20, P106, P39, P449 give almost none; P103 has 2 patterns.
QL_CPU_RELATIONS = ("P36", "P30", "P495", "P176", "P178", "P407", "P740", "P47", "P1376", "P159")

SCALES: dict[str, ScaleConfig] = {
    "smoke": ScaleConfig(),
    # cpu: every reduction from the paper's settings is listed in docs/reproduce.md ("cpu: what was reduced")
    "cpu": ScaleConfig(
        name="cpu", cnl_locate_n=200, cnl_ig=IGConfig(steps=4, rule="gauss_legendre"), cnl_max_answer_tokens=1, cnl_groups=20,
        cnl_eval_n=128, cnl_eval_n_code=10, cnl_eval_datasets=("emotion", "mbpp"), n_random=200, cnl_ppl_texts=4,
        cnl_ppl_n_random=200,
        cnl_eval_facts=10, cnl_eval_known_top_k=1, cnl_eval_rewrites=5, cnl_eval_ig=IGConfig(steps=4, rule="gauss_legendre"),
        cnl_eval_trace_samples=3, cnl_eval_kc_top_n=300, cnl_eval_kc_steps=1, cnl_eval_rome_layers=(0, 5, 10, 15, 20, 25),
        cnl_eval_rome_facts=3, cnl_eval_rome_steps=10, cnl_eval_pairs=30,
        enhance_train_n=50, enhance_eval_n=200, enhance_epochs=(1,), enhance_n_random=5, cross_eval_n=25, cross_n_random=3,
        ql_relations=QL_CPU_RELATIONS, ql_n_facts=140, ql_max_queries=6, ql_known_top_k=10, ql_known_policy="any",
        ql_min_queries=3, ql_ig=IGConfig(steps=4, rule="gauss_legendre"), ql_sig_facts=10, ql_amig_facts=10,
        ql_sig_amig_queries=3,
        ql_edit_queries=1, ql_analysis_queries=3,
        n_boot=5000,
    ),
    "full": ScaleConfig(
        name="full", cnl_eval_known_top_k=1,
        # 8 samples' rows share passes (exact; 0.39–0.51 s vs 4.4 s per GSM8K sample at 7B on an H200, README)
        cnl_locate_n=None, cnl_ig=IGConfig(steps=20, sample_batch=8), cnl_max_answer_tokens=32, cnl_groups=20, cnl_eval_n=1000,
        cnl_eval_n_code=1000,
        cnl_ppl_texts=64, cnl_ppl_n_random=200,
        cnl_eval_datasets=("gsm8k", "emotion", "mbpp", "svamp", "imdb"), cnl_eval_facts=200, cnl_eval_pairs=1000,
        n_random=200, cnl_eval_rewrites=5, cnl_eval_ig=IGConfig(steps=20), cnl_eval_trace_samples=10, cnl_eval_kc_top_n=300,
        cnl_eval_kc_steps=5,
        cnl_eval_rome_layers=None, cnl_eval_rome_facts=None, cnl_eval_rome_steps=20,
        enhance_train_n=1000, enhance_eval_n=1000,
        enhance_epochs=(1, 5, 10), enhance_n_random=5, cross_eval_n=500, cross_n_random=5, ql_relations=(), ql_n_facts=None,
        ql_max_queries=None, ql_known_top_k=10, ql_ig=IGConfig(steps=20), ql_sig_facts=None, ql_amig_facts=None,
        ql_edit_queries=None, n_boot=5000,
    ),
}

# The CNL paper's locate sizes (§5.3), capped by what the stand-in datasets hold (train split).
FULL_LOCATE_N = {"gsm8k": 1600, "emotion": 2400, "mbpp": 1200, "svamp": 700, "imdb": 800}


def get_scale(name: str) -> ScaleConfig:
    """The sizes of scale ``name`` (:class:`UnknownNameError` for another name).

    Args:
        name: ``"smoke"``, ``"cpu"`` or ``"full"`` (a key of :data:`SCALES`).

    Returns:
        The scale's :class:`ScaleConfig`.
    """
    if name not in SCALES:
        raise UnknownNameError.of("scale", name, SCALE_NAMES, option="--scale")
    return SCALES[name]


def locate_n(scale: ScaleConfig, dataset: str) -> int | None:
    """Samples located on ``dataset`` at ``scale`` (``full``: the paper's count for the dataset it stands for).

    Args:
        scale: The scale's sizes.
        dataset: The CNL dataset, e.g. ``"gsm8k"``.

    Returns:
        The scale's ``cnl_locate_n``, or when it is ``None`` the dataset's :data:`FULL_LOCATE_N` entry
        (``None``: every sample).
    """
    if scale.cnl_locate_n is None:
        return FULL_LOCATE_N.get(dataset)
    return scale.cnl_locate_n


def sizes_frame() -> pd.DataFrame:
    """Every size of every scale: one row per knob, one column per scale.

    Returns:
        A DataFrame with a ``knob`` column and one column per scale; nested configs show the fields some scale
        changes (and ``steps``, ``rule``) as ``config.field``; ``None`` and empty tuples read ``all``.
    """
    rows = []
    for f in ScaleConfig.field_names():
        if f == "name":
            continue
        if isinstance(getattr(SCALES["smoke"], f), Config):  # a nested config: the fields some scale sets
            sub = [g for g in type(getattr(SCALES["smoke"], f)).field_names()
                   if len({repr(getattr(getattr(SCALES[s], f), g)) for s in SCALE_NAMES}) > 1 or g in ("steps", "rule")]
            rows += [{"knob": f"{f}.{g}", **{s: _fmt(getattr(getattr(SCALES[s], f), g)) for s in SCALE_NAMES}} for g in sub]
            continue
        rows.append({"knob": f, **{s: _fmt(getattr(SCALES[s], f)) for s in SCALE_NAMES}})
    return pd.DataFrame(rows, columns=["knob", *SCALE_NAMES])


def _fmt(v: object) -> str:
    if v is None:
        return "all"
    if isinstance(v, tuple):
        return ", ".join(str(x) for x in v) if v else "all"
    return str(v)


__all__ = ["ScaleConfig", "SCALES", "SCALE_NAMES", "CNL_DATASETS", "SIGMAS", "get_scale", "locate_n", "sizes_frame",
           "FULL_LOCATE_N"]
