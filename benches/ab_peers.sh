#!/usr/bin/env bash
# A/B of kernel builds in the peers' harness, on the GPU machine from the repo root after
# `bash tests/gpu/stage.sh --peers` (and tests/gpu/stage_variant.sh for each variant): the
# staged build ("main") and every stage/variants/NAME.cubin (loaded through
# MLA_IMAGE_FILE: same kernel ABI as the staged host; a variant staged with --host runs its
# own libmla.so through MLA_LIB instead), our peers timed on the shapes file
# $1 in MLA_AB_PASSES (default 2) passes, the variants alternating inside each pass so that
# clock drift hits all alike; the peers (MLA_AB_REF, default FlashMLA bf16 and fp8,
# FlashInfer, FA3-MLA; empty: none) once. Extra arguments go to the harness. Then
# benches/ab_ratios.py: each variant's time (the faster pass) against main's, per shape and
# as geomeans. MLA_AB_ENV="name:VAR=v,VAR=v name2:..." adds variants of the staged build
# defined by environment (e.g. "cp:MLA_TMA_CP=all"). JSONs in stage/logs/abp (and
# $OUT/abp.tgz).
#   bash benches/ab_peers.sh stage/shapes.json --rep-ms 20 --warmup-ms 10
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 SHAPES.json [harness arguments]" >&2; exit 2; }
shapes=$1
shift
out=stage/logs/abp
rm -rf "$out"
mkdir -p "$out"
source tests/gpu/unpack.sh
export MLA_LIB=${MLA_LIB:-$PWD/stage/lib/libmla.so}
ours=${MLA_AB_PEERS:-mla_rs,mla_rs_fp8,mla_rs_fp8q_fp8}
ref=${MLA_AB_REF-flashmla_bf16,flashmla_fp8,flashinfer,fa3_mla}
harness=(python3 stage/peers/bench_mla.py --plugin benches/peer_plugin.py
  --plugin benches/peer_plugin_fp8q.py --plugin stage/peers/fa3_mla_plugin.py
  --shapes "$shapes" --deadline-s=-1)
variants=(main)
for v in stage/variants/*.cubin; do
  [[ -f $v ]] && variants+=("$(basename "$v" .cubin)")
done
declare -A env_of=()
for e in ${MLA_AB_ENV:-}; do
  variants+=("${e%%:*}")
  env_of[${e%%:*}]=$(tr ',' ' ' <<<"${e#*:}")
done
echo "commit $(cat stage/COMMIT)  variants: ${variants[*]}"
if [[ -n $ref ]]; then
  "${harness[@]}" --peers "$ref" --json "$out/peers.json" "$@" >"$out/peers.log" 2>&1
fi
for pass in $(seq 1 "${MLA_AB_PASSES:-2}"); do
  for v in "${variants[@]}"; do
    img=()
    if [[ -n "${env_of[$v]:-}" ]]; then
      # shellcheck disable=SC2206 # VAR=v words, split on purpose
      img=(env ${env_of[$v]})
    elif [[ -f stage/variants/$v/lib/libmla.so ]]; then
      # A host variant (stage_variant.sh --host): its own library, kernels and launch shapes.
      img=(env "MLA_LIB=$PWD/stage/variants/$v/lib/libmla.so")
    elif [[ $v != main ]]; then
      img=(env "MLA_IMAGE_FILE=$PWD/stage/variants/$v.cubin")
    fi
    "${img[@]}" "${harness[@]}" --peers "$ours" --json "$out/$v-$pass.json" "$@" \
      >"$out/$v-$pass.log" 2>&1 || echo "variant $v pass $pass: harness exit $?"
  done
done
python3 benches/ab_ratios.py "$out" | tee "$out/ratios.txt"
[[ -n "${OUT:-}" ]] && tar czf "$OUT/abp.tgz" -C stage/logs abp
exit 0
