#!/usr/bin/env bash
# Stages another git revision's build beside the main stage, for A/Bs in one device call.
# Run after tests/gpu/stage.sh (which wipes ./stage):
#   bash tests/gpu/stage_variant.sh REV NAME          # kernels only: stage/variants/NAME.cubin
#   bash tests/gpu/stage_variant.sh --host REV NAME   # also stage/variants/NAME/bin.tgz
# The cubin is the sm_90a image of REV's kernels, loaded on the GPU machine through
# MLA_IMAGE_FILE by the main stage's host (tests/gpu/ab.sh runs every stage/variants/*.cubin);
# it is only valid where REV's kernel ABI (lib.rs's names and layouts) equals the main
# stage's. With --host, REV's libmla.so (for the peers' harness: MLA_LIB) and its test
# binaries and `mla` CLI go to stage/variants/NAME/ as well, for changes that touch host and
# kernels (tests/gpu/ab.sh then runs that variant's own binaries); MLA_STAGE_BINS="mla
# test-gpu_decode" keeps only the named binaries, as in tests/gpu/stage.sh.
# The build happens in a git worktree under target/variants/NAME (its own target dir).
set -euo pipefail
cd "$(dirname "$0")/../.."
host=0
if [[ "${1:-}" == --host ]]; then host=1; shift; fi
[[ $# == 2 ]] || { echo "usage: $0 [--host] REV NAME" >&2; exit 2; }
rev=$1 name=$2
[[ -d stage ]] || { echo "no ./stage: run tests/gpu/stage.sh first" >&2; exit 2; }
root=$PWD
wt=$root/target/variants/$name
git worktree remove --force "$wt" 2>/dev/null || true
rm -rf "$wt"
git worktree add --detach "$wt" "$rev" >/dev/null
export CARGO_TARGET_DIR=$root/target/variants/target-$name
(cd "$wt" && cargo build --release --lib)
out_dir=$(dirname "$(ls -t "$CARGO_TARGET_DIR"/release/build/mla-*/out/mla_sm_90a.cubin | head -1)")
[[ -s $out_dir/mla_sm_90a.cubin ]] || { echo "no sm_90a cubin built (set MLA_PTXAS)" >&2; exit 1; }
mkdir -p stage/variants
cp "$out_dir/mla_sm_90a.cubin" "stage/variants/$name.cubin"
if [[ $host == 1 ]]; then
  mkdir -p "stage/variants/$name/lib" "stage/variants/$name/bin"
  cp "$CARGO_TARGET_DIR/release/libmla.so" "stage/variants/$name/lib/"
  (cd "$wt" && cargo test --release --no-run --message-format=json 2>/dev/null) \
    | python3 tests/gpu/copy_test_bins.py "stage/variants/$name/bin"
  (cd "$wt" && cargo build --release -p mla-dev --bin mla)
  cp "$CARGO_TARGET_DIR/release/mla" "stage/variants/$name/bin/mla"
  if [[ -n "${MLA_STAGE_BINS:-}" ]]; then
    for f in "stage/variants/$name"/bin/*; do
      [[ " $MLA_STAGE_BINS " == *" $(basename "$f") "* ]] || rm "$f"
    done
  fi
  strip "stage/variants/$name"/bin/* "stage/variants/$name"/lib/* 2>/dev/null || true
  tar czf "stage/variants/$name/bin.tgz" -C "stage/variants/$name" bin lib \
    && rm -rf "stage/variants/$name/bin" "stage/variants/$name/lib"
fi
echo "$(git rev-parse --short "$rev")" >"stage/variants/$name.rev"
git worktree remove --force "$wt"
du -sh stage/variants
