#!/usr/bin/env bash
# One prepared check of the CUDA path, for a machine with NVIDIA GPUs (< 10 minutes):
#   1. CUDA + NCCL devices, builtin rollout engine: a static run (the reference)
#   2. the same with a forced resize schedule: the same sample records as 1 (needs >= 3 GPUs:
#      NCCL cannot put two ranks of one group on one GPU)
#   3. the vLLM rollout engine (if vllm imports and the config has rollout.engine), then with
#      speculative decoding on: the same samples, or how many differ (DIFF, not a failure)
#   4. dynaresize bench resize (CPU devices, gloo; tiny + 100M model, 1 repetition)
#   5. dynaresize bench rollout (if the subcommand exists)
# then one table. Without CUDA it prints "no CUDA: skipping ..." and exits 0.
#
# Python: $PYTHON, else .venv/bin/python (scripts/setup.sh installs the CPU build of torch: on a
# GPU machine install a CUDA build of the same torch into it, or point PYTHON at one).
# Output: $OUT (default runs/gpu-check-<time>); every step's log is there.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
OUT=${OUT:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}

if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "no CUDA: skipping the GPU check (no nvidia-smi on this machine: no NVIDIA driver)"
  exit 0
fi
if [ ! -x "$PYTHON" ]; then
  echo "no CUDA: skipping the GPU check ($PYTHON not found: run scripts/setup.sh or set PYTHON)"
  exit 0
fi
NUM_GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)
if [ "${NUM_GPUS:-0}" -lt 1 ]; then
  echo "no CUDA: skipping the GPU check ($("$PYTHON" -c 'import torch; print("torch", torch.__version__, "sees no CUDA device")' 2>&1 | tail -1))"
  exit 0
fi
mkdir -p "$OUT"
echo "GPU check: $NUM_GPUS GPU(s), $("$PYTHON" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())))'); logs in $OUT"

ROWS=()
row() { ROWS+=("$(printf '| %-34s | %-7s | %6s | %s |' "$1" "$2" "$3" "$4")"); }

# run NAME TIMEOUT_S CMD...: the step's output goes to $OUT/NAME.log; sets RC and SECS
run() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "== $name: $*"
  timeout -k 30 "$limit" "$@" >"$OUT/$name.log" 2>&1
  RC=$?
  SECS=$((SECONDS - t0))
  if [ $RC -eq 124 ] || [ $RC -eq 137 ]; then echo "   timed out after ${limit}s"; fi
  tail -3 "$OUT/$name.log" | sed 's/^/   /'
}

# devices: one GPU each when there are >= 2; else two devices sharing the one GPU (static only)
if [ "$NUM_GPUS" -ge 2 ]; then
  NUM_DEV=$((NUM_GPUS < 4 ? NUM_GPUS : 4)); GPU_SHARE=1.0
else
  NUM_DEV=2; GPU_SHARE=0.5
fi
NUM_TRAIN=$((NUM_DEV / 2)); NUM_ROLLOUT=$((NUM_DEV - NUM_TRAIN))
TRAIN=("$PYTHON" -m dynaresize train
  --set "devices.type='cuda'" --set "devices.gpus_per_device=$GPU_SHARE"
  --set "allocation.num_rollout_devices=$NUM_ROLLOUT" --set "allocation.num_train_devices=$NUM_TRAIN"
  --set run.steps=4 --set task.prompts_per_step=4 --set task.samples_per_prompt=4
  --set train.micro_batch_size=2 --set "controller.policy='static'"
  --set "output.progress='plain'")
DEVS="$NUM_ROLLOUT R + $NUM_TRAIN T, $GPU_SHARE GPU each"

summary_of() {  # DIR -> "nodes N, W s wall, reward R, T tok/s" from summary.json
  "$PYTHON" - "$1" <<'EOF' 2>/dev/null || echo "no summary.json"
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
print(f"nodes {s.get('nodes')}, {s['wall_s']:.1f} s wall, reward {s['final_reward']:.3f}, "
      f"{s['tokens_per_s']:.0f} tok/s")
EOF
}

same_samples() {  # DIR_A DIR_B -> "same" | "DIFFERENT: ..."
  "$PYTHON" - "$1" "$2" <<'EOF'
import json, sys
def view(d):
    rows = [json.loads(l) for l in open(f"{d}/samples.jsonl")]
    return {(r["step"], r["prompt"], r["sample"]): (r["version"], r["tokens_sha256"]) for r in rows}
a, b = view(sys.argv[1]), view(sys.argv[2])
diff = [k for k in a.keys() | b.keys() if a.get(k) != b.get(k)]
print("same" if a and not diff else f"DIFFERENT: {len(diff)} of {len(a | b)} samples differ")
EOF
}

