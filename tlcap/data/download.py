"""Download the full datasets that tlcap bundles only in part (Emotion, IMDB).

The files are the originals recorded in each dataset's ``PROVENANCE.md`` (pinned repository
commit, sha256 checked), written to :func:`~tlcap.data.files.data_home` in the layout the loaders
read (``emotion/train.txt``, ``imdb/imdb_reviews_2500.csv``). A download happens only when asked
for, or when a loader needs more samples than the bundled subset holds; never in offline mode
(``TLCAP_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``, which ``make test`` sets).

Example (doctests run offline, so the download is refused here; online, ``root`` is the data home
holding ``emotion/``, and ``load_task("emotion", root, "train", n=5000)`` draws from the full files):

    >>> import tempfile
    >>> offline()
    True
    >>> root = fetch_emotion(tempfile.mkdtemp())     # ~2 MB, once; later calls only check the checksums
    Traceback (most recent call last):
    ...
    tlcap.errors.DatasetUnavailableError: emotion needs emotion/train.txt downloaded, but offline mode is on ...
"""

from __future__ import annotations

import hashlib
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tlcap.data.files import data_home
from tlcap.errors import DatasetUnavailableError, TlcapError


@dataclass(frozen=True)
class RemoteFile:
    """One file to download: where from, where to (relative to the data home), its sha256."""

    url: str
    path: str
    sha256: str


_EMOTION = "https://raw.githubusercontent.com/niuzaisheng/AttExplainer/fc8080f783028a0f2f6510175d0cf48a9fb2e3a3/data/emotion"
_IMDB = "https://raw.githubusercontent.com/DeekshithaKalluri/SentimentAnalysis/e517edc21129b4ea9fa4d2ef9708abd6e0cdfcbd"

REMOTE: dict[str, tuple[RemoteFile, ...]] = {
    "emotion": (
        RemoteFile(
            f"{_EMOTION}/train.txt", "emotion/train.txt", "29d6a6986e391f1882d17089d53bedff82443e1e6bb6ab2427c0aafd5e261910"
        ),
        RemoteFile(f"{_EMOTION}/val.txt", "emotion/val.txt", "54ca705d677f12b1273bf012ec47d2fdfcf974995d7ab71c4af0965f092e69d3"),
        RemoteFile(
            f"{_EMOTION}/test.txt", "emotion/test.txt", "4187b1cfb1e46f2d75541d937feb6aba69365c706ec17e45c26d1db33a8783f0"
        ),
    ),
    "imdb": (
        RemoteFile(
            f"{_IMDB}/IMDB%20Dataset.csv",
            "imdb/imdb_reviews_2500.csv",
            "27eb2025b12430a31ade5f433f204a2ccfaad0d15e962c5f832848e6fd4c46da",
        ),
    ),
}


def offline() -> bool:
    """Is offline mode on (``TLCAP_OFFLINE`` or ``HF_HUB_OFFLINE`` set to 1/true/yes)?

    Returns:
        True when downloads must not be attempted.
    """
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes") for k in ("TLCAP_OFFLINE", "HF_HUB_OFFLINE"))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _download(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - fixed https (or test file://) URLs
        return resp.read()


def fetch(name: str, data_home_dir: str | Path | None = None, *, force: bool = False, timeout: float = 60.0) -> Path:
    """Download dataset ``name``'s full files (if not already there) and return the data folder.

    Args:
        name: ``"emotion"`` or ``"imdb"`` (the other datasets are bundled whole).
        data_home_dir: Target folder (default :func:`~tlcap.data.files.data_home`).
        force: Download again even if a file with the right checksum is present.
        timeout: Seconds per download.

    Returns:
        The folder to pass as ``data_dir`` (it holds ``name/``).

    Raises:
        TlcapError: no download is defined for ``name``.
        DatasetUnavailableError: offline mode, no network, a checksum mismatch, or a file already
            present with other content (it is never overwritten without ``force``).

    Example:
        >>> sorted(REMOTE)                           # the datasets with a download
        ['emotion', 'imdb']
        >>> fetch("gsm8k")
        Traceback (most recent call last):
        ...
        tlcap.errors.TlcapError: no download for 'gsm8k': downloads exist for emotion, imdb; ...

        ``root = fetch("imdb")`` downloads into ``~/.cache/tlcap/data`` (or ``$TLCAP_DATA`` when set)
        and returns that folder; offline it raises :class:`~tlcap.errors.DatasetUnavailableError`.
    """
    if name not in REMOTE:
        raise TlcapError(
            f"no download for {name!r}: downloads exist for {', '.join(sorted(REMOTE))}; "
            "the other datasets are bundled whole with tlcap"
        )
    root = Path(data_home_dir).expanduser() if data_home_dir is not None else data_home()
    for f in REMOTE[name]:
        dest = root / f.path
        if dest.is_file() and not force:
            if _sha256(dest.read_bytes()) == f.sha256:
                continue
            raise DatasetUnavailableError(
                f"{dest} exists but is not the expected file (sha256 differs); remove it or call fetch(..., force=True)"
            )
        if offline():
            raise DatasetUnavailableError(
                f"{name} needs {f.path} downloaded, but offline mode is on (TLCAP_OFFLINE / HF_HUB_OFFLINE)"
            )
        try:
            data = _download(f.url, timeout)
        except OSError as exc:  # URLError, timeouts, HTTP errors
            raise DatasetUnavailableError(f"could not download {f.url} ({exc})") from None
        if _sha256(data) != f.sha256:
            raise DatasetUnavailableError(f"{f.url} has sha256 {_sha256(data)}, expected {f.sha256}; not saved")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(dest)
    return root


def fetch_emotion(data_home_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """The full Emotion train/val/test files (16,000 / 2,000 / 2,000 tweets); see :func:`fetch`.

    Args:
        data_home_dir: Target folder (default :func:`~tlcap.data.files.data_home`).
        force: Download again even if files with the right checksums are present.

    Returns:
        The data folder to pass as ``data_dir`` (holding ``emotion/``).
    """
    return fetch("emotion", data_home_dir, force=force)


def fetch_imdb(data_home_dir: str | Path | None = None, *, force: bool = False) -> Path:
    """The 2,500-review IMDB file the bundled subset was drawn from; see :func:`fetch`.

    The full 50k-review IMDB set is on the Hugging Face hub: ``load_task("imdb", "hf:", ...)``.

    Args:
        data_home_dir: Target folder (default :func:`~tlcap.data.files.data_home`).
        force: Download again even if a file with the right checksum is present.

    Returns:
        The data folder to pass as ``data_dir`` (holding ``imdb/``).
    """
    return fetch("imdb", data_home_dir, force=force)


__all__ = ["REMOTE", "RemoteFile", "fetch", "fetch_emotion", "fetch_imdb", "offline"]
