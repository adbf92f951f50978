#!/usr/bin/env bash
# Session 8, device call 1a: settle the TMA decode's racecheck reports (PERF v11). Racecheck
# on the first 7 sparse bf16 cases, wgmma tile only, checking only the TMA decode kernel:
# main's cubin (embedded) against branch racecheck-control's (exchange through full bar.sync
# pairs). ncu lists the TMA launches so a clean run cannot mean "never launched". Then the
# padded-strides test (b62fb3c's upload change) on main.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=stage/s8a; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
export MLA_SEED=$(date +%s%N | cut -c1-18)
echo "commit $(cat stage/COMMIT) rcctl $(cat stage/variants/rcctl.rev) seed $MLA_SEED" | tee $L/head.txt
sv() { tar czf "$OUT/s8a.tgz" -C stage s8a 2>/dev/null; }
export MLA_GPU_MATRIX=sparse MLA_GPU_MATRIX_DTYPES=bf16 MLA_GPU_MATRIX_MAX=7 MLA_GPU_TILES=wg64n64 MLA_TRACE=1
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n "${SKIP_NCU:-}" ]] || timeout 90 $ncu --kernel-name regex:mla_decode_tma --launch-count 3 --section LaunchStats \
  stage/bin/test-gpu_decode --test-threads=1 case_matrix > $L/ncu-tma.log 2>&1
echo "ncu rc=$? tma launches seen: $(grep -c 'mla_decode_tma' $L/ncu-tma.log)" | tee -a $L/head.txt; sv
for v in main rcctl; do
  img=(); [[ $v == rcctl ]] && img=(env MLA_IMAGE_FILE=stage/variants/rcctl.cubin)
  "${img[@]}" timeout 220 compute-sanitizer --tool racecheck --print-limit 10 --kernel-name kns=mla_decode_tma \
    stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/racecheck-$v.log 2>&1
  echo "racecheck $v rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-$v.log | tail -1); $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/racecheck-$v.log | tail -1)" | tee -a $L/head.txt; sv
done
unset MLA_GPU_MATRIX MLA_GPU_MATRIX_DTYPES MLA_GPU_MATRIX_MAX MLA_GPU_TILES
timeout 90 stage/bin/test-gpu_decode --test-threads=1 --nocapture padded_cache_strides > $L/padded.log 2>&1
echo "padded rc=$? $(grep -E '^test result' $L/padded.log)" | tee -a $L/head.txt; sv
cat $L/head.txt
for v in main rcctl; do echo "== $v"; grep -E "Race reported|Warning|Error" $L/racecheck-$v.log | sort | uniq -c | head -8; done
