"""ROME (Meng et al. 2022): rank-one editing of an MLP down projection, reversible.

For a request (prompt containing a subject, new object ``o*``) and a layer l:

1. **Key** ``k*``: the down projection's input (``mlp_post``) at the subject's last token,
   averaged over the prompt preceded by a few fixed prefixes (ROME samples them from the
   model; fixed, neutral prefixes keep the edit deterministic and cheap).
2. **Value**: a vector δ added to the layer's output (``mlp_out``) at the subject's last token
   (:func:`tlcap.runtime.hooks.add_rows`) is optimised with Adam so that every prefixed prompt
   continues with ``o*`` (teacher-forced NLL), plus ROME's KL "essence" term on
   ``"{subject} is a"`` (weight 0.0625) and weight decay ``wd·‖δ‖²/‖v₀‖²``; ‖δ‖ is clamped to
   ``4‖v₀‖`` (v₀ = the layer's output at the prompt). Stops early when the NLL < 0.05.
3. **Update**, with ``u = C⁻¹k*`` (C = E[kkᵀ] on WikiText-2, :mod:`tlcap.intervene.covariance`)
   and ``k`` the prompt's own key, ``v* = W k + δ``::

       W ← W + (v* − W k) uᵀ / (uᵀ k)

   This is the paper's closed form ``W + (v* − W k*)(C⁻¹k*)ᵀ / ((C⁻¹k*)ᵀ k*)`` as the official
   implementation applies it (residual and denominator at the prompt's key, so the edited
   prompt gets exactly ``v*``).

The edit goes through :class:`tlcap.intervene.WeightEdit`, so ``undo()`` (or leaving a ``with``
block) restores the weights bit for bit.

CPU budget (SmolLM2-135M): 20 Adam steps on 6 + 1 short rows and an 8,192-token covariance
(cached) — a few seconds per edit on an idle 2-core CPU. ROME's GPT-2 XL defaults are
20 steps, lr 0.5, KL 0.0625, weight decay 0.5, clamp 4, 100k covariance tokens, 20 prefixes.

Example:
    >>> with rome_edit(model, "The Eiffel Tower is located in", "The Eiffel Tower", " Rome", layer=6):
    ...     print(target_prob(model, "The Eiffel Tower is located in", " Rome"))
    >>> res = evaluate_rome(model, "The Eiffel Tower is located in", "The Eiffel Tower", " Rome", layer=6)
    >>> res.efficacy, res.specificity
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from tlcap.config import Config, check_float, check_int, check_sequence, check_str
from tlcap.errors import InvalidConfigError, SubjectNotFoundError
from tlcap.intervene.covariance import key_covariance, solve_key
from tlcap.intervene.weights import WeightEdit
from tlcap.models.adapter import Model
from tlcap.results import Result
from tlcap.runtime import hooks as H

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
    :class:`~tlcap.errors.InvalidConfigError` naming the field and its CLI option.

    Attributes:
        steps: Adam steps for δ (ROME 20), ``>= 1``.
        lr: Adam learning rate (ROME 0.5), ``> 0``.
        kl_factor: Weight of the KL essence term (ROME 0.0625), ``>= 0``.
        weight_decay: ``wd·‖δ‖²/‖v₀‖²`` (ROME 0.5), ``>= 0``.
        clamp_norm_factor: ‖δ‖ ≤ factor·‖v₀‖ (ROME 4), ``> 0``.
        stop_loss: Stop when the mean NLL of the new object falls below this (ROME 0.05), ``>= 0``.
        prefixes: Prefixes the prompt is put after (key average and value optimisation); at
            least one (``""`` = the bare prompt).
        kl_prompt: Essence prompt template, must contain ``{}`` (the subject).
        cov_tokens / cov_seq_len: WikiText-2 sample for ``C`` (ROME: 100,000 tokens).
        cov_reg: Relative ridge added to ``C`` before solving (0 = none), ``>= 0``.
        seed: Torch seed for the optimisation (it is deterministic anyway), ``>= 0``.

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
    cov_tokens: int = 8192
    cov_seq_len: int = 128
    cov_reg: float = 1e-2
    seed: int = 0

    def validate(self) -> None:
        check_int("steps", self.steps, min=1)
        check_float("lr", self.lr, gt=0)
        check_float("kl_factor", self.kl_factor, ge=0)
        check_float("weight_decay", self.weight_decay, ge=0)
        check_float("clamp_norm_factor", self.clamp_norm_factor, gt=0)
        check_float("stop_loss", self.stop_loss, ge=0)
        self._set("prefixes", check_sequence(
            "prefixes", self.prefixes, min_len=1, item=lambda n, x: check_str(n, x, nonempty=False, cli=None), cli=None,
        ))
        check_str("kl_prompt", self.kl_prompt, cli=None)
        if "{}" not in self.kl_prompt:
            raise InvalidConfigError(f"kl_prompt must contain {{}} (where the subject goes), got {self.kl_prompt!r}")
        check_int("cov_tokens", self.cov_tokens, min=1)
        check_int("cov_seq_len", self.cov_seq_len, min=2, cli=None)
        check_float("cov_reg", self.cov_reg, ge=0, cli=None)
        check_int("seed", self.seed, min=0)


class RomeEdit(WeightEdit):
    """A ROME edit applied in place; ``undo()`` / ``with`` restores the weights exactly.

    Attributes:
        layer: Edited layer. key: ``k*`` (averaged). prompt_key: the prompt's own key.
        delta: Optimised δ. u: ``C⁻¹k*``. right: the column of the update (``ΔW = right ⊗ u``).
        losses: NLL per optimisation step. seconds: Wall time of the edit.
    """

    layer: int
    key: Tensor
    prompt_key: Tensor
    delta: Tensor
    u: Tensor
    right: Tensor
    losses: list[float]
    seconds: float

    @property
    def update_norm(self) -> float:
        return float(self.right.norm() * self.u.norm())


# ---------------------------------------------------------------------------- keys
def _subject_last(model: Model, text: str, subject: str, start_char: int = 0) -> int:
    """Index (in ``model.encode(text)``) of the subject's last token, searching from ``start_char``."""
    return model.subject_span(text, subject, start=start_char).last


