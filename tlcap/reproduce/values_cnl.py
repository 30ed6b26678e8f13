"""The CNL paper's numbers (Huang et al., ICLR 2025), as printed rows (see :mod:`.paper_values`).

Sources: ``capability-localization.txt`` (``TXT``, the paper's text with most formulas lost) and
``capability-localization-poster.md`` (``POSTER``, the same tables with their row labels). Where
a table is printed in both, the poster line comes first and ``" = "`` names the text's line.
Model spellings are normalised (``Llama2-7B`` → ``LLaMA2-7B``, ``GPTJ-6B`` → ``GPT-J-6B``),
dataset labels kept (``Imdb`` → ``IMDB``). Changes (Table 3's arrows) are signed: ``↓ 0.25`` is
``-0.25``; the text prints Table 3 without them (``TXT`` line = poster line + 9), so its rows cite
the poster only.
"""

from __future__ import annotations

from tlcap.reproduce.paper_values import Block, Column, PaperClaim, columns

TXT = "capability-localization.txt"
POSTER = "capability-localization-poster.md"
L7, L13, GJ = "LLaMA2-7B", "LLaMA2-13B", "GPT-J-6B"
NOT_STATED = "not stated"

T1_DATASETS = ("GSM8K", "Emotion", "Code25K", "Meta_Math", "IMDB")
T1_DEF = {
    "overlap": "split-half overlap (|A∩B|/|A| + |A∩B|/|B|)/2 of the neurons located on two halves of the dataset (CNL eq. 9), %",
    "IoU": "split-half IoU |A∩B|/|A∪B| of the neurons located on the two halves, %",
    "neuron": "located neurons as a share of all MLP neurons ('proportion of localized parameters to MLP parameters'), %",
}
T2_DEF = {"accuracy": "held-out accuracy (%) after fine-tuning the neuron group for the given epochs (Adam, lr 1e-5); "
                      "Avg. is the mean of the three datasets"}
T3_DEF = {
    "accuracy": "held-out accuracy (%) with the neuron group's parameters set to 0 (base: no neuron erased); avg. is the "
                "mean of the three datasets",
    "change": "accuracy change (points) from the base accuracy, printed with an arrow",
}
T4_DEF = {
    "Overlap": "consistency of the localization: mean pairwise overlap over rewrites (KN, ROME, KC) or split-half "
               "overlap (CNL), %",
    "Neuron": "located parameters as a share of the model's parameters, %",
    "IPP": "performance with the located parameters manipulated minus the best performance over random draws of "
           "equal size (points)",
}

_T1 = columns(None, dataset=T1_DATASETS)
_T2 = columns("accuracy", epoch=("1", "5", "10"), dataset=("GSM8K", "Emotion", "Code25K", "Avg."))
_T3_BASE = columns("accuracy", dataset=("GSM8K", "Emotion", "Code25K", "avg."))
_T3 = columns(None, dataset=("GSM8K", "Emotion", "Code25K", "avg."), quantity=("accuracy", "change"))


def _t1(model: str, quantity: str, line: int, numbers: str) -> Block:
    cols = tuple(Column(quantity, c.coords) for c in _T1)
    return Block("cnl", "Table 1", model, numbers, cols, f"{POSTER}:{line} = {TXT}:{line + 17}", "%", T1_DEF)


def _t2(model: str, sigma: str, method: str, line: int, numbers: str) -> Block:
    return Block("cnl", "Table 2", model, numbers, _T2, f"{POSTER}:{line} = {TXT}:{line + 14}", "%", T2_DEF,
                 coords=(("sigma", sigma), ("method", method)))


def _t3(model: str, sigma: str, method: str, line: int, numbers: str) -> Block:
    base = sigma == "base"
    coords = (("method", "base"),) if base else (("sigma", sigma), ("method", method))
    return Block("cnl", "Table 3", model, numbers, _T3_BASE if base else _T3, f"{POSTER}:{line}", "%", T3_DEF,
                 coords=coords)


