"""Serving: in-process (no recompiles), batch scoring, and the HTTP server (answers equal
`score`, fuzzed bodies never 5xx, limits, hot reload under load, a damaged reload refused)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import msgspec
import numpy as np
import pytest
from conftest import (
  FAST_COMPILE,
  ROOT,
  assert_one_line_error,
  flip_byte_in_largest_file,
  run_cli,
  wait_until_ready,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from hindsight.data import episode_to_json, open_labels
from hindsight.errors import HindsightError
from hindsight.model.predictor import Predictor
from hindsight.serving import Client
from hindsight.serving.app import create_app
from hindsight.serving.config import ServeConfig

pytestmark = pytest.mark.xdist_group("serving")
MAX_STEPS = 24


@pytest.fixture(scope="module")
def run(tabular_run):
  return tabular_run


@pytest.fixture(scope="module")
def episodes(run):
  labels = open_labels(os.path.join(run, "labels"))
  return [episode_to_json(labels[i]) for i in range(len(labels))]


def _bare(ep):
  return {k: ep[k] for k in ("observations", "actions", "rewards")}


TOKEN = "s3cret-admin-token"
ADMIN = {"authorization": f"Bearer {TOKEN}"}


def _test_root(tmp_path_factory):
  """The directory every test's tmp_path and the shared runs sit under (xdist: the parent
  of this worker's), allowed as a reload root."""
  root = tmp_path_factory.getbasetemp()
  return str(root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root)


@pytest.fixture(scope="module")
def client(run, tmp_path_factory):
  token_file = tmp_path_factory.mktemp("admin") / "token"
  token_file.write_text(TOKEN + "\n")
  cfg = ServeConfig(checkpoint=run, max_steps=MAX_STEPS, max_trajectories=32,
                    admin_token_file=str(token_file),
                    allow_reload_from=_test_root(tmp_path_factory))  # fmt: skip
  app = create_app(cfg)
  with TestClient(app) as c:
    for _ in range(600):
      if c.get("/readyz").status_code == 200:
        break
      time.sleep(0.1)
    yield c


def test_http_answer_equals_score_and_credit_fn(client, run, episodes):
  predictor = Predictor.load(run)
  eps = [_bare(e) for e in episodes[:5]]
  r = client.post("/v1/credit", json={"trajectories": eps})
  assert r.status_code == 200, r.text
  answer = r.json()
  scores = predictor.score(eps)
  batch = predictor.batch(eps)
  direct = predictor.credit_fn()(predictor.state, batch)
  for i, sc in enumerate(scores):
    n = len(eps[i]["actions"])
    np.testing.assert_allclose(answer["credit"][i], sc["credit"], atol=1e-6)
    np.testing.assert_allclose(answer["credit"][i], np.asarray(direct["credit"])[i, :n], atol=1e-6)
    np.testing.assert_allclose(answer["credit_std"][i], sc["std"], atol=1e-6)
    assert len(answer["klass"][i]) == n and isinstance(answer["klass"][i][0], str)
  assert answer["model"] == {"step": predictor.step, "digest": predictor.digest}
  # msgpack in and out.
  body = msgspec.msgpack.encode({"trajectories": eps})
  r = client.post(
    "/v1/credit",
    content=body,
    headers={"content-type": "application/msgpack", "accept": "application/msgpack"},
  )
  assert r.status_code == 200
  assert msgspec.msgpack.decode(r.content)["credit"] == answer["credit"]


@pytest.mark.slow
def test_a_steady_stream_never_recompiles(run):
  predictor = Predictor.load(run)
  compiled = predictor.warmup(MAX_STEPS)
  assert predictor.compiled_programs() == compiled
  rng = np.random.default_rng(0)
  spec = predictor.spec
  for _ in range(1000):
    count = int(rng.integers(1, 70))
    eps = []
    for n in rng.integers(1, MAX_STEPS + 1, count):
      eps.append(
        {
          "observations": rng.integers(0, spec.encoder.num_ids, n),
          "actions": rng.integers(0, spec.num_actions, n),
          "rewards": rng.normal(size=n),
        }
      )
    predictor.score(eps, allow_longer=True)  # warmed up past the trained length on purpose
  assert predictor.compiled_programs() == compiled


