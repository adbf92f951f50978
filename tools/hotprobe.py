"""Each peer's call timed twice per shape: as the peers' harness times it (the KV in DRAM, a
zeroing L2 flush before every replay) and "hot" (every block-table entry folded onto the
first `--hot-pages` pages, so the whole KV a call reads sits in L2, and no flush). The hot
time is the kernel's compute and hand-off path with the copies' latency cut to L2's: if a
peer's lead stays when both run hot, the lead is in the math path, not in the copy pipeline.

    python3 tools/hotprobe.py --peers flashmla_bf16,mla_rs --shapes 128,1,64,4096 128,3,32,16384 \\
        [--kit stage/peers] [--reps 50]

Needs the staged peers' kit (`tests/gpu/stage.sh --peers`; `bench_mla.py` and `vendor/`
suffice for our plugins alone) and, for ours (`mla_rs`, `mla_rs_fp8`, `mla_rs_fp8q_fp8`), the
staged `libmla.so`. Page 64, the
harness's inputs (seed 1234); CUDA graph replays timed with events, median.
"""
import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="flashmla_bf16,mla_rs")
    ap.add_argument("--shapes", nargs="+", required=True, help="H,S_q,B,L ...")
    ap.add_argument("--kit", default=str(ROOT / "stage" / "peers"))
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--hot-pages", type=int, default=64)
    args = ap.parse_args()
    sys.path.insert(0, args.kit)
    sys.path.insert(0, str(ROOT / "tools"))
    import torch
    import bench_mla as bm

    from timeline import l2_flushes, peer_call

    names = args.peers.split(",")
    plugins, _ = bm.load_plugins(
        [str(ROOT / "benches" / f) for f in ("peer_plugin.py", "peer_plugin_fp8q.py")],
        lambda *a: None,
    )
    peers = bm.Peers(set(names), lambda k, s: None, plugins)
    flush = l2_flushes(torch)["zero"]

    def timed(call, do_flush):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(args.reps):
            if do_flush:
                flush()
            start.record()
            call()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) * 1e3)
        return statistics.median(out)

    print("shape (H,S_q,B,L) | " + " | ".join(f"{n} cold / hot us" for n in names))
    for shape in args.shapes:
        h, sq, b, seq = (int(x) for x in shape.split(","))
        q, kc, bt, sl = bm.make_inputs(b, seq, h, sq, 1234, page=64)
        hot_bt = (bt % min(args.hot_pages, kc.shape[0])).contiguous()
        # The fp8 peers' cache, quantised once per shape (the harness's per-tensor e4m3).
        fp8_kv = (bm.quantize_fp8_per_tensor(kc)
                  if any(peers.plugin_peers.get(n, (None, False))[1] for n in names) else None)
        row = []
        for name in names:
            times = []
            for table in (bt, hot_bt):
                fn = peer_call(peers, name, (q, kc, table, sl), sq > 1, bm.D_QK ** -0.5,
                               fp8_kv)
                fn()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                for _ in range(3):
                    g.replay()
                torch.cuda.synchronize()
                times.append(timed(g.replay, table is bt))
            row.append(f"{times[0]:8.1f} / {times[1]:8.1f}")
        print(f"{shape:>16} | " + " | ".join(row), flush=True)


if __name__ == "__main__":
    main()