@torch.no_grad()
def _keys(model: Model, layer: int, texts: list[str], subject: str, prefix_lens: list[int]) -> tuple[Tensor, Tensor]:
    """``mlp_post`` and ``mlp_out`` at the subject's last token of each text, ``[n, d]``."""
    look = torch.tensor([_subject_last(model, t, subject, pl) for t, pl in zip(texts, prefix_lens)])
    k_name, v_name = model.hook_name("mlp_post", layer), model.hook_name("mlp_out", layer)
    acts = model.record(model.encode_batch(texts), [k_name, v_name])
    r = torch.arange(len(texts))
    return acts[k_name][r, look], acts[v_name][r, look]


# ---------------------------------------------------------------------------- the edit
def rome_edit(
    model: Model,
    prompt: str,
    subject: str,
    target_new: str,
    layer: int,
    config: RomeConfig | None = None,
    cov: Float[Tensor, "d_mlp d_mlp"] | None = None,
    progress: bool = False,
) -> RomeEdit:
    """Apply a ROME edit at ``layer`` and return its handle (already applied).

    Args:
        model: The model (edited in place, reversibly).
        prompt: A prompt containing ``subject`` whose continuation is the fact's object.
        subject: The subject as written in the prompt.
        target_new: The new object, e.g. ``" Rome"`` (all its tokens are optimised).
        layer: The layer whose MLP down projection is edited.
        config: Hyper-parameters (:class:`RomeConfig`).
        cov: ``C = E[kkᵀ]`` of the layer (default: :func:`key_covariance`, cached on disk).

    Example:
        >>> edit = rome_edit(model, "Paris is the capital of", "Paris", " Italy", layer=5)
        >>> ...; edit.undo()
    """
    cfg = config or RomeConfig()
    if not 0 <= layer < model.n_layers:
        raise ValueError(f"layer {layer} out of range for {model.name} ({model.n_layers} layers)")
    if subject not in prompt:
        raise SubjectNotFoundError(f"Subject {subject!r} does not occur in the prompt {prompt!r}.")
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    t_ids = model.target_ids(prompt, target_new)
    if cov is None:
        cov = key_covariance(model, [layer], n_tokens=cfg.cov_tokens, seq_len=cfg.cov_seq_len)[layer]

    # 1. key: average over prefixes; the prompt's own key and output.
    texts = [p + prompt for p in cfg.prefixes]
    keys, _ = _keys(model, layer, texts, subject, [len(p) for p in cfg.prefixes])
    k_star = keys.mean(0)
    k_prompt, v0 = (x[0] for x in _keys(model, layer, [prompt], subject, [0]))

    # 2. value: optimise delta at the subject's last token.
    rows, look, tgt_pos, tgt_ids = [], [], [], []
    for r, (p, text) in enumerate(zip(cfg.prefixes, texts)):
        ids = model.encode(text)
        look.append(_subject_last(model, text, subject, len(p)))
        start = len(ids) - 1
        rows.append(ids + t_ids[:-1])
        for j, tid in enumerate(t_ids):
            tgt_pos.append((r, start + j))
            tgt_ids.append(tid)
    n_rw = len(rows)
    kl_text = cfg.kl_prompt.format(subject)
    rows.append(model.encode(kl_text))
    look.append(_subject_last(model, kl_text, subject, 0))
    toks = model.encode_batch(rows).tokens
    look_t = torch.tensor(look, device=model.device)
    tp_r = torch.tensor([a for a, _ in tgt_pos], device=model.device)
    tp_p = torch.tensor([b for _, b in tgt_pos], device=model.device)
    tp_id = torch.tensor(tgt_ids, device=model.device)
    n_tgt = len(t_ids)

    delta = torch.zeros(model.d_model, device=model.device, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=cfg.lr)
    name = model.hook_name("mlp_out", layer)
    rows_all = torch.arange(toks.shape[0], device=model.device)
    kl_init = None
    losses: list[float] = []
    v0_norm = float(v0.norm())
    max_norm = cfg.clamp_norm_factor * v0_norm
    for _ in tqdm(range(cfg.steps), desc=f"ROME value (layer {layer})", disable=not progress):
        opt.zero_grad()
        logits = model.logits(toks, hooks=[(name, H.add_rows(rows_all, look_t, delta))])
        logp = logits.float().log_softmax(-1)
        nll = -logp[tp_r, tp_p, tp_id].sum() / (n_rw * n_tgt)
        kl_logp = logp[n_rw:][torch.arange(toks.shape[0] - n_rw), look_t[n_rw:]]
        if kl_init is None:
            kl_init = kl_logp.detach().clone()
        kl = torch.nn.functional.kl_div(kl_logp, kl_init, log_target=True, reduction="batchmean")
        wd = cfg.weight_decay * delta.norm() ** 2 / max(v0_norm**2, 1e-12)
        loss = nll + cfg.kl_factor * kl + wd
        losses.append(float(nll.detach()))
        if losses[-1] < cfg.stop_loss:
            break
        loss.backward()
        opt.step()
        with torch.no_grad():
            if delta.norm() > max_norm:
                delta.mul_(max_norm / delta.norm())
    delta = delta.detach()

    # 3. rank-one update of the down projection.
    u = solve_key(cov.to(k_star.device), k_star, cfg.cov_reg)
    right = delta / torch.dot(u, k_prompt)
    edit = RomeEdit()

    def apply(e: WeightEdit) -> None:
        e.touch(model.mlp_out_weight(layer).param)
        W = model.mlp_down_matrix(layer)  # [d_model, d_mlp] view of the parameter
        W.add_(torch.outer(right, u).to(W.dtype))

    edit.apply(apply)
    edit.layer, edit.key, edit.prompt_key, edit.delta = layer, k_star, k_prompt, delta
    edit.u, edit.right, edit.losses = u, right, losses
    edit.seconds = time.perf_counter() - t0
    return edit


