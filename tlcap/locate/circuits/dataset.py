"""Circuit datasets: many (clean, corrupted, target) items, from ParaRel, ROME's known facts or a user file.

A :class:`CircuitDataset` is a tuple of :class:`~.task.CircuitItem` with a name; its
:meth:`~CircuitDataset.tasks` tokenizes it into batches of items (:func:`~.task.make_items_task`,
right-padded), which the scoring and evaluation passes stream through one batch at a time.

**Corrupted prompts.** Edge patching replaces a node's output position by position, so a
corrupted prompt must have as many tokens as its clean prompt. Sources without corrupted
prompts get them from :func:`pair_corruptions`: each item's corrupted prompt is the prompt of
the next item (in dataset order, wrapping around) of the same relation with the same number of
prompt tokens and another answer; an item with no such partner is dropped and counted
(:attr:`CircuitDataset.dropped`). Zero and mean ablation need no corrupted prompt
(``corrupt=False``).

Sources (:func:`load_circuit_dataset`):

* ``"pararel"``: a ParaRel relation (``relation="P36"``), each fact's first query as the prompt,
  its object as the answer (facts the model knows with ``known_top_k``);
* ``"known"``: ROME's known facts (``relation`` keeps one ``relation_id``);
* a path to a JSON (a list, or ``{"items": [...]}``), JSON Lines or CSV file of rows with
  ``prompt``, ``target`` and optionally ``corrupt_prompt``, ``corrupt_target``, ``relation``.
"""

from __future__ import annotations

import csv
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tlcap.data.files import read_json_rows, read_jsonl, text_stream
from tlcap.data.knowns import load_known_facts
from tlcap.data.pararel import load_pararel
from tlcap.data.sample import DataWarning
from tlcap.errors import DataFormatError, EmptyDatasetError, InvalidConfigError, MissingFileError
from tlcap.locate.circuits.task import CircuitItem, CircuitTask, make_items_task
from tlcap.models import Model
from tlcap.runtime.batching import CPU_MAX_ITEMS, auto_batch_rows, eap_item_bytes

SOURCES: tuple[str, ...] = ("pararel", "known")
_FIELDS = ("prompt", "target", "corrupt_prompt", "corrupt_target", "relation", "uid")


@dataclass(frozen=True)
class CircuitDataset:
    """Items to find one circuit for.

    Attributes:
        items: The items (all with a corrupted prompt, or none).
        name: Where they come from (``"pararel:P36"``, ``"known"``, a file name).
        dropped: Items of the source dropped for want of a same-length corrupted partner.

    Example:
        >>> from tlcap.locate.circuits import edge_attribution
        >>> ds = load_circuit_dataset("pararel", relation="P36", n=8, model=model)
        >>> ds.name, len(ds.items), ds.items[0].prompt, ds.items[0].corrupt_prompt
        ('pararel:P36', 8, 'The capital of Cook County is', 'The capital of South Australia is')
        >>> scores = edge_attribution(model, ds, steps=5, batch_size=8)
        >>> scores.n_items, scores.dataset
        (8, 'pararel:P36')
    """

    items: tuple[CircuitItem, ...]
    name: str = "user"
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.items)

    @property
    def has_corrupt(self) -> bool:
        """Whether the items carry corrupted prompts."""
        return bool(self.items) and self.items[0].corrupt_prompt is not None

    def batches(self, size: int) -> Iterator[tuple[CircuitItem, ...]]:
        """The items in consecutive batches of ``size`` (the last one shorter).

        Args:
            size: Items per batch.

        Yields:
            Tuples of :class:`CircuitItem`, in dataset order.
        """
        for i in range(0, len(self.items), size):
            yield self.items[i : i + size]

    def tasks(self, model: Model, batch_size: int, metric: str = "nll") -> list[CircuitTask]:
        """The dataset tokenized in right-padded batches (token ids only: activations are made per batch).

        Args:
            model: The model that tokenizes the items.
            batch_size: Items per task.
            metric: ``"nll"`` or ``"logit_diff"``.

        Returns:
            One :class:`CircuitTask` per batch, in dataset order.

        Raises:
            EmptyDatasetError: no items.
            ShapeMismatchError: an item whose corrupted prompt has another token length.
        """
        if not self.items:
            raise EmptyDatasetError(f"circuit dataset {self.name!r} has no items")
        return [make_items_task(model, list(b), metric) for b in self.batches(batch_size)]

    def without_corrupt(self) -> CircuitDataset:
        """The same items without corrupted prompts (for zero and mean ablation).

        Returns:
            A copy of the dataset whose items have ``corrupt_prompt=None``.
        """
        return replace(self, items=tuple(replace(it, corrupt_prompt=None) for it in self.items))

    def to_rows(self) -> list[dict[str, Any]]:
        """The items as dicts (the JSON format :func:`load_circuit_dataset` reads).

        Returns:
            One dict per item with the item's fields.
        """
        return [{f: getattr(it, f) for f in _FIELDS} for it in self.items]


