#!/usr/bin/env bash
# Session 7, device call 7: racecheck on the fp8 16-row kernel (sparse fp8 matrix).
set -uo pipefail
cd "$(dirname "$0")/.."
L=stage/s7g; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
export MLA_SEED=$(date +%s%N | cut -c1-18)
echo "commit $(cat stage/COMMIT) seed $MLA_SEED" | tee $L/head.txt
MLA_GPU_MATRIX=sparse MLA_GPU_MATRIX_DTYPES=fp8 timeout 140 compute-sanitizer --tool racecheck --print-limit 20 \
  stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/racecheck-fp8.log 2>&1
echo "racecheck-fp8 rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-fp8.log | tail -1); $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/racecheck-fp8.log | tail -1)" | tee -a $L/head.txt
tar czf "$OUT/s7g.tgz" -C stage s7g
grep -E "Race reported|mma16|decodes" $L/racecheck-fp8.log | sort | uniq -c | head -20