# ---------------------------------------------------------------------------- evaluation
@torch.no_grad()
def _target_logprobs(model: Model, items: Sequence[tuple[str, str]]) -> Tensor:
    """Mean log-probability of each ``(prompt, target)``'s tokens (teacher forcing, one batch)."""
    rows, spans = [], []
    for prompt, target in items:
        p = model.encode(prompt)
        t = model.target_ids(prompt, target)
        rows.append(p + t[:-1])
        spans.append((len(p) - 1, t))
    logits = model.logits(model.encode_batch(rows)).float().log_softmax(-1)
    out = []
    for r, (start, t) in enumerate(spans):
        idx = torch.arange(start, start + len(t), device=logits.device)
        out.append(logits[r, idx, torch.tensor(t, device=logits.device)].mean())
    return torch.stack(out)


@torch.no_grad()
def _next_tokens(model: Model, prompts: Sequence[str]) -> list[int]:
    return model.last_logits(model.encode_batch(prompts)).argmax(-1).tolist()


def default_paraphrases(prompt: str) -> list[str]:
    """Two prefixed variants of the prompt (used when no paraphrases are given)."""
    return ["Fact: " + prompt, "Remember this. " + prompt]


@dataclass(frozen=True)
class RomeEditResult(Result):
    """Metrics of one ROME edit (the model is restored afterwards).

    Attributes:
        efficacy: The new object beats the old one on the prompt (mean token log-prob).
        paraphrase: Share of paraphrases where the new object beats the old one.
        specificity: Share of unrelated prompts whose top next token is unchanged.
        new_prob_before / new_prob_after: P(new object) on the prompt (geometric mean over
            its tokens) before / after the edit; likewise ``old_prob_*``.
    """

    layer: int
    efficacy: bool
    paraphrase: float
    specificity: float
    new_prob_before: float
    new_prob_after: float
    old_prob_before: float
    old_prob_after: float
    prompt: str = ""
    subject: str = ""
    target_new: str = ""
    target_old: str = ""
    paraphrases: tuple = ()
    paraphrase_success: tuple = ()
    neighbourhood: tuple = ()
    neighbourhood_kept: tuple = ()
    losses: tuple = ()
    delta_norm: float = 0.0
    update_norm: float = 0.0
    seconds: float = 0.0

    def to_frame(self) -> pd.DataFrame:
        keys = ["layer", "efficacy", "paraphrase", "specificity", "new_prob_before", "new_prob_after",
                "old_prob_before", "old_prob_after", "delta_norm", "seconds"]
        return pd.DataFrame([{k: getattr(self, k) for k in keys}])

    def summary(self) -> dict[str, Any]:
        return self.to_dict()


