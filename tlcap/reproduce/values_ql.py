"""The QL paper's numbers (Chen et al., "Knowledge Localization: Mission Not Accomplished? Enter
Query Localization!"), as printed rows (see :mod:`.paper_values`).

Source: ``query-localization.md``. Model spellings are normalised (``LLaMA2-7b`` →
``LLaMA2-7B``). Localization methods are named as in tlcap: ``IG`` (Dai et al. [7]), ``SIG``
(Enguehard [10]), ``AMIG`` (Chen et al. [4]). Figures 3–7 print no numbers; what the text says
about them is in :data:`CLAIMS`.
"""

from __future__ import annotations

from tlcap.reproduce.paper_values import Block, PaperClaim, columns

QL = "query-localization.md"
G2, L2, L3 = "GPT-2", "LLaMA2-7B", "LLaMA3-8B"
MODELS = (G2, L2, L3)
METHODS = ("IG", "SIG", "AMIG")

T1_DEF = {
    "R:I": "share of facts in K_I (CS2 above the threshold)",
    "S:I": "mean KN-consistency score CS2 of the K_I facts",
    "R:II": "share of facts in K_II (CS2 at or below the threshold)",
    "S:II": "mean CS2 of the K_II facts",
    "t": "Welch's t statistic between the CS2 of K_I and K_II (p < 1e-6 in all cases)",
    "∩:II": "share of facts classified K_II by all three localization methods",
}
MOD_DEF = {
    "Rel": "reliability: edited query answered as intended (erasure: 1 − accuracy on the original object; update: "
           "accuracy on the new object)",
    "Gen": "generalization: the same on the neighbor queries",
    "Loc": "locality: unrelated facts' answers unchanged",
    "Avg": "mean of Rel, Gen and Loc",
    "ΔPPL": "relative perplexity change (PPL_after − PPL_before)/PPL_before on five WikiText-2 entries",
}
_T1 = (*columns(None, method=METHODS[:2], quantity=("R:I", "S:I", "R:II", "S:II", "t")),
       *columns(None, method=METHODS[2:], quantity=("R:I", "S:I", "R:II", "S:II")),
       *columns("∩:II", method=("all",)))
_MOD = columns(None, quantity=("Rel", "Gen", "Loc", "Avg", "ΔPPL"))


def _t1(model: str, threshold: str, line: int, numbers: str) -> Block:
    return Block("ql", "Table 1", model, numbers, _T1, f"{QL}:{line}", "fraction", T1_DEF,
                 coords=(("threshold", threshold),))


def _mod(item: str, op: str, kn_set: str, group: str, line: int, numbers: str, notes: dict | None = None) -> list[Block]:
    """One printed row of Table 2/3 holds the three models side by side: one block per model."""
    toks = numbers.split()
    out = []
    for k, model in enumerate(MODELS):
        out.append(Block("ql", item, model, " ".join(toks[5 * k:5 * k + 5]), _MOD, f"{QL}:{line}", "fraction", MOD_DEF,
                         coords=(("operation", op), ("set", kn_set), ("group", group)),
                         notes=(notes or {}).get(model, {})))
    return out


_AVG_T2 = {L2: {"Avg": "Avg (0.42) is not the mean of Rel, Gen, Loc (0.47); Table 3 prints 0.47 for the same row."},
           L3: {"Avg": "Avg (0.49) is not the mean of Rel, Gen, Loc (0.42); Table 3 prints 0.42 for the same row."}}
_AVG_UPD = {L2: {"Avg": "Avg (0.68) is not the mean of Rel, Gen, Loc (0.58), here and in Table 3."}}

