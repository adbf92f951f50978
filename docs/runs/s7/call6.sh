#!/usr/bin/env bash
# Session 7, device call 6: compute-sanitizer on the thinned case matrix (the sampling fixed
# in 3c514d5): memcheck on the fp8 dtypes, racecheck on fp8kv_bf16q and bf16.
set -uo pipefail
cd "$(dirname "$0")/.."
L=stage/s7f; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
export MLA_SEED=$(date +%s%N | cut -c1-18)
echo "commit $(cat stage/COMMIT) seed $MLA_SEED" | tee $L/head.txt
sv() { tar czf "$OUT/s7f.tgz" -C stage s7f 2>/dev/null; }
MLA_GPU_MATRIX=quick MLA_GPU_MATRIX_DTYPES=fp8kv_bf16q,fp8 timeout 150 compute-sanitizer --tool memcheck --print-limit 20 \
  stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/memcheck.log 2>&1
echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck.log | tail -1); $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/memcheck.log | tail -1)" | tee -a $L/head.txt; sv
MLA_GPU_MATRIX=sparse MLA_GPU_MATRIX_DTYPES=fp8kv_bf16q,bf16 timeout 230 compute-sanitizer --tool racecheck --print-limit 20 \
  stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/racecheck.log 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck.log | tail -1); $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/racecheck.log | tail -1)" | tee -a $L/head.txt; sv
cat $L/head.txt; grep -E "chunk|decodes" $L/racecheck.log | tail -4
