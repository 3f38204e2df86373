"""The registry of who labels each environment family (a `labeling.label_source.LabelSource`).

`hindsight.labeling.job` chunks, resumes, shards and writes the dataset; a label source turns
one chunk of episode indices into the stored arrays. Three ship with hindsight: the JAX engine
(`labeling.jax_source.JaxSource`, every functional family), the Python-adapter labeler
(`labeling.py_labeler.PySource`, every family of stateful Python environments) and the text
labeler (`text.source.TextSource`, which the text plug-in registers for its `text` family).
A new kind of labeler is one class and one `register_label_source` call.

JAX-free: the CLI reads the registry (a family's own job options become flags) before JAX
starts; the sources themselves are imported when a job builds one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from hindsight.envs.families import EnvFamily

if TYPE_CHECKING:
  from hindsight.labeling.config import LabelJob
  from hindsight.labeling.label_source import LabelSource


@dataclasses.dataclass(frozen=True)
class SourceEntry:
  """Who labels a family's episodes, and the job options that labeler takes.

  make: (LabelJob, out_dir) -> LabelSource.
  workers: it takes `LabelJob.workers` (labels over a pool of processes).
  options: the family's own job options (a frozen dataclass the job carries as
    `LabelJob.options`; its fields' metadata["help"] make the `hindsight label` flags), or
    None. Its class attribute `job_key` names it in the job's description.
  """

  make: Callable[[LabelJob, str], LabelSource]
  workers: bool = False
  options: type | None = None


def _jax_source(job: LabelJob, out_dir: str) -> LabelSource:
  from hindsight.labeling.jax_source import JaxSource

  del out_dir
  return JaxSource(job)


def _python_source(job: LabelJob, out_dir: str) -> LabelSource:
  from hindsight.labeling.py_labeler import PySource

  del out_dir
  return PySource(job)


JAX_ENGINE = SourceEntry(_jax_source)
PYTHON_ADAPTERS = SourceEntry(_python_source, workers=True)
_SOURCES: dict[str, SourceEntry] = {}


def register_label_source(family: str, entry: SourceEntry) -> SourceEntry:
  """Registers who labels family `family` (a plug-in's own labeler)."""
  _SOURCES[family] = entry
  return entry


def source_entry(family: EnvFamily) -> SourceEntry:
  """Who labels `family`: its registered source, else the Python-adapter labeler for
  stateful Python environments, else the JAX engine."""
  if family.name in _SOURCES:
    return _SOURCES[family.name]
  return PYTHON_ADAPTERS if family.make_python is not None else JAX_ENGINE


def families_with_options() -> list[tuple[str, type]]:
  """(family, options class) of every registered source with job options of its own."""
  return [(name, e.options) for name, e in _SOURCES.items() if e.options is not None]
