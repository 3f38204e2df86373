"""A verifier of the tests' own (`--verifier tests.text_verifiers:first_boxed`): the first
\\boxed{} answer against the reference, where the built-in `boxed` reads the last."""

from hindsight.text.verify import same_answer


def first_boxed(completion: str, trace) -> float:
  start = completion.find("\\boxed{")
  if start < 0:
    return 0.0
  end = completion.find("}", start)
  return float(same_answer(completion[start + len("\\boxed{") : end], trace.reference))


def four_steps(completion: str, trace) -> float:
  """1 for a completion of at least four sentences (`text.trace.chunk_text`): an outcome the
  barely trained smoke LM reaches about 70% of the time (its right answers, about 3%, give a
  reload test no power)."""
  from hindsight.text.trace import chunk_text

  return float(len(chunk_text(completion)) >= 4) if completion.strip() else 0.0
