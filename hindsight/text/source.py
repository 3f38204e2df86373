"""Text traces as a source of the labeling job (`hindsight.labeling.job`): chunks of traces
labeled through the endpoint, written, resumed and turned into the TFDS dataset like every
other environment's. Beside the usual fields the dataset carries each trace's `prompt`,
`trace_id` and the text of every step (`step_text`), for a text encoder."""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from hindsight.errors import HindsightError, note
from hindsight.labeling.config import LabelJob
from hindsight.labeling.label_source import SourceInfo, chunk_totals
from hindsight.text.estimate import SUCCESS_THRESHOLD

CACHE_FILE = "completions.sqlite"

# What an agent-trace job counts beside its labels (per trace, summed in its metadata): the
# calls its environment executed, the continuations that ended before the model or the
# environment ended them, and those --tool-check ran again.
AGENT_ENDS = {
  "context_ends": "because their text (a long tool result, say) filled the model's context "
  "(an environment's max_result_chars cuts long results: docs/agents-text.md)",
  "turn_ends": "at --max-turns",
}
AGENT_COUNTS = ("tool_calls", *AGENT_ENDS, "tool_checked")
# The labeler of `--tools` (agent traces), imported when asked for.
AGENT_LABELER = "hindsight.agentic.labeler:AgentLabeler"


class TextSource:
  """The job's chunks from `TextLabeler` (a `hindsight.labeling.label_source.LabelSource`)."""

  def __init__(self, job: LabelJob, out_dir: str):
    from hindsight.text.labeler import TextLabeler

    if job.options is None:
      raise HindsightError("env text:... needs --model NAME (the endpoint's model)")
    if jax.process_count() > 1:
      raise HindsightError(
        "text traces are labeled by one process (the endpoint does the work: raise "
        "--concurrency instead of --num-processes)"
      )
    options = job.options
    labeler = TextLabeler
    if options.tools:  # the agent labeler sits above the text library: named, not imported
      from hindsight.plugins import import_function

      labeler = import_function(AGENT_LABELER, "--tools")[1]
    self.labeler = labeler(job.env, job.episodes, job.config, options)
    self.cache_path = options.cache or os.path.join(out_dir, CACHE_FILE)
    self.info = SourceInfo(
      env_name="text",
      policy=options.model,
      horizon=None,  # the longest trace: known once every chunk is labeled (`finish`)
      num_actions=0,
      null_action=None,
      success_threshold=SUCCESS_THRESHOLD,
      success_from_return=True,
      tag_names=self.labeler.tag_names,
      obs_shape=(1,),
      obs_dtype=np.float32,
      texts=True,
      compiles=False,
    )
    self._truncated = 0
    self._ends = dict.fromkeys(AGENT_ENDS, 0)

  def chunk_multiple(self) -> int:
    return 1

  def label(self, seed: int, start: int, stop: int, bar) -> dict:
    if self.labeler.client is None:
      self.labeler.open(self.cache_path, bar)
      self.labeler.check_context()
    rows = self.labeler.label(start, stop, seed)
    bar.update(stop - start)
    arrays = stack_traces(rows)
    stats = self.labeler.client.stats
    if stats.truncated > self._truncated:
      cap, context = self.labeler.options.max_tokens, self.labeler.client.context
      less = ""
      if stats.truncated_by_context:
        less = (f"; {stats.truncated_by_context} of them at fewer, what the text before them "
                f"left of the model's {context}-token context")  # fmt: skip
      note(f"{stats.truncated} continuations so far ended at their token cap (--max-tokens "
           f"{cap}{less}; finish_reason length): the verifier scored them as written")  # fmt: skip
      self._truncated = stats.truncated
    for name, why in AGENT_ENDS.items():
      ended = int(np.sum(arrays.get(name, 0)))
      if ended:
        self._ends[name] += ended
        note(f"{self._ends[name]} continuations so far ended {why}: scored as written, "
             f"counted in the dataset's {name}")  # fmt: skip
    return arrays

  def finish(self, chunk_paths: list[str]) -> dict:
    """The horizon is the longest trace, and the cost is in completions (and, for agent
    traces, in the tool calls the environment executed)."""
    agents = bool(self.labeler.options.tools)
    totals = chunk_totals(chunk_paths, ("length", "completions", *AGENT_COUNTS * agents))
    out = {
      "horizon": int(totals["length"].max()),
      "completions": int(totals["completions"].sum()),
      "text": json.dumps(self.labeler.options.describe(), sort_keys=True),
    }
    if agents:
      out.update({name: int(totals[name].sum()) for name in AGENT_COUNTS})
      if out["tool_checked"]:
        note(f"--tool-check: {out['tool_checked']} continuations' calls run again on fresh "
             "forks gave the same results")  # fmt: skip
    return out


def stack_traces(rows: list[dict]) -> dict:
  """Per-trace fields -> arrays [n, H, ...] of the longest trace H (floats NaN-padded,
  ints and flags 0, texts empty); per-trace scalars -> [n]."""
  H = max(int(r["length"]) for r in rows)
  out = {}
  for name, value in rows[0].items():
    if isinstance(value, np.ndarray | list) and name != "prompt":
      sample = np.asarray(value)
      if sample.dtype.kind == "f":
        pad = np.nan
      elif sample.dtype.kind in "US":
        pad = ""
      else:
        pad = 0
      shape = (len(rows), H, *sample.shape[1:])
      dtype = sample.dtype if sample.dtype.kind not in "US" else object
      block = np.full(shape, pad, dtype)
      for i, r in enumerate(rows):
        v = np.asarray(r[name])
        block[i, : len(v)] = v
      out[name] = block.astype(str) if dtype is object else block
    else:
      out[name] = np.array([r[name] for r in rows])
  return out
