"""Ours / best-peer ratios from one peers-bench JSON (same run, same harness).

    python3 benches/ratios.py peers.json [--ours mla_rs] [--markdown]

Speed ratio = best peer's time / our time (> 1: we are faster), per shape, for bf16 KV
against the best BF16 peer (FlashMLA, FlashInfer, FA3-MLA; torch_naive excluded), and for fp8 KV
against our own bf16 throughput (tokens/s) and FlashMLA's fp8 kernel where both ran; for fp8 Q
with an fp8 cache (peer mla_rs_fp8q_fp8) against the best BF16 peer. Last, per (H, s_q), each
ratio's range and geometric mean over the shapes (and the speed's geomean from B = 32), and for
s_q > 1 our time per query token over our S_q = 1 time of the same H, B, L and page where the
run has both (`--sq 1,2,3,4`; from B = 32).
"""
import json
import math
import sys

BF16_PEERS = ("flashmla_bf16", "flashinfer", "fa3_mla")


def main():
    args = sys.argv[1:]
    path = args[0]
    ours = args[args.index("--ours") + 1] if "--ours" in args else "mla_rs"
    md = "--markdown" in args
    d = json.load(open(path))
    copy = d["meta"].get("d2d_copy_GBps_read_plus_write")
    rows = {}
    for r in d["results"]:
        key = (r["H"], r["s_q"], r["B"], r["L"], r.get("page_size", 64))
        rows.setdefault(key, {})[r["peer"]] = r
    sep = " | " if md else "  "
    head = ["H", "s_q", "B", "L", "page", "ours us", "GB/s", "TFLOP/s", "%copy", "best peer", "peer us", "speed x",
            "fp8 us", "fp8/bf16 tok/s", "vs flashmla_fp8", "fp8q us", "fp8q vs best"]
    print(f"same-run copy bandwidth: {copy:.0f} GB/s" if copy else "no copy bandwidth in meta")
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(sep.join(f"{h:>10}" for h in head))
    # (H, s_q) -> ratio name -> values, for the summary.
    groups = {}

    def note(key, name, value):
        groups.setdefault((key[0], key[1]), {}).setdefault(name, []).append(value)

    for key in sorted(rows):
        peers = rows[key]
        o = peers.get(ours)
        if o is None:
            continue
        best = min((peers[p] for p in BF16_PEERS if p in peers), key=lambda r: r["us"], default=None)
        f8 = peers.get(ours + "_fp8")
        fm8 = peers.get("flashmla_fp8")
        f8q = peers.get("mla_rs_fp8q_fp8")
        if best:
            note(key, "speed x", best["us"] / o["us"])
            if key[2] >= 32:
                note(key, "speed x, B >= 32", best["us"] / o["us"])
        one = rows.get((key[0], 1) + key[2:], {}).get(ours)
        if key[1] > 1 and key[2] >= 32 and one:
            note(key, "per token / S_q=1, B >= 32", o["us"] / key[1] / one["us"])
        if f8:
            note(key, "fp8/bf16 tok/s", o["us"] / f8["us"])
        if f8 and fm8:
            note(key, "fp8 vs flashmla_fp8", fm8["us"] / f8["us"])
        if f8q and best:
            note(key, "fp8q vs best", best["us"] / f8q["us"])
        cells = [key[0], key[1], key[2], key[3], key[4], f"{o['us']:.1f}", f"{o['gbps']:.0f}", f"{o['tflops']:.1f}",
                 f"{100 * o['gbps'] / copy:.1f}" if copy else "-",
                 best["peer"] if best else "-", f"{best['us']:.1f}" if best else "-",
                 f"{best['us'] / o['us']:.2f}" if best else "-",
                 f"{f8['us']:.1f}" if f8 else "-", f"{o['us'] / f8['us']:.2f}" if f8 else "-",
                 f"{fm8['us'] / f8['us']:.2f}" if (f8 and fm8) else "-",
                 f"{f8q['us']:.1f}" if f8q else "-",
                 f"{best['us'] / f8q['us']:.2f}" if (f8q and best) else "-"]
        if md:
            print("| " + " | ".join(str(c) for c in cells) + " |")
        else:
            print(sep.join(f"{c:>10}" for c in cells))
    for (h, s_q), ratios in sorted(groups.items()):
        parts = []
        for name, vals in ratios.items():
            gm = math.exp(sum(math.log(v) for v in vals) / len(vals))
            parts.append(f"{name} {min(vals):.2f}-{max(vals):.2f} (geomean {gm:.2f}, {len(vals)} shapes)")
        print(f"H={h} s_q={s_q}: " + "; ".join(parts))
    bad = [c for c in d.get("correctness", []) if not c.get("ok")]
    print(f"correctness checks failing: {len(bad)}" + "".join(f"\n  {c}" for c in bad))
    print("status: " + ", ".join(f"{k}={v}" for k, v in d.get("status", {}).items()))


if __name__ == "__main__":
    main()
