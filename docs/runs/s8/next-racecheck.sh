#!/usr/bin/env bash
# Prepared in session 8 for the next device call (not yet run): the exchange primitive
# under racecheck in sync mode 4 (mode 3 plus a tile handed from one warpgroup's generic
# stores to the other's wgmma each round, the decode's async-proxy traffic). Modes 1-3
# were clean and mode 0 (bar.arrive) reported hazards (docs/PERF.md v12 item 3); if mode
# 4 reports hazards, racecheck loses the barrier ordering once wgmma runs, which would
# explain the TMA decode's all-bar.sync control. Run after tests/gpu/stage.sh, carry stage.
set -uo pipefail
cd "$(dirname "$0")/../../.."
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
for m in 3 4; do
  MLA_PRIM_SYNC_MODE=$m timeout 60 compute-sanitizer --tool racecheck stage/bin/test-gpu_primitives --test-threads=1 --nocapture exchange > "$OUT/racecheck-prim-$m.log" 2>&1
  echo "racecheck prim sync_mode=$m rc=$? $(grep -E 'RACECHECK SUMMARY' "$OUT/racecheck-prim-$m.log" | tail -1); $(grep -E '^test result' "$OUT/racecheck-prim-$m.log")"
done
