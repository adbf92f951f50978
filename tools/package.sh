#!/usr/bin/env bash
# Packages the workspace's crates as they would be published and proves a stable-toolchain
# consumer builds against them with no ptxas and no CUDA install:
# 1. builds the kernel images here (nightly, ptxas) and copies them to ./prebuilt (ignored);
# 2. `cargo package --workspace` less the dev-only mla-dev: mla-abi, mla-host and mla (which
#    ships prebuilt/, not the kernel sources; its build script embeds those), each verified by
#    a build of the package (their path-only dev-dependencies on mla-dev are dropped);
# 3. unpacks the .crate files and builds and runs tools/downstream on the stable toolchain,
#    with every ptxas and CUDA path out of reach.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cargo build --release --lib
out_dir=$(dirname "$(ls -t target/release/build/mla-*/out/mla_sm_90a.ptx | head -1)")
rm -rf prebuilt && mkdir prebuilt
cp "$out_dir"/mla_*.ptx "$out_dir"/mla_*.cubin prebuilt/
for c in prebuilt/mla_sm_90a.cubin prebuilt/mla_sm_100a.cubin; do
  [[ -s $c ]] || { echo "package: $c is empty (no ptxas at build time)" >&2; exit 1; }
done
ptxas=${MLA_PTXAS:-$(ls "$root"/.venv/lib/python3*/site-packages/nvidia/cu13/bin/ptxas 2>/dev/null | head -1)}
"$ptxas" --version | grep release > prebuilt/ptxas-version.txt
# cargo takes registry crates of one version as unchanging: it reuses their unpacked
# sources under CARGO_HOME and their builds in the target dir. Both start fresh (the
# verification builds in its own target dir), or a rerun would verify an earlier packaging.
rm -rf target/package target/package-verify "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/mla-abi-* \
  "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/mla-host-*
cargo package --workspace --exclude mla-dev --allow-dirty --target-dir target/package-verify
mkdir -p target/package && cp target/package-verify/package/*.crate target/package/
# The consumer: the unpacked packages, patched in for crates.io's (they are unpublished).
work=$root/target/downstream
rm -rf "$work" && mkdir -p "$work/crates"
for c in target/package/mla-abi-*.crate target/package/mla-host-*.crate target/package/mla-[0-9]*.crate; do
  tar xzf "$c" -C "$work/crates"
done
cp -r tools/downstream "$work/app"
{
  cat tools/downstream/Cargo.toml.in
  for d in "$work"/crates/*/; do
    name=$(basename "$d" | sed -E 's/-[0-9]+\.[0-9]+\.[0-9]+$//')
    echo "$name = { path = \"$d\" }"
  done
} > "$work/app/Cargo.toml"
rm -f "$work/app/Cargo.toml.in"
cd "$work/app"
# Stable Rust, no ptxas, no CUDA: only the system's own paths.
env -i HOME="$HOME" PATH="$HOME/.cargo/bin:/usr/local/bin:/usr/bin:/bin" \
  CARGO_TARGET_DIR="$work/target" cargo +stable build --release
env -i HOME="$HOME" PATH="$HOME/.cargo/bin:/usr/local/bin:/usr/bin:/bin" \
  CARGO_TARGET_DIR="$work/target" cargo +stable run --release -q
