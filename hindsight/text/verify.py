"""Verifiers: the outcome of a text trace, a number in [0, 1] (1 = correct).

A verifier is FN(completion: str, trace: TextTrace) -> float or bool, where `completion` is
everything the model wrote after the prompt (a trace's own steps, or a prefix of them and a
sampled continuation). `--verifier boxed` is built in: the last \\boxed{...} of the
completion against the trace's `reference`, compared as numbers where both parse as numbers,
else as strings with spaces and a surrounding $ removed. `--verifier MODULE:FN` names a user
function.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from hindsight.errors import HindsightError
from hindsight.text.trace import TextTrace


def last_boxed(text: str) -> str | None:
  """The contents of the last \\boxed{...} in `text` (braces may nest), or None."""
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  i, depth = start + len("\\boxed{"), 1
  for j in range(i, len(text)):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return text[i:j]
  return None  # unclosed: no answer


def _normalise(answer: str) -> str:
  return "".join(answer.strip().strip("$").split()).rstrip(".")


def same_answer(answer: str | None, reference: str) -> bool:
  if answer is None:
    return False
  a, b = _normalise(answer), _normalise(reference)
  try:
    return math.isclose(float(a.replace(",", "")), float(b.replace(",", "")), rel_tol=1e-9)
  except ValueError:
    return a == b


def boxed(completion: str, trace: TextTrace) -> float:
  """1.0 if the last \\boxed{} answer equals the trace's `reference`, else 0.0."""
  if trace.reference is None:
    raise HindsightError(
      f"trace {trace.id or '?'} has no `reference`: the boxed verifier compares against it"
    )
  return float(same_answer(last_boxed(completion), trace.reference))


def load_verifier(spec: str) -> Callable[[str, TextTrace], float]:
  """The verifier of `--verifier SPEC`, checked to return a number in [0, 1] and to name any
  exception it raises (with the trace) in one line rather than a traceback."""
  if spec == "boxed":
    fn = boxed
  else:
    from hindsight.plugins import import_function

    fn = import_function(spec, "--verifier")[1]

  def verify(completion: str, trace: TextTrace) -> float:
    try:
      value = float(fn(completion, trace))
    except HindsightError:
      raise
    except Exception as e:  # user code: any failure is named, with the trace it failed on
      raise HindsightError(
        f"--verifier {spec} raised {type(e).__name__} on trace {trace.id or '?'}: {e}"
      ) from None
    if not 0.0 <= value <= 1.0:
      raise HindsightError(
        f"--verifier {spec} returned {value} on trace {trace.id or '?'}: outcomes must be in [0, 1]"
      )
    return value

  return verify
