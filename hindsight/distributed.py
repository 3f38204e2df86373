"""Several processes under `jax.distributed`: start-up, and barriers that carry failures.

The training program (`distributed.coordinator=HOST:PORT`, `distributed.num_processes=N`,
`distributed.process_id=I`) and `hindsight label` (`--coordinator`, `--num-processes`,
`--process-id`) start the same way: `initialize` joins process I to the N-process run whose
process 0 listens at HOST:PORT. On CPU the processes exchange data through gloo collectives.

A barrier in a multi-process job has to carry failures, not only wait: a process that raises
and exits before a barrier would leave the others blocked in it until the coordination
service's heartbeat timeout (100 s) kills them with a fatal log. `together(what)` is a barrier
every process passes with the outcome of its block: if any process failed, every process
raises, the failed one its own error and the others a one-line `HindsightError` naming it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax
import numpy as np

from hindsight.errors import HindsightError, one_line

CLI_NAMES = ("--coordinator", "--num-processes", "--process-id")
CONFIG_NAMES = tuple(
  f"config distributed.{n}" for n in ("coordinator", "num_processes", "process_id")
)


def check_processes(
  coordinator: str, num_processes: int, process_id: int, names: tuple[str, ...] = CLI_NAMES
) -> None:
  """One-line errors for a process layout that cannot run (`names`: how the user set them)."""
  coordinator_name, count_name, id_name = names
  if num_processes < 1:
    raise HindsightError(f"{count_name} must be >= 1, got {num_processes}")
  if not 0 <= process_id < num_processes:
    raise HindsightError(f"{id_name} must be in [0, {num_processes}), got {process_id}")
  if num_processes > 1 and not coordinator:
    raise HindsightError(f"{num_processes} processes need {coordinator_name} HOST:PORT")
  if coordinator:
    host, sep, port = coordinator.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
      raise HindsightError(f"{coordinator_name} must be HOST:PORT, got '{coordinator}'")


def initialize(coordinator: str, num_processes: int, process_id: int) -> None:
  """Joins the multi-process run (nothing to do without a coordinator, or if joined already).

  Must run before the first JAX computation of the process.
  """
  if coordinator and not jax.distributed.is_initialized():
    # CPU processes talk through gloo; accelerators bring their own collectives.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id)


class ProcessLost(HindsightError):
  """Another process of the run stopped (killed, crashed) before a barrier.

  The survivors end at once (`exit_at_once`): JAX's exit handler would first wait in its
  shutdown barrier for the lost process until the heartbeat timeout (100 s), then abort
  with a page of fatal logs. Every file a job writes is atomic, so rerunning every process
  resumes it.
  """

  exit_at_once = True


def gather(value: int) -> np.ndarray:
  """[num_processes] int32: every process's `value`, in process order (a barrier).

  Raises `ProcessLost` if another process is gone (its collective connection closed).
  """
  if jax.process_count() == 1:
    return np.array([value], np.int32)
  from jax.experimental import multihost_utils

  try:
    values = multihost_utils.process_allgather(np.array([value], np.int32))
  except jax.errors.JaxRuntimeError as e:
    raise ProcessLost(
      f"process {jax.process_index()} lost another process of the run ({one_line(e)[:120]}); "
      "rerun every process to resume"
    ) from None
  return np.asarray(values, np.int32).reshape(-1)


def any_process(flag: bool) -> bool:
  """Whether `flag` is set in any process (the flag itself in a single-process run)."""
  return bool(gather(int(flag)).any())


@contextlib.contextmanager
def together(what: str) -> Iterator[None]:
  """Runs a block in every process, then waits for all of them (see the module docstring).

  Raises in every process if the block raised in any: the failed process re-raises its own
  exception, the others `HindsightError("process I failed while WHAT ...")`.
  """
  error = None
  try:
    yield
  except Exception as e:  # re-raised below, once the other processes are told
    error = e
  try:
    failed = np.flatnonzero(gather(int(error is not None)))
  except ProcessLost as lost:
    own = f"{one_line(error)}; then " if error is not None else ""
    raise ProcessLost(f"{own}{lost} (while {what})") from None
  if error is not None:
    raise error
  if failed.size:
    raise HindsightError(
      f"process {int(failed[0])} failed while {what} (its own output says why); "
      "fix that and rerun every process"
    )
