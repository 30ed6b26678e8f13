"""The prompt/target boundary, checked on the strings before any model is loaded.

BPE tokenizers put a word's leading space in the word's token (``" Paris"``). A prompt that ends
with a space and a target that starts with one (``"The capital of France is " + " Paris"``)
makes the model predict the answer after a lone ``" "`` token, a position it never sees in
training: on SmolLM2 P(" Paris") drops from 0.77 to 0.01 and the located neurons are noise.
:func:`fix_prompt_boundary` removes that trailing whitespace with a
:class:`~tlcap.errors.PromptBoundaryWarning`, and refuses a prompt that ends with whitespace
before a target that does not start with it (the space belongs to the target). Merges of the
target into the prompt's last token are caught with the tokenizer by
:meth:`~tlcap.models.Model.target_ids`.
"""

from __future__ import annotations

import warnings

from tlcap.errors import PromptBoundaryWarning, TargetTokenizationError

_TRAILING = " \t"
"""Whitespace removed from a prompt's end (a trailing newline is a template's choice and kept)."""


def fix_prompt_boundary(prompt: str, target: str, option: str = "--prompt") -> tuple[str, str | None]:
    """Return ``prompt`` without trailing spaces/tabs when the target starts with whitespace.

    Args:
        prompt: The prompt (or a paraphrase).
        target: The answer that follows it, e.g. ``" Paris"``.
        option: How the prompt is named in messages (``--prompt``, ``--paraphrase``).

    Returns:
        ``(prompt, note)``: the prompt to use and, when it was changed, the warning text (also
        issued as a :class:`~tlcap.errors.PromptBoundaryWarning`); ``note`` is ``None`` otherwise.

    Raises:
        TargetTokenizationError: the prompt ends with a space or tab and the target does not
            start with whitespace; the message gives the corrected pair.

    Example:
        >>> fix_prompt_boundary("The capital of France is ", " Paris")[0]
        'The capital of France is'
    """
    stripped = prompt.rstrip(_TRAILING)
    if stripped == prompt or not target:
        return prompt, None
    if not target[0].isspace():
        raise TargetTokenizationError(
            f"{option} {prompt!r} ends with whitespace and the target {target!r} does not start with it; "
            f"the space belongs to the answer's first token: use {option} {stripped!r} --target {' ' + target!r}"
        )
    note = (
        f"{option} {prompt!r} ends with whitespace and the target {target!r} starts with a space; "
        f"removed the prompt's trailing whitespace (using {stripped!r}) so the target starts at a token boundary"
    )
    warnings.warn(note, PromptBoundaryWarning, stacklevel=2)
    return stripped, note


__all__ = ["fix_prompt_boundary"]
