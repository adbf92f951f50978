"""FlashMLA's split schedule for the peers' harness shapes: after the harness's first call
(which builds the scheduler metadata), prints each sequence's piece count (from the
cumulative `num_splits`) and the parts (`tile_scheduler_metadata` rows: first and last
sequence, first block of the first and end block of the last).

    python3 tools/flashmla_meta.py --kit stage/peers --shapes "128,3,32,4096;128,1,8,1024"

Shapes are H,S_q,B,L (page 64, the harness's inputs, seed 1234). Compare with our work
list's cut (`host::plan::work_list`) to see how many sequences each splits and how many
partial bytes its combine reads (pieces of split sequences x S_q x H x 512 x 4 bytes).
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", default=str(ROOT / "stage" / "peers"))
    ap.add_argument("--shapes", required=True, help='"H,S_q,B,L;..."')
    args = ap.parse_args()
    sys.path.insert(0, args.kit)
    import torch
    import bench_mla as bm

    peers = bm.Peers({"flashmla_bf16"}, lambda k, s: None, [])
    if peers.fm is None:
        sys.exit(f"FlashMLA not loaded: {peers.status}")
    for shape in args.shapes.split(";"):
        h, sq, b, seq = (int(x) for x in shape.split(","))
        q, kc, bt, sl = bm.make_inputs(b, seq, h, sq, 1234)
        sched, _ = peers.fm.get_mla_metadata()
        peers.fm.flash_mla_with_kvcache(q, kc, bt, sl, bm.D_V, sched, None,
                                        softmax_scale=bm.D_QK ** -0.5, causal=sq > 1)
        torch.cuda.synchronize()
        cum = sched.num_splits.tolist()
        pieces = [cum[i + 1] - cum[i] for i in range(len(cum) - 1)]
        split = [p for p in pieces if p > 1]
        partial_mb = sum(split) * sq * h * bm.D_V * 4 / 1e6
        print(f"H={h} S_q={sq} B={b} L={seq}: {len(split)} of {b} sequences split, "
              f"{sum(split)} pieces with partials ({partial_mb:.1f} MB); pieces {pieces}")
        for row in sched.tile_scheduler_metadata.tolist():
            print(f"  part: sequences {row[0]}..{row[1]}, blocks {row[2]} .. {row[3]}")


if __name__ == "__main__":
    main()
