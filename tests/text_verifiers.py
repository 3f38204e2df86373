"""A verifier of the tests' own (`--verifier tests.text_verifiers:first_boxed`): the first
\\boxed{} answer against the reference, where the built-in `boxed` reads the last."""

from hindsight.text.verify import same_answer


def first_boxed(completion: str, trace) -> float:
  start = completion.find("\\boxed{")
  if start < 0:
    return 0.0
  end = completion.find("}", start)
  return float(same_answer(completion[start + len("\\boxed{") : end], trace.reference))
