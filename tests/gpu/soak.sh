#!/usr/bin/env bash
# Repeats one GPU test to find intermittent failures and hangs, on the GPU machine from the
# repo root after tests/gpu/stage.sh. Each run gets its own seed (MLA_SEED0 + run number) and
# MLA_TRACE=1, so the test names every case before it runs it; a run that makes no progress
# (its log unchanged) for MLA_SOAK_STALL seconds is reported with its last case and the GPU's
# state, then killed. Runs until MLA_SOAK_SECONDS have passed.
#   MLA_GPU_MATRIX_DTYPES=fp8kv_bf16q,fp8 MLA_GPU_TILES=wg64n64 bash tests/gpu/soak.sh
# Switches: MLA_SOAK_BIN (default test-gpu_decode), MLA_SOAK_FILTER (default case_matrix),
# MLA_SOAK_SECONDS (default 300), MLA_SOAK_STALL (default 30), MLA_SEED0 (default the time).
# Logs of failed and stalled runs go to stage/logs/soak (and $OUT/soak.tgz).
set -uo pipefail
cd "$(dirname "$0")/../.."
source tests/gpu/unpack.sh
logs=stage/logs/soak
mkdir -p "$logs"
bin=stage/bin/${MLA_SOAK_BIN:-test-gpu_decode}
filter=${MLA_SOAK_FILTER:-case_matrix}
secs=${MLA_SOAK_SECONDS:-300}
stall=${MLA_SOAK_STALL:-30}
seed0=${MLA_SEED0:-$(date +%s)}
export MLA_TRACE=1
t0=$(date +%s)
runs=0 passed=0 failed=0 stalled=0
while (( $(date +%s) - t0 < secs )); do
  runs=$((runs + 1))
  seed=$((seed0 + runs))
  log=$logs/run-$runs.log
  MLA_SEED=$seed "$bin" --test-threads=1 --nocapture "$filter" >"$log" 2>&1 &
  pid=$!
  last_size=-1 still=0 stuck=0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    size=$(stat -c %s "$log")
    if [[ $size == "$last_size" ]]; then still=$((still + 1)); else still=0 last_size=$size; fi
    if (( still >= stall )); then
      echo "run $runs seed $seed: no progress for ${stall} s; last case:"
      grep -E "\] run " "$log" | tail -1
      nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv,noheader
      kill -9 "$pid"
      stuck=1
      break
    fi
  done
  wait "$pid" 2>/dev/null
  rc=$?
  if (( stuck )); then
    stalled=$((stalled + 1))
  elif [[ $rc == 0 ]]; then
    passed=$((passed + 1))
    rm -f "$log"
  else
    failed=$((failed + 1))
    echo "run $runs seed $seed: rc=$rc"
    grep -E "FAIL|panicked" "$log" | head -5
  fi
done
echo "soak: $bin $filter: $runs runs, $passed passed, $failed failed, $stalled stalled (seeds $((seed0 + 1))..$((seed0 + runs)))"
[[ -n "${OUT:-}" ]] && tar czf "$OUT/soak.tgz" -C stage/logs soak 2>/dev/null
(( failed == 0 && stalled == 0 ))
