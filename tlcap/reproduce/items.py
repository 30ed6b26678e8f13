"""Every table and figure of both papers, and which of the papers' models a run's model is.

:data:`PAPER_ITEMS` lists each item with what it shows, so the report can say, from this list and
the value registry, what it did *not* reproduce (:func:`not_reproduced` in :mod:`.report`), instead
of a hand-written sentence. :func:`paper_model` maps a model name to the paper's model it is (only
real checkpoints: random weights of a real shape are not that model), which decides whether a
value row can be compared with the paper's number (:mod:`.verdict`).

Example:
    >>> paper_model("gpt2"), paper_model("gpt2-small-random"), paper_model("meta-llama/Llama-2-7b-hf")
    ('GPT-2', None, 'LLaMA2-7B')
    >>> reference_model("ql", "gpt2"), reference_model("ql", "smollm2-135m")
    ('GPT-2', 'GPT-2')
    >>> comparable_models("cnl")
    ('LLaMA2-7B', 'LLaMA2-13B', 'GPT-J-6B')
"""

from __future__ import annotations

from dataclasses import dataclass

PAPER_MODELS: dict[str, tuple[str, ...]] = {
    "cnl": ("LLaMA2-7B", "LLaMA2-13B", "GPT-J-6B"),
    "ql": ("GPT-2", "LLaMA2-7B", "LLaMA3-8B"),
}
"""The models each paper reports numbers for, default reference first (QL's GPT-2: the paper's main model)."""

DEFAULT_REFERENCE = {"cnl": "LLaMA2-7B", "ql": "GPT-2"}

MODEL_NAMES: dict[str, str] = {
    # GPT-2 (QL's GPT-2 is GPT-2 small, 124M; the TransformerLens and HF names)
    "gpt2": "GPT-2", "gpt2-small": "GPT-2", "openai-community/gpt2": "GPT-2",
    # LLaMA 2 / 3 (HF names and TransformerLens aliases)
    "meta-llama/llama-2-7b-hf": "LLaMA2-7B", "llama-2-7b": "LLaMA2-7B", "llama2-7b": "LLaMA2-7B",
    "meta-llama/llama-2-13b-hf": "LLaMA2-13B", "llama-2-13b": "LLaMA2-13B", "llama2-13b": "LLaMA2-13B",
    "meta-llama/meta-llama-3-8b": "LLaMA3-8B", "meta-llama-3-8b": "LLaMA3-8B", "llama-3-8b": "LLaMA3-8B",
    # GPT-J
    "eleutherai/gpt-j-6b": "GPT-J-6B", "gpt-j-6b": "GPT-J-6B", "gpt-j": "GPT-J-6B",
}
"""Model names (lower case) of real checkpoints → the paper's spelling of that model."""


def paper_model(name: str) -> str | None:
    """The paper's name of model ``name`` (``None`` when it is none of the papers' models).

    Args:
        name: A model name as ``load_model`` takes it, or ``Model.name``.

    Returns:
        ``"GPT-2"``, ``"LLaMA2-7B"``, ... or ``None`` (random weights of a real shape, other models).
    """
    return MODEL_NAMES.get(str(name).strip().lower())


def reference_model(paper: str, name: str) -> str:
    """The paper model a run on ``name`` is compared with: the model itself when the paper has it.

    Args:
        paper: ``"cnl"`` or ``"ql"``.
        name: The run's model name, as :func:`paper_model` takes it.

    Returns:
        The paper's spelling of the model, or the paper's :data:`DEFAULT_REFERENCE` model when it reports none.
    """
    m = paper_model(name)
    return m if m in PAPER_MODELS[paper] else DEFAULT_REFERENCE[paper]


def is_paper_model(paper: str, name: str) -> bool:
    """Whether ``name`` is one of the models ``paper`` reports numbers for.

    Args:
        paper: ``"cnl"`` or ``"ql"``.
        name: A model name, as :func:`paper_model` takes it.

    Returns:
        ``True`` when the paper has numbers for this model.
    """
    return paper_model(name) in PAPER_MODELS[paper]


def comparable_models(paper: str) -> tuple[str, ...]:
    """The models on which the paper's value rows can be compared.

    Args:
        paper: ``"cnl"`` or ``"ql"``.

    Returns:
        The paper's models (its :data:`PAPER_MODELS` entry), in the paper's spelling.
    """
    return PAPER_MODELS[paper]


@dataclass(frozen=True)
class PaperItem:
    """A table or figure of a paper.

    Attributes:
        paper: ``"cnl"`` or ``"ql"``.
        item: As the report names it without the paper prefix (``"Table 1"``, ``"Fig. 4"``).
        kind: ``"result"`` (numbers or claims a run can reproduce), ``"illustration"`` (an example
            figure), ``"method"`` (a diagram of the method) or ``"setting"`` (sizes, hyper-parameters,
            data examples: followed or listed in ``docs/deviations.md``, not reproduced).
        what: One line on what it shows.
    """

    paper: str
    item: str
    kind: str
    what: str


