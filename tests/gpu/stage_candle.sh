#!/usr/bin/env bash
# Builds the `candle` feature's GPU test and example here and stages them beside the main
# stage (run after tests/gpu/stage.sh) as stage/candle.tgz, which run.sh unpacks.
# candle links the CUDA libraries at build time; this machine has none, so the link uses
# stub libraries with the real sonames that define exactly the symbols the binaries use
# (found by a first link that leaves them unresolved). On the GPU machine run.sh puts the
# real libraries (the driver's libcuda.so.1, torch's CUDA wheels) on LD_LIBRARY_PATH.
# Needs in ./.venv: nvidia-cuda-nvcc==13.0.88, nvidia-nvvm==13.0.*, nvidia-cuda-crt==13.0.*,
# nvidia-cuda-runtime==13.0.*, nvidia-cuda-cccl==13.0.* (candle-kernels runs nvcc).
set -euo pipefail
cd "$(dirname "$0")/../.."
cu=$(ls -d "$PWD"/.venv/lib/python3*/site-packages/nvidia/cu13)
stubs=$PWD/target/cuda-stubs
mkdir -p "$stubs" stage
export PATH=$cu/bin:$PATH CUDA_COMPUTE_CAP=90 CUDA_ROOT=$cu
export CARGO_TARGET_DIR=$PWD/target/candle
export RUSTFLAGS="-L $stubs -C link-arg=-Wl,--unresolved-symbols=ignore-all"
ln -sf "$cu/lib/libcudart.so.13" "$stubs/libcudart.so"
build() {
  cargo test --release --no-default-features --features candle --test gpu_candle --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and "gpu_candle" in m["target"]["name"]:
        print(m["executable"])'
  cargo build --release --no-default-features --features candle --example 05_candle_mla_layer
}
# Pass 1: empty stubs (the link succeeds, symbols left unresolved); list what is used.
echo 'void mla_stub(void) {}' >"$stubs/e.c"
for l in cuda:libcuda.so.1 nvrtc:libnvrtc.so.13 curand:libcurand.so.10 cublas:libcublas.so.13 cublasLt:libcublasLt.so.13; do
  [[ -f "$stubs/lib${l%%:*}.so" ]] || cc -shared -fPIC -o "$stubs/lib${l%%:*}.so" -Wl,-soname,"${l#*:}" "$stubs/e.c"
done
test_bin=$(build | head -1)
ex_bin=$CARGO_TARGET_DIR/release/examples/05_candle_mla_layer
nm -u --dynamic "$test_bin" "$ex_bin" 2>/dev/null | awk 'NF==2 {print $2}' | grep -v '@' | sort -u >"$stubs/undef.txt"
# Pass 2: stubs that define those symbols, so the links record each library as needed.
gen() {
  { grep -E "$3" "$stubs/undef.txt" | sed 's/.*/void &(void) {}/' || true; echo "void mla_stub_$1(void) {}"; } >"$stubs/s_$1.c"
  cc -shared -fPIC -o "$stubs/lib$1.so" -Wl,-soname,"$2" "$stubs/s_$1.c"
}
gen cuda libcuda.so.1 '^cu[A-Z]'
gen cublas libcublas.so.13 '^cublas[^L]'
gen cublasLt libcublasLt.so.13 '^cublasLt'
gen curand libcurand.so.10 '^curand'
gen nvrtc libnvrtc.so.13 '^nvrtc'
touch tests/gpu_candle.rs examples/05_candle_mla_layer.rs
test_bin=$(build | head -1)
tmp=$(mktemp -d)
mkdir -p "$tmp/bin"
cp "$test_bin" "$tmp/bin/test-gpu_candle"
cp "$ex_bin" "$tmp/bin/example-05_candle_mla_layer"
strip "$tmp"/bin/* 2>/dev/null || true
readelf -d "$tmp/bin/test-gpu_candle" | grep NEEDED
# run.sh unpacks it into stage/bin.
tar czf stage/candle.tgz -C "$tmp" bin && rm -rf "$tmp"
du -sh stage/candle.tgz
echo "staged stage/candle.tgz (bin/test-gpu_candle, bin/example-05_candle_mla_layer)"