@dataclass(frozen=True)
class RomeSweep(Result):
    """The same edit at each layer separately (the CNL reliability test's efficacy-by-layer)."""

    results: tuple = ()
    prompt: str = ""
    subject: str = ""
    target_new: str = ""

    def __post_init__(self) -> None:
        # Loading from JSON gives the nested results as tagged dicts; revive them.
        revived = tuple(
            RomeEditResult._from_fields(r["fields"], {}) if isinstance(r, dict) and "__result__" in r else r
            for r in self.results
        )
        object.__setattr__(self, "results", revived)

    @property
    def layers(self) -> list[int]:
        return [r.layer for r in self.results]

    def column(self, name: str) -> list[Any]:
        return [getattr(r, name) for r in self.results]

    def to_frame(self) -> pd.DataFrame:
        return pd.concat([r.to_frame() for r in self.results], ignore_index=True)

    def figure(self, title: str | None = None):  # noqa: ANN201
        from tlcap.viz.trace import edit_sweep_figure

        return edit_sweep_figure(self, title=title)

    def summary(self) -> dict[str, Any]:
        cols = ["efficacy", "paraphrase", "specificity", "new_prob_before", "new_prob_after", "old_prob_after", "seconds"]
        out: dict[str, Any] = {"prompt": self.prompt, "subject": self.subject, "target_new": self.target_new,
                               "layers": self.layers}
        out.update({c: self.column(c) for c in cols})
        out["target_old"] = self.results[0].target_old if self.results else ""
        out["efficacy_rate"] = sum(map(bool, self.column("efficacy"))) / max(len(self.results), 1)
        return out


