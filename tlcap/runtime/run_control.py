"""How a long run executes: one value for checkpoints, resuming, sharding and progress.

Every function that streams over a dataset and can be interrupted — dataset scoring
(:func:`~tlcap.attribution.dataset.score_dataset`), CNL locating and erasing, the CNL evaluation
experiments (``fidelity``, ``reliability``, ``decoupling``) — takes ``run=RunControl(...)``
instead of its own copy of these arguments. Nothing in it changes a result: a run with
checkpoints, resumed after a kill, sharded and merged, or without a progress bar gives the
same numbers as one uninterrupted run (tested per function).

Example:
    >>> import tempfile
    >>> rc = RunControl(checkpoint_dir=tempfile.mkdtemp(), checkpoint_every=10, shard="1/4", progress=False)
    >>> rc.every(25), rc.shard_of(), rc.in_folder("A0").checkpoint_dir.endswith("A0")
    (10, (1, 4), True)
    >>> RunControl(shard="4/4")
    Traceback (most recent call last):
    ...
    tlcap.errors.InvalidConfigError: shard (--shard) 4/4 is invalid: need 0 <= i < n
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tlcap.config import Config, check_bool, check_int
from tlcap.errors import InvalidConfigError


def parse_shard(shard: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"i/n"`` (or ``(i, n)``) → ``(i, n)`` with 0 ≤ i < n.

    Args:
        shard: ``"i/n"``, ``(i, n)`` or ``None``.

    Returns:
        ``(i, n)``, or ``None`` for ``None``.

    Raises:
        InvalidConfigError: not of the form ``i/n``, or ``i`` out of range.

    Example:
        >>> parse_shard("2/8")
        (2, 8)
    """
    if shard is None:
        return None
    if isinstance(shard, str):
        try:
            i, n = (int(x) for x in shard.split("/"))
        except ValueError:
            raise InvalidConfigError(f"--shard must look like i/n (e.g. 0/4), got {shard!r}") from None
    else:
        i, n = shard
    if not (n >= 1 and 0 <= i < n):
        raise InvalidConfigError(f"shard (--shard) {i}/{n} is invalid: need 0 <= i < n")
    return (int(i), int(n))


@dataclass(frozen=True)
class RunControl(Config):
    """Where a run checkpoints, whether it resumes, which shard it takes, whether it shows progress.

    Attributes:
        checkpoint_dir: Folder of the streamed checkpoint (``None``: none); a rerun with the same
            folder, inputs and settings resumes after the last save (a path is stored as a string).
        checkpoint_every: Items between saves (``None``: the function's default — 25 samples for
            dataset scoring and erasing, a few facts for the evaluation experiments), ``>= 1``.
        resume: Continue from the checkpoint in ``checkpoint_dir`` (``False``: start over).
        shard: ``"i/n"`` (or ``(i, n)``, stored as ``"i/n"``): dataset scoring takes only the
            samples at positions ``≡ i (mod n)``; merge the shards afterwards.
        distributed: Under ``torchrun``: shard by rank and all-reduce (gloo on CPU).
        progress: Show progress bars.
    """

    checkpoint_dir: str | Path | None = None
    checkpoint_every: int | None = None
    resume: bool = True
    shard: str | tuple[int, int] | None = None
    distributed: bool = False
    progress: bool = True

    def validate(self) -> None:
        if isinstance(self.checkpoint_dir, Path):
            self._set("checkpoint_dir", str(self.checkpoint_dir))
        if self.checkpoint_every is not None:
            check_int("checkpoint_every", self.checkpoint_every, min=1)
        check_bool("resume", self.resume)
        if self.shard is not None:
            i, n = parse_shard(self.shard)  # type: ignore[misc]
            self._set("shard", f"{i}/{n}")
        check_bool("distributed", self.distributed)
        check_bool("progress", self.progress)

    def every(self, default: int) -> int:
        """``checkpoint_every``, or the function's ``default`` when it is not set.

        Args:
            default: The calling function's default.

        Returns:
            Items between saves.
        """
        return default if self.checkpoint_every is None else int(self.checkpoint_every)

    def shard_of(self) -> tuple[int, int] | None:
        """The shard as ``(i, n)`` (``None``: the whole dataset).

        Returns:
            ``(i, n)`` or ``None``.
        """
        return parse_shard(self.shard)

    @property
    def directory(self) -> Path | None:
        """``checkpoint_dir`` as a :class:`~pathlib.Path` (``None``: no checkpoints)."""
        return Path(self.checkpoint_dir) if self.checkpoint_dir is not None else None

    def in_folder(self, name: str) -> RunControl:
        """The same control checkpointing into the sub-folder ``name`` (one part of a run).

        Args:
            name: The sub-folder.

        Returns:
            A copy (no checkpoints when this one has none).
        """
        return self if self.checkpoint_dir is None else self.replace(checkpoint_dir=str(Path(self.checkpoint_dir) / name))


__all__ = ["RunControl", "parse_shard"]
