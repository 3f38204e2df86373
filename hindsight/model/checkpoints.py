"""Checkpoints that refuse to come back damaged: orbax plus a manifest of checksums.

orbax restores a checkpoint whose bytes were flipped on disk without complaint, with wrong
values. So every saved step gets `hindsight_manifest.json` (SHA-256 of each of its files),
written after orbax has finished the step, and `restore` checks it first:
  - no manifest: the save was cut short (the process died between orbax and the manifest);
    the step is set aside and the previous one used.
  - a file missing or not matching: the step is damaged. Restoring raises a one-line
    HindsightError naming the file, or, with `fallback=True`, sets the step aside under
    `<directory>.damaged/` and falls back to the previous good step.

Each step may carry small JSON files beside orbax's arrays (`save(..., files=...)`: the
credit model's config and DataSpec, so a step directory alone rebuilds the model); they are
written before the manifest, so the manifest covers them.

Preservation: the last `keep` steps, plus the one with the lowest validation loss.
Saving is synchronous: a step is complete on disk before training moves on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint import checkpoint_managers as policies

from hindsight.errors import HindsightError
from hindsight.files import atomic_write_text, sha256_file

MANIFEST = "hindsight_manifest.json"
log = logging.getLogger(__name__)


class _QuietReadOnly(logging.Filter):
  """orbax warns twice that a read-only manager is read-only; a Predictor means it."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "read_only" not in record.getMessage() and "read only" not in record.getMessage()


logging.getLogger("absl").addFilter(_QuietReadOnly())


def _files(step_dir: str) -> list[str]:
  out = []
  for root, _, names in os.walk(step_dir):
    for name in names:
      rel = os.path.relpath(os.path.join(root, name), step_dir)
      if rel != MANIFEST:
        out.append(rel)
  return sorted(out)


def write_manifest(step_dir: str) -> None:
  """Checksums of every file of a finished step, written atomically."""
  manifest = {rel: sha256_file(os.path.join(step_dir, rel)) for rel in _files(step_dir)}
  text = json.dumps({"sha256": manifest}, indent=1, sort_keys=True)
  atomic_write_text(os.path.join(step_dir, MANIFEST), text)


def verify_manifest(step_dir: str) -> str | None:
  """None if every file listed matches its checksum, else the path of the first that does
  not ("" when the manifest itself is missing: an unfinished save)."""
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.isfile(path):
    return ""
  try:
    with open(path) as f:
      manifest = json.load(f)["sha256"]
  except (OSError, ValueError, KeyError):
    return path
  for rel, digest in sorted(manifest.items()):
    full = os.path.join(step_dir, rel)
    if not os.path.isfile(full) or sha256_file(full) != digest:
      return full
  return None


