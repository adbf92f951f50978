#!/usr/bin/env bash
# Session 8, device call 4: (1) the exchange primitive under racecheck in its three barrier
# forms (bar.arrive/bar.sync, bar.sync pairs, bar.sync 0); (2) racecheck on the 16-bit
# 16-row tile (three barriers per block), the first sparse cases; (3) A/B of branch
# tma-one-rescale's cubin against HEAD's: correctness on the wgmma tile, then
# `mla bench` bf16 wg64n64, two interleaved repeats.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=stage/s8f; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
echo "commit $(cat stage/COMMIT) onescale $(cat stage/variants/onescale.rev)" | tee $L/head.txt
sv() { tar czf "$OUT/s8f.tgz" -C stage s8f 2>/dev/null; }
for m in 0 1 2; do
  MLA_PRIM_SYNC_MODE=$m timeout 60 compute-sanitizer --tool racecheck stage/bin/test-gpu_primitives --test-threads=1 --nocapture exchange > $L/racecheck-prim-$m.log 2>&1
  echo "racecheck prim sync_mode=$m rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-prim-$m.log | tail -1); $(grep -E '^test result' $L/racecheck-prim-$m.log)" | tee -a $L/head.txt
done
sv
MLA_GPU_MATRIX=sparse MLA_GPU_MATRIX_DTYPES=bf16,fp16 MLA_GPU_MATRIX_MAX=6 MLA_GPU_TILES=m16n64 MLA_TRACE=1 timeout 150 compute-sanitizer --tool racecheck --print-limit 10 \
  stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/racecheck-m16.log 2>&1
echo "racecheck m16n64 rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-m16.log | tail -1); $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/racecheck-m16.log | tail -1)" | tee -a $L/head.txt; sv
MLA_GPU_TILES=wg64n64 MLA_AB_FILTER='bf16 wg64n64' MLA_AB_REPS=2 MLA_AB_TIMEOUT=90 \
  MLA_AB_VARIANTS="main: onescale:MLA_IMAGE_FILE=stage/variants/onescale.cubin" bash tests/gpu/ab.sh 2>&1 | tail -60
cat $L/head.txt
