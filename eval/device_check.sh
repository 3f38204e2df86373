#!/usr/bin/env bash
# One accelerator check, at most 8 minutes: on whatever device JAX finds (GPU, TPU, or the
# CPU, where each benchmark runs its smallest sizes and says so) it prints
#   1. the symbolic labeler's env steps/s (eval/bench_labeler.py --quick: tabular MDP, K = 64);
#   2. the credit model's training steps/s, FLOP/s and MFU in bf16 (eval/bench_model.py,
#      configs/reasoning.py with model.compute_dtype=bfloat16);
#   3. the LM-backbone decoder's training tokens/s and MFU in bf16, and the LM slot engine's
#      completions/s (eval/bench_lm.py: Qwen2.5-0.5B's shape on an accelerator).
# Each part has its own time limit (the limits and the start-up probe add to under 8 minutes);
# a part that fails or runs out prints why, the rest run, and the script exits 1.
#
#   bash eval/device_check.sh            # uses .venv (make test creates it) or $PYTHON
#   bash eval/device_check.sh --tiny     # every part at a toy size (its test)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
BACKEND=$(timeout 30 "$PY" -c "import jax; print(jax.default_backend(), jax.devices()[0].device_kind, len(jax.devices()))" 2>/dev/null) \
  || { echo "device_check: JAX does not start with $PY"; exit 1; }
echo "device_check: backend, device, count: $BACKEND"
LM=()
if [[ "${1:-}" == --tiny ]]; then
  echo "device_check: --tiny: toy sizes (the script's test, no figures)"
  LABEL=(--episodes 16 --rollouts 4 --states 6 --horizon 6 --repeats 1)
  MODEL=(--steps 2 --repeats 1 --score-batch 8)
  LM=(--size small --batch 2 --seq 16 --prompts 4 --prompt-len 8 --tokens 4 --steps 1 --repeats 1)
elif [[ "$BACKEND" == cpu* ]]; then
  echo "device_check: no accelerator: the smallest sizes (figures for the CPU, not a device)"
  LABEL=(--episodes 128 --rollouts 16 --repeats 1)
  MODEL=(--steps 10 --repeats 1 --score-batch 128)
else
  LABEL=(--episodes 8192 --rollouts 64 --repeats 2)
  MODEL=(--steps 50 --repeats 3 --score-batch 8192)
fi
FAILED=0
part() {  # part SECONDS NAME COMMAND...: runs one benchmark under its own limit
  local limit=$1 name=$2; shift 2
  echo "== $name"
  local start=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  if [[ $rc == 124 ]]; then echo "device_check: $name ran past its ${limit} s"; FAILED=1; \
  elif [[ $rc != 0 ]]; then echo "device_check: $name failed (exit $rc)"; FAILED=1; fi
  echo "   ($name: $((SECONDS - start)) s)"
}
part 110 "labeler" "$PY" eval/bench_labeler.py --quick "${LABEL[@]}"
part 110 "credit model (bf16)" "$PY" eval/bench_model.py --config configs/reasoning.py \
  --set model.compute_dtype=bfloat16 "${MODEL[@]}"
part 220 "LM backbone and engine (bf16)" "$PY" eval/bench_lm.py ${LM[@]+"${LM[@]}"}
echo "device_check: done in $SECONDS s"
exit "$FAILED"
