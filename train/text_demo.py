"""The whole text path offline, in one command (`make demo-text`):

  1. train the small language model on the text world's traces   (WORKDIR/lm)
  2. serve it at /v1/completions, from a thread of this process
  3. sample traces from text-world prompts and label them through that endpoint
                                                                  (WORKDIR/labels)
  4. train the credit model on the labels (configs/text.py)      (WORKDIR/model)
  5. the drift report against a resample of the held-out traces at K_ref with its own seed
                                                                  (WORKDIR/model/drift)
  6. train the LM-backbone credit model on the same labels (configs/text_lm.py), its decoder
     starting from the policy's weights                           (WORKDIR/lm_model)
  7. its drift report on the same traces and reference, the step encoder's model beside it
                                                                  (WORKDIR/lm_model/drift)

Every stage resumes: a rerun computes nothing it has (checkpoints, the completion cache, the
finished training report). With --endpoint URL --model NAME the traces come from that server
instead (a vLLM or SGLang server of your own; stages 1 and 2 are skipped; --backbone names
that model's Hugging Face folder for stage 6, else a fresh small Qwen2 reads the traces). On a
machine with a GPU, --lm-width/--lm-depth/--lm-steps make a bigger model.

  python -m train.text_demo --workdir runs/text-demo
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--workdir", default="runs/text-demo")
  # At a fixed number of completions more traces at a lower K make the better credit model
  # (docs/text.md, `python eval/label_budget.py`): 1,600 traces at K = 2.
  p.add_argument("--traces", type=int, default=1600, help="traces to label")
  p.add_argument("--rollouts", type=int, default=2, help="K of the labels")
  p.add_argument("--reference-traces", type=int, default=48, help="held-out traces evaluated")
  p.add_argument("--reference-rollouts", type=int, default=64, help="K of the reference")
  p.add_argument("--credit-steps", type=int, default=2000, help="credit model steps")
  p.add_argument("--backbone-steps", type=int, default=300, help="LM-backbone model steps")
  p.add_argument("--backbone", default="", help="the LM backbone's folder (default: the small LM)")
  p.add_argument("--lm-steps", type=int, default=2000)
  p.add_argument("--lm-width", type=int, default=128)
  p.add_argument("--lm-depth", type=int, default=2)
  p.add_argument("--lm-traces", type=int, default=4000)
  p.add_argument("--endpoint", default="", help="an existing server instead of the small LM")
  p.add_argument("--model", default="", help="its model name (with --endpoint)")
  p.add_argument("--max-tokens", type=int, default=320, help="longest continuation")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--smoke", action="store_true", help="tiny sizes (tests)")
  args = p.parse_args(argv)

  from hindsight.devices import use_all_cpu_cores
  from hindsight.errors import report_errors

  use_all_cpu_cores()
  return report_errors("text_demo", run, args)


def run(args) -> int:
  from hindsight.config_io import load_config
  from hindsight.drift import DriftConfig, run_drift
  from hindsight.labeling.config import LabelConfig
  from hindsight.labeling.job import LabelJob, run_label_job
  from hindsight.lm.config import LMTrainConfig
  from hindsight.lm.server import MAX_BATCH, running_lm
  from hindsight.lm.train import train_lm
  from hindsight.text.options import TextOptions
  from hindsight.text.trace import write_traces
  from hindsight.training import run_training
  from hindsight.worlds import world

  W = args.workdir
  os.makedirs(W, exist_ok=True)
  timings: dict[str, float] = {}

  @contextlib.contextmanager
  def stage(name):
    t0 = time.monotonic()
    print(f"== {name}", flush=True)
    yield
    timings[name] = time.monotonic() - t0

  lm_cfg = LMTrainConfig(
    traces=args.lm_traces, seed=args.seed, steps=args.lm_steps, width=args.lm_width,
    depth=args.lm_depth, eval_every=min(250, args.lm_steps),
  )  # fmt: skip
  if not args.endpoint:
    with stage("train the small language model"):
      lm = train_lm(lm_cfg, os.path.join(W, "lm"))
      print(f"held-out loss {lm['val_loss']:.4f}")
    server = running_lm(os.path.join(W, "lm"))
  else:
    if not args.model:
      raise SystemExit("text_demo: --endpoint needs --model NAME")
    server = contextlib.nullcontext((args.endpoint, args.model))
  with server as (url, model):
    prompts = os.path.join(W, "prompts.jsonl")
    # The small LM's problems have the box counts it was trained on; a server of your own
    # gets the world's.
    counts = world.COUNTS if args.endpoint else lm_cfg.counts
    write_traces(prompts, world.prompt_traces(args.seed, args.traces, counts))
    with stage("sample and label traces through the endpoint"):
      job = LabelJob(
        f"text:{prompts}", args.traces, LabelConfig(num_rollouts=args.rollouts),
        seed=args.seed,
        # About as many choices in flight as the in-thread server has slots.
        options=TextOptions(endpoint=url, model=model, max_tokens=args.max_tokens,
                            concurrency=max(16, MAX_BATCH // args.rollouts)),
      )  # fmt: skip
      labels = run_label_job(job, os.path.join(W, "labels"))
    with stage("train the credit model"):
      config = load_config("text:smoke" if args.smoke else "text")
      config.data.labels_dir = labels
      config.train.steps = args.credit_steps
      config.train.eval_every = min(250, args.credit_steps)
      run_training(config, os.path.join(W, "model"))
    drift = dict(
      episodes=args.reference_traces,
      reference="resample",
      reference_rollouts=args.reference_rollouts,
      endpoint=url,
      seed=args.seed,
    )
    with stage("drift report against a resampled reference"):
      report = run_drift(DriftConfig(checkpoint=os.path.join(W, "model"), **drift))
    with stage("train the LM-backbone credit model"):
      config = load_config("text_lm:smoke" if args.smoke else "text_lm")
      config.data.labels_dir = labels
      config.data.lm = args.backbone or ("" if args.endpoint else os.path.join(W, "lm"))
      config.train.steps = args.backbone_steps
      config.train.eval_every = min(100, args.backbone_steps)
      run_training(config, os.path.join(W, "lm_model"))
    with stage("drift report: the LM backbone beside the step encoder"):
      # The step encoder's episodes and reference (its cache): nothing is resampled twice.
      # The learned baselines are in the first report already (baseline_steps 0).
      lm_report = run_drift(DriftConfig(
        checkpoint=os.path.join(W, "lm_model"), versus=os.path.join(W, "model"),
        cache=os.path.join(report["out"], "cache"), baseline_steps=0, **drift,
      ))  # fmt: skip
  for r in (report, lm_report):
    with open(os.path.join(r["out"], "report.md")) as f:
      print(f.read())
  print("stage timings:")
  for name, seconds in timings.items():
    print(f"  {name:<48} {seconds:8.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
