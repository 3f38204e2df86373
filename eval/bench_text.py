"""Text labeling's speed and cost against the text world (no network, no GPU).

Starts `hindsight text-world serve` in a subprocess and prints:
  1. completions/s of the client against it at concurrency 1, 16 and 64 (n = 1 per request);
  2. a rerun of the same draws: the share answered from the cache and the requests sent;
  3. the client's own overhead per completion, against a server that does no work
     (httpx.MockTransport), at n = 1 and 16 per request;
  4. labels per completion: `hindsight label --env text:...` on --traces prompts at K = 16
     and 64 (policy), with the completions each labeled step cost, the mean credit stderr,
     and the error against the world's exact credit; beside it thought-anchors' 100
     resamples per chunk;
  5. plain resampling against the stratified estimator on the same pools;
  6. the language model's endpoint (`hindsight lm serve`: the bundled Qwen2 or --lm PATH, a
     workdir or a Hugging Face folder, default runs/text-demo/lm when it exists, served from a
     thread with continuous batching and shared prefixes): completions/s at concurrency 1,
     16 and 64 with n = 16 per request, continuing prefixes of 12-step world traces, the
     most slots live, and the prompt tokens the engine computed and read from its cache;
     then a fresh server whose engine decodes over one window (`SlotEngine(by_length=
     False)`: every live slot over the furthest one's) on the same requests at 1 and 16,
     and the ratio of the two;
  7. the same model in process (`PolicySampler`, as LM RL's credit pools sample): K = 8
     continuations of every prefix of --completions / 64 of those traces on the slot engine
     (continuous batching; a trace's prefixes cost one prefill of the trace: each runs only
     its new step against the one before it), decoding by length and over one window,
     against static batches of 64 rows, each prefilled on its own (`lm.sample.generate`).

  python eval/bench_text.py [--traces 16] [--completions 512] [--lm runs/text-demo/lm]
                            [--only-lm]  (parts 6 and 7 alone)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

from hindsight.labeling.config import LabelConfig, LabelJob
from hindsight.labeling.job import run_label_job
from hindsight.text.client import CompletionCache, CompletionClient, Draw, Sampling
from hindsight.text.options import TextOptions
from hindsight.text.trace import write_traces
from hindsight.worlds import world
from hindsight.worlds.exact import compare_to_exact


def _start_server(port: int) -> subprocess.Popen:
  cmd = [sys.executable, "-m", "hindsight.cli", "text-world", "serve", "--port", str(port)]
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    try:
      if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1).status_code == 200:
        return proc
    except httpx.TransportError:
      time.sleep(0.1)
  proc.kill()
  raise SystemExit(f"the text world did not start: {proc.stderr.read().decode()[-300:]}")


def _draws(count: int, seed: int) -> list[Draw]:
  """`count` one-sample draws from prefixes of sampled world traces (varied lengths)."""
  traces = world.sample_traces(seed, max(1, count // 8))
  prefixes = [t.prefix(j) for t in traces for j in range(len(t.steps))]
  return [Draw(prefixes[i % len(prefixes)], seed + i, 0, 1) for i in range(count)]


def _client(url: str, cache_path: str, concurrency: int, transport=None) -> CompletionClient:
  return CompletionClient(url, world.MODEL_NAME, Sampling(max_tokens=512),
                          CompletionCache(cache_path), concurrency=concurrency,
                          transport=transport)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--traces", type=int, default=16, help="prompts labeled in part 4")
  p.add_argument("--completions", type=int, default=512, help="completions per concurrency")
  p.add_argument("--port", type=int, default=8131)
  p.add_argument("--lm", default="runs/text-demo/lm", help="a `hindsight lm train` workdir")
  p.add_argument("--no-warmup", action="store_true",
                 help="part 6 compiles only the programs its requests need, as they arrive "
                      "(its rates then include compiling: for a smoke run)")  # fmt: skip
  p.add_argument("--only-lm", action="store_true", help="parts 6 and 7 alone (the language model)")
  args = p.parse_args(argv)
  work = tempfile.mkdtemp(prefix="bench_text_")
  if not args.only_lm:
    _text_world(args, work)
  _small_lm(args.lm, args.completions, work, warmup=not args.no_warmup)
  return 0


def _text_world(args, work: str) -> None:
  """Parts 1-5 (module docstring): the text world's server, the client and the labels."""
  url = f"http://127.0.0.1:{args.port}/v1"
  server = _start_server(args.port)
  try:
    print("1. completions/s against the text world (n = 1 per request; server: one process)")
    print(f"{'concurrency':>12}{'completions/s':>15}{'requests/s':>12}")
    for c in (1, 16, 64):
      client = _client(url, os.path.join(work, f"c{c}.sqlite"), c)
      draws = _draws(args.completions, 1000 * c)
      tic = time.perf_counter()
      client.sample(draws)
      rate = len(draws) / (time.perf_counter() - tic)
      print(f"{c:>12}{rate:>15.1f}{client.stats.requests / (time.perf_counter() - tic):>12.1f}")

    again = _client(url, os.path.join(work, "c16.sqlite"), 16)
    draws = _draws(args.completions, 16000)
    again.sample(draws)
    share = again.stats.cached / len(draws)
    print(f"\n2. rerun of {len(draws)} draws: {100 * share:.1f}% from the cache, "
          f"{again.stats.requests} requests sent")  # fmt: skip

    print("\n3. client overhead per completion (a server that does no work)")
    for n in (1, 16):
      body = {"choices": [{"index": i, "text": "x.", "finish_reason": "stop"} for i in range(n)]}
      transport = httpx.MockTransport(lambda r, body=body: httpx.Response(200, json=body))
      client = _client("http://mock/v1", os.path.join(work, f"mock{n}.sqlite"), 16, transport)
      draws = [Draw(f"p{i}", i, 0, n) for i in range(2048 // n)]
      tic = time.perf_counter()
      client.sample(draws)
      per = (time.perf_counter() - tic) / (len(draws) * n)
      print(f"  n = {n:>2}: {1e6 * per:8.1f} us per completion")

    print("\n4. labels per completion (policy, the text world's exact credit as the truth)")
    prompts = os.path.join(work, "prompts.jsonl")
    write_traces(prompts, world.prompt_traces(7, args.traces))
    print(f"{'K':>4}{'steps':>7}{'completions':>13}{'per step':>10}{'mean stderr':>13}"
          f"{'RMSE':>8}{'z RMS':>7}{'seconds':>9}")  # fmt: skip
    rmse = {}
    for K in (16, 64):
      options = TextOptions(endpoint=url, model=world.MODEL_NAME, concurrency=16)
      job = LabelJob(f"text:{prompts}", args.traces, LabelConfig(num_rollouts=K), options=options)
      tic = time.perf_counter()
      path = run_label_job(job, os.path.join(work, f"labels{K}"), progress=False)
      seconds = time.perf_counter() - tic
      from hindsight.data import open_labels

      labels = open_labels(path)
      se = np.concatenate([np.asarray(e["credit_stderr"]) for e in labels])
      report = compare_to_exact(path)
      f = report["fields"]["credit"]
      completions = report["summary"]["completions"]
      rmse[K] = float(np.sqrt(np.mean(np.square(_errors(labels)))))
      print(f"{K:>4}{f['steps']:>7}{completions:>13}{completions / f['steps']:>10.1f}"
            f"{se.mean():>13.4f}{rmse[K]:>8.4f}{f['z_rms']:>7.2f}{seconds:>9.1f}")  # fmt: skip
    print(f"  thought-anchors' 100 resamples per chunk cost 100 completions per step; at that "
          f"cost this estimator's RMSE would be about {rmse[64] * np.sqrt(64 / 100):.4f} "
          "(the K = 64 figure scaled by 1/sqrt(K))")  # fmt: skip
    _stratified(prompts, args.traces, url, os.path.join(work, "labels16", "completions.sqlite"))
  finally:
    server.terminate()
    server.wait(timeout=10)


def _small_lm(workdir: str, completions: int, work: str, warmup: bool = True) -> None:
  """6. The small language model's endpoint (module docstring)."""
  print("\n6. the language model's endpoint (n = 16 per request, 12-step traces)")
  if not os.path.isdir(os.path.join(workdir, "checkpoints")) and not os.path.isfile(
    os.path.join(workdir, "config.json")
  ):
    print(f"  skipped: no model in {workdir} (hindsight lm train --workdir {workdir})")
    return
  from hindsight.lm.server import running_lm

  traces = [t for t in world.sample_traces(12, 400) if len(t.steps) == 12][:32]
  prefixes = [t.prefix(j) for t in traces for j in range(12)]
  print(f"{'concurrency':>12}{'completions/s':>15}{'tokens/completion':>19}{'slots live':>12}"
        f"{'prompt tokens computed':>24}{'reused':>9}")  # fmt: skip
  rates = {}
  for by_length, levels in ((True, (1, 16, 64)), (False, (1, 16))):
    with running_lm(workdir, warmup=warmup, by_length=by_length) as (url, model):
      before = httpx.get(url.removesuffix("/v1") + "/stats").json()
      for c in levels:
        tag = "" if by_length else "-one-window"
        client = CompletionClient(url, model, Sampling(max_tokens=320),
                                  CompletionCache(os.path.join(work, f"lm{c}{tag}.sqlite")),
                                  concurrency=c)  # fmt: skip
        # Each prefix asks for at most what it leaves of the context (a request over it is a
        # 400, as from vLLM), measured by the server's /tokenize as the labeler measures it.
        room = [client.context - n for n in client.count_tokens(prefixes)]
        draws = [Draw(prefixes[i % len(prefixes)], 7000 * c + i, 0, 16,
                      min(320, room[i % len(prefixes)]))
                 for i in range(max(1, completions // 16))]  # fmt: skip
        tic = time.perf_counter()
        got = client.sample(draws)
        rates[by_length, c] = rate = sum(len(x) for x in got) / (time.perf_counter() - tic)
        if not by_length:
          continue
        tokens = client.stats.tokens / max(1, sum(len(x) for x in got))
        stats = httpx.get(url.removesuffix("/v1") + "/stats").json()
        computed, reused = (stats[k] - before[k] for k in ("prefill_tokens", "reused_tokens"))
        before = stats
        print(f"{c:>12}{rate:>15.1f}{tokens:>19.1f}{stats['max_live']:>12}{computed:>24}"
              f"{reused:>9}")  # fmt: skip
  print("  (the text world's scripted server above writes no tokens: it is the ceiling of the "
        "client, not a model)")  # fmt: skip
  print(f"  one window (every live slot over the furthest one's: a fresh server, the same "
        f"requests at 1 then 16): {rates[False, 16]:.1f} completions/s at 16; by length / one "
        f"window: {rates[True, 16] / rates[False, 16]:.2f}x at 16, "
        f"{rates[True, 1] / rates[False, 1]:.2f}x at 1")  # fmt: skip
  _pools(workdir, traces[: max(1, completions // 64)], warmup)


def _pools(workdir: str, traces: list, warmup: bool = True) -> None:
  """7. The in-process pools (module docstring): `PolicySampler` (the slot engine: continuous
  batching, each prefix prefilled once for its K rows), decoding by length and over one
  window, against static batches of 64 rows each prefilled on its own
  (`lm.sample.generate`), timed on a second pass (the first compiles; with `warmup` each
  engine compiles all its programs first, so a program the second pass alone needs is not
  compiled while it is timed)."""
  import jax

  from hindsight.lm import sample
  from hindsight.lm.rl.rollout import PolicySampler
  from hindsight.lm.train import load_lm

  K = 8
  lm = load_lm(workdir)
  prefixes = [lm.tokenizer.encode(t.prefix(j), start=True) for t in traces
              for j in range(len(t.steps))]  # fmt: skip
  rows = [p for p in prefixes for _ in range(K)]
  budgets = [min(320, lm.cfg.max_len - len(p)) for p in rows]
  static = sample.sampler(lm.graphdef, lm.cfg)

  def in_static_batches(keys) -> list:
    """Rows sorted by length into calls of 64, each call until its longest row ends."""
    out: list = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for lo in range(0, len(rows), 64):
      part = order[lo : lo + 64]
      ids, lengths = sample.pad_prompts([rows[i] for i in part], lm.cfg.max_len)
      R = ids.shape[0]
      pick = np.array(part + [part[0]] * (R - len(part)))
      ones = np.ones(R, np.float32)
      tokens, count, _ = static(lm.state, ids, lengths, np.array(budgets, np.int32)[pick], ones,
                                ones, keys[pick])  # fmt: skip
      for r, i in enumerate(part):
        out[i] = np.asarray(tokens[r, : int(count[r])])
    return out

  engines = {"engine, by length": PolicySampler(lm.graphdef, lm.cfg),
             "engine, one window": PolicySampler(lm.graphdef, lm.cfg, by_length=False)}  # fmt: skip
  print(f"\n7. in-process pools: K = {K} continuations of each of {len(prefixes)} prefixes "
        f"({len(traces)} traces), {len(rows)} completions")  # fmt: skip
  if warmup:
    for sampler in engines.values():
      sampler.engine(lm.state).warmup()
  # What the engines counted before the passes (warmup's own rows), left out of the figures.
  before = {name: _counts(sampler.engine(lm.state).stats) for name, sampler in engines.items()}
  print(f"{'sampler':>24}{'completions/s':>15}{'tokens/completion':>19}{'seconds':>9}")
  rates, drawn = {}, {}
  runs = {"static, every row": in_static_batches}
  for name, engine in engines.items():
    runs[name] = lambda keys, engine=engine: engine.complete(lm.state, rows, budgets, keys)
  for name, run in runs.items():
    for attempt in range(2):  # the first pass compiles
      keys = jax.random.split(jax.random.key(attempt), len(rows))
      tic = time.perf_counter()
      got = run(keys)
      seconds = time.perf_counter() - tic
    rates[name], drawn[name] = len(rows) / seconds, got
    tokens = sum(len(x) for x in got) / len(rows)
    print(f"{name:>24}{rates[name]:>15.1f}{tokens:>19.1f}{seconds:>9.1f}")
  print(f"  engine / static: {rates['engine, by length'] / rates['static, every row']:.2f}x; "
        f"by length / one window: "
        f"{rates['engine, by length'] / rates['engine, one window']:.2f}x")  # fmt: skip
  same = sum(np.array_equal(a, b) for a, b in zip(*(drawn[n] for n in engines), strict=True))
  print(f"  the two decodes drew the same tokens for {same} of {len(rows)} completions")
  counts = {}
  for name, sampler in engines.items():
    now = _counts(sampler.engine(lm.state).stats)
    counts[name] = {k: n - before[name].get(k, 0) for k, n in now.items()}
    by_window = sorted((k[1], n) for k, n in counts[name].items() if isinstance(k, tuple) and n)
    windows = ", ".join(f"{w}: {n}" for w, n in by_window)
    print(f"  {name}: decode calls by window over both passes {{{windows}}}")
  stats = counts["engine, by length"]
  print(
    f"  the engine's prompt tokens over both passes: {stats['prefill_tokens']} computed, "
    f"{stats['reused_tokens']} reused ({sum(len(p) for p in prefixes)} in the prefixes, "
    f"{sum(len(p) for p in rows)} in the rows)"
  )
  for sampler in engines.values():
    sampler.close()


def _counts(stats: dict) -> dict:
  """An engine's counters, flat: decode calls by window as ("window", w)."""
  flat = {k: v for k, v in stats.items() if isinstance(v, int)}
  return flat | {("window", w): n for w, n in stats["decode_windows"].items()}


def _stratified(prompts: str, traces: int, url: str, cache: str) -> None:
  """5. Plain resampling against a stratified estimator on the same K = 16 pools (all from
  the cache): a redraw of step t that repeats it verbatim continues exactly as the trace
  does, so with w the share of verbatim redraws, Delta_t = (1 - w) (Q(step t) - E[Q | a
  different step]); the verbatim redraws' outcomes join the keep arm."""
  from hindsight.text.labeler import TextLabeler
  from hindsight.text.trace import chunk_text
  from hindsight.worlds.exact import exact_labels

  options = TextOptions(endpoint=url, model=world.MODEL_NAME)
  labeler = TextLabeler(f"text:{prompts}", traces, LabelConfig(num_rollouts=16), options)
  labeler.open(cache)
  plain_err, strat_err, shares = [], [], []
  requests_before = labeler.client.stats.requests
  for found in labeler.resamples(0, traces, seed=0):  # the part 4 job's seed
    trace, pools, outcomes, R = found.trace, found.pools, found.outcomes, found.outcome
    T = len(trace.steps)
    truth = exact_labels({"prompt": trace.prompt, "step_text": [s.text for s in trace.steps]},
                         "policy")["credit"]  # fmt: skip
    for t in range(T):
      keep = outcomes[t + 1] if t + 1 < T else np.array([R])
      first = [(chunk_text(c.text) or [""])[0].strip() for c in pools[t]]
      same = np.array([f == trace.steps[t].text.strip() for f in first])
      w = same.mean()
      plain = keep.mean() - outcomes[t].mean()
      if same.all():
        strat = 0.0
      else:
        pooled = keep if t + 1 == T else np.concatenate([keep, outcomes[t][same]])
        strat = (1 - w) * (pooled.mean() - outcomes[t][~same].mean())
      plain_err.append(plain - truth[t])
      strat_err.append(strat - truth[t])
      shares.append(w)
  assert labeler.client.stats.requests == requests_before  # every pool came from the cache
  mse_p, mse_s = np.mean(np.square(plain_err)), np.mean(np.square(strat_err))
  print(f"\n5. plain against stratified on the same K = 16 pools ({len(shares)} steps; verbatim "
        f"redraws: {100 * np.mean(shares):.0f}% of draws)")  # fmt: skip
  print(f"  MSE against the exact credit: plain {mse_p:.4f}, stratified {mse_s:.4f} "
        f"(ratio {mse_s / mse_p:.2f}); bias: plain {np.mean(plain_err):+.4f}, "
        f"stratified {np.mean(strat_err):+.4f}")  # fmt: skip


def _errors(labels) -> np.ndarray:
  from hindsight.worlds.exact import exact_labels

  out = []
  for example in labels:
    truth = exact_labels(example, labels.metadata.replacement)
    out.append(np.asarray(example["credit"], np.float64) - truth["credit"])
  return np.concatenate(out)


if __name__ == "__main__":
  sys.exit(main())
