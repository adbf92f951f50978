#!/usr/bin/env bash
# Session 8, device call 2a: the GPU suite at HEAD (tests, examples, demo; no sanitizers),
# then racecheck on the exchange primitive (the TMA decode's protocol alone), racecheck on
# the bf16 16-row tile (three barriers per block since c253e80) and memcheck on the combine
# (four rows per CTA since 1446900).
set -uo pipefail
cd "$(dirname "$0")/../../.."
[[ -n "${SKIP_SUITE:-}" ]] || MLA_TIMEOUT_MAX=150 MLA_SANITIZE=0 bash tests/gpu/run.sh 2>&1 | tail -30
L=stage/s8d; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
echo "commit $(cat stage/COMMIT)" > $L/head.txt
sv() { tar czf "$OUT/s8d.tgz" -C stage s8d 2>/dev/null; }
timeout 60 stage/bin/test-gpu_primitives --test-threads=1 --nocapture exchange > $L/prim.log 2>&1; echo "prim exchange rc=$? $(grep -E "^test result" $L/prim.log)" | tee -a $L/head.txt
timeout 60 compute-sanitizer --tool racecheck stage/bin/test-gpu_primitives --test-threads=1 --nocapture exchange > $L/racecheck-prim.log 2>&1
echo "racecheck prim-exchange rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-prim.log | tail -1); $(grep -E '^test result' $L/racecheck-prim.log)" | tee -a $L/head.txt; sv
MLA_GPU_MATRIX=sparse MLA_GPU_MATRIX_DTYPES=bf16,fp16 MLA_GPU_TILES=m16n64 timeout 150 compute-sanitizer --tool racecheck --print-limit 10 \
  stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/racecheck-m16.log 2>&1
echo "racecheck m16n64 rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-m16.log | tail -1); $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/racecheck-m16.log | tail -1)" | tee -a $L/head.txt; sv
timeout 90 compute-sanitizer --tool memcheck stage/bin/test-gpu_combine --test-threads=1 > $L/memcheck-combine.log 2>&1
echo "memcheck combine rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck-combine.log | tail -1)" | tee -a $L/head.txt; sv
grep -E "Race reported|Error" $L/racecheck-prim.log | sort | uniq -c | head
cat $L/head.txt
