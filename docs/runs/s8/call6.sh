#!/usr/bin/env bash
# Session 8, device call 6: the bitwise-repeat test (a race shows up as a run-to-run
# difference): 300 runs per case on every tile, then 2000 per case on the wgmma tile (the
# TMA decode) while a second process runs `mla bench` on the same GPU, so that the CTAs'
# timing varies from run to run.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=stage/s8h; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
echo "commit $(cat stage/COMMIT)" | tee $L/head.txt
sv() { tar czf "$OUT/s8h.tgz" -C stage s8h 2>/dev/null; }
timeout 150 stage/bin/test-gpu_decode --test-threads=1 --nocapture repeated_runs > $L/repeat.log 2>&1
echo "repeat (300, all tiles) rc=$? $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/repeat.log | tail -1)" | tee -a $L/head.txt; sv
( for i in 1 2 3 4 5 6; do timeout 100 stage/bin/mla bench > $L/bg-bench-$i.log 2>&1; done ) &
bg=$!
MLA_GPU_REPEATS=2000 MLA_GPU_TILES=wg64n64 timeout 300 stage/bin/test-gpu_decode --test-threads=1 --nocapture repeated_runs > $L/repeat-contended.log 2>&1
echo "repeat (2000, wgmma tile, with a concurrent mla bench) rc=$? $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/repeat-contended.log | tail -1)" | tee -a $L/head.txt
kill $bg 2>/dev/null; pkill -f "stage/bin/mla bench" 2>/dev/null; wait 2>/dev/null
echo "background bench runs: $(ls $L/bg-bench-*.log | wc -l)" | tee -a $L/head.txt
sv
grep -E "FAIL|differ|runs per case" $L/repeat*.log | head
cat $L/head.txt