def evaluate_rome(
    model: Model,
    prompt: str,
    subject: str,
    target_new: str,
    layer: int,
    target_old: str | None = None,
    paraphrases: Sequence[str] | None = None,
    neighbourhood: Sequence[str] | None = None,
    config: RomeConfig | None = None,
    cov: Tensor | None = None,
    progress: bool = False,
) -> RomeEditResult:
    """Edit at ``layer``, measure efficacy / paraphrase / specificity, restore the weights.

    Args:
        target_old: The fact's current object (default: the model's top next token).
        paraphrases: Other prompts of the same fact (default: :func:`default_paraphrases`).
        neighbourhood: Unrelated prompts whose answers must not change (default: 10 generic
            facts, :data:`DEFAULT_NEIGHBOURHOOD`).
    """
    if target_old is None:
        target_old = model.to_str_tokens([_next_tokens(model, [prompt])[0]])[0]
    paras = list(paraphrases) if paraphrases is not None else default_paraphrases(prompt)
    neigh = list(neighbourhood) if neighbourhood is not None else list(DEFAULT_NEIGHBOURHOOD)
    items = [(p, t) for p in [prompt] + paras for t in (target_new, target_old)]

    def measure() -> tuple[Tensor, list[int]]:
        return _target_logprobs(model, items), _next_tokens(model, neigh) if neigh else []

    lp0, top0 = measure()
    with rome_edit(model, prompt, subject, target_new, layer, config, cov, progress) as edit:
        lp1, top1 = measure()
    lp1 = lp1.reshape(-1, 2)
    lp0 = lp0.reshape(-1, 2)
    succ = tuple(bool(a > b) for a, b in lp1[1:].tolist())
    kept = tuple(a == b for a, b in zip(top0, top1))
    return RomeEditResult(
        layer=layer, efficacy=bool(lp1[0, 0] > lp1[0, 1]),
        paraphrase=sum(succ) / len(succ) if succ else float("nan"),
        specificity=sum(kept) / len(kept) if kept else float("nan"),
        new_prob_before=float(lp0[0, 0].exp()), new_prob_after=float(lp1[0, 0].exp()),
        old_prob_before=float(lp0[0, 1].exp()), old_prob_after=float(lp1[0, 1].exp()),
        prompt=prompt, subject=subject, target_new=target_new, target_old=target_old,
        paraphrases=tuple(paras), paraphrase_success=succ, neighbourhood=tuple(neigh), neighbourhood_kept=kept,
        losses=tuple(edit.losses), delta_norm=float(edit.delta.norm()), update_norm=edit.update_norm,
        seconds=edit.seconds,
    )


def rome_sweep(
    model: Model,
    prompt: str,
    subject: str,
    target_new: str,
    layers: Sequence[int] | None = None,
    target_old: str | None = None,
    paraphrases: Sequence[str] | None = None,
    neighbourhood: Sequence[str] | None = None,
    config: RomeConfig | None = None,
    progress: bool = False,
) -> RomeSweep:
    """The same edit at every layer (or ``layers``) separately; the model is restored between.

    Covariances of all layers come from one pass over the text sample (then cached).
    """
    cfg = config or RomeConfig()
    layers = list(range(model.n_layers)) if layers is None else list(layers)
    covs = key_covariance(model, layers, n_tokens=cfg.cov_tokens, seq_len=cfg.cov_seq_len, progress=progress)
    if target_old is None:
        target_old = model.to_str_tokens([_next_tokens(model, [prompt])[0]])[0]
    results = []
    for l in tqdm(layers, desc="ROME all layers", disable=not progress):
        results.append(evaluate_rome(model, prompt, subject, target_new, l, target_old, paraphrases, neighbourhood,
                                     cfg, covs[l]))
    return RomeSweep(results=tuple(results), prompt=prompt, subject=subject, target_new=target_new)


__all__ = [
    "DEFAULT_NEIGHBOURHOOD", "DEFAULT_PREFIXES", "RomeConfig", "RomeEdit", "RomeEditResult", "RomeSweep",
    "default_paraphrases", "evaluate_rome", "rome_edit", "rome_sweep",
]
