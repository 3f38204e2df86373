# Two commands matter: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-text test test-fast bench lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

# Label the reasoning environment, train the credit model (runs/demo/report.json: the test
# split against its own training labels), then the drift report against the reference
# credit on 512 of the test episodes and every baseline (`hindsight eval --run runs/tabular`
# adds the policy-gradient table, which needs a tabular MDP):
# runs/demo/drift/report.md (+ plots). Rerunning resumes; on a finished run it computes
# nothing (the report, the reference and the learned baselines are cached).
demo: $(STAMP)
	$(BIN)/python -m train.main --config configs/reasoning.py --workdir runs/demo
	$(BIN)/python -m hindsight.cli eval --run runs/demo --episodes 512

# The text path offline (docs/text.md): train a small language model on the text world, serve it
# at /v1/completions, label its traces through that endpoint, train the credit model on the
# text, and the drift report against a resampled reference (runs/text-demo/model/drift/report.md).
demo-text: $(STAMP)
	$(BIN)/python -m train.text_demo --workdir runs/text-demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -n 2 --dist loadgroup --max-worker-restart=0 --durations=15 tests

# The suite without its slow tier (end-to-end trainings, multi-process runs, and the modules of
# tests/conftest.py's SLOW_MODULES: the language model, servers, RL): the library's core, a
# quick check while working. CI runs `make test`, everything.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -n 2 --dist loadgroup --max-worker-restart=0 -m "not slow" tests

bench: $(STAMP)
	$(BIN)/python eval/bench_labeler.py
	$(BIN)/python eval/bench_model.py --config configs/reasoning.py
	$(BIN)/python eval/bench_rl.py --config configs/rl_reasoning.py
	$(BIN)/python eval/bench_text.py
	$(BIN)/python eval/bench_lm.py
	@if [ -d runs/demo/checkpoints ]; then $(BIN)/python eval/bench_serve.py --checkpoint runs/demo; \
	else echo "bench_serve: skipped (it serves the demo's model: run make demo first)"; fi

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf runs .pytest_cache
