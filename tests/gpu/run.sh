#!/usr/bin/env bash
# The whole GPU suite, run from the repo root on the GPU machine after tests/gpu/stage.sh
# staged ./stage here. Logs go to ./stage/logs (and, on the device machine, as
# $OUT/logs.tgz plus the bench tables); the summary is printed last.
# Each test runs under a timeout so that one hang cannot eat the whole call.
# Switches: MLA_TESTS=0 (skip the tests, examples and demo), MLA_ONLY="name ..." (only those
# tests; "examples" keeps the examples), MLA_SANITIZE=0 (or =decode: the decode matrix only),
# MLA_BENCH=1 (mla bench), MLA_TIMEOUT_MAX=N (cap every test's timeout at N seconds: for a
# first run of a changed kernel, so that a hang costs little device time),
# MLA_BENCH_EXTRA=1 (mla bench --grid extra: page sizes, S_q 1/2/4), MLA_PEERS=1 (the peers'
# harness with our plugins; needs `stage.sh --peers`), MLA_NSYS="SHAPE" (an Nsight Systems
# GPU trace of the serving path on one `mla bench` shape).
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=stage/logs
rm -rf "$logs"
mkdir -p "$logs"
export MLA_LOGS=$PWD/$logs
export MLA_SEED=${MLA_SEED:-$(date +%s%N | cut -c1-18)}
# The peers' bench stops starting shapes 540 s after this (its --deadline-s auto rule).
export PEERS_T0=${PEERS_T0:-$(date +%s)}
source tests/gpu/unpack.sh
# The candle feature's test and example (tests/gpu/stage_candle.sh), linked against the
# CUDA libraries by soname: the driver's and torch's CUDA wheels' on the loader's path.
if [[ -f stage/candle.tgz ]]; then
  tar xzf stage/candle.tgz -C stage && rm stage/candle.tgz
  cuda_libs=$(python3 -c 'import nvidia, os, glob; print(":".join(d for p in nvidia.__path__ for d in glob.glob(os.path.join(p, "*", "lib"))))' 2>/dev/null)
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda_libs"
fi
echo "commit $(cat stage/COMMIT)  seed $MLA_SEED"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
summary=()
# Logs go back after every step, so a call cut short still returns what ran.
save() {
  [[ -n "${OUT:-}" ]] || return 0
  printf '%s\n' "${summary[@]}" >"$logs/summary.txt"
  tar czf "$OUT/logs.tgz" -C stage logs 2>/dev/null
}
# NCCL for the context-parallel tests and example: the PyPI wheel's libnccl.so.2 (torch
# brings it), linked as the libnccl.so the loader is asked for.
nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
if [[ -n "$nccl_dir" && -f "$nccl_dir/libnccl.so.2" ]]; then
  mkdir -p stage/nccl && ln -sf "$nccl_dir/libnccl.so.2" stage/nccl/libnccl.so
  export LD_LIBRARY_PATH="$PWD/stage/nccl:$nccl_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
stage/bin/mla info >"$logs/info.log" 2>&1
head -4 "$logs/info.log"

# name  binary  timeout(s)  test arguments (the rest of the line; none: every test)
plan=(
  "load       test-gpu_load       90"
  "prims      test-gpu_primitives 150 --skip=bulk_copy --skip=tma_slabs"
  "prims-bulk test-gpu_primitives 30  bulk_copy"
  "prims-tma  test-gpu_primitives 30  tma_slabs"
  "paged      test-gpu_paged      90"
  "combine    test-gpu_combine    60"
  "merge      test-gpu_merge      90"
  "shard      test-gpu_shard      300"
  "split      test-gpu_split      240"
  "candle     test-gpu_candle     120"
  "capi       test-capi           30"
  "serving    test-gpu_serving    240"
  "interleave test-gpu_interleave  300"
  "bad-input  test-gpu_decode     30  bad_requests"
  "invariance test-gpu_decode     90  split_and_page"
  "fp8-acc    test-gpu_decode     90  fp8_accuracy"
  "corners    test-gpu_decode     180 corner_cases"
  "padded     test-gpu_decode     90  padded_cache_strides"
  "nan-key    test-gpu_decode     90  nan_in_a"
  "repeat     test-gpu_decode     180 repeated_runs"
  "matrix     test-gpu_decode     ${MLA_MATRIX_TIMEOUT:-300} case_matrix"
)
export MLA_TRACE=1
[[ "${MLA_TESTS:-1}" == 1 ]] || plan=()
# MLA_ONLY="corners matrix": run only the named entries of the plan.
if [[ -n "${MLA_ONLY:-}" ]]; then
  kept=()
  for entry in "${plan[@]}"; do
    [[ " $MLA_ONLY " == *" ${entry%% *} "* ]] && kept+=("$entry")
  done
  plan=("${kept[@]}")
