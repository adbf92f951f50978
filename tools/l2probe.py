"""One peer's call made as the peers' harness makes it, run after an L2 flush eight times
(eagerly, or replayed from a CUDA graph with `--graph`): a target for Nsight Compute with
`--cache-control none`, so the kernels see the L2 that
the flush left (the harness's own, zeroing, or a read, a nonzero fill or an increment of the
same 256 MB: `tools/timeline.py`'s `l2_flushes`).

    ncu --cache-control none --clock-control none --kernel-name regex:"splitkv_mla|mla_decode" \\
        --launch-skip 4 --launch-count 2 \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python3 tools/l2probe.py PEER zero|read|fill|bump H,S_q,B,L [--kit stage/peers]

PEER: flashmla_bf16, or ours: mla_rs (bf16), mla_rs_fp8 (fp8 cache, bf16 Q), mla_rs_fp8q_fp8.

With `--graph` the call is captured once and replayed after each flush, as the harness times it
(add `--graph-profiling node` to ncu; the launch counts then count the graph's kernel nodes).

Needs the staged peers' kit (`tests/gpu/stage.sh --peers`) and, for ours, the staged
`libmla.so` (`benches/peer_plugin.py`, `benches/peer_plugin_fp8q.py`). The harness's inputs (seed 1234), page 64 unless
`--page` says otherwise.
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("peer", choices=["flashmla_bf16", "mla_rs", "mla_rs_fp8", "mla_rs_fp8q_fp8"])
    ap.add_argument("flush", choices=["zero", "read", "fill", "bump"])
    ap.add_argument("shape", help="H,S_q,B,L")
    ap.add_argument("--kit", default=str(ROOT / "stage" / "peers"))
    ap.add_argument("--page", type=int, default=64, help="tokens per page")
    ap.add_argument("--graph", action="store_true",
                    help="capture the call in a CUDA graph and replay it, as the harness times it "
                         "(profile its kernels with ncu --graph-profiling node)")
    args = ap.parse_args()
    sys.path.insert(0, args.kit)
    sys.path.insert(0, str(ROOT / "tools"))
    import torch
    import bench_mla as bm

    from timeline import l2_flushes, peer_call

    h, sq, b, seq = (int(x) for x in args.shape.split(","))
    plugins, _ = bm.load_plugins(
        [str(ROOT / "benches" / p) for p in ("peer_plugin.py", "peer_plugin_fp8q.py")],
        lambda *a: None,
    )
    peers = bm.Peers({args.peer}, lambda k, s: None, plugins)
    inputs = bm.make_inputs(b, seq, h, sq, 1234, page=args.page)
    fn = peer_call(peers, args.peer, inputs, sq > 1, bm.D_QK ** -0.5)
    flush = l2_flushes(torch)[args.flush]
    call = fn
    if args.graph:
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        call = g.replay
    for _ in range(8):
        flush()
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
