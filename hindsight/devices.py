"""How many XLA devices a program gets on a CPU host."""

from __future__ import annotations

import os


def use_all_cpu_cores() -> None:
  """One XLA CPU device per core, so labeling shards episodes over every core and training
  shards batches over them.

  Must run before JAX creates its CPU client; a user's own XLA_FLAGS setting wins.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count or 1}".strip()
