"""Kernel builds against each other in the peers' harness (benches/ab_peers.sh's JSONs).

    python3 benches/ab_ratios.py DIR [--base main]

DIR holds VARIANT-PASS.json per variant and pass (our peers) and, optionally, peers.json
(the reference peers, timed once). Per our peer and shape: each variant's time (the faster
of its passes, the harness's median of each) and its ratio to the base variant's (< 1:
faster), with the best bf16 peer's time over the base's (> 1: the base is faster); then per
our peer and H, each variant's geomean ratio, range and shape count. Ratios measure only
within one run: the variants alternate inside each pass.
"""
import glob
import json
import math
import os
import re
import sys

BF16_PEERS = ("flashmla_bf16", "flashinfer", "fa3_mla")


def load(path):
    out = {}
    for r in json.load(open(path))["results"]:
        if "us" in r:
            out[(r["peer"], r["H"], r["s_q"], r["B"], r["L"], r.get("page_size", 64))] = r["us"]
    return out


def main():
    args = sys.argv[1:]
    if not args:
        print(__doc__)
        return 2
    d = args[0]
    base = args[args.index("--base") + 1] if "--base" in args else "main"
    runs = {}
    for p in sorted(glob.glob(os.path.join(d, "*-*.json"))):
        m = re.fullmatch(r"(.+)-(\d+)\.json", os.path.basename(p))
        if m:
            runs.setdefault(m.group(1), []).append(load(p))
    if base not in runs:
        print(f"no {base}-N.json in {d}")
        return 1
    ref = load(os.path.join(d, "peers.json")) if os.path.exists(os.path.join(d, "peers.json")) else {}
    names = [base] + sorted(v for v in runs if v != base)

    def best(v, k):
        ts = [r[k] for r in runs[v] if k in r]
        return min(ts) if ts else None

    keys = sorted({k for r in runs[base] for k in r})
    logs = {}
    print("peer H S_q B L page | " + " | ".join(names) + " | " + " | ".join(
        f"{v}/{base}" for v in names[1:]) + " | best bf16 peer / " + base)
    for k in keys:
        t = {v: best(v, k) for v in names}
        if t[base] is None:
            continue
        peers = [ref[(p,) + k[1:]] for p in BF16_PEERS if (p,) + k[1:] in ref]
        cells = [f"{t[v]:.1f}" if t[v] else "-" for v in names]
        ratios = []
        for v in names[1:]:
            if t[v]:
                ratios.append(f"{t[v] / t[base]:.3f}")
                logs.setdefault((k[0], k[1], v), []).append(math.log(t[v] / t[base]))
            else:
                ratios.append("-")
        rp = f"{min(peers) / t[base]:.2f}" if peers else "-"
        print(" ".join(str(x) for x in k) + " | " + " | ".join(cells) + " | " + " | ".join(ratios)
              + " | " + rp)
    print()
    for (peer, h, v), ls in sorted(logs.items()):
        r = [math.exp(x) for x in ls]
        print(f"{peer} H={h} {v}/{base}: geomean {math.exp(sum(ls) / len(ls)):.4f} "
              f"({min(r):.3f}-{max(r):.3f}, {len(ls)} shapes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