BLOCKS: tuple[Block, ...] = (
    # ------------------------------------------------------------------ Table 1 (locate)
    _t1(L7, "overlap", 93, "96.42 97.93 90.14 94.33 95.81"),
    _t1(L7, "IoU", 94, "93.08 95.95 82.05 89.15 91.96"),
    _t1(L7, "neuron", 95, "0.14 0.19 0.11 0.14 0.19"),
    _t1(L13, "overlap", 96, "94.26 94.68 91.10 95.37 98.32"),
    _t1(L13, "IoU", 97, "88.92 89.79 83.62 91.10 96.68"),
    _t1(L13, "neuron", 98, "0.10 0.19 0.11 0.09 0.08"),
    _t1(GJ, "overlap", 99, "95.66 87.62 91.25 83.62 98.27"),
    _t1(GJ, "IoU", 100, "91.63 77.96 83.89 71.77 96.60"),
    _t1(GJ, "neuron", 101, "0.28 0.19 0.11 0.27 0.26"),
    # ------------------------------------------------------------------ Table 2 (enhance)
    _t2(L7, "6", "random", 121, "0.00 14.62 52.79 22.47 0.02 14.62 52.90 22.51 5.25 14.99 53.05 24.43"),
    _t2(L7, "6", "w/o located", 122, "25.35 19.06 44.43 28.95 24.44 39.93 45.63 36.67 25.06 49.99 46.48 40.51"),
    _t2(L7, "6", "located", 123, "24.52 23.57 54.28 34.12 24.79 32.33 55.57 37.56 25.75 44.93 55.68 42.12"),
    _t2(L7, "3", "random", 124, "0.00 14.04 52.88 22.31 24.31 22.38 53.37 33.35 23.75 26.79 53.47 34.67"),
    _t2(L7, "3", "w/o located", 125, "24.56 18.38 39.37 27.44 25.31 18.29 41.48 28.36 25.19 19.29 42.77 29.08"),
    _t2(L7, "3", "located", 126, "23.44 30.46 54.63 36.18 25.81 46.04 55.93 42.59 26.31 51.62 56.02 44.65"),
    _t2(GJ, "3", "random", 127, "0.00 5.71 50.81 18.84 25.94 23.42 50.93 33.43 25.69 28.54 51.07 35.10"),
    _t2(GJ, "3", "w/o located", 128, "23.31 31.00 43.73 32.68 26.25 33.67 47.37 35.76 32.00 38.71 48.50 39.73"),
    _t2(GJ, "3", "located", 129, "24.75 28.00 51.48 34.74 26.38 31.50 52.42 36.77 27.38 48.58 52.53 42.83"),
    # ------------------------------------------------------------------ Table 3 (erase)
    _t3(L7, "base", "", 140, "0.00 17.63 40.80 19.48"),
    _t3(L13, "base", "", 140, "0.38 31.96 45.95 26.10"),
    _t3(L7, "3", "random", 141, "0.00 -0.00 17.38 -0.25 40.59 -0.21 19.32 -0.16"),
    _t3(L13, "3", "random", 141, "1.00 0.62 30.96 -1.00 45.72 -0.23 25.89 -0.21"),
    _t3(L7, "3", "located", 142, "0.00 -0.00 0.00 -17.63 25.86 -14.94 8.62 -10.86"),
    _t3(L13, "3", "located", 142, "0.00 -0.38 0.33 -31.63 21.95 -24.00 7.42 -18.68"),
    _t3(L7, "6", "random", 143, "0.00 -0.00 17.50 -0.13 40.67 -0.13 19.39 -0.09"),
    _t3(L13, "6", "random", 143, "0.31 -0.07 33.75 1.79 45.81 -0.14 26.62 0.52"),
    _t3(L7, "6", "located", 144, "0.00 -0.00 3.38 -14.25 32.77 -8.03 12.05 -7.43"),
    _t3(L13, "6", "located", 144, "0.00 -0.38 5.38 -26.58 18.06 -27.89 7.81 -18.29"),
    _t3(L7, "12", "random", 145, "0.00 -0.00 17.54 -0.09 40.79 -0.01 19.44 -0.04"),
    _t3(L13, "12", "random", 145, "0.38 -0 32.04 0.08 45.80 -0.15 26.07 -0.03"),
    _t3(L7, "12", "located", 146, "0.06 0.06 10.38 -7.25 34.11 -6.69 14.85 -4.63"),
    _t3(L13, "12", "located", 146, "0.31 -0.07 2.50 -29.46 20.48 -25.47 7.76 -18.34"),
    # ------------------------------------------------------------------ Table 4 (comparison)
    *(Block("cnl", "Table 4", model, nums, columns(None, quantity=("Overlap", "Neuron", "IPP")), f"{TXT}:{line}",
            "%", T4_DEF, coords=(("method", method),),
            notes={"*": "Table 4 names no model: the KN/ROME/KC overlaps equal the GPT-J fidelity numbers of §3.1, "
                        "CNL's 96.4 the LLaMA2-7B GSM8K split-half overlap of Table 1."})
      for method, model, line, nums in (("KN", GJ, 169, "37.3 0.2 11.4"), ("ROME", GJ, 170, "32.7 16.7 0.0"),
                                        ("KC", GJ, 171, "7.2 1.6 10.5"), ("CNL", L7, 172, "96.4 0.2 20.0"))),
    # ------------------------------------------------------------------ §3.1 fidelity (GPT-J)
    Block("cnl", "§3.1 fidelity", GJ, "15.3", columns("neurons_per_sample"), f"{TXT}:52", "count",
          {"neurons_per_sample": "knowledge neurons KN locates per prompt (mean)"}, coords=(("method", "KN"),)),
    Block("cnl", "§3.1 fidelity", GJ, "37.3", columns("overlap"), f"{TXT}:52", "%",
          {"overlap": "mean pairwise overlap of KN's neuron sets over 5 rewrites of a fact, %"},
          coords=(("method", "KN"),), notes={"overlap": "The introduction (TXT:8) prints 27.5 % for KN."}),
    Block("cnl", "§3.1 fidelity", GJ, "32.7", columns("overlap"), f"{TXT}:54", "%",
          {"overlap": "mean pairwise overlap of the top-3 traced layers over 5 rewrites, %"},
          coords=(("method", "ROME"),), notes={"overlap": "The introduction (TXT:8) prints 37.3 % for ROME."}),
    Block("cnl", "§3.1 fidelity", GJ, "7.2 1.6", columns(None, quantity=("overlap", "param_share")), f"{TXT}:56", "%",
          {"overlap": "overlap of the knowledge circuits (edge sets) over 5 rewrites, %",
           "param_share": "parameters in the circuit as a share of all model parameters, %"},
          coords=(("method", "KC"),), notes={"overlap": "The introduction (TXT:8) prints 32.7 % for KC."}),
    Block("cnl", "Introduction", GJ, "37.3 27.5 32.7", columns("overlap", method=("ROME", "KN", "KC")), f"{TXT}:8", "%",
          {"overlap": "fidelity overlap as the introduction prints it"},
          notes={"*": "Conflicts with §3.1, Table 4 and the poster (KN 37.3, ROME 32.7, KC 7.2); the report compares "
                      "with §3.1."}),
    # ------------------------------------------------------------------ §3.2 reliability (GPT-J, zsRE)
    Block("cnl", "§3.2 reliability", GJ, "85.1 14.9 72.3 27.7 27.4 72.4 17.6 82.6",
          columns("share", manipulation=("double", "zero"), neurons=("located", "random"), direction=("up", "down")),
          f"{TXT}:62", "%",
          {"share": "samples whose target probability rises (up) / falls (down) when the KN activations are doubled or "
                    "zeroed, %"},
          notes={"zero": "Zeroing located: 27.4 + 72.4 = 99.8, zeroing random 17.6 + 82.6 = 100.2 (as printed)."}),
    Block("cnl", "§3.2 reliability", GJ, "12.3 2.6", columns(None, quantity=("recall", "param_share")), f"{TXT}:67", "%",
          {"recall": "facts whose circuit alone ranks the target first (rank 1), %",
           "param_share": "parameters of the successful circuits as a share of the model's parameters, %"},
          coords=(("method", "KC"),)),
    # ------------------------------------------------------------------ §4 decoupling
    Block("cnl", "§4 decoupling", NOT_STATED, "15.6 7.3 8.6", columns(None, quantity=("C12", "C11", "C22")),
          f"{TXT}:81 = {POSTER}:70", "%",
        {"C12": "coincidence rate of the KN sets of the two framings of a pair (C^{1,2}), %",
         "C11": "coincidence rate of the neurons common to all samples of framing 1 (C^{1,1}), %",
         "C22": "coincidence rate of the neurons common to all samples of framing 2 (C^{2,2}), %"},
        notes={"*": "§4 names no model (§3 uses GPT-J-6B). The printed formula divides by n·L·J (all neurons): literal "
                    "values would be ~1e-4, see docs/statistics.md."}),
    # ------------------------------------------------------------------ §5.3 locate sizes and enhance text
    Block("cnl", "§5.3 locate sizes", "all", "1600 2400 1200 700 800",
          columns("n_samples", dataset=("GSM8K", "Emotion", "Code25K", "Meta_Math", "IMDB")), f"{TXT}:105", "count",
          {"n_samples": "samples used to locate the commonality neurons (split into two halves)"}),
    Block("cnl", "§5.4 enhance", L7, "5.17", columns("gain"), f"{TXT}:144", "%",
          {"gain": "Avg. accuracy of located minus w/o located, points (Table 2: σ = 6, epoch 1)"},
          coords=(("sigma", "6"), ("epoch", "1"), ("dataset", "Avg."))),
    Block("cnl", "§5.4 enhance", GJ, "9.87", columns("gain"), f"{TXT}:144", "%",
          {"gain": "Emotion accuracy of located minus w/o located, points (Table 2: σ = 3, epoch 10)"},
          coords=(("sigma", "3"), ("epoch", "10"), ("dataset", "Emotion"))),
    *(Block("cnl", "§5.4 enhance", "all", nums, columns("param_share", method=(method,)), f"{TXT}:{line}", "%",
            {"param_share": "parameters fine-tuned as a share of the neurons' parameters, %"})
      for method, line, nums in (("random", 126, "0.15"), ("w/o located", 129, "99.85"), ("located", 132, "0.15"))),
    # ------------------------------------------------------------------ Fig. 5 and App. G (cross-dataset)
    Block("cnl", "Fig. 5", NOT_STATED, "22", columns("gain"), f"{TXT}:165", "%",
          {"gain": "Meta_Math accuracy gain after enhancing the GSM8K neurons, points"},
          coords=(("neurons_of", "GSM8K"), ("evaluated_on", "Meta_Math")),
          notes={"*": "The model of Fig. 5 is not stated (App. F holds 'additional models')."}),
    *(Block("cnl", "App. G", model, nums, columns("gain", method=("random", "w/o located", "located")), f"{TXT}:{line}", "%",
            {"gain": "mean accuracy gain (points) on datasets not involved in the fine-tuning"}, coords=(("row", str(row)),),
            notes={"*": "Two LLaMA2-7B rows; the paper does not say how they differ (Table 2 has LLaMA2-7B at σ = 6 "
                        "and σ = 3)."} if model == L7 else {})
      for row, model, line, nums in ((1, L7, 255, "3.20 -3.31 11.18"), (2, L7, 256, "5.20 -5.58 9.43"),
                                     (3, GJ, 257, "9.00 14.73 17.66"))),
)