def test_limits_and_bad_requests_are_4xx_with_a_message(client, episodes):
  good = _bare(episodes[0])
  long = dict(good, actions=[0] * 30, rewards=[0.0] * 30, observations=[0] * 30)
  cases = [
    (b"not json", 400, "not valid JSON"),
    (json.dumps({"trajectories": []}), 400, "empty"),
    (json.dumps({"trajectories": [good] * 33}), 413, "limit is 32"),
    (json.dumps({"trajectories": [long]}), 413, "limit is 24 (`hindsight serve --max-steps N`"),
    (json.dumps({"trajectories": [dict(good, actions=good["actions"][:-1])]}), 400, "per action"),
    (json.dumps({"trajectories": [dict(good, rewards=["x"] * len(good["rewards"]))]}), 400, ""),
    (json.dumps({"trajectories": [{"actions": [1]}]}), 400, "missing field"),
  ]
  for body, status, fragment in cases:
    r = client.post("/v1/credit", content=body)
    assert r.status_code == status, (body[:80], r.text)
    assert fragment in r.json()["error"]["message"]
  big = ServeConfig(checkpoint="x").max_body_bytes + 1
  r = client.post("/v1/credit", content=b" " * big)
  assert r.status_code == 413 and "the body has" in r.json()["error"]["message"]
  # Streamed (chunked, no Content-Length): refused once what arrived passes the limit.
  r = client.post("/v1/credit", content=iter([b" " * (1 << 20)] * 9))
  assert r.status_code == 413 and "exceeds the limit" in r.json()["error"]["message"], r.text
  metrics = client.get("/metrics").text
  assert 'hindsight_requests_total{code="413",route="credit"}' in metrics
  assert "hindsight_request_seconds_bucket" in metrics and "hindsight_batch_trajectories" in metrics


json_values = st.recursive(
  st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=5),
  lambda children: (
    st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
  ),
  max_leaves=30,
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
  body=st.one_of(
    json_values,
    st.fixed_dictionaries({"trajectories": st.lists(json_values, max_size=3)}),
    st.fixed_dictionaries(
      {
        "trajectories": st.lists(
          st.fixed_dictionaries(
            {
              "observations": st.lists(st.one_of(st.integers(-5, 40), st.floats()), max_size=6),
              "actions": st.lists(st.one_of(st.integers(-2, 6), st.floats()), max_size=6),
              "rewards": st.lists(st.floats(), max_size=6),
            },
            optional={"success": json_values, "agent": json_values},
          ),
          min_size=1,
          max_size=3,
        )
      }
    ),
  )
)
def test_fuzzed_bodies_never_5xx(client, body):
  r = client.post("/v1/credit", content=json.dumps(body, allow_nan=True))
  assert r.status_code < 500, (body, r.text)
  if r.status_code != 200:
    assert r.json()["error"]["message"]


def test_still_serving_after_the_fuzz(client, episodes):
  r = client.post("/v1/credit", json={"trajectories": [_bare(episodes[1])]})
  assert r.status_code == 200 and client.get("/healthz").status_code == 200