BLOCKS: tuple[Block, ...] = (
    # ------------------------------------------------------------------ Table 1 (consistency)
    _t1(G2, "static", 71, "0.56 0.21 0.44 0.03 236 0.54 0.23 0.46 0.03 235 0.53 0.25 0.47 0.03 0.42"),
    _t1(G2, "Otsu", 72, "0.41 0.24 0.59 0.06 223 0.44 0.29 0.55 0.05 219 0.40 0.29 0.60 0.06 0.53"),
    _t1(L2, "static", 77, "0.40 0.21 0.60 0.04 158 0.39 0.20 0.61 0.04 150 0.40 0.20 0.60 0.04 0.55"),
    _t1(L2, "Otsu", 78, "0.21 0.28 0.79 0.062 152 0.20 0.25 0.80 0.07 158 0.24 0.30 0.76 0.06 0.70"),
    _t1(L3, "static", 83, "0.16 0.16 0.84 0.03 114 0.15 0.18 0.85 0.03 105 0.18 0.19 0.82 0.03 0.77"),
    _t1(L3, "Otsu", 84, "0.23 0.14 0.77 0.03 128 0.21 0.15 0.79 0.03 107 0.24 0.16 0.76 0.03 0.70"),
    # ------------------------------------------------------------------ Table 4 (thresholds of Table 1)
    *(Block("ql", "Table 4", model, nums, columns("threshold", method=METHODS), f"{QL}:{line}", "threshold",
            {"threshold": "CS2 threshold separating K_I (above) from K_II"}, coords=(("threshold", kind),))
      for model, kind, line, nums in ((G2, "static", 313, "0.1 0.1 0.1"), (G2, "Otsu", 314, "0.146 0.150 0.148"),
                                      (L2, "static", 317, "0.1 0.1 0.1"), (L2, "Otsu", 318, "0.170 0.169 0.170"),
                                      (L3, "static", 321, "0.1 0.1 0.1"), (L3, "Otsu", 322, "0.080 0.082 0.081"))),
    # ------------------------------------------------------------------ Table 2 (modification)
    *_mod("Table 2", "erasure", "N_i", "K_I", 118, "0.55 0.47 0.93 0.65 0.02 0.33 0.34 0.79 0.49 0.01 0.28 0.30 0.83 0.47 0.04"),
    *_mod("Table 2", "erasure", "N_i", "K_II", 119, "0.50 0.09 0.97 0.52 0.06 0.36 0.11 0.80 0.42 0.03 0.34 0.04 0.90 0.43 0.05"),
    *_mod("Table 2", "update", "N_i", "K_I", 123, "0.53 0.40 0.99 0.64 0.04 0.30 0.39 0.89 0.53 0.03 0.30 0.29 0.79 0.46 0.07"),
    *_mod("Table 2", "update", "N_i", "K_II", 124, "0.44 0.11 0.96 0.50 0.09 0.39 0.07 0.80 0.42 0.08 0.29 0.08 0.86 0.41 0.08"),
    *_mod("Table 2", "erasure", "N_g", "K_I", 128, "0.58 0.55 0.90 0.68 0.12 0.30 0.55 0.70 0.52 0.08 0.30 0.35 0.80 0.48 0.18"),
    *_mod("Table 2", "erasure", "N_g", "K_II", 129, "0.65 0.60 0.70 0.65 2.02 0.44 0.45 0.52 0.42 1.50 0.36 0.40 0.50 0.49 1.05",
          _AVG_T2),
    *_mod("Table 2", "update", "N_g", "K_I", 133, "0.56 0.48 0.88 0.64 0.13 0.32 0.59 0.82 0.68 0.10 0.44 0.41 0.74 0.53 0.22",
          _AVG_UPD),
    *_mod("Table 2", "update", "N_g", "K_II", 134, "0.54 0.55 0.74 0.61 1.88 0.40 0.43 0.62 0.48 1.16 0.29 0.33 0.66 0.43 0.93"),
    # ------------------------------------------------------------------ Table 3 (CAS)
    *_mod("Table 3", "erasure", "N_i", "K_I", 199, "0.55 0.47 0.93 0.65 0.02 0.33 0.34 0.79 0.49 0.01 0.28 0.30 0.83 0.47 0.04"),
    *_mod("Table 3", "erasure", "N_g", "K_I", 200, "0.58 0.55 0.90 0.68 0.12 0.30 0.55 0.70 0.52 0.08 0.30 0.35 0.80 0.48 0.18"),
    *_mod("Table 3", "erasure", "CAS", "K_I", 201, "0.56 0.50 0.90 0.65 0.03 0.32 0.44 0.88 0.55 0.03 0.30 0.33 0.80 0.48 0.02"),
    *_mod("Table 3", "erasure", "N_i", "K_II", 202, "0.50 0.09 0.97 0.52 0.06 0.36 0.11 0.80 0.42 0.03 0.34 0.04 0.90 0.43 0.05"),
    *_mod("Table 3", "erasure", "N_g", "K_II", 203, "0.65 0.60 0.70 0.65 2.02 0.44 0.45 0.52 0.47 1.50 0.36 0.40 0.50 0.42 1.05"),
    *_mod("Table 3", "erasure", "CAS", "K_II", 204, "0.55 0.40 0.90 0.62 0.10 0.35 0.35 0.77 0.49 0.06 0.34 0.30 0.88 0.51 0.09"),
    *_mod("Table 3", "update", "N_i", "K_I", 208, "0.53 0.40 0.99 0.64 0.04 0.30 0.39 0.89 0.53 0.03 0.30 0.29 0.79 0.46 0.07"),
    *_mod("Table 3", "update", "N_g", "K_I", 209, "0.56 0.48 0.88 0.64 0.13 0.32 0.59 0.82 0.68 0.10 0.44 0.41 0.74 0.53 0.22",
          _AVG_UPD),
    *_mod("Table 3", "update", "CAS", "K_I", 210, "0.55 0.44 0.98 0.66 0.14 0.30 0.50 0.88 0.56 0.10 0.35 0.33 0.70 0.46 0.10"),
    *_mod("Table 3", "update", "N_i", "K_II", 211, "0.44 0.11 0.96 0.50 0.09 0.39 0.07 0.80 0.42 0.08 0.29 0.08 0.86 0.41 0.08"),
    *_mod("Table 3", "update", "N_g", "K_II", 212, "0.54 0.55 0.74 0.61 1.88 0.40 0.43 0.62 0.48 1.16 0.29 0.33 0.66 0.43 0.93"),
    *_mod("Table 3", "update", "CAS", "K_II", 213, "0.45 0.45 0.88 0.59 0.20 0.40 0.38 0.75 0.51 0.12 0.29 0.29 0.80 0.46 0.14"),
    # ------------------------------------------------------------------ numbers in the text
    Block("ql", "§1 introduction", L3, "77", columns("∩:II", method=("all",)), f"{QL}:36", "%",
          {"∩:II": "share of facts K_II under all three methods ('this proportion reaches 77%'), %"},
          coords=(("threshold", "static"),)),
    Block("ql", "§1 introduction", L3, "8 9", columns("gain", baseline=("N_i", "N_g")), f"{QL}:49", "%",
          {"gain": "Avg of Consistency-Aware KN erasure minus the baseline's Avg, K_II facts (Table 3), points"},
          coords=(("operation", "erasure"), ("group", "K_II"))),
    Block("ql", "A.1 hyper-parameters", "all", "2 2", columns(None, quantity=("lambda1", "lambda2")), f"{QL}:328",
          "count", {"lambda1": "λ1 of the Update edit (eq. 2)", "lambda2": "λ2 of the Update edit (eq. 2)"}),
    Block("ql", "A.1 hyper-parameters", "all", "0.3", columns("alpha"), f"{QL}:330", "threshold",
          {"alpha": "scaling factor of the synapse threshold τ (eqs. 5–6; the text calls it τ)"}),
    Block("ql", "A.1 hyper-parameters", "all", "0.7 0.3 0.3", columns(None, quantity=("beta1", "beta2", "cas_threshold")),
          f"{QL}:332", "threshold", {"beta1": "β1 of CAS (eq. 7)", "beta2": "β2 of CAS (eq. 7)",
                                     "cas_threshold": "CAS > t · max(CAS) selects the KNs to edit"}),
    Block("ql", "A.2 dataset", "all", "328 38 2", columns(None, quantity=("paraphrases", "relations", "excluded")),
          f"{QL}:336", "count", {"paraphrases": "ParaRel paraphrases", "relations": "ParaRel relations",
                                 "excluded": "relations excluded (no paraphrases)"}),
    Block("ql", "A.4 IG", "all", "20", columns("steps"), f"{QL}:417", "count",
          {"steps": "Riemann steps m of the IG approximation (eq. 10)"}),
)

