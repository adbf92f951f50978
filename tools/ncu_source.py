#!/usr/bin/env python3
"""Summaries of Nsight Compute's source page (SASS lines with their stall samples).

    ncu ... --section SourceCounters -o F <target>
    ncu -i F.ncu-rep --page source --csv --print-source sass > F.csv
    python3 tools/ncu_source.py F.csv [G.csv ...]            # stall reasons per kernel
    python3 tools/ncu_source.py F.csv --top gmma [--n 12]     # lines with the most of one reason
    python3 tools/ncu_source.py F.csv --lines 3160:3240       # a range, with samples per line
    python3 tools/ncu_source.py F.csv --single                # one-thread code runs
    python3 tools/ncu_source.py F.csv G.csv --split           # what the warps wait on

The source page lists a column per stall reason but none for `gmma` (a warp waiting to issue
a `wgmma`, which Warp State Statistics reports): a line's samples less the listed reasons'
are counted as `gmma` here (they sat on `HGMMA` lines in every profile so far). `--single`
finds runs of lines executed with at most 1.5 threads on average (one thread's branch, such
as a copy issue), with their samples and warp instructions: such code delays the other warps
of its warpgroup at their next `wgmma`. Line numbers are rows of the CSV after its header
(stable for one report). `--split` sorts the samples by what a warp waits on: a copy (the
`mbarrier` polls: `TRYWAIT`, the vote and branch after it), a `wgmma` to complete
(`WARPGROUP.DEPBAR`), a `wgmma` to issue (`HGMMA` lines), the other warpgroup (the `barrier`
samples left, which land on the instruction after a named barrier), and everything else (the
math and hand-off code itself), with the lines that hold most of the first and fourth. Used for
docs/PERF.md 3.3.
"""
import argparse
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


class Report:
    def __init__(self, path):
        rows = list(csv.reader(open(path, newline="")))
        # Row 0 names the kernel, row 1 is the header.
        self.kernel = rows[0][1] if len(rows[0]) > 1 else "?"
        self.hdr = rows[1]
        self.rows = rows[2:]
        self.col = {h: i for i, h in enumerate(self.hdr)}
        self.reasons = [h for h in self.hdr if h.startswith("stall_") and "Not Issued" not in h]

    def get(self, row, name):
        return num(row[self.col[name]])

    def samples(self, row):
        return self.get(row, "# Samples")

    def reason(self, row, name):
        if name == "gmma":
            return self.samples(row) - sum(self.get(row, r) for r in self.reasons)
        return self.get(row, "stall_" + name)

    def names(self):
        return [r[len("stall_"):] for r in self.reasons] + ["gmma"]


def summary(rep):
    total = sum(rep.samples(r) for r in rep.rows)
    inst = sum(rep.get(r, "Instructions Executed") for r in rep.rows)
    print(f"{rep.kernel[:60]}: {total:.0f} samples, {inst / 1e6:.1f} M warp instructions")
    by = {n: sum(rep.reason(r, n) for r in rep.rows) for n in rep.names()}
    parts = [f"{n} {100 * v / total:.1f}%" for n, v in sorted(by.items(), key=lambda x: -x[1])
             if total and v / total >= 0.005]
    print("  " + ", ".join(parts))


def split(rep, n):
    """Samples by what the warps wait on (see the module docs), and the largest lines."""
    total = sum(rep.samples(r) for r in rep.rows) or 1.0
    parts = {"copy polls": [], "wgmma waits": [], "wgmma issue": [], "named barriers": [],
             "the rest": []}
    poll = False
    for i, row in enumerate(rep.rows):
        sass, v = row[1], rep.samples(row)
        if "TRYWAIT" in sass:
            poll = True
            parts["copy polls"].append((v, i))
        elif poll and ("VOTE" in sass or "BRA" in sass):
            parts["copy polls"].append((v, i))
            poll = "VOTE" in sass
        else:
            poll = False
            if "WARPGROUP.DEPBAR" in sass:
                parts["wgmma waits"].append((v, i))
            elif "HGMMA" in sass:
                parts["wgmma issue"].append((v, i))
            else:
                bar = rep.reason(row, "barrier")
                parts["named barriers"].append((bar, i))
                parts["the rest"].append((v - bar, i))
    print("  " + ", ".join(f"{k} {100 * sum(v for v, _ in p) / total:.1f}%"
                           for k, p in parts.items()))
    for k in ("copy polls", "named barriers"):
        top = sorted(parts[k], reverse=True)[:n]
        print(f"    {k}, largest lines: " + ", ".join(
            f"{i} ({100 * v / total:.1f}%)" for v, i in top if v > 0))


def line(rep, i, row):
    top = sorted(((rep.reason(row, n), n) for n in rep.names()), reverse=True)[:2]
    why = " ".join(f"{n}:{v:.0f}" for v, n in top if v > 0)
    return (f"{i:6d} {rep.samples(row):6.0f} ex={rep.get(row, 'Instructions Executed'):9.0f} "
            f"th={rep.get(row, 'Avg. Threads Executed'):4.1f}  {row[1][:64]:64s} {why}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--top", metavar="REASON", help="lines with the most samples of REASON")
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--lines", metavar="A:B", help="print lines A..B")
    ap.add_argument("--single", action="store_true", help="runs of one-thread code")
    ap.add_argument("--split", action="store_true", help="samples by what the warps wait on")
    args = ap.parse_args()
    for path in args.csv:
        rep = Report(path)
        summary(rep)
        if args.split:
            split(rep, min(args.n, 4))
        if args.top:
            if args.top not in rep.names():
                sys.exit(f"unknown reason {args.top}: one of {', '.join(rep.names())}")
            ranked = sorted(enumerate(rep.rows), key=lambda t: -rep.reason(t[1], args.top))
            for i, row in ranked[: args.n]:
                print(f"  {args.top} {rep.reason(row, args.top):6.0f} |" + line(rep, i, row))
        if args.lines:
            a, b = (int(x) for x in args.lines.split(":"))
            for i in range(max(a, 0), min(b, len(rep.rows))):
                print(line(rep, i, rep.rows[i]))
        if args.single:
            runs, cur = [], None
            for i, row in enumerate(rep.rows):
                ex = rep.get(row, "Instructions Executed")
                if ex > 0 and rep.get(row, "Avg. Threads Executed") <= 1.5:
                    if cur is None:
                        cur = [i, i, 0.0, 0.0]
                    cur[1] = i
                    cur[2] += rep.samples(row)
                    cur[3] += ex
                elif cur:
                    runs.append(cur)
                    cur = None
            if cur:
                runs.append(cur)
            total = sum(rep.samples(r) for r in rep.rows)
            one = sum(c[2] for c in runs)
            print(f"  one-thread code: {one:.0f} samples ({100 * one / max(total, 1):.1f}%), "
                  f"{sum(c[3] for c in runs) / 1e6:.2f} M warp instructions")
            for c in sorted(runs, key=lambda c: -c[2])[: args.n]:
                print(f"    lines {c[0]}-{c[1]}: {c[2]:.0f} samples, {c[3]:.0f} instructions")


if __name__ == "__main__":
    main()