def test_hot_reload_under_load_drops_nothing_and_a_damaged_one_is_refused(client, run, episodes):
  """Reload another step while three clients keep scoring: every answer is 200 and comes
  from the old model or the new one, whole (its values are that model's `score`), and both
  models answered while the load ran."""
  sent = [_bare(e) for e in episodes[:3]]
  answers, stop, swapped_at = [], threading.Event(), []

  def load():
    while not stop.is_set():
      r = client.post("/v1/credit", json={"trajectories": sent})
      answers.append((r.status_code, r.json() if r.status_code == 200 else r.text))
      if swapped_at and len(answers) > swapped_at[0] + 20:  # 20 answers after the swap
        stop.set()

  old = Predictor.load(run)
  other = next(s for s in sorted(os.listdir(os.path.join(run, "checkpoints")), key=str)
               if s.isdigit() and int(s) != old.step)  # fmt: skip
  new = Predictor.load(run, int(other))
  assert new.digest != old.digest
  threads = [threading.Thread(target=load) for _ in range(3)]
  for t in threads:
    t.start()
  try:
    while len(answers) < 10:
      time.sleep(0.01)
    r = client.post("/v1/reload", json={"step": int(other)}, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == {"step": new.step, "digest": new.digest}
    swapped_at.append(len(answers))
    # A damaged checkpoint is refused; the model served stays the same.
    damaged = os.path.join(os.path.dirname(run), "damaged_run")
    shutil.rmtree(damaged, ignore_errors=True)
    shutil.copytree(os.path.join(run, "checkpoints"), os.path.join(damaged, "checkpoints"))
    flip_byte_in_largest_file(os.path.join(damaged, "checkpoints", str(old.step)))
    r = client.post("/v1/reload", json={"checkpoint": damaged, "step": old.step}, headers=ADMIN)
    assert r.status_code == 409 and "damaged" in r.json()["error"]["message"], r.text
    assert damaged not in r.text and "<path>" in r.text  # no server path in the answer
    assert client.get("/readyz").json()["model"]["digest"] == new.digest
  finally:
    stop.set()
    for t in threads:
      t.join()
  assert all(code == 200 for code, _ in answers), {code for code, _ in answers}
  by_digest = {m.digest: [sc["credit"] for sc in m.score(sent)] for m in (old, new)}
  seen = {body["model"]["digest"] for _, body in answers}
  assert seen == set(by_digest), seen  # both models answered under load
  for _, body in answers:
    for got, want in zip(body["credit"], by_digest[body["model"]["digest"]], strict=True):
      np.testing.assert_allclose(got, want, atol=1e-6)
  client.post("/v1/reload", json={"step": "best"}, headers=ADMIN)  # the others serve the best


def test_an_incompatible_reload_is_refused_and_the_model_stays(client, run, tmp_path):
  """A checkpoint of another architecture (width 32, trained 2 steps on the same labels):
  409 naming the parameter that differs, and the served model is unchanged."""
  from hindsight.config_io import load_config
  from hindsight.training import train_and_evaluate

  narrow = str(tmp_path / "narrow")
  overrides = [f"data.labels_dir={run}/labels", "model.width=32", "train.steps=2",
               "optim.warmup_steps=1", "train.eval_every=2", "train.progress=False"]  # fmt: skip
  train_and_evaluate(load_config("configs/tabular.py:smoke", overrides), narrow)
  before = client.get("/readyz").json()["model"]
  r = client.post("/v1/reload", json={"checkpoint": narrow}, headers=ADMIN)
  assert r.status_code == 409, r.text
  assert (
    "float32[4, 32] parameter where the served model has float32[4, 16]"
    in r.json()["error"]["message"]
  ), r.text
  assert client.get("/readyz").json()["model"] == before


def test_reload_is_an_admin_action_confined_to_its_roots(client, run, tmp_path, tmp_path_factory):
  """POST /v1/reload without a token or with a wrong one: 401; with the right one: 200. A
  checkpoint outside the allowed roots (an absolute path, a `..` path, a symlink inside the
  run that points out, a sibling whose name extends a root's, ROOT-evil beside ROOT): 403.
  No answer names a server path; /metrics counts each reason."""
  before = client.get("/readyz").json()["model"]
  assert client.post("/v1/reload", json={}).status_code == 401
  wrong = {"authorization": "Bearer not-the-token"}
  assert client.post("/v1/reload", json={}, headers=wrong).status_code == 401
  assert client.post("/v1/reload", json={}, headers={"authorization": TOKEN}).status_code == 401
  r = client.post("/v1/reload", json={"step": "best"}, headers=ADMIN)
  assert r.status_code == 200 and r.json()["model"] == before, r.text
  outside = tmp_path.parent.parent.parent  # above every allowed root
  link = str(tmp_path / "escape")  # inside an allowed root, pointing out of it
  os.symlink(str(outside), link)
  sibling = _test_root(tmp_path_factory).rstrip(os.sep) + "-evil"  # a prefix match, not a root
  os.makedirs(sibling, exist_ok=True)
  for checkpoint in (str(outside), "/etc", os.path.join(run, *[".."] * 4), link, sibling):
    r = client.post("/v1/reload", json={"checkpoint": checkpoint}, headers=ADMIN)
    assert r.status_code == 403, (checkpoint, r.text)
    assert "outside the directories" in r.json()["error"]["message"]
    assert not re.search(r"(^|\s)/\w", r.json()["error"]["message"]), r.text  # no absolute path
  r = client.post("/v1/reload", json={"checkpoint": str(tmp_path / "missing")}, headers=ADMIN)
  assert r.status_code == 409 and str(tmp_path) not in r.text, r.text
  assert client.get("/readyz").json()["model"] == before
  metrics = client.get("/metrics").text
  os.rmdir(sibling)
  for reason, count in (("missing", 1), ("wrong", 2), ("outside", 5)):
    line = f'hindsight_admin_denied_total{{reason="{reason}"}}'
    assert float(metrics.split(line)[1].split()[0]) >= count, (reason, metrics)


def test_without_an_admin_token_reload_over_http_is_off(run, monkeypatch):
  """No --admin-token-file and no HINDSIGHT_ADMIN_TOKEN: every HTTP reload is 403, the token
  of another server included; an empty token file is a one-line error at start."""
  monkeypatch.delenv("HINDSIGHT_ADMIN_TOKEN", raising=False)
  app = create_app(ServeConfig(checkpoint=run, warmup=False), Predictor.load(run))
  with TestClient(app) as c:
    for headers in ({}, ADMIN):
      r = c.post("/v1/reload", json={}, headers=headers)
      assert r.status_code == 403 and "reload over HTTP is off" in r.json()["error"]["message"]
    assert 'hindsight_admin_denied_total{reason="disabled"} 2.0' in c.get("/metrics").text
  monkeypatch.setenv("HINDSIGHT_ADMIN_TOKEN", TOKEN)
  assert ServeConfig(checkpoint=run).admin_token() == TOKEN
  empty = os.path.join(os.path.dirname(run), "empty_token")
  with open(empty, "w") as f:
    f.write("\n")
  with pytest.raises(HindsightError, match="is empty"):
    ServeConfig(checkpoint=run, admin_token_file=empty).admin_token()


@pytest.mark.slow
def test_score_command_on_jsonl_and_a_dataset(run, episodes, tmp_path):
  src = tmp_path / "in.jsonl"
  src.write_text("".join(json.dumps(e) + "\n" for e in episodes[:10]))
  out = tmp_path / "out.jsonl"
  proc = run_cli("score", "--checkpoint", run, "--input", src, "--out", out, "--no-progress")
  assert proc.returncode == 0, proc.stderr
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  scores = Predictor.load(run).score(episodes[:10])
  assert len(lines) == 10
  for line, sc in zip(lines, scores, strict=True):
    np.testing.assert_allclose(line["predicted_credit"], sc["credit"], atol=1e-6)
    assert line["actions"] == episodes[lines.index(line)]["actions"]
  proc = run_cli("score", "--checkpoint", run, "--input", os.path.join(run, "labels"),
                 "--out", tmp_path / "all.jsonl", "--no-progress")  # fmt: skip
  assert proc.returncode == 0 and len((tmp_path / "all.jsonl").read_text().splitlines()) == 64
  bad = tmp_path / "bad.jsonl"
  bad.write_text(
    json.dumps(episodes[0]) + "\n" + json.dumps(dict(episodes[1], actions=[99])) + "\n"
  )
  proc = run_cli("score", "--checkpoint", run, "--input", bad, "--out", tmp_path / "b.jsonl")
  assert_one_line_error(proc)
  assert "episode 1" in proc.stderr and not (tmp_path / "b.jsonl").exists()


def test_serve_from_another_process_with_the_client(run, episodes, tmp_path):
  """`hindsight serve` in its own process: answers equal `score`; SIGHUP reloads (here the
  last step, removed, gives way to the one before it); SIGTERM with a request in flight
  still answers it (200) before the process ends, without a traceback."""
  served = tmp_path / "run"
  shutil.copytree(run, served, ignore=shutil.ignore_patterns("labels", "tensorboard", "drift"))
  steps = sorted(int(s) for s in os.listdir(served / "checkpoints") if s.isdigit())
  port = 18000 + os.getpid() % 1000
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, HINDSIGHT_ADMIN_TOKEN=TOKEN)
  # A 2 s collection window: a request waits that long in the server, so the SIGTERM below
  # lands while it is in flight.
  proc = subprocess.Popen(
    [sys.executable, "-m", "hindsight.cli", "serve", "--checkpoint", str(served), "--port",
     str(port), "--max-steps", str(MAX_STEPS), "--step", "last", "--window-ms", "2000"],
    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  in_flight = {}
  try:
    client = Client(f"http://127.0.0.1:{port}")
    wait_until_ready(client, proc)
    out = client.credit([_bare(e) for e in episodes[:2]])
    last = Predictor.load(str(served), "last")
    assert out["model"]["step"] == steps[-1] == last.step
    expected = last.score([_bare(e) for e in episodes[:2]])
    np.testing.assert_allclose(out["credit"][1], expected[1]["credit"], atol=1e-6)
    with pytest.raises(HindsightError, match="400 trajectories"):
      client.credit([dict(_bare(episodes[0]), actions=[-1] * len(episodes[0]["actions"]))])
    # The serving page's client example, as written (this server, this run's episodes).
    exported = tmp_path / "episodes.jsonl"
    exported.write_text("".join(json.dumps(e) + "\n" for e in episodes[:4]))
    namespace: dict = {}
    exec(_page_block("client-example").replace("http://127.0.0.1:8000", client.url)
         .replace('"episodes.jsonl"', repr(str(exported))), namespace)  # fmt: skip
    assert namespace["out"]["credit"] == client.credit([_bare(e) for e in episodes[:4]])["credit"]

    shutil.rmtree(served / "checkpoints" / str(steps[-1]))
    proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 120
    while client.credit([_bare(episodes[0])])["model"]["step"] != steps[-2]:
      assert proc.poll() is None and time.time() < deadline, "SIGHUP did not reload"
    # The client's reload carries the admin token (from the environment, here); without it,
    # 401.
    with pytest.raises(HindsightError, match="401"):
      client.reload(step="last")
    admin = Client(client.url, admin_token=TOKEN)
    assert admin.reload(step="last")["model"]["step"] == steps[-2]

    def request():
      in_flight["answer"] = client.credit([_bare(e) for e in episodes[:2]])

    thread = threading.Thread(target=request)
    thread.start()
    time.sleep(0.8)  # the request now waits in the server's collection window
  finally:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
  thread.join(timeout=60)
  assert in_flight["answer"]["model"]["step"] == steps[-2]  # answered: 200, not dropped
  # uvicorn drains in-flight requests, then re-raises the SIGTERM it caught: killed by it.
  err = proc.stderr.read()
  assert proc.returncode in (0, -signal.SIGTERM), err
  assert "Traceback" not in err, err


def test_a_failed_warm_up_is_reported_not_swallowed(run):
  """A warm-up that fails (here: the allocation a 64 x 4096 program asked for) is logged,
  /readyz answers 503 saying it failed, and `on_failure` hears the reason (`hindsight serve`
  then ends with it as its one-line error). By default the buckets stop at the longest
  episode the model was trained on."""
  predictor = Predictor.load(run)
  assert ServeConfig(checkpoint=run).steps_limit(predictor.spec) == predictor.spec.max_length

  def boom(max_steps=None):
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 52.7 GB")

  predictor.warmup = boom
  heard: list[str] = []
  app = create_app(ServeConfig(checkpoint=run, max_steps=4096), predictor, on_failure=heard.append)
  with TestClient(app) as c:
    for _ in range(200):
      if heard:
        break
      time.sleep(0.05)
    r = c.get("/readyz")
  assert r.status_code == 503 and r.json() == {"ready": False, "error": "failed"}
  assert len(heard) == 1 and "RESOURCE_EXHAUSTED" in heard[0], heard
  assert "4096-step buckets" in heard[0] and "--max-steps" in heard[0]


def test_serve_bad_checkpoint_is_one_line(tmp_path):
  assert_one_line_error(run_cli("serve", "--checkpoint", tmp_path), "no checkpoints")


def _page_block(marker: str) -> str:
  """The Python block after `<!-- MARKER` on the serving page."""
  with open(os.path.join(ROOT, "docs", "serving.md")) as f:
    text = f.read()
  start = text.index("```python", text.index(f"<!-- {marker}"))
  return text[start + len("```python") : text.index("```", start + 3)]


def test_readme_policy_gradient_example_runs(run, episodes):
  """The serving page's in-process example, run as written (on this module's model)."""
  code = _page_block("pg-example")
  namespace = {"trajectories": [_bare(e) for e in episodes[:8]]}
  exec(code.replace('"runs/demo"', repr(run)), namespace)
  w = np.asarray(namespace["params"]["w"])
  spec = namespace["spec"]
  width = namespace["width"]
  assert w.shape == (width, spec.num_actions)
  # From w = 0 the policy is uniform, so the loss's gradient is, in closed form,
  # g[d, a] = -(1/N) sum_steps credit * x_d * (1[a_t = a] - 1/A), with the credit the
  # Predictor's mean; Adam's first step moves each weight by -lr sign(g).
  g = np.zeros_like(w, np.float64)
  steps = 0
  for tr, sc in zip(namespace["trajectories"], Predictor.load(run).score(
      namespace["trajectories"]), strict=True):  # fmt: skip
    for obs, a, c in zip(tr["observations"], tr["actions"], sc["mean"], strict=True):
      x = np.eye(width)[obs] if namespace["discrete"] else np.asarray(obs)
      g -= c * np.outer(x, np.eye(spec.num_actions)[a] - 1.0 / spec.num_actions)
      steps += 1
  g /= steps
  moved = np.abs(g) > 1e-4
  assert moved.sum() >= 4
  np.testing.assert_allclose(w[moved], -1e-3 * np.sign(g[moved]), rtol=1e-3)


# A stand-in for `hey` (rakyll/hey) with its flags and its summary format: the bench's path
# through a compiled load generator, where none is installed.
_FAKE_HEY = """#!{python}
import argparse, http.client, threading, time, urllib.parse
p = argparse.ArgumentParser()
for flag in ("-z", "-c", "-m", "-T", "-D"):
  p.add_argument(flag)
p.add_argument("url")
a = p.parse_args()
assert a.m == "POST" and a.T == "application/json", (a.m, a.T)
url, body = urllib.parse.urlparse(a.url), open(a.D, "rb").read()
stop, lat, codes = time.perf_counter() + float(a.z.rstrip("s")), [], {{}}
def run():
  conn = http.client.HTTPConnection(url.hostname, url.port)
  while time.perf_counter() < stop:
    tic = time.perf_counter()
    conn.request("POST", url.path, body, {{"Content-Type": a.T}})
    r = conn.getresponse(); r.read()
    lat.append(time.perf_counter() - tic); codes[r.status] = codes.get(r.status, 0) + 1
threads = [threading.Thread(target=run) for _ in range(int(a.c))]
[t.start() for t in threads]; [t.join() for t in threads]
lat.sort()
print("Summary:\\n  Requests/sec:\\t%.4f\\n\\nLatency distribution:" % (len(lat) / float(a.z[:-1])))
for q in (10, 50, 90, 99):
  print("  %d%% in %.4f secs" % (q, lat[min(len(lat) - 1, len(lat) * q // 100)]))
print("\\nStatus code distribution:")
for code, n in codes.items():
  print("  [%d]\\t%d responses" % (code, n))
"""


@pytest.mark.slow
def test_bench_serve_smoke(run, tmp_path):
  port = 19000 + os.getpid() % 1000
  hey = tmp_path / "hey"
  hey.write_text(_FAKE_HEY.format(python=sys.executable))
  hey.chmod(0o755)
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, PATH=f"{tmp_path}:{os.environ['PATH']}")
  proc = subprocess.run(
    [sys.executable, "eval/bench_serve.py", "--checkpoint", run, "--steps", "16",
     "--clients", "1,4", "--seconds", "0.5", "--port", str(port), "--load-generator", "hey"],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stderr
  assert f"load from hey ({hey})" in proc.stdout, proc.stdout
  rows = re.findall(r"(\d+) clients: +(\d+) requests +p50 +([\d.]+) ms +p99 +([\d.]+) ms +"
                    r"([\d,]+) steps/s +\(([\d.]+)x", proc.stdout)  # fmt: skip
  assert [int(r[0]) for r in rows] == [1, 4], proc.stdout
  for _clients, requests, p50, p99, rate, _ratio in rows:
    assert int(requests) > 0 and float(p50) <= float(p99)
    # steps/s is the requests' steps (16 each) over the 0.5 s row, as printed.
    assert abs(int(rate.replace(",", "")) - int(requests) * 16 / 0.5) <= 1
  assert rows[0][5] == "1.0"


def test_a_missing_success_is_a_400_where_success_is_an_event(run, episodes):
  """A model whose DataSpec says success is not a return level (key_to_door's door) answers
  a trajectory without `success` with a 400 naming the field, and scores it with one."""
  import dataclasses as dc

  served = Predictor.load(run)
  event = dc.replace(served.spec, success_from_return=False)
  predictor = Predictor(served.graphdef, served.state, event, served.model_config, served.step)
  bare = _bare(episodes[0])
  with pytest.raises(HindsightError, match="missing field 'success'"):
    predictor.score([bare])
  assert len(predictor.score([{**bare, "success": True}])) == 1
  cfg = ServeConfig(checkpoint=run, max_steps=MAX_STEPS, warmup=False)
  with TestClient(create_app(cfg, predictor)) as c:
    for _ in range(600):
      if c.get("/readyz").status_code == 200:
        break
      time.sleep(0.05)
    r = c.post("/v1/credit", json={"trajectories": [bare]})
    assert r.status_code == 400 and "'success'" in r.json()["error"]["message"], r.text


def test_not_ready_until_warm_then_concurrent_requests_share_batches(run, episodes):
  """Before its warm-up ends the server answers 503 (readyz and credit); after, requests
  sent at once by several clients are scored together (batches of more than one)."""
  warm = threading.Event()

  class _SlowWarmup(Predictor):
    def warmup(self, max_steps=None):
      warm.wait(60)
      return 0

  loaded = Predictor.load(run)
  predictor = _SlowWarmup(loaded.graphdef, loaded.state, loaded.spec, loaded.model_config,
                          loaded.step)  # fmt: skip
  body = {"trajectories": [_bare(episodes[0])]}
  cfg = ServeConfig(checkpoint=run, max_steps=MAX_STEPS, window_ms=50.0)
  with TestClient(create_app(cfg, predictor)) as c:
    assert c.get("/readyz").status_code == 503
    r = c.post("/v1/credit", json=body)
    assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
    warm.set()
    for _ in range(600):
      if c.get("/readyz").status_code == 200:
        break
      time.sleep(0.05)
    codes = []

    def send():
      codes.append(c.post("/v1/credit", json=body).status_code)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert codes == [200] * 8
    metrics = c.get("/metrics").text
  count = float(re.search(r"hindsight_batch_trajectories_count (\S+)", metrics)[1])
  singles = float(re.search(r'hindsight_batch_trajectories_bucket\{le="1.0"\} (\S+)', metrics)[1])
  assert count < 8 and singles < count, (count, singles)  # 8 requests in fewer batches


def test_long_episodes_are_scored_fewer_to_a_call_with_the_same_answers(run):
  """rows_per_call keeps rows x pad^2 attention scores within the budget (64 rows of 128
  steps ran at half the speed of 16); the split batch scores every episode as alone."""
  from hindsight.model.predictor import rows_per_call

  assert [rows_per_call(p) for p in (8, 32, 64, 128, 256, 1024)] == [64, 64, 64, 16, 4, 1]
  assert rows_per_call(32, batch_size=4) == 4
  predictor = Predictor.load(run)
  spec = predictor.spec
  rng = np.random.default_rng(3)
  eps = [
    {"observations": rng.integers(0, spec.encoder.num_ids, n),
     "actions": rng.integers(0, spec.num_actions, n), "rewards": rng.normal(size=n)}
    for n in rng.integers(65, 129, 20)
  ]  # fmt: skip
  together = predictor.score(eps, allow_longer=True)
  for ep, got in zip(eps, together, strict=True):
    alone = predictor.score([ep], allow_longer=True)[0]
    np.testing.assert_allclose(got["credit"], alone["credit"], rtol=1e-5, atol=1e-6)