class Checkpoints:
  """An orbax CheckpointManager over one pytree, with manifests (see the module docstring)."""

  def __init__(self, directory: str, keep: int = 1, read_only: bool = False):
    """read_only: open someone else's run (a Predictor): never deletes or writes anything."""
    self.directory = os.path.abspath(directory)
    self.read_only = read_only
    options = ocp.CheckpointManagerOptions(
      read_only=read_only,
      enable_async_checkpointing=False,
      cleanup_tmp_directories=not read_only,
      # best_fn makes orbax write each step's metrics to disk (its `metrics` item, covered by
      # the manifest); without it they live in memory only, so after the run `best_step`
      # found none. Which steps are kept is the preservation policy's choice, not best_fn's.
      best_fn=lambda m: m["val_loss"],
      best_mode="min",
      preservation_policy=policies.AnyPreservationPolicy(
        [
          policies.LatestN(n=keep),
          policies.BestN(
            get_metric_fn=lambda m: m["val_loss"],
            reverse=True,  # sorted high to low, the kept end is the lowest loss
            n=1,
            keep_checkpoints_without_metrics=False,
          ),
        ]
      ),
    )
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state, val_loss: float, files: dict[str, str] | None = None) -> None:
    """Saves `state` as `step`; files: {name: text} written into the step directory."""
    self.manager.save(
      step, args=ocp.args.StandardSave(state), metrics={"val_loss": float(val_loss)}, force=True
    )
    self.manager.wait_until_finished()
    if jax.process_index() == 0:
      for name, text in (files or {}).items():
        atomic_write_text(os.path.join(self.step_dir(step), name), text)
      write_manifest(self.step_dir(step))
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"hindsight_manifest_{step}")

  def add_files(self, step: int, files: dict[str, str]) -> None:
    """Writes {name: text} into a finished step's directory and extends its manifest (the
    step must verify first: a manifest never vouches for files it did not check)."""
    if jax.process_index() != 0:
      return
    step_dir = self.step_dir(step)
    bad = verify_manifest(step_dir)
    if bad is not None:
      raise HindsightError(f"checkpoint step {step} does not verify ({bad or 'no manifest'})")
    for name, text in files.items():
      atomic_write_text(os.path.join(step_dir, name), text)
    write_manifest(step_dir)

  def best_step(self) -> int:
    """The kept step with the lowest validation loss (a one-line error if no kept step
    carries one: never a silent fallback to the latest)."""
    scored = []
    for step in self.steps():
      metrics = self.manager.metrics(step)
      if metrics and "val_loss" in metrics:
        scored.append((float(metrics["val_loss"]), step))
    if not scored:
      raise HindsightError(
        f"no checkpoint in {self.directory} records its validation loss (saved before "
        "hindsight kept it?): retrain, or score the latest with checkpoint.evaluate=last"
      )
    return min(scored)[1]

  def _set_aside(self, step: int) -> None:
    if jax.process_index() == 0:
      dest = os.path.join(self.directory + ".damaged", str(step))
      shutil.rmtree(dest, ignore_errors=True)
      os.makedirs(os.path.dirname(dest), exist_ok=True)
      shutil.move(self.step_dir(step), dest)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices(f"hindsight_set_aside_{step}")
    self.manager.reload()

  def restore(
    self, abstract_state, step: int | None = None, fallback: bool = False, partial: bool = False
  ):
    """(step, state) of `step` or else the latest good step; (None, None) when there is none.

    abstract_state: ShapeDtypeStructs (with shardings) of the pytree that was saved, or with
    `partial` of a subtree of it (e.g. {"model": ...} without the optimizer): only those
    arrays are read.
    """
    candidates = [s for s in self.steps() if step is None or s <= step][::-1]
    for s in candidates:
      bad = verify_manifest(self.step_dir(s))
      if bad == "" and self.read_only:
        continue  # a save in progress (or cut short): not ours to move
      if bad == "":
        log.warning("checkpoint step %d has no manifest (an unfinished save); set aside", s)
        self._set_aside(s)
        continue
      if bad is not None:
        if not fallback or self.read_only:
          raise HindsightError(
            f"checkpoint step {s} is damaged: {bad} does not match its manifest checksum "
            "(set checkpoint.fallback=True to resume from the previous good step)"
          )
        log.warning("checkpoint step %d is damaged (%s); falling back", s, bad)
        self._set_aside(s)
        continue
      if partial:
        restore_args = ocp.checkpoint_utils.construct_restore_args(abstract_state)
        args = ocp.args.PyTreeRestore(
          abstract_state, restore_args=restore_args, partial_restore=True
        )
      else:
        args = ocp.args.StandardRestore(abstract_state)
      return s, self.manager.restore(s, args=args)
    return None, None

  def close(self) -> None:
    # A writable manager cleans its directory's temporary paths in a background thread it
    # starts when opened; a process that exits while that thread runs (after a one-line
    # error) gets orbax's traceback on stderr, so the cleanup is awaited first.
    await_cleanup = getattr(self.manager, "_maybe_await_cleanup_tmp_directory", None)
    if await_cleanup is not None:
      try:
        await_cleanup()
      except Exception as e:
        # A leftover temporary path is harmless; the error a caller may be raising (a
        # damaged step) is not to be hidden by this one.
        log.warning("orbax's cleanup of temporary checkpoint paths failed: %s", e)
    self.manager.close()
