import time


def test_probe(text_run):
  from hindsight.data.episode import Episode
  from hindsight.model.predictor import Predictor

  p = Predictor.load(text_run["workdir"])
  for n in (10000, 200000):
    t = {"steps": ["ab"] * n, "outcome": 1}
    tic = time.perf_counter()
    e = Episode.parse(t, p.spec, "x")
    print("PROBE", n, len(e), time.perf_counter() - tic)
  t = {"steps": ["ab " * 100000] * 16, "outcome": 1}
  tic = time.perf_counter()
  try:
    Episode.parse(t, p.spec, "x")
  except Exception as ex:
    print("PROBE", str(ex)[:80])
  print("PROBE 16 long", time.perf_counter() - tic)
