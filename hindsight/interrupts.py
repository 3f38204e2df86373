"""Ctrl-C that always stops a long job.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives. Inside a
callback that the interpreter calls for its own bookkeeping (JAX's garbage-collection hook)
the exception is printed as "Exception ignored" and dropped, and the job runs on: one
Ctrl-C in four did so during `hindsight label`. The handler installed here also remembers
the interrupt, and `check()` (called by every progress bar update) raises it again at the
next safe point.
"""

from __future__ import annotations

import signal
import threading

_pending = False


def _handler(signum, frame):
  global _pending
  _pending = True
  raise KeyboardInterrupt


def install() -> None:
  """SIGINT raises KeyboardInterrupt and is remembered (main thread only)."""
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, _handler)


def check() -> None:
  """Raises KeyboardInterrupt if a SIGINT arrived and may have been swallowed."""
  if _pending:
    raise KeyboardInterrupt
