#!/usr/bin/env bash
# On the GPU machine, from the repo root, after tests/gpu/stage_trace.sh staged
# stage/trace/NAME and NAME-trace for each candidate: `mla bench` of every staged binary on the
# H=128 rows of `--grid short` and MLA_TRACE_AB_FILTER's rows of the default grid (default: the
# H=128 64-row TMA shapes at L=4096), MLA_TRACE_AB_REPS times (default 2), interleaved; the
# trace builds print their phase times (MLA_TRACE_PRINT=1). Logs in stage/logs/trace (and
# $OUT/trace.tgz: one file, since only a few come back from a call).
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=stage/logs/trace
mkdir -p "$logs"
f2=${MLA_TRACE_AB_FILTER:-"bf16 wg64n64 B64 L4096 H128 S1|bf16 wg64n64 B8 L4096 H128 S1|bf16 wg64n64 B128 L4096 H128 S1|bf16 wg64n64 B64 L4096 H128 S2|fp8kv_bf16q wg64n64 B64 L4096 H128 S1|fp8 wg64n64 B64 L4096 H128 S1"}
for rep in $(seq 1 "${MLA_TRACE_AB_REPS:-2}"); do
  for bin in stage/trace/*; do
    [[ -x $bin && $bin != *.rev ]] || continue
    name=$(basename "$bin")
    MLA_TRACE_PRINT=1 MLA_BENCH_FILTER="H128" timeout 60 "$bin" bench --grid short \
      >"$logs/$name-short-$rep.txt" 2>&1
    MLA_TRACE_PRINT=1 MLA_BENCH_FILTER="$f2" timeout 60 "$bin" bench \
      >"$logs/$name-default-$rep.txt" 2>&1
  done
done
[[ -n "${OUT:-}" ]] && tar czf "$OUT/trace.tgz" -C stage/logs trace
for f in "$logs"/*-1.txt; do echo "== $f"; grep -E "^(trace|bf16|fp8)" "$f"; done
