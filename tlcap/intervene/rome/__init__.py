"""ROME (Meng et al. 2022): rank-one editing of an MLP down projection, reversible.

For a request (prompt containing a subject, new object ``o*``) and a layer l:

1. **Key** ``k*``: the down projection's input (``mlp_post``) at the subject's last token,
   averaged over the prompt preceded by a few fixed prefixes (ROME samples them from the
   model; fixed, neutral prefixes keep the edit deterministic and cheap).
2. **Value**: a vector δ added to the layer's output (``mlp_out``) at the subject's last token
   (:func:`tlcap.runtime.hooks.add_rows`) is optimised with Adam so that every prefixed prompt
   continues with ``o*`` (teacher-forced NLL), plus ROME's KL "essence" term on
   ``"{subject} is a"`` (weight 0.0625) and a weight decay; ‖δ‖ is clamped to ``4‖v₀‖``
   (v₀ = the layer's output at the prompt). See :mod:`.value` for the exact objective.
3. **Update**, with ``u = C⁻¹k*`` (C = E[kkᵀ] on WikiText-2, :mod:`tlcap.intervene.covariance`)
   and ``k`` the prompt's own key, ``v* = W k + δ``::

       W ← W + (v* − W k) uᵀ / (uᵀ k)

   This is the paper's closed form ``W + (v* − W k*)(C⁻¹k*)ᵀ / ((C⁻¹k*)ᵀ k*)`` as the official
   implementation applies it (residual and denominator at the prompt's key, so the edited
   prompt gets exactly ``v*``).

The edit goes through :class:`tlcap.intervene.WeightEdit`, so ``undo()`` (or leaving a ``with``
block) restores the weights bit for bit; :func:`evaluate_rome` restores them on every exit path.

CPU budget (SmolLM2-135M): 20 Adam steps on 6 + 1 short rows and an 8,192-token covariance
(cached) — a few seconds per edit on an idle 2-core CPU. ROME's GPT-2 XL defaults are
20 steps, lr 0.5, KL 0.0625, weight decay 0.5, clamp 4, 100k covariance tokens, 20 prefixes.

Modules: :mod:`.config` (``RomeConfig``), :mod:`.value` (keys and the value optimisation),
:mod:`.edit` (:func:`rome_edit`), :mod:`.evaluate` (:func:`evaluate_rome`, :func:`rome_sweep`),
:mod:`.measures` (what an edit is measured by), :mod:`.sweep_rows` (the sweep's layers as rows of shared passes, on
an accelerator),
:mod:`.results` (``RomeEditResult``, ``RomeSweep``).

Example (on SmolLM2-135M the paper's setting is a middle layer, e.g. ``layer=6``, with the
default 20 steps; the tiny random model here has 2 layers, and ``cov=`` skips the disk cache):
    >>> from tlcap.intervene.covariance import key_covariance
    >>> from tlcap.metrics import target_prob
    >>> cov = key_covariance(model, [0], n_tokens=512, cache=False)[0]
    >>> p = target_prob(model, "The Eiffel Tower is located in", " Rome")
    >>> with rome_edit(model, "The Eiffel Tower is located in", "The Eiffel Tower", " Rome", layer=0,
    ...                cov=cov, steps=10, bos=True):
    ...     print(target_prob(model, "The Eiffel Tower is located in", " Rome") > p)
    True
    >>> target_prob(model, "The Eiffel Tower is located in", " Rome") == p      # restored
    True
    >>> res = evaluate_rome(model, "The Eiffel Tower is located in", "The Eiffel Tower", " Rome", layer=0,
    ...                     cov=cov, steps=10, bos=True)
    >>> type(res.efficacy).__name__, round(res.specificity, 2)
    ('bool', 0.89)
"""

from tlcap.intervene.rome.config import DEFAULT_NEIGHBOURHOOD, DEFAULT_PREFIXES, RomeConfig
from tlcap.intervene.rome.edit import RomeEdit, check_layer, rome_edit
from tlcap.intervene.rome.evaluate import default_paraphrases, evaluate_rome, next_tokens, rome_sweep, target_logprobs
from tlcap.intervene.rome.results import RomeEditResult, RomeMetricsRow, RomeSweep
from tlcap.intervene.rome.value import (
    LossTerms,
    ValueRows,
    ValueStep,
    optimise_value,
    subject_keys,
    value_loss,
    value_rows,
)

__all__ = [
    "DEFAULT_NEIGHBOURHOOD", "DEFAULT_PREFIXES", "LossTerms", "RomeConfig", "RomeEdit", "RomeEditResult",
    "RomeMetricsRow", "RomeSweep", "ValueRows", "ValueStep", "check_layer", "default_paraphrases", "evaluate_rome",
    "next_tokens", "optimise_value", "rome_edit", "rome_sweep", "subject_keys", "target_logprobs", "value_loss",
    "value_rows",
]
