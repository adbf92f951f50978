#!/usr/bin/env bash
# Stages the `mla` CLI of a git revision twice, as built and as a trace build (`MLA_TRACE=1`:
# the 64-row bf16 TMA decode's phase stamps, docs/PERF.md 3.15), for timing A/Bs of the
# decode's fixed cost:
#   bash tests/gpu/stage_trace.sh REV NAME     # -> stage/trace/NAME and stage/trace/NAME-trace
# Each build happens in a git worktree under target/trace/NAME with its own target dirs
# (two full builds the first time). Run after tests/gpu/stage.sh (which wipes ./stage), or
# alone and carry `stage` with only stage/trace in it. Run several names, carry `stage`, and run
# `bash tests/gpu/trace_ab.sh` on the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# == 2 ]] || { echo "usage: $0 REV NAME" >&2; exit 2; }
rev=$1 name=$2
root=$PWD
wt=$root/target/trace/$name
git worktree remove --force "$wt" 2>/dev/null || true
rm -rf "$wt"
git worktree add --detach "$wt" "$rev" >/dev/null
mkdir -p stage/trace
for kind in plain trace; do
  tdir=$root/target/trace/target-$name-$kind
  trace=$([[ $kind == trace ]] && echo 1 || echo 0)
  (cd "$wt" && CARGO_TARGET_DIR=$tdir MLA_TRACE=$trace cargo build --release -p mla-dev --bin mla)
  out=stage/trace/$name$([[ $kind == trace ]] && echo -trace || true)
  cp "$tdir/release/mla" "$out"
  strip "$out" 2>/dev/null || true
done
git worktree remove --force "$wt"
echo "$(git rev-parse --short "$rev")" >"stage/trace/$name.rev"
du -sh stage/trace
