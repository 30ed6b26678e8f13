"""Causal tracing (ROME, Meng et al. 2022) on the shared hook runtime.

Three runs of one prompt:

- **clean**: the prompt as is; every state needed later is recorded;
- **corrupted**: Gaussian noise (std ν, default 3 × the std of subject-token embeddings, ROME's
  "s3") added to the *subject* tokens' embeddings (the ``embed`` site), ``samples`` fixed noise
  draws (seeded); ``bos=True`` prepends the BOS so the subject is not the attention sink at 0;
- **corrupted-with-restoration**: the corrupted run with the clean state of one
  ``(token, layer)`` copied back: the residual stream (``resid_post``, one layer) or the MLP /
  attention output (``mlp_out`` / ``attn_out``) of a *window* of layers centred on the layer
  (ROME: ``range(max(0, l - w//2), min(L, l - (-w//2)))``, w = 10).

The score of a cell is the probability of the target token (the first token of the answer,
as in ROME) at the last position, averaged over the noise samples; the indirect effect is
score − corrupted probability.

How it is made fast (exact, not approximate):

- **Batched restorations**: one forward pass carries many rows, each row one noise sample ×
  one (kind, layer) restoration (:func:`tlcap.runtime.hooks.patch_rows` copies the clean state
  into just that row), instead of one forward per cell.
- **Corrupted-prefix reuse**: a restoration at token t cannot change positions < t (causal
  attention), so those positions are the corrupted run's. Their keys/values are computed once
  per token t (a :class:`tlcap.models.PrefixCache` with one row per noise sample, whose rows
  are repeated for the cells of that sample) and each row recomputes only positions ≥ t.
- **Tokens before the subject**: the clean and corrupted states there are identical, so
  restoring them is a no-op; those cells get the corrupted probability without a forward.
- **Last-position logits**: only the next-token logits are read, so the unembedding runs
  on the last position only (:meth:`tlcap.models.Model.last_logits`).

:func:`trace_reference` is the slow one-cell-at-a-time reference (one forward of ``samples``
rows per cell, full prompt, the ``patch`` / ``add_noise`` factories) used in tests and the
benchmark. Settings: :class:`TraceConfig` (``config=`` plus keyword overrides).

Modules: :mod:`.config` (``TraceConfig``), :mod:`.setup` (clean/corrupted runs, noise),
:mod:`.engine` (batched engine, reference, :func:`causal_trace`), :mod:`.facts` (:func:`causal_trace_facts`:
the cells of several facts in one batch), :mod:`.results`
(``CausalTrace``), :mod:`.dataset` (token classes, ``DatasetTrace``, :func:`trace_dataset`).

Example (on SmolLM2, ``tr.top_layers`` names the layers whose restored state brings " Paris" back;
the tiny random model here has 2 layers and no knowledge, so only shapes are shown):
    >>> tr = causal_trace(model, "The capital of France is", "France", " Paris", samples=5)
    >>> tr.tokens, tr.subject_range, tr.kinds
    (('The', ' capital', ' of', ' France', ' is'), (3, 4), ('resid', 'mlp', 'attn'))
    >>> tuple(tr.scores.shape), tr.top_layers(k=3)        # [kind, token, layer]
    ((3, 5, 2), [0, 1])
    >>> fig = tr.figure()                                   # fig.show() in a notebook
"""

from tlcap.data.knowns import load_known_facts  # re-exported: it moved to tlcap.data
from tlcap.errors import SubjectNotFoundError
from tlcap.locate.causal_trace.config import KIND_SITES, KINDS, NOISE_FROM, TraceConfig
from tlcap.locate.causal_trace.dataset import (
    TOKEN_CLASSES,
    DatasetEffectRow,
    DatasetTrace,
    token_classes,
    trace_dataset,
)
from tlcap.locate.causal_trace.engine import causal_trace, late_chunks, trace_batched, trace_cell, trace_reference
from tlcap.locate.causal_trace.facts import causal_trace_facts, trace_setups
from tlcap.locate.causal_trace.results import CausalTrace, TraceCellRow
from tlcap.locate.causal_trace.setup import (
    TraceSetup,
    embedding_noise_std,
    known_subjects,
    noise_level,
    prepare_trace,
    subject_noise_std,
    subject_span,
    window_layers,
)

__all__ = [
    "KINDS", "KIND_SITES", "NOISE_FROM", "TOKEN_CLASSES", "CausalTrace", "DatasetEffectRow", "DatasetTrace",
    "SubjectNotFoundError", "TraceCellRow", "TraceConfig", "TraceSetup", "causal_trace", "embedding_noise_std",
    "known_subjects", "load_known_facts", "noise_level", "prepare_trace", "subject_noise_std", "subject_span",
    "late_chunks", "token_classes", "trace_batched", "trace_cell", "trace_dataset", "trace_reference", "window_layers",
    "causal_trace_facts", "trace_setups",
]
