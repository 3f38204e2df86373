"""`hindsight lm train` and `hindsight lm serve` as a user meets them on a tiny config: lines
in place of the progress bar, the step a server serves from an unfinished workdir, and
training on the user's own text traces (`--traces-file`)."""

from __future__ import annotations

import json
import threading

import jax
import numpy as np
import pytest

from hindsight.errors import HindsightError

TINY = ["--width", "32", "--depth", "1", "--batch-size", "4"]


def _serve_lines(path: str, monkeypatch, capsys) -> str:
  """What `serve_lm` says while it starts (the server itself is not run)."""
  from hindsight.lm.server import serve_lm
  from hindsight.serving import openai_protocol

  monkeypatch.setattr(
    openai_protocol, "serve_until_stopped", lambda app, host, port, listening: None
  )
  capsys.readouterr()
  serve_lm(path, warmup=False, max_batch=1)
  return capsys.readouterr().out


def test_without_the_bar_training_says_its_checkpoints_and_a_server_which_step_it_serves(
  tmp_path, monkeypatch, capsys
):
  """A run killed after its first checkpoint: `lm serve` says it serves step 2 of 4 and that
  the training is unfinished; the rerun, with --no-progress, says where it starts, each
  checkpoint and the loss every LOG_EVERY steps; then the server serves step 4 of 4."""
  from hindsight.cli import main
  from hindsight.lm import train
  from hindsight.model.checkpoints import Checkpoints

  work = str(tmp_path / "lm")
  args = ["lm", "train", "--workdir", work, "--traces", "24", "--steps", "4", "--eval-every",
          "2", *TINY, "--no-progress"]  # fmt: skip
  save = Checkpoints.save

  def save_and_die(self, step, *rest, **kw):
    save(self, step, *rest, **kw)
    raise RuntimeError("killed")

  monkeypatch.setattr(Checkpoints, "save", save_and_die)
  with pytest.raises(RuntimeError, match="killed"):
    main(args)
  monkeypatch.setattr(Checkpoints, "save", save)
  said = _serve_lines(work, monkeypatch, capsys)
  assert "hindsight: serving step 2 of 4: its training is unfinished" in said, said

  monkeypatch.setattr(train, "LOG_EVERY", 3)
  capsys.readouterr()
  assert main(args) == 0
  lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("lm train: ")]
  assert len(lines) == 3, lines
  assert lines[0].startswith("lm train: steps 3..4 on 23 traces (1 held out), a checkpoint "
                             "every 2")  # fmt: skip
  assert lines[1].startswith("lm train: step 3/4: loss ")
  assert lines[2].startswith("lm train: step 4/4: loss ") and "held-out loss" in lines[2]
  assert "checkpoint saved" in lines[2]
  said = _serve_lines(work, monkeypatch, capsys)
  assert "hindsight: serving step 4 of 4 (its training finished)" in said, said


def _write(path, traces: list[dict]) -> str:
  path.write_text("".join(json.dumps(t) + "\n" for t in traces))
  return str(path)


def test_the_bundled_model_trains_on_a_users_own_traces_file(tmp_path):
  """Traces in `hindsight label`'s text format (steps or text) are what the model learns: a
  completion every trace shares, with a non-ASCII character, is what it then writes
  greedily (so the model may draw what its traces hold, not ASCII only)."""
  from hindsight.cli import main
  from hindsight.lm.engine import Row, SlotEngine
  from hindsight.lm.train import load_lm

  answer = "The café opens at 9.\n"
  traces = [{"id": f"t{k}", "prompt": f"Question {k}: when does it open?\n",
             **({"text": answer} if k % 2 else
                {"steps": [{"text": "The café opens "}, {"text": "at 9.\n"}]})}
            for k in range(24)]  # fmt: skip
  work = str(tmp_path / "lm")
  mine = _write(tmp_path / "mine.jsonl", traces)
  assert main(["lm", "train", "--workdir", work, "--traces-file", mine, "--steps", "60",
               "--eval-every", "60", "--learning-rate", "1e-2", "--warmup-steps", "5",
               "--max-len", "128", *TINY, "--no-progress"]) == 0  # fmt: skip
  lm = load_lm(work)
  assert lm.record["ascii"] is False
  engine = SlotEngine(lm, slots=1)
  try:
    ids = lm.tokenizer.encode("Question 99: when does it open?\n", start=True)
    [(tokens, _)] = engine.complete([Row(ids.astype(np.int32), 24, 0.0, 1.0, jax.random.key(0))])
  finally:
    engine.close()
  assert lm.tokenizer.decode(tokens) == answer


def test_a_traces_file_the_model_cannot_train_on_is_one_line(tmp_path):
  """A trace with no completion, and too few traces for one batch (which trained forever,
  drawing empty epochs), are one-line errors before any step."""
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.train import train_lm

  config = LMTrainConfig(steps=2, eval_every=2, width=32, depth=1, max_len=128, progress=False)
  empty = _write(tmp_path / "empty.jsonl", [{"id": "a", "prompt": "Q", "text": "A.\n"},
                                            {"id": "b", "prompt": "Q"}])  # fmt: skip
  with pytest.raises(HindsightError, match=r"empty\.jsonl: trace b has no completion"):
    train_lm(config, str(tmp_path / "w1"), traces_file=empty)
  few = _write(tmp_path / "few.jsonl", [{"prompt": "Q", "text": f"A {k}.\n"} for k in range(6)])
  raised = []

  def run():  # in a daemon thread: a run that never ends must not hold the test forever
    try:
      train_lm(config, str(tmp_path / "w2"), traces_file=few)
    except HindsightError as e:
      raised.append(str(e))

  worker = threading.Thread(target=run, daemon=True)
  worker.start()
  worker.join(120)
  assert not worker.is_alive(), "training on 5 traces in batches of 16 never ended"
  assert len(raised) == 1 and "5 training traces make no batch of 16 traces" in raised[0], raised