PAPER_ITEMS: tuple[PaperItem, ...] = (
    PaperItem("cnl", "Fig. 1", "method", "the fidelity / reliability / decoupling framework"),
    PaperItem("cnl", "§3.1 fidelity", "result", "overlap of KN, ROME and KC localizations over rewrites"),
    PaperItem("cnl", "§3.2 reliability", "result", "doubling / zeroing KN activations vs random; KC recall"),
    PaperItem("cnl", "Fig. 2", "result", "ROME edits succeed at non-located layers too"),
    PaperItem("cnl", "§4 decoupling", "result", "coincidence rates of KN sets over comparative pairs"),
    PaperItem("cnl", "Fig. 3", "method", "the CNL pipeline"),
    PaperItem("cnl", "Table 1", "result", "split-half overlap, IoU and neuron share of the located sets"),
    PaperItem("cnl", "Fig. 4", "result", "located neurons per dataset and their overlap"),
    PaperItem("cnl", "Table 2", "result", "enhance: fine-tuning located vs random vs w/o located neurons"),
    PaperItem("cnl", "§5.4 enhance", "result", "enhance gains quoted in the text and parameter shares"),
    PaperItem("cnl", "Table 3", "result", "erase: accuracy with located vs random neurons zeroed at σ = 3, 6, 12"),
    PaperItem("cnl", "Fig. 5", "result", "cross-dataset effect of enhancing / erasing each dataset's neurons"),
    PaperItem("cnl", "Table 4", "result", "Overlap, Neuron share and IPP of KN, ROME, KC and CNL"),
    PaperItem("cnl", "Fig. 6", "result", "split-half overlap as the data grows (App. E)"),
    PaperItem("cnl", "App. F", "result", "cross-dataset results on other models"),
    PaperItem("cnl", "App. G", "result", "mean accuracy gain on datasets not involved in fine-tuning"),
    PaperItem("cnl", "App. H", "result", "detailed cross-dataset results"),
    PaperItem("cnl", "§5.3 locate sizes", "setting", "samples located per dataset"),
    PaperItem("cnl", "Introduction", "setting", "numbers quoted in the introduction"),
    PaperItem("ql", "Fig. 1", "illustration", "KN activation heatmaps of one fact's queries (the KL assumption fails)"),
    PaperItem("ql", "Fig. 2", "method", "the KL vs QL assumptions"),
    PaperItem("ql", "Table 1", "result", "consistency analysis: K_I/K_II shares, CS2 means, Welch t, ∩:II"),
    PaperItem("ql", "Fig. 3", "result", "CS2 per relation (IG)"),
    PaperItem("ql", "Table 2", "result", "knowledge modification of N_i and N_g for K_I and K_II"),
    PaperItem("ql", "Fig. 4", "result", "query-KN mapping: ΔProb of a query's own vs neighbor KNs"),
    PaperItem("ql", "Fig. 5", "result", "predominance P of the most attended token"),
    PaperItem("ql", "Fig. 6", "result", "dynamic KN selection: manipulating knowledge synapses"),
    PaperItem("ql", "Fig. 7", "result", "KN activations after suppressing knowledge synapses"),
    PaperItem("ql", "Table 3", "result", "Consistency-Aware KN modification"),
    PaperItem("ql", "Table 4", "result", "the thresholds of Table 1 (static and Otsu)"),
    PaperItem("ql", "Table 5", "setting", "example ParaRel data"),
    PaperItem("ql", "Fig. 8", "result", "CS2 per relation (SIG)"),
    PaperItem("ql", "Fig. 9", "result", "CS2 per relation (AMIG)"),
    PaperItem("ql", "Fig. 10", "illustration", "KN activations: none / suppressed / enhanced synapses"),
    PaperItem("ql", "A.1 hyper-parameters", "setting", "the paper's hyper-parameters"),
    PaperItem("ql", "A.2 dataset", "setting", "ParaRel sizes"),
    PaperItem("ql", "A.4 IG", "setting", "IG settings"),
    PaperItem("ql", "§1 introduction", "setting", "numbers quoted in the introduction"),
)


def items_of(paper: str) -> list[PaperItem]:
    """The items of one paper in printed order.

    Args:
        paper: ``"cnl"`` or ``"ql"``.

    Returns:
        The paper's :class:`PaperItem` entries of :data:`PAPER_ITEMS`.
    """
    return [i for i in PAPER_ITEMS if i.paper == paper]


__all__ = ["PAPER_MODELS", "DEFAULT_REFERENCE", "MODEL_NAMES", "PaperItem", "PAPER_ITEMS", "paper_model",
           "reference_model", "is_paper_model", "comparable_models", "items_of"]
