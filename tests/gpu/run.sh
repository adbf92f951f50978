#!/usr/bin/env bash
# The whole GPU suite, run from the repo root on the GPU machine after tests/gpu/stage.sh
# staged ./stage here. Logs go to $OUT (or ./stage/logs); the summary is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=${OUT:-stage/logs}
mkdir -p "$logs"
export MLA_SEED=${MLA_SEED:-$(date +%s%N | cut -c1-18)}
echo "commit $(cat stage/COMMIT)  seed $MLA_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
summary=()
stage/bin/mla info 2>&1 | tee "$logs/info.log"
for t in stage/bin/test-*; do
  name=$(basename "$t")
  start=$(date +%s)
  "$t" --test-threads=1 >"$logs/$name.log" 2>&1
  rc=$?
  line=$(grep -E "^test result:" "$logs/$name.log" | tail -1)
  summary+=("$(printf '%-22s rc=%d %4ss  %s' "$name" "$rc" "$(( $(date +%s) - start ))" "$line")")
  grep -E "SKIPPED|FAIL|panicked|decodes checked|failures|rel L2|vs 1:|seed =|-> sm" "$logs/$name.log" | head -40
done
stage/bin/mla demo --seed "${MLA_SEED:0:9}" 2>&1 | tee "$logs/demo.log"
if [[ "${MLA_SANITIZE:-1}" == 1 ]] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    MLA_GPU_MATRIX=quick timeout 240 compute-sanitizer --tool "$tool" --print-limit 20 \
      stage/bin/test-gpu_decode --test-threads=1 case_matrix >"$logs/sanitizer-$tool.log" 2>&1
    rc=$?
    summary+=("$(printf '%-22s rc=%d  %s' "sanitizer-$tool" "$rc" "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitizer-$tool.log" | tail -1)")")
  done
  MLA_GPU_MATRIX=quick timeout 120 compute-sanitizer --tool memcheck stage/bin/test-gpu_paged --test-threads=1 >"$logs/sanitizer-paged.log" 2>&1
  summary+=("$(printf '%-22s rc=%d  %s' "sanitizer-paged" "$?" "$(grep -E "ERROR SUMMARY" "$logs/sanitizer-paged.log" | tail -1)")")
fi
echo "================ GPU suite summary (seed $MLA_SEED) ================"
printf '%s\n' "${summary[@]}"
