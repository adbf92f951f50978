#!/usr/bin/env bash
# Builds the release test binaries and the `mla` CLI, and stages them with libmla.so and
# the cubins (and, when given --peers, the peers' benchmark kit; when given --swfp8, the CLI
# built with MLA_HW_FP8=0 (software fp8 decode) as stage/bin/mla-swfp8) in ./stage, which
# git ignores. The GPU machine has no Rust: pass `stage` in the device call's carry and run
#   bash tests/gpu/run.sh
# there from the repo root. MLA_STAGE_BINS="mla test-gpu_decode" keeps only the named
# binaries (a lean stage for A/B calls that also carry the kit and variants).
set -euo pipefail
cd "$(dirname "$0")/../.."
with_peers=0
with_swfp8=0
for arg in "$@"; do
  case "$arg" in
    --peers) with_peers=1 ;;
    --swfp8) with_swfp8=1 ;;
    *) echo "usage: $0 [--peers] [--swfp8]" >&2; exit 2 ;;
  esac
done

rm -rf stage
mkdir -p stage/bin stage/ptx stage/lib
# libmla.so is the `mla` package's; the `mla` CLI is the dev crate's (dev/src/main.rs).
cargo build --release -p mla -p mla-dev --lib --bin mla
cp target/release/mla stage/bin/mla
cp target/release/libmla.so stage/lib/libmla.so
cargo test --release -p mla --no-run --message-format=json 2>/dev/null \
  | python3 tests/gpu/copy_test_bins.py stage/bin
if [[ $with_swfp8 == 1 ]]; then
  CARGO_TARGET_DIR=target/swfp8 MLA_HW_FP8=0 cargo build --release -p mla-dev --bin mla
  cp target/swfp8/release/mla stage/bin/mla-swfp8
fi
# The numbered examples (run by run.sh as part of the suite). Examples that need a feature
# the default build lacks (05 needs `candle`) are staged by their own script.
cargo build --release -p mla --examples
for ex in examples/*.rs; do
  name=$(basename "$ex" .rs)
  [[ -f "target/release/examples/$name" ]] || continue
  cp "target/release/examples/$name" "stage/bin/example-$name"
done
strip stage/bin/* stage/lib/* 2>/dev/null || true
out_dir=$(dirname "$(ls -t target/release/build/mla-*/out/mla_sm_90a.ptx | head -1)")
# The hardware fp8 decode is the default image; cargo has been seen to keep a stale
# MLA_HW_FP8=0 build of the kernels, which would stage the software conversion unnoticed.
if [[ "${MLA_HW_FP8:-}" != 0 ]] && ! awk '/\.entry /{f=($0 ~ /mla_decode_mma16_fp8\(/)}
    f && /cvt\.rn\.f16x2\.e4m3x2/ {print "hw"; exit}' "$out_dir/mla_sm_90a.ptx" | grep -q hw; then
  echo "stage.sh: the sm_90a image has the software fp8 decode; touch build.rs and rerun" >&2
  exit 1
fi
cp "$out_dir"/*.cubin stage/ptx/ 2>/dev/null || true
if [[ $with_peers == 1 ]]; then
  tar czf stage/peers.tgz -C ../shared peers
fi
if [[ -n "${MLA_STAGE_BINS:-}" ]]; then
  for f in stage/bin/*; do
    [[ " $MLA_STAGE_BINS " == *" $(basename "$f") "* ]] || rm "$f"
  done
fi
git rev-parse --short HEAD > stage/COMMIT 2>/dev/null || echo unknown > stage/COMMIT
# The binaries each embed the PTX images, so uncompressed they pass the device call's 64 MiB
# carry limit; the GPU-machine scripts unpack (tests/gpu/unpack.sh).
tar czf stage/bin.tgz -C stage bin lib ptx && rm -rf stage/bin stage/lib stage/ptx
du -sh stage
