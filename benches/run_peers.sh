#!/usr/bin/env bash
# Side by side with the best open MLA decode kernels, same harness, same run: the peers'
# benchmark (staged by `bash tests/gpu/stage.sh --peers`) with FA3-MLA's and our plugins (bf16,
# fp8 cache, fp8 Q and cache, per step), on the reference
# grid (B {1,8,32,64,128} x L {1024,4096,16384} x H {16,128} x S_q {1,2}, page 64, causal
# for S_q > 1), then ours / best-peer ratios and the same-run copy bandwidth. Extra arguments
# go to the harness: `--sq 1,2,3,4` adds the draft-token shapes, and the ratios then give our
# time per query token against our S_q=1 time.
# Run on the GPU machine from the repo root.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${MLA_LOGS:-stage/logs}
mkdir -p "$out"
source tests/gpu/unpack.sh
export MLA_LIB=${MLA_LIB:-$PWD/stage/lib/libmla.so}
PYTHONUNBUFFERED=1 python3 stage/peers/bench_mla.py --plugin benches/peer_plugin.py \
  --plugin benches/peer_plugin_step.py --plugin benches/peer_plugin_fp8q.py \
  --plugin benches/peer_plugin_wg.py --plugin benches/peer_plugin_cp.py \
  --plugin stage/peers/fa3_mla_plugin.py \
  --peers "${MLA_PEER_LIST:-flashmla_bf16,flashmla_fp8,flashinfer,fa3_mla,mla_rs,mla_rs_fp8,mla_rs_fp8q_fp8,mla_rs_step,mla_rs_step_fp8}" --json "$out/peers.json" "$@" 2>&1 | tee "$out/peers.log" | tail -5
{
  python3 benches/ratios.py "$out/peers.json"
  echo "--- timed per step, schedule included (mla_rs_step) ---"
  python3 benches/ratios.py "$out/peers.json" --ours mla_rs_step
} | tee "$out/ratios.txt"