def pair_corruptions(model: Model, items: Sequence[CircuitItem]) -> tuple[list[CircuitItem], int]:
    """Give every item a corrupted prompt: the next same-relation item with equal prompt length and another answer.

    Args:
        model: The model (token lengths).
        items: Items without corrupted prompts.

    Returns:
        The items that found a partner (with ``corrupt_prompt`` and ``corrupt_target`` set), and
        how many were dropped.
    """
    lens = [len(model.encode(it.prompt)) for it in items]
    out: list[CircuitItem] = []
    n = len(items)
    for i, it in enumerate(items):
        for k in range(1, n):
            j = (i + k) % n
            o = items[j]
            if o.relation == it.relation and lens[j] == lens[i] and o.target != it.target and o.prompt != it.prompt:
                out.append(replace(it, corrupt_prompt=o.prompt, corrupt_target=o.target))
                break
    return out, n - len(out)


def _from_rows(rows: Any, path: Path) -> list[CircuitItem]:
    if not isinstance(rows, list) or not rows:
        raise DataFormatError(f"{path}: expected a non-empty list of items (each with 'prompt' and 'target')")
    items = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not r.get("prompt") or not r.get("target"):
            raise DataFormatError(f"{path}: item {i} needs non-empty 'prompt' and 'target' fields, got {r!r}")
        items.append(CircuitItem(**{f: (str(r[f]) if r.get(f) not in (None, "") else None) if f.startswith("corrupt")
                                    else str(r.get(f) or "") for f in _FIELDS}))
    return items


def read_items(path: str | Path) -> list[CircuitItem]:
    """Items of a user file: JSON (a list or ``{"items": [...]}``), JSON Lines (``.jsonl``) or CSV (header row).

    Args:
        path: A ``.json``, ``.jsonl`` or ``.csv`` file.

    Returns:
        The :class:`CircuitItem` list, in file order.

    Raises:
        MissingFileError: no such file.
        DataFormatError: not valid JSON, or an item without ``prompt`` / ``target``.
    """
    path = Path(path)
    missing = f"circuit dataset file {path} not found (a .json, .jsonl or .csv file of prompt,target rows)"
    if path.suffix in (".csv", ".jsonl") and not path.is_file():
        raise MissingFileError(missing)
    if path.suffix == ".csv":
        return _from_rows(list(csv.DictReader(text_stream(path))), path)
    if path.suffix == ".jsonl":
        try:
            return _from_rows(read_jsonl(path), path)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f"{path} is not valid JSON Lines ({exc})") from None
    return _from_rows(read_json_rows(path, "items", missing=missing), path)


