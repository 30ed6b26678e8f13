"""``RomeConfig``: the hyper-parameters of a ROME edit, and the default prompt sets."""

from __future__ import annotations

from dataclasses import dataclass

from tlcap.config import Config, check_bool, check_float, check_int, check_sequence, check_str
from tlcap.errors import InvalidConfigError

DEFAULT_PREFIXES: tuple[str, ...] = (
    "",
    "The following is a fact. ",
    "Here is what I know. ",
    "I read this yesterday. ",
    "According to the encyclopedia, ",
)

DEFAULT_NEIGHBOURHOOD: tuple[str, ...] = (
    "The capital of France is",
    "The Eiffel Tower is located in the city of",
    "The largest planet in the solar system is",
    "The author of Romeo and Juliet is",
    "The currency of Japan is the",
    "Mount Everest is located in",
    "The first president of the United States was",
    "The chemical symbol for gold is",
    "The Great Wall is located in",
    "Water freezes at a temperature of",
)


@dataclass(frozen=True)
class RomeConfig(Config):
    """Hyper-parameters of a ROME edit (defaults: ROME's GPT-2 XL values, CPU-sized sample).

    Validated at construction (:class:`tlcap.config.Config`): an invalid value raises
    :class:`~tlcap.errors.InvalidConfigError` naming the field and its CLI option. The official
    hyper-parameters (``hparams/ROME/gpt2-xl.json``) map as: ``v_num_grad_steps`` → ``steps``,
    ``v_lr`` → ``lr``, ``kl_factor``, ``v_weight_decay`` → ``weight_decay``,
    ``clamp_norm_factor``, ``mom2_adjustment``, ``mom2_n_samples`` → ``cov_tokens``,
    ``context_template_length_params`` → ``prefixes`` (fixed here, sampled there),
    ``fact_token = subject_last`` (the only one implemented), ``layers`` → the ``layer`` argument.

    Attributes:
        steps: Iterations of the value optimisation (ROME 20), ``>= 1``; as in the official loop
            the last one only evaluates the loss, so δ gets at most ``steps − 1`` Adam updates.
        lr: Adam learning rate (ROME 0.5), ``> 0``.
        kl_factor: Weight of the KL essence term (ROME 0.0625), ``>= 0``.
        weight_decay: The term ``wd·‖δ‖/‖v₀‖²`` (ROME 0.5; the norm, not its square), ``>= 0``.
        clamp_norm_factor: ‖δ‖ ≤ factor·‖v₀‖ (ROME 4), ``> 0``.
        stop_loss: Stop when the total loss (NLL + KL term + weight decay) falls below this
            (ROME 0.05), ``>= 0``.
        prefixes: Prefixes the prompt is put after (key average and value optimisation); at
            least one (``""`` = the bare prompt).
        kl_prompt: Essence prompt template, must contain ``{}`` (the subject).
        mom2_adjustment: Solve with the key covariance, ``u = C⁻¹k*`` (ROME); off: ``u = k*``.
        cov_tokens / cov_seq_len: WikiText-2 sample for ``C`` (ROME: 100,000 tokens).
        cov_reg: Relative ridge added to ``C`` before solving (0 = none, ROME), ``>= 0``.
        seed: Torch seed for the optimisation (it is deterministic anyway), ``>= 0``.
        bos: Prepend the model's BOS to every prompt (keys, value rows, evaluation), so a
            subject that starts the prompt is not at position 0 (the attention sink); ROME's
            GPT-2 prompts have none. Off, a subject at position 0 warns.

    Example:
        >>> cfg = RomeConfig(steps=10)
        >>> cfg.replace(lr=0.1).to_dict()["lr"]
        0.1
    """

    steps: int = 20
    lr: float = 0.5
    kl_factor: float = 0.0625
    weight_decay: float = 0.5
    clamp_norm_factor: float = 4.0
    stop_loss: float = 0.05
    prefixes: tuple[str, ...] = DEFAULT_PREFIXES
    kl_prompt: str = "{} is a"
    mom2_adjustment: bool = True
    cov_tokens: int = 8192
    cov_seq_len: int = 128
    cov_reg: float = 1e-2
    seed: int = 0
    bos: bool = False

    def validate(self) -> None:
        check_int("steps", self.steps, min=1)
        check_float("lr", self.lr, gt=0)
        check_float("kl_factor", self.kl_factor, ge=0)
        check_float("weight_decay", self.weight_decay, ge=0)
        check_float("clamp_norm_factor", self.clamp_norm_factor, gt=0)
        check_float("stop_loss", self.stop_loss, ge=0)
        self._set("prefixes", check_sequence(
            "prefixes", self.prefixes, min_len=1,
            item=lambda n, x: check_str(n, x, nonempty=False, cli=None), cli=None,
        ))
        check_str("kl_prompt", self.kl_prompt, cli=None)
        if "{}" not in self.kl_prompt:
            raise InvalidConfigError(f"kl_prompt must contain {{}} (where the subject goes), got {self.kl_prompt!r}")
        check_bool("mom2_adjustment", self.mom2_adjustment, cli="--no-mom2")
        check_int("cov_tokens", self.cov_tokens, min=1)
        check_int("cov_seq_len", self.cov_seq_len, min=2, cli=None)
        check_float("cov_reg", self.cov_reg, ge=0)
        check_int("seed", self.seed, min=0)
        check_bool("bos", self.bos)


__all__ = ["DEFAULT_NEIGHBOURHOOD", "DEFAULT_PREFIXES", "RomeConfig"]
