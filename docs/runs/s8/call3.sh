#!/usr/bin/env bash
# Session 8, device call 3: (1) the small-batch split sweep at H=128: `mla bench --grid
# small` on the plan path (schedule + graph-safe grid + combine) and on the tight grid, with
# the split cap at 64/32/16/8/4, to see what the plan's grid costs and whether fewer,
# fuller CTAs win at B=1/8; (2) ncu counters for the two #5 rows that lacked them: the
# TMA decode at page 16 against page 64, and the fp8-cache wgmma decode, B64 L4096 H128.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=stage/s8e; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
echo "commit $(cat stage/COMMIT)" | tee $L/head.txt
sv() { tar czf "$OUT/s8e.tgz" -C stage s8e 2>/dev/null; }
for plan in 1 0; do
  for ms in 64 32 16 8 4; do
    MLA_BENCH_PLAN=$plan MLA_BENCH_MAX_SPLITS=$ms MLA_BENCH_FILTER="H128" timeout 60 stage/bin/mla bench --grid small \
      > $L/small-plan$plan-ms$ms.log 2>&1
    echo "small plan=$plan max_splits=$ms rc=$?" >> $L/head.txt
  done
  sv
done
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
i=0
for shape in "bf16 wg64n64 B64 L4096 H128 S1 P64" "bf16 wg64n64 B64 L4096 H128 S1 P16" "fp8kv_bf16q wg64n64 B64 L4096 H128 S1 P64"; do
  MLA_BENCH_FILTER="$shape" timeout 100 $ncu --kernel-name "regex:mla_decode_(wg|tma)" --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats stage/bin/mla bench --grid extra > $L/ncu-$i.log 2>&1
  echo "ncu-$i '$shape' rc=$?" >> $L/head.txt; i=$((i+1)); sv
done
cat $L/head.txt
for f in $L/small-*.log; do echo "== $f"; grep -E "^bf16" $f; done
