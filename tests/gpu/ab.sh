#!/usr/bin/env bash
# A/B of kernel builds with one staged host build, on the GPU machine from the repo root
# after tests/gpu/stage.sh. Each stage/variants/NAME.cubin (a sm_90a image of this crate's
# kernels, built against the same ABI as the staged host) is loaded through
# MLA_IMAGE_FILE, and each stage/variants/NAME/ holding binaries (`stage_variant.sh --host`:
# host and kernels of another revision) runs its own: first a short correctness pass
# (corners, invariance, the bf16 case matrix, capped at MLA_AB_TIMEOUT seconds each so a
# hang costs little), then `mla bench` on the shapes matching MLA_AB_FILTER (default "bf16
# wg64n64"), MLA_AB_REPS times, interleaved across variants so that clock drift hits all
# of them alike. MLA_AB_VARIANTS="name:VAR=v,VAR=v name2:..." replaces that list with
# variants defined by environment (e.g. "old:MLA_IMAGE_FILE=stage/variants/x.cubin,MLA_PDL=0
# new:MLA_PDL=1"; a name with nothing after the colon runs the staged build as is, or a
# host variant's own binaries).
# Logs go to stage/logs/ab (and $OUT/ab.tgz); the tables are printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
logs=stage/logs/ab
mkdir -p "$logs"
source tests/gpu/unpack.sh
export MLA_SEED=${MLA_SEED:-$(date +%s%N | cut -c1-18)}
tmo=${MLA_AB_TIMEOUT:-60}
filter=${MLA_AB_FILTER:-bf16 wg64n64}
echo "commit $(cat stage/COMMIT)  seed $MLA_SEED  filter '$filter'"
if [[ -n "${MLA_AB_VARIANTS:-}" ]]; then
  read -ra variants <<<"$MLA_AB_VARIANTS"
else
  variants=()
  for v in stage/variants/*.cubin; do
    name=$(basename "$v" .cubin)
    # A host variant's binaries embed its own kernels.
    [[ -d stage/variants/$name/bin ]] && continue
    variants+=("$name:MLA_IMAGE_FILE=$v")
  done
  for d in stage/variants/*/; do
    [[ -d $d/bin ]] && variants+=("$(basename "$d"):")
  done
fi
# The binaries of variant $1: its own (a host variant), else the staged build's.
bin_of() { local d=stage/variants/$1/bin; [[ -d $d ]] && echo "$d" || echo stage/bin; }
# `env` arguments of variant $1 (name:VAR=v,VAR=v).
env_of() { local e=${1#*:}; [[ -n "$e" ]] && tr ',' ' ' <<<"$e"; }
save() { [[ -n "${OUT:-}" ]] && tar czf "$OUT/ab.tgz" -C stage/logs ab 2>/dev/null; return 0; }
if [[ "${MLA_AB_CHECK:-1}" == 1 ]]; then
  for v in "${variants[@]}"; do
    name=${v%%:*}
    for t in corner_cases split_and_page padded_cache_strides case_matrix; do
      env $(env_of "$v") MLA_GPU_MATRIX_DTYPES=${MLA_AB_DTYPES:-bf16} timeout "$tmo" "$(bin_of "$name")"/test-gpu_decode \
        --test-threads=1 --nocapture "$t" >"$logs/$name-$t.log" 2>&1
      rc=$?
      printf '%-12s %-22s rc=%-3d %s\n' "$name" "$t" "$rc" \
        "$(grep -E "^test result:|decodes checked" "$logs/$name-$t.log" | tail -1)" | tee -a "$logs/check.txt"
    done
    save
  done
fi
for rep in $(seq 1 "${MLA_AB_REPS:-1}"); do
  for v in "${variants[@]}"; do
    name=${v%%:*}
    env $(env_of "$v") MLA_BENCH_FILTER="$filter" timeout 120 "$(bin_of "$name")"/mla bench \
      --seed "${MLA_SEED:0:9}" ${MLA_AB_GRID:+--grid "$MLA_AB_GRID"} >"$logs/$name-bench-$rep.log" 2>&1
    echo "rc=$? $name rep $rep" >>"$logs/bench-rc.txt"
    save
  done
done
cat "$logs/check.txt" 2>/dev/null
for f in "$logs"/*-bench-*.log; do echo "== $f"; cat "$f"; done
save