# 1. static, builtin engine
run train-static 100 "${TRAIN[@]}" --out "$OUT/static"
if [ $RC -eq 0 ]; then row "CUDA+NCCL static (builtin)" ok "$SECS" "$DEVS; $(summary_of "$OUT/static")"
else row "CUDA+NCCL static (builtin)" FAIL "$SECS" "exit $RC, see $OUT/train-static.log"; fi

# 2. forced schedule vs static
if [ "$NUM_GPUS" -ge 3 ] && [ $RC -eq 0 ]; then
  run train-forced 100 "${TRAIN[@]}" --out "$OUT/forced" --set "resize.schedule=[
    {step=1, at='start', move='rollout->train', num_devices=1},
    {step=2, at='rollout:0.3', move='train->rollout', num_devices=1}]"
  if [ $RC -eq 0 ]; then
    SAME=$(same_samples "$OUT/static" "$OUT/forced")
    [ "$SAME" = same ] && STATUS=ok || STATUS=FAIL
    row "forced schedule vs static" "$STATUS" "$SECS" "samples: $SAME; $(summary_of "$OUT/forced")"
  else row "forced schedule vs static" FAIL "$SECS" "exit $RC, see $OUT/train-forced.log"; fi
else
  row "forced schedule vs static" skip 0 "needs >= 3 GPUs and step 1 (NCCL: one rank per GPU in a group)"
fi

# 3. vLLM engine
if ! "$PYTHON" -c 'import vllm' >/dev/null 2>&1; then
  row "CUDA static (vllm engine)" skip 0 "vllm does not import"
elif ! "$PYTHON" -m dynaresize train --set "rollout.engine='vllm'" --dry-run >/dev/null 2>&1; then
  row "CUDA static (vllm engine)" skip 0 "this version has no rollout.engine key"
else
  run train-vllm 120 "${TRAIN[@]}" --out "$OUT/vllm" --set "rollout.engine='vllm'"
  if [ $RC -eq 0 ]; then row "CUDA static (vllm engine)" ok "$SECS" "$(summary_of "$OUT/vllm")"
  else row "CUDA static (vllm engine)" FAIL "$SECS" "exit $RC, see $OUT/train-vllm.log"; fi
  # 3b. vLLM with exact speculative decoding: the same samples as 3, or how many differ (a GPU
  # may round a verify forward differently from a decode forward: docs/speculative.md)
  if [ $RC -eq 0 ] && "$PYTHON" -m dynaresize train --set "rollout.engine='vllm'" \
      --set rollout.speculative.enabled=true --dry-run >/dev/null 2>&1; then
    run train-vllm-spec 120 "${TRAIN[@]}" --out "$OUT/vllm-spec" --set "rollout.engine='vllm'" \
      --set rollout.speculative.enabled=true --set rollout.speculative.full_batch=3
    if [ $RC -eq 0 ]; then
      SAME=$(same_samples "$OUT/vllm" "$OUT/vllm-spec")
      [ "$SAME" = same ] && STATUS=ok || STATUS=DIFF
      row "vllm speculation vs off" "$STATUS" "$SECS" "samples: $SAME"
    else row "vllm speculation vs off" FAIL "$SECS" "exit $RC, see $OUT/train-vllm-spec.log"; fi
  fi
fi

# 4. bench resize (CPU devices, gloo)
run bench-resize 150 "$PYTHON" -m dynaresize bench resize --repeats 1 --out "$OUT/bench-resize.json"
if [ $RC -eq 0 ]; then row "bench resize (cpu/gloo)" ok "$SECS" "table in $OUT/bench-resize.log"
else row "bench resize (cpu/gloo)" FAIL "$SECS" "exit $RC, see $OUT/bench-resize.log"; fi

# 5. bench rollout
if "$PYTHON" -m dynaresize bench rollout --help >/dev/null 2>&1; then
  run bench-rollout 120 "$PYTHON" -m dynaresize bench rollout
  if [ $RC -eq 0 ]; then row "bench rollout" ok "$SECS" "table in $OUT/bench-rollout.log"
  else row "bench rollout" FAIL "$SECS" "exit $RC, see $OUT/bench-rollout.log"; fi
else
  row "bench rollout" skip 0 "this version has no 'dynaresize bench rollout'"
fi

echo
printf '| %-34s | %-7s | %6s | %s |\n' step result s details
echo "|------------------------------------|---------|--------|---------|"
printf '%s\n' "${ROWS[@]}"
printf '%s\n' "${ROWS[@]}" | grep -q '| FAIL ' && exit 1
exit 0
