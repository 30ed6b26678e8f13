"""``TraceConfig``: the settings of causal tracing (one fact or a dataset of facts).

One frozen, validated value carries what defines a trace (kinds, layers, window, noise, samples,
seed) and the exact speed knobs (rows per forward pass, corrupted-prefix reuse, skipping the
cells before the subject — results do not depend on them). :func:`causal_trace`,
:func:`prepare_trace`, :func:`trace_reference` and :func:`trace_dataset` take it as ``config=``
plus keyword overrides of its fields (:meth:`tlcap.config.Config.resolve`), so an invalid value
fails at construction, before any model load or forward pass.

Example:
    >>> from tlcap.locate.causal_trace import causal_trace
    >>> cfg = TraceConfig(samples=5, kinds=("mlp",))
    >>> tr = causal_trace(model, "The capital of France is", "France", " Paris", config=cfg)
    >>> same = causal_trace(model, "The capital of France is", "France", " Paris", samples=5, kinds=("mlp",))
    >>> torch.equal(tr.scores, same.scores), tr.kinds
    (True, ('mlp',))
    >>> TraceConfig(samples=0)
    Traceback (most recent call last):
    ...
    tlcap.errors.InvalidConfigError: samples (--samples) must be >= 1, got 0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tlcap.config import Config, check_bool, check_choice, check_float, check_int, check_sequence
from tlcap.errors import InvalidConfigError
from tlcap.runtime.batching import parse_memory

KINDS: tuple[str, ...] = ("resid", "mlp", "attn")
KIND_SITES: dict[str, str] = {"resid": "resid_post", "mlp": "mlp_out", "attn": "attn_out"}
NOISE_FROM: tuple[str, ...] = ("subjects", "embedding")
TOKEN_SETS: tuple[str, ...] = ("all", "subject", "last_subject")


@dataclass(frozen=True)
class TraceConfig(Config):
    """Settings of causal tracing (the options of ``tlcap trace``).

    Attributes:
        kinds: States restored, any of ``resid`` (``resid_post`` of one layer), ``mlp`` and
            ``attn`` (``mlp_out`` / ``attn_out`` of a window of layers); stored as a tuple.
        layers: Layers traced (``None`` = all; stored as a tuple). Bounds against the model are
            checked when the trace runs, before any forward pass. Windows still reach the layers
            around a traced layer.
        window: Layers restored per MLP/attention cell (ROME: 10), ``>= 1``.
        samples: Noise draws, i.e. corrupted runs per cell (ROME: 10), ``>= 1``.
        noise_std: ν, the noise standard deviation, ``> 0`` (``None``: ``noise_factor`` × a
            standard deviation chosen by ``noise_from``).
        noise_factor: The factor of the automatic ν (ROME's "s3": 3), ``> 0``.
        noise_from: What the automatic ν is the standard deviation of: ``subjects`` (ROME's
            ``collect_embedding_std``: the token embeddings of the subjects, each tokenised on
            its own — dataset mode: the traced facts' subjects; one fact: the subjects of ROME's
            known facts, as ROME's notebook does) or ``embedding`` (every entry of ``W_E``).
        bos: Prepend the model's BOS token, so the subject is not at position 0 (the attention
            sink of most models; ROME's GPT-2 prompts have no BOS). Without it a subject that
            starts the prompt gets a :class:`~tlcap.locate.subjects.SubjectWarning`.
        seed: Seed of the noise draws (fixed tensors; dataset mode adds the fact's index), ``>= 0``.
        top_k: Located layers reported per trace (CNL uses 3), ``>= 1``.
        use_attribute: Dataset mode: score each fact's ``target`` / ``attribute`` instead of the
            model's own prediction (ROME traces the prediction, the default).
        batch_rows: Most rows (noise sample × restoration) per forward pass, ``>= 1``, or
            ``"auto"`` (the default): within what fits ``max_memory``, the smallest batch that
            reaches the throughput plateau on an accelerator (a timed probe, cached), at most 256 on
            a CPU; halved and rerun on out-of-memory (:mod:`tlcap.runtime.batching`). Exact: the
            scores do not depend on it.
        max_memory: Memory budget of ``batch_rows="auto"`` per device (bytes or ``"8GiB"``); ``None`` = free memory.
        prefix_reuse: Reuse the corrupted prefix's keys/values (exact; off only to compare).
        late_expand: Reuse the corrupted run below each batch's lowest restored layer (exact;
            TransformerBridge backends; off only to compare).
        skip_pre_subject: Give the cells before the subject the corrupted probability without a
            forward pass (exact: restoring them is a no-op; off only to compare).
        tokens: Token positions traced: ``"all"`` (the default, ROME's figure), ``"subject"``,
            ``"last_subject"`` (the only row ROME's and CNL's located layers read) or a tuple of
            positions (negative counts from the end). The other rows are NaN; each cell is computed
            as in a full trace (exact), so a ``"last_subject"`` trace costs one row of the figure.
    """

    kinds: Sequence[str] = KINDS
    layers: Sequence[int] | None = None
    window: int = 10
    samples: int = 10
    noise_std: float | None = None
    noise_factor: float = 3.0
    noise_from: str = "subjects"
    bos: bool = False
    seed: int = 0
    top_k: int = 3
    use_attribute: bool = False
    batch_rows: int | str = "auto"
    max_memory: int | str | None = None
    prefix_reuse: bool = True
    skip_pre_subject: bool = True
    late_expand: bool = True
    tokens: str | Sequence[int] = "all"

    def validate(self) -> None:
        kinds = check_sequence("kinds", self.kinds, min_len=1, unique=True,
                               item=lambda n, x: check_choice("kind", x, KINDS, cli="--kinds"))
        self._set("kinds", kinds)
        if self.layers is not None:
            self._set("layers", check_sequence(
                "layers", self.layers, min_len=1, unique=True,
                item=lambda n, x: check_int(n, x, min=0, cli="--layers"),
            ))
        check_int("window", self.window, min=1)
        check_int("samples", self.samples, min=1)
        if self.noise_std is not None:
            check_float("noise_std", self.noise_std, gt=0, cli="--noise")
        check_float("noise_factor", self.noise_factor, gt=0)
        check_choice("noise_from", self.noise_from, NOISE_FROM)
        check_bool("bos", self.bos)
        check_int("seed", self.seed, min=0)
        check_int("top_k", self.top_k, min=1)
        check_bool("use_attribute", self.use_attribute)
        if self.batch_rows != "auto":
            check_int("batch_rows", self.batch_rows, min=1)
        if self.max_memory is not None:
            parse_memory(self.max_memory)
        check_bool("prefix_reuse", self.prefix_reuse, cli=None)
        check_bool("skip_pre_subject", self.skip_pre_subject, cli=None)
        check_bool("late_expand", self.late_expand, cli=None)
        if isinstance(self.tokens, str):
            check_choice("tokens", self.tokens, TOKEN_SETS, cli="--tokens")
        else:
            self._set("tokens", check_sequence("tokens", self.tokens, min_len=1, unique=True,
                                               item=lambda n, x: check_int(n, x, cli="--tokens")))

    def token_positions(self, n_tokens: int, subject_range: tuple[int, int]) -> tuple[int, ...]:
        """The traced positions of a prompt of ``n_tokens`` tokens whose subject is ``subject_range``.

        Args:
            n_tokens: Length of the prompt in tokens.
            subject_range: ``(start, end)`` token positions of the subject (end exclusive).

        Returns:
            The positions, sorted and made non-negative (``tokens``: ``"all"``, ``"subject"``, ``"last_subject"`` or a list).

        Raises:
            InvalidConfigError: a position outside the prompt.
        """
        s0, s1 = subject_range
        if self.tokens == "all":
            return tuple(range(n_tokens))
        if self.tokens == "subject":
            return tuple(range(s0, s1))
        if self.tokens == "last_subject":
            return (s1 - 1,)
        bad = [t for t in self.tokens if not -n_tokens <= t < n_tokens]
        if bad:
            raise InvalidConfigError(f"tokens (--tokens) {bad} outside the prompt's {n_tokens} tokens")
        return tuple(sorted({t % n_tokens for t in self.tokens}))

    def check_layers(self, n_layers: int, model_name: str = "the model") -> tuple[int, ...]:
        """The traced layers for a model of ``n_layers`` layers (all when ``layers`` is ``None``).

        Args:
            n_layers: The model's number of layers.
            model_name: Name used in the error message.

        Returns:
            The layers to trace.

        Raises:
            InvalidConfigError: a layer is ``>= n_layers``.
        """
        if self.layers is None:
            return tuple(range(n_layers))
        bad = [layer for layer in self.layers if layer >= n_layers]
        if bad:
            raise InvalidConfigError(
                f"layers (--layers) {bad} out of range for {model_name} ({n_layers} layers: 0..{n_layers - 1})"
            )
        return tuple(self.layers)


__all__ = ["KINDS", "KIND_SITES", "NOISE_FROM", "TOKEN_SETS", "TraceConfig"]