CLAIMS: tuple[PaperClaim, ...] = (
    PaperClaim("cnl.table1.above-random", "cnl", "Table 1", (L7, L13, GJ),
               "Both overlap and IoU have high values: a set of data has commonalities reflected by neurons.",
               "split-half overlap minus the overlap of the half-A set with random sets matched to the half-B set",
               +1, f"{TXT}:107"),
    PaperClaim("cnl.fig6.converges", "cnl", "Fig. 6", (L7, L13, GJ),
               "The consistency of the localisation converges as the data size increases.",
               "split-half overlap at the largest data size minus at the smallest", +1, f"{TXT}:237"),
    PaperClaim("cnl.table2.located-vs-random", "cnl", "Table 2", (L7, GJ),
               "Compared to random and w/o located, located achieves superior performance in multiple datasets.",
               "held-out accuracy after fine-tuning the located neurons minus after fine-tuning as many random ones",
               +1, f"{TXT}:144"),
    PaperClaim("cnl.table3.located-vs-random", "cnl", "Table 3", (L7, L13),
               "Compared to random, erasing the neurons we locate will significantly impair the performance of the model.",
               "accuracy with the located neurons erased minus with as many random neurons erased", -1, f"{TXT}:156"),
    PaperClaim("cnl.fig5.own-dataset", "cnl", "Fig. 5", (NOT_STATED,),
               "Enhancing and erasing capacity neurons has substantial effects on the same type of dataset, with little "
               "impact on other types of datasets.",
               "accuracy change on the dataset the neurons were located on minus the mean change on the other datasets "
               "(erasing)", -1, f"{POSTER}:184"),
    PaperClaim("cnl.fig4.gsm8k-emotion", "cnl", "Fig. 4", (NOT_STATED,),
               "GSM8K and Emotion's neurons have a higher overlap rate.",
               "overlap of the GSM8K and Emotion neuron sets minus the mean overlap of the other dataset pairs", +1,
               f"{TXT}:165"),
    PaperClaim("cnl.fig2.rome-any-layer", "cnl", "Fig. 2", (GJ,),
               "Editing other (non-located) layers resulted in similar performance.",
               "ROME edit success at the traced layer minus the mean over the other layers", 0, f"{TXT}:65"),
    PaperClaim("cnl.reliability.kn-vs-random", "cnl", "§3.2 reliability", (GJ,),
               "Doubling/zeroing located activations gives results similar to random activations.",
               "share of samples whose probability rises when doubling located neurons minus random ones", 0, f"{TXT}:62",
               value=85.1 - 72.3, unit="%"),
)

__all__ = ["BLOCKS", "CLAIMS", "TXT", "POSTER", "T1_DATASETS"]
