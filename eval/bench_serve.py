"""Load benchmark of `hindsight serve` on loopback: latency and throughput under 1 and N clients.

Starts the server on a trained run (default runs/demo) in a subprocess, waits until it is
ready (warmed up), then for each client count sends requests of one trajectory of `--steps`
steps (random observations and actions of the model's shape; for a text model, sentences of
the text world in the trace format) over that many keep-alive
connections, for `--seconds` each. Prints p50/p99 latency and steps scored per second; the
server is stopped at the end (and on any error). Then the same trajectories scored in
process, in batches of each client count (the server's ceiling).

The load comes from `hey` (a compiled load generator, the Debian package `hey`) where it is
on PATH, else from Python threads, which share the server's cores and so take part of the
throughput they measure (`--load-generator` picks one).

  python eval/bench_serve.py --checkpoint runs/demo
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from hindsight.model.encoders import VectorEncoder
from hindsight.model.predictor import Predictor
from hindsight.serving import Client


def _trajectory(spec, steps: int, rng) -> dict:
  enc = spec.encoder
  if enc.episode_format == "text":  # a text model: the text world's sentences, as traces
    from hindsight.worlds import world

    traces = world.sample_traces(int(rng.integers(1 << 30)), 8)
    sentences = [s.text for t in traces for s in t.steps]
    return {"prompt": traces[0].prompt,  # read by an LM-backbone model, not by the other
            "steps": [sentences[int(i)] for i in rng.integers(0, len(sentences), steps)],
            "outcome": 1.0}  # fmt: skip
  if isinstance(enc, VectorEncoder):
    obs = rng.normal(size=(steps, enc.dim)).round(3).tolist()
  else:
    obs = rng.integers(0, enc.num_ids, steps).tolist()
  return {
    "observations": obs,
    "actions": rng.integers(0, spec.num_actions, steps).tolist(),
    "rewards": [0.0] * (steps - 1) + [1.0],
  }


def _pooling_body(trajectory: dict, tag: str = "<extra_0>") -> dict:
  """The same text trace as vLLM's process-reward request (POST /pooling, chat form: the
  prompt as the user's message, the steps each closed by the step tag)."""
  return {"messages": [{"role": "user", "content": trajectory["prompt"]},
                       {"role": "assistant", "content": "".join(s + tag for s in
                                                                trajectory["steps"])}],
          "task": "token_classify", "outcome": trajectory["outcome"]}  # fmt: skip


