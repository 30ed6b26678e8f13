"""Data: ParaRel facts, task datasets (GSM8K, SVAMP, MBPP, Emotion, IMDB), WikiText-2."""

from tlcap.data.pararel import Fact, load_pararel
from tlcap.data.tasks import Sample, Task, get_task, load_task, register_task
from tlcap.data.wikitext import load_wikitext

__all__ = ["Fact", "load_pararel", "Sample", "Task", "get_task", "load_task", "register_task", "load_wikitext"]