CLAIMS: tuple[PaperClaim, ...] = (
    PaperClaim("ql.table1.k1-vs-k2", "ql", "Table 1", MODELS,
               "The difference between K_I and K_II is significant (high t statistics, p < 1e-6 in all cases).",
               "mean CS2 of K_I minus mean CS2 of K_II (Welch's t-test)", +1, f"{QL}:66"),
    PaperClaim("ql.fig3.majority-below", "ql", "Fig. 3", (G2,),
               "Using an example threshold of 0.3, the majority of facts across various relations fall below it (K_II).",
               "share of facts with CS2 ≤ 0.3 minus 0.5", +1, f"{QL}:91"),
    PaperClaim("ql.table2.gen-k1-vs-k2", "ql", "Table 2", MODELS,
               "For K_II, modifying N_i results in a low generalization; for K_I Gen is higher.",
               "Gen of editing N_i for K_I facts minus for K_II facts", +1, f"{QL}:107"),
    PaperClaim("ql.table2.global-gen", "ql", "Table 2", MODELS,
               "For K_II, we must modify N_g to ensure high generalization.",
               "Gen of editing N_g minus editing N_i, K_II facts", +1, f"{QL}:107"),
    PaperClaim("ql.table2.global-ppl", "ql", "Table 2", MODELS,
               "Modifying N_g leads to a high ΔPPL.", "ΔPPL of editing N_g minus editing N_i, K_II facts", +1, f"{QL}:107"),
    PaperClaim("ql.table3.cas-avg", "ql", "Table 3", MODELS,
               "For K_II, the Avg values of K_II(Ours) are notably higher than those of K_II(N_i).",
               "Avg of editing the CAS set minus editing N_i, K_II facts", +1, f"{QL}:229"),
    PaperClaim("ql.table3.cas-ppl", "ql", "Table 3", MODELS,
               "The increase in PPL is much lower than that of K_II(N_g).",
               "ΔPPL of editing the CAS set minus editing N_g, K_II facts", -1, f"{QL}:229"),
    PaperClaim("ql.fig4.self-vs-intersection", "ql", "Fig. 4", MODELS,
               "For K_II, the average values of N_i^N are much lower than that of N_i, especially in the Intersection case.",
               "Avg ΔProb of N_i minus of the neighbors' intersection, K_II facts", +1, f"{QL}:146"),
    PaperClaim("ql.fig4.k2-drops-more", "ql", "Fig. 4", MODELS,
               "For K_I, the average values decrease less.",
               "(ΔProb of N_i − of the intersection) for K_II minus the same for K_I", +1, f"{QL}:146"),
    PaperClaim("ql.fig6.self-vs-irrelevant", "ql", "Fig. 6", MODELS,
               "Manipulating the query's own synapses changes KN activation and answer probability; irrelevant synapses "
               "have a smaller effect.", "Avg ΔProb of the query's synapses minus of an irrelevant query's", +1, f"{QL}:219"),
    PaperClaim("ql.fig6.k2-relies-more", "ql", "Fig. 6", MODELS,
               "Manipulating the KSs has a larger impact on ΔValue and ΔProb for K_II than for K_I.",
               "Avg ΔProb of the query's own synapses, K_II minus K_I", +1, f"{QL}:219"),
    PaperClaim("ql.fig7.suppress-lowers", "ql", "Fig. 7", (G2,),
               "Suppressing KSs reduces KN activation values.",
               "mean |KN activation| after suppressing the query's synapses minus before", -1, f"{QL}:219"),
)

__all__ = ["BLOCKS", "CLAIMS", "QL", "MODELS", "METHODS"]
