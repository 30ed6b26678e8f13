"""Data: ParaRel facts, task datasets (GSM8K, SVAMP, MBPP, Emotion, IMDB), WikiText-2, ROME known facts.

Every dataset is bundled with tlcap (Emotion and IMDB as a seeded subset), so the loaders work
offline with no argument; ``$TLCAP_DATA`` or an explicit ``data_dir`` point to full local copies,
and :func:`fetch` downloads the full Emotion / IMDB files. See ``docs/data.md``.
"""

from tlcap.data.download import fetch, fetch_emotion, fetch_imdb
from tlcap.data.files import HF, bundled_dir, data_home
from tlcap.data.knowns import load_known_facts
from tlcap.data.pararel import Fact, load_pararel
from tlcap.data.tasks import Sample, Task, get_task, load_task, register_task
from tlcap.data.wikitext import load_wikitext

__all__ = [
    "Fact", "load_pararel", "Sample", "Task", "get_task", "load_task", "register_task", "load_wikitext",
    "load_known_facts", "fetch", "fetch_emotion", "fetch_imdb", "data_home", "bundled_dir", "HF",
]