fi
for entry in "${plan[@]}"; do
  read -r name bin tmo filter <<<"$entry"
  # The candle binaries are staged only by tests/gpu/stage_candle.sh.
  if [[ ! -x "stage/bin/$bin" && "$name" == candle ]]; then
    summary+=("$(printf '%-11s skipped (not staged: tests/gpu/stage_candle.sh)' "$name")")
    continue
  fi
  [[ -n "${MLA_TIMEOUT_MAX:-}" && "$tmo" -gt "$MLA_TIMEOUT_MAX" ]] && tmo=$MLA_TIMEOUT_MAX
  start=$(date +%s)
  timeout "$tmo" "stage/bin/$bin" --test-threads=1 --nocapture $filter >"$logs/$name.log" 2>&1
  rc=$?
  line=$(grep -E "^test result:" "$logs/$name.log" | tail -1)
  [[ $rc == 124 ]] && line="TIMED OUT after ${tmo}s; last: $(tail -1 "$logs/$name.log" | cut -c1-150)"
  summary+=("$(printf '%-11s rc=%-3d %4ss  %s' "$name" "$rc" "$(( $(date +%s) - start ))" "$line")")
  grep -E "SKIPPED|FAIL|panicked|checked|failures|rel L2|vs 1:|chunk|GPU runs" "$logs/$name.log" | tail -8
  save
