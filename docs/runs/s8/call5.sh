#!/usr/bin/env bash
# Session 8, device call 5: racecheck on the TMA decode (first 7 sparse bf16 cases, wgmma
# tile, TMA kernel only) with HEAD's cubin and with branch racecheck-control-sync's (every
# named barrier a bar.sync on both sides). With call 4's primitive result (bar.arrive ->
# bar.sync handoffs reported, bar.sync pairs clean), a clean control means the decode's
# reports are racecheck's model of bar.arrive.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=stage/s8g; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
echo "commit $(cat stage/COMMIT) rcsync $(cat stage/variants/rcsync.rev)" | tee $L/head.txt
export MLA_GPU_MATRIX=sparse MLA_GPU_MATRIX_DTYPES=bf16 MLA_GPU_MATRIX_MAX=7 MLA_GPU_TILES=wg64n64 MLA_TRACE=1
for v in main rcsync; do
  img=(); [[ $v == rcsync ]] && img=(env MLA_IMAGE_FILE=stage/variants/rcsync.cubin)
  "${img[@]}" timeout 200 compute-sanitizer --tool racecheck --print-limit 10 --kernel-name kns=mla_decode_tma \
    stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/racecheck-$v.log 2>&1
  echo "racecheck $v rc=$? $(grep -E 'RACECHECK SUMMARY' $L/racecheck-$v.log | tail -1); $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/racecheck-$v.log | tail -1)" | tee -a $L/head.txt
done
tar czf "$OUT/s8g.tgz" -C stage s8g
for v in main rcsync; do echo "== $v"; grep -E "Race reported" -A1 $L/racecheck-$v.log | sort | uniq -c | head -12; done
