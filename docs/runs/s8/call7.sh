#!/usr/bin/env bash
# Session 8, device call 7: the exchange primitive under racecheck in sync modes 1 and 3
# (bar.sync pairs; the same plus a per-warpgroup 128-thread barrier and an mbarrier poll
# each round, the decode's other barrier kinds).
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=stage/s8i; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
echo "commit $(cat stage/COMMIT)" | tee $L/head.txt
for m in 1 3; do
  MLA_PRIM_SYNC_MODE=$m timeout 60 compute-sanitizer --tool racecheck stage/bin/test-gpu_primitives --test-threads=1 --nocapture exchange > $L/racecheck-prim-$m.log 2>&1
  echo "racecheck prim sync_mode=$m rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-prim-$m.log | tail -1); $(grep -E '^test result' $L/racecheck-prim-$m.log)" | tee -a $L/head.txt
done
tar czf "$OUT/s8i.tgz" -C stage s8i
grep -E "Race reported" -A1 $L/racecheck-prim-3.log | head -12