done
# The numbered examples (examples/*.rs): each must exit 0 (03 checks its graph-replayed loop
# against the oracle).
if [[ "${MLA_TESTS:-1}" == 1 && ( -z "${MLA_ONLY:-}" || " $MLA_ONLY " == *" examples "* ) ]]; then
  for ex in stage/bin/example-*; do
    [[ -x "$ex" ]] || continue
    name=${ex#stage/bin/example-}
    timeout 120 "$ex" >"$logs/example-$name.log" 2>&1
    summary+=("$(printf '%-11s rc=%-3d  %s' "${name:0:11}" "$?" "$(tail -1 "$logs/example-$name.log" | cut -c1-120)")")
  done
  save
fi
if [[ "${MLA_TESTS:-1}" == 1 ]]; then
  stage/bin/mla demo --seed "${MLA_SEED:0:9}" >"$logs/demo.log" 2>&1
  summary+=("$(printf '%-11s rc=%-3d  %s' demo "$?" "$(tail -1 "$logs/demo.log")")")
  cat "$logs/demo.log"
fi
if [[ "${MLA_BENCH:-0}" == 1 ]]; then
  timeout 240 stage/bin/mla bench --seed "${MLA_SEED:0:9}" --json "$logs/bench.json" >"$logs/bench.log" 2>&1
  summary+=("$(printf '%-11s rc=%-3d  (table in bench.log)' bench "$?")")
  save
fi
if [[ "${MLA_BENCH_EXTRA:-0}" == 1 ]]; then
  # Page sizes 16..128 and S_q 1, 2, 3, 4 (secondary targets).
  timeout 120 stage/bin/mla bench --grid extra --seed "${MLA_SEED:0:9}" --json "$logs/bench-extra.json" >"$logs/bench-extra.log" 2>&1
  summary+=("$(printf '%-11s rc=%-3d  (table in bench-extra.log)' bench-extra "$?")")
  save
fi
if [[ -x stage/bin/mla-swfp8 ]]; then
  # The same CLI built with MLA_HW_FP8=0 (software fp8 decode): its demo checks every dtype
  # against the oracle; its bench is the fp8 A/B against the hardware conversion.
  timeout 60 stage/bin/mla-swfp8 demo --seed "${MLA_SEED:0:9}" >"$logs/demo-swfp8.log" 2>&1
  summary+=("$(printf '%-11s rc=%-3d  %s' demo-swfp8 "$?" "$(tail -1 "$logs/demo-swfp8.log")")")
  if [[ "${MLA_BENCH:-0}" == 1 ]]; then
    timeout 240 stage/bin/mla-swfp8 bench --seed "${MLA_SEED:0:9}" >"$logs/bench-swfp8.log" 2>&1
    summary+=("$(printf '%-11s rc=%-3d  (table in bench-swfp8.log)' bench-swfp8 "$?")")
  fi
  save
fi
# MLA_NCU="bf16 wg64n64 B64 L4096 H128 S1": Nsight Compute on one decode launch of that
# `mla bench` shape (MLA_NCU_KERNEL: kernel-name regex, default the decode kernels;
# MLA_NCU_GRID=short|small|extra: the bench grid the shape is in, default the default grid;
# MLA_NCU_SOURCE=1 adds the stall samples per SASS instruction as ncu-src-N.csv).
if [[ -n "${MLA_NCU:-}" ]]; then
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  IFS=',' read -ra ncu_shapes <<<"$MLA_NCU"
  for i in "${!ncu_shapes[@]}"; do
    MLA_BENCH_FILTER="${ncu_shapes[$i]}" timeout 150 "$ncu_bin" --kernel-name "regex:${MLA_NCU_KERNEL:-mla_decode_(wg|mma)}" \
      --launch-skip 3 --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
      --section LaunchStats ${MLA_NCU_SOURCE:+--section SourceCounters -o "$logs/ncu-$i"} \
      stage/bin/mla bench ${MLA_NCU_GRID:+--grid "$MLA_NCU_GRID"} >"$logs/ncu-$i.log" 2>&1
    summary+=("$(printf '%-11s rc=%-3d  %s' "ncu-$i" "$?" "${ncu_shapes[$i]} (ncu-$i.log)")")
    # MLA_NCU_SOURCE=1: also the sections and the per-SASS-instruction stall samples.
    if [[ -f "$logs/ncu-$i.ncu-rep" ]]; then
      "$ncu_bin" -i "$logs/ncu-$i.ncu-rep" --page details >>"$logs/ncu-$i.log" 2>&1
      "$ncu_bin" -i "$logs/ncu-$i.ncu-rep" --page source --csv --print-source sass >"$logs/ncu-src-$i.csv" 2>&1
      rm -f "$logs/ncu-$i.ncu-rep"
    fi
  done
  save
fi
# MLA_NSYS="bf16 wg64n64 B64 L4096 H128 S1" (the H200 machine had no nsys when last tried; MLA_NCU
# works there): Nsight Systems over `mla bench` on that
# shape through the serving path (MLA_BENCH_PLAN=1: schedule or fold, decode,
# combine), the per-kernel GPU trace (start, duration, gaps) as nsys-trace.csv: where the
# plan path's time over the decode goes. Needs nsys on the GPU machine.
if [[ -n "${MLA_NSYS:-}" ]]; then
  nsys_bin=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
  if [[ -n "$nsys_bin" ]]; then
    MLA_BENCH_PLAN=1 MLA_BENCH_FILTER="$MLA_NSYS" timeout 150 "$nsys_bin" profile --trace=cuda --force-overwrite=true \
      -o "$logs/nsys" stage/bin/mla bench >"$logs/nsys.log" 2>&1
    rc=$?
    "$nsys_bin" stats --report cuda_gpu_trace --format csv --output "$logs/nsys-trace" "$logs/nsys.nsys-rep" >>"$logs/nsys.log" 2>&1
    rm -f "$logs/nsys.nsys-rep" "$logs/nsys.sqlite"
    summary+=("$(printf '%-11s rc=%-3d  %s' nsys "$rc" "$MLA_NSYS (nsys-trace*.csv)")")
  else
    summary+=("$(printf '%-11s rc=%-3d  %s' nsys 127 "no nsys on this machine")")
  fi
  save
fi
if [[ "${MLA_PEERS:-0}" == 1 && -d stage/peers ]]; then
  timeout 420 bash benches/run_peers.sh >"$logs/peers-run.log" 2>&1
  summary+=("$(printf '%-11s rc=%-3d  (ratios in ratios.txt)' peers "$?")")
  save
fi
if [[ "${MLA_TESTS:-1}" == 1 && "${MLA_SANITIZE:-1}" != 0 ]] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    # racecheck: about 1 case in 24 (every dtype, page size, head count, S_q) at ~100x the
    # normal time; memcheck: 1 in 6.
    MLA_GPU_MATRIX=$([[ $tool == racecheck ]] && echo sparse || echo quick) \
      timeout $([[ $tool == racecheck ]] && echo 360 || echo 150) compute-sanitizer --tool "$tool" --print-limit 20 \
      stage/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix >"$logs/sanitizer-$tool.log" 2>&1
    rc=$?
    summary+=("$(printf '%-11s rc=%-3d  %s; %s' "$tool" "$rc" "$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$logs/sanitizer-$tool.log" | tail -1)" "$(grep -oE "[0-9]+ decodes checked, [0-9]+ failed" "$logs/sanitizer-$tool.log" | tail -1)")")
  done
  [[ "${MLA_SANITIZE:-1}" == decode ]] || {
  timeout 90 compute-sanitizer --tool memcheck stage/bin/test-gpu_paged --test-threads=1 >"$logs/sanitizer-paged.log" 2>&1
  summary+=("$(printf '%-11s rc=%-3d  %s' "memcheck-pg" "$?" "$(grep -E "ERROR SUMMARY" "$logs/sanitizer-paged.log" | tail -1)")")
  timeout 120 compute-sanitizer --tool memcheck stage/bin/test-gpu_serving --test-threads=1 schedule >"$logs/sanitizer-serving.log" 2>&1
  summary+=("$(printf '%-11s rc=%-3d  %s' "memcheck-sv" "$?" "$(grep -E "ERROR SUMMARY" "$logs/sanitizer-serving.log" | tail -1)")")
  }
  save
fi
echo "================ GPU suite summary (commit $(cat stage/COMMIT), seed $MLA_SEED) ================"
printf '%s\n' "${summary[@]}"
[[ -f "$logs/bench.log" ]] && cat "$logs/bench.log"
[[ -f "$logs/bench-extra.log" ]] && cat "$logs/bench-extra.log"
[[ -f "$logs/ratios.txt" ]] && cat "$logs/ratios.txt"
if [[ -n "${OUT:-}" ]]; then
  save
  for f in bench.log bench-extra.log bench-swfp8.log ratios.txt peers.json; do [[ -f "$logs/$f" ]] && cp "$logs/$f" "$OUT/"; done
fi
# The exit status is the suite's: 1 if any entry above failed.
if printf '%s\n' "${summary[@]}" | grep -qE ' rc=[1-9]'; then
  exit 1
fi
exit 0