def _load(port: int, body: bytes, clients: int, seconds: float, path: str = "/v1/credit"):
  """Latencies (s) of every request sent by `clients` threads during `seconds`."""
  latencies: list[float] = []
  lock = threading.Lock()
  stop = time.perf_counter() + seconds

  def run():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    mine = []
    while time.perf_counter() < stop:
      tic = time.perf_counter()
      conn.request("POST", path, body, {"Content-Type": "application/json"})
      response = conn.getresponse()
      response.read()
      if response.status != 200:
        raise RuntimeError(f"status {response.status}")
      mine.append(time.perf_counter() - tic)
    conn.close()
    with lock:
      latencies.extend(mine)

  threads = [threading.Thread(target=run) for _ in range(clients)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return latencies


def _threads(port: int, body: bytes, clients: int, seconds: float, path: str = "/v1/credit"):
  """(requests, p50 s, p99 s) of `clients` Python threads for `seconds`."""
  lat = np.asarray(_load(port, body, clients, seconds, path))
  p50, p99 = np.percentile(lat, [50, 99])
  return lat.size, float(p50), float(p99)


def hey_command(hey: str, url: str, body_file: str, clients: int, seconds: float) -> list[str]:
  """`hey` POSTing body_file to url over `clients` connections for `seconds`."""
  return [hey, "-z", f"{seconds:g}s", "-c", str(clients), "-m", "POST", "-T",
          "application/json", "-D", body_file, url]  # fmt: skip


def parse_hey(output: str) -> tuple[int, float, float]:
  """(requests answered 200, p50 s, p99 s) from hey's summary; raises on any other status."""
  codes = {int(c): int(n) for c, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", output)}
  if not codes or set(codes) != {200}:
    raise RuntimeError(f"hey: status codes {codes or 'none'}")
  quantile = {q: float(s) for q, s in re.findall(r"(\d+)% in ([\d.]+) secs", output)}
  return codes[200], quantile["50"], quantile["99"]


def _hey(hey: str, port: int, body: bytes, clients: int, seconds: float, path: str = "/v1/credit"):
  with tempfile.NamedTemporaryFile(suffix=".json") as f:
    f.write(body)
    f.flush()
    url = f"http://127.0.0.1:{port}{path}"
    run = subprocess.run(hey_command(hey, url, f.name, clients, seconds), capture_output=True,
                         text=True, check=True)  # fmt: skip
  return parse_hey(run.stdout)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--checkpoint", default="runs/demo")
  p.add_argument("--steps", type=int, default=128, help="steps per trajectory")
  p.add_argument("--clients", default="1,16,64", help="client counts to measure")
  p.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
  p.add_argument("--port", type=int, default=8791)
  p.add_argument("--load-generator", choices=("auto", "hey", "threads"), default="auto",
                 help="auto: hey where it is on PATH, else Python threads")  # fmt: skip
  args = p.parse_args()
  hey = shutil.which("hey") if args.load_generator != "threads" else None
  if args.load_generator == "hey" and hey is None:
    raise SystemExit("bench_serve: --load-generator hey, but no hey on PATH")

  spec = Predictor.load(args.checkpoint).spec
  rng = np.random.default_rng(0)
  trajectory = _trajectory(spec, args.steps, rng)
  routes = {"/v1/credit": json.dumps({"trajectories": [trajectory]}).encode()}
  if spec.encoder.episode_format == "text":  # the same trace as a vLLM PRM request
    routes["/pooling"] = json.dumps(_pooling_body(trajectory)).encode()
  server = subprocess.Popen(
    [sys.executable, "-m", "hindsight.cli", "serve", "--checkpoint", args.checkpoint,
     "--port", str(args.port), "--max-steps", str(args.steps)],
    stdout=subprocess.DEVNULL,
  )  # fmt: skip
  try:
    client = Client(f"http://127.0.0.1:{args.port}")
    deadline = time.time() + 300
    while not client.ready():
      if server.poll() is not None or time.time() > deadline:
        raise SystemExit("bench_serve: the server did not become ready")
      time.sleep(0.2)
    generator = f"hey ({hey})" if hey else "Python client threads on the server's cores"
    by_route = {}
    for path, body in routes.items():
      _load(args.port, body, 1, 1.0, path)  # warm connections and caches
      single, http_rates, p99s = None, {}, {}
      print(f"POST {path}: {args.steps}-step trajectories, one per request, {args.seconds:g} s "
            f"per row, load from {generator}:")  # fmt: skip
      for clients in (int(c) for c in args.clients.split(",")):
        if hey:
          requests, p50, p99 = _hey(hey, args.port, body, clients, args.seconds, path)
        else:
          requests, p50, p99 = _threads(args.port, body, clients, args.seconds, path)
        rate = requests * args.steps / args.seconds
        single = rate if single is None else single
        http_rates[clients], p99s[clients] = rate, p99
        print(
          f"  {clients:>3} clients: {requests:>6} requests  p50 {p50 * 1e3:6.2f} ms  p99 "
          f"{p99 * 1e3:6.2f} ms  {rate:>10,.0f} steps/s  ({rate / single:.1f}x one client)"
        )
      by_route[path] = (http_rates, p99s)
  finally:
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)
  in_process = _in_process(args, [int(c) for c in args.clients.split(",")])
  _goals(by_route["/v1/credit"][0], in_process, bool(hey))
  if "/pooling" in by_route:
    _pooling_goals(by_route, args.steps)


def _pooling_goals(by_route: dict, steps: int) -> None:
  """/pooling against its goals: p99 <= 20 ms for one client's trace, and within 20% of
  /v1/credit's steps/s at 16 clients."""
  rates, p99s = by_route["/pooling"]
  credit_rates, _ = by_route["/v1/credit"]
  if 1 in p99s:
    print(f"  /pooling p99, one client, {steps}-step trace: {p99s[1] * 1e3:.1f} ms  "
          "(goal <= 20 ms)")  # fmt: skip
  if 16 in rates:
    print(f"  /pooling / /v1/credit steps/s at 16 clients: {rates[16] / credit_rates[16]:4.0%}  "
          "(goal >= 80%)")  # fmt: skip


def _goals(http_rates: dict[int, float], in_process: dict[int, float], hey: bool) -> None:
  """The server's goals against their anchors: HTTP >= 70% of in-process scoring of the
  same batches at 16 and 64 connections (with hey), and 64 connections >= 5x one."""
  print("goals:" + ("" if hey else " (Python client threads, not hey: not comparable)"))
  for clients in (16, 64):
    if clients in http_rates and clients in in_process:
      share = http_rates[clients] / in_process[clients]
      print(f"  HTTP / in process at {clients:>2} connections: {share:4.0%}  (goal >= 70%)")
  if 1 in http_rates and 64 in http_rates:
    print(f"  64 connections / one: {http_rates[64] / http_rates[1]:.1f}x  (goal >= 5x)")


def _in_process(args, batches: list[int]) -> dict[int, float]:
  """Steps/s of `Predictor.score` on batches of B of the same trajectories in this process,
  by B (the server's ceiling: HTTP adds parsing, batching and the load generator)."""
  predictor = Predictor.load(args.checkpoint)
  rng = np.random.default_rng(0)
  print(f"in process, Predictor.score on B trajectories of {args.steps} steps:")
  rates = {}
  for B in batches:
    episodes = [_trajectory(predictor.spec, args.steps, rng) for _ in range(B)]
    predictor.score(episodes, allow_longer=True)  # compile
    calls, tic = 0, time.perf_counter()
    while time.perf_counter() - tic < min(args.seconds, 3.0):
      predictor.score(episodes, allow_longer=True)
      calls += 1
    seconds = time.perf_counter() - tic
    rates[B] = calls * B * args.steps / seconds
    print(f"  B = {B:>3}: {rates[B]:>10,.0f} steps/s  "
          f"({seconds / calls * 1e3:.1f} ms per call)")  # fmt: skip
  return rates


if __name__ == "__main__":
  main()