def load_circuit_dataset(
    source: str | Path,
    *,
    relation: str | None = None,
    n: int | None = None,
    model: Model,
    corrupt: bool = True,
    known_top_k: int | None = None,
) -> CircuitDataset:
    """A circuit dataset from ParaRel, ROME's known facts or a user file (module docstring).

    Args:
        source: ``"pararel"``, ``"known"`` or a file path.
        relation: ParaRel relation (required for ``"pararel"``) or known-facts ``relation_id``.
        n: Keep at most this many items (after pairing).
        model: The model (token lengths, the known-fact filter).
        corrupt: Give every item a same-length corrupted prompt (:func:`pair_corruptions`);
            ``False`` for zero and mean ablation.
        known_top_k: ParaRel: keep only facts whose answer the model ranks within its top-k.

    Returns:
        The :class:`CircuitDataset`.

    Raises:
        InvalidConfigError: ``"pararel"`` without a relation.
        EmptyDatasetError: no item left (e.g. no same-length corrupted partners).

    Example:
        >>> ds = load_circuit_dataset("pararel", relation="P36", n=8, model=model)
        >>> len(ds.items), ds.dropped      # items without a same-length corrupted partner are dropped
        (8, 3)
    """
    src = str(source)
    if src == "pararel":
        if not relation:
            raise InvalidConfigError("--dataset pararel needs --relation (e.g. P36)")
        # scan more facts than asked for: pairing drops the ones without a same-length partner
        facts = load_pararel(None, [relation], n_facts=None if n is None else 3 * n, model=model, progress=False,
                             known_top_k=known_top_k, max_scan=max(1000, 6 * (n or 0)))
        items = [CircuitItem(f.queries[0], f.target, relation=f.relation, uid=f.uuid) for f in facts]
        name = f"pararel:{relation}"
    elif src == "known":
        facts_k = load_known_facts()
        items = [CircuitItem(f["prompt"], " " + f["attribute"], relation=str(f["relation_id"]), uid=str(f["known_id"]))
                 for f in facts_k if relation is None or f["relation_id"] == relation]
        name = "known" + (f":{relation}" if relation else "")
        if n is not None:
            items = items[: 3 * n]
    else:
        items = read_items(source)
        if relation is not None:
            items = [it for it in items if it.relation == relation]
        name = Path(source).name
    dropped = 0
    if corrupt and items and items[0].corrupt_prompt is None:
        items, dropped = pair_corruptions(model, items)
    elif not corrupt:
        items = [replace(it, corrupt_prompt=None) for it in items]
    if n is not None:
        items = items[:n]
    if not items:
        raise EmptyDatasetError(
            f"no items left in {name!r}" + (f" ({dropped} dropped without a same-length corrupted partner; "
                                            "use zero or mean ablation)" if dropped else "")
        )
    if n is not None and len(items) < n:
        warnings.warn(f"{name}: {len(items)} items instead of {n} ({dropped} had no same-length corrupted partner)",
                      DataWarning, stacklevel=2)
    return CircuitDataset(tuple(items), name, dropped)


def dataset_batch_size(model: Model, dataset: CircuitDataset, batch_size: int | str, steps: int = 1,
                       max_memory: Any = None, circuit_runs: bool = False) -> int:
    """Items per pass: ``batch_size`` when it is a number; for ``"auto"`` the most items whose
    estimated memory (:func:`~tlcap.runtime.batching.eap_item_bytes` of the longest item) fits
    ``max_memory`` (default: the device's free memory), at most ``CPU_MAX_ITEMS`` (8) on a CPU.

    Gradient passes count the per-head split inputs only where the model has no grouped reader
    gradients (:attr:`~tlcap.models.Model.grouped_reader_grads`); ``circuit_runs`` (circuits run
    alone, which always split) counts them. Callers run the pass through
    :func:`~tlcap.runtime.batching.run_auto_batched`, which halves the size and reruns on an
    out-of-memory error.

    Args:
        model: The model (tokenizer, device, ``grouped_reader_grads``).
        dataset: The dataset; its longest ``prompt + target`` sizes the estimate.
        batch_size: Items per pass, or ``"auto"``.
        steps: Integrated-gradient steps per item (EAP-IG), which scale the memory estimate.
        max_memory: Memory budget in bytes (default: the device's free memory).
        circuit_runs: Count the per-head split inputs (for circuits run alone).

    Returns:
        Items per pass, ``>= 1``.
    """
    if batch_size != "auto":
        return int(batch_size)
    longest = max((len(model.encode(it.prompt + it.target)) for it in dataset.items), default=1)
    split = circuit_runs or not model.grouped_reader_grads
    return auto_batch_rows(eap_item_bytes(model, longest, steps, split), max(len(dataset), 1), max_memory, model.device,
                           cpu_max=CPU_MAX_ITEMS, model=model)


__all__ = ["CircuitDataset", "SOURCES", "dataset_batch_size", "load_circuit_dataset", "pair_corruptions", "read_items"]
