#!/usr/bin/env python3
"""Each SM's CTA end time from a trace build's dump, to see whether a tail follows the SMs.

    MLA_TRACE_DUMP=dump.tsv MLA_TRACE_PRINT=1 MLA_BENCH_FILTER=... mla-trace bench   # GPU machine
    python3 tools/trace_sm.py dump.tsv [--gap 3]

The dump (`mla bench` of a `MLA_TRACE=1` build, docs/PERF.md 3.16) has one line per CTA: the
shape's label, the CTA, its SM, its entry and, per recorded cell, the blocks and four stamps (ns
after the call's earliest entry). A label's lines repeat once per run. For every label this
prints each SM's mean last end over the runs and its range (a stable tail has small ranges),
then the SMs grouped into classes: sorted by end, a new class where the next SM ends more than
`--gap` percent of the label's last end later. Used on the H=16 rows, where three classes of SMs stream at different rates.
"""
import argparse
import collections
import statistics
import sys


def read(path):
    """{label: {sm: [last end in us, one per run]}} from the dump's lines."""
    ends = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(path) as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 5:
                continue
            label, sm, last = fields[0], int(fields[2]), fields[-1].split()
            ends[label][sm].append(int(last[-1]) / 1000.0)
    return ends


def classes(per_sm, gap_pct):
    """The SMs sorted by mean end, cut where the next one ends more than `gap_pct` percent of
    the last end later."""
    order = sorted(per_sm, key=lambda sm: statistics.mean(per_sm[sm]))
    gap = gap_pct / 100.0 * max(statistics.mean(per_sm[sm]) for sm in order)
    groups, last = [], None
    for sm in order:
        end = statistics.mean(per_sm[sm])
        if last is None or end - last > gap:
            groups.append([])
        groups[-1].append(sm)
        last = end
    return groups


def runs_of(sms):
    """SM ids as runs: 28-31, 44-47, ..."""
    out, start, prev = [], None, None
    for sm in sorted(sms):
        if start is None:
            start = prev = sm
        elif sm == prev + 1:
            prev = sm
        else:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = prev = sm
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ", ".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump")
    ap.add_argument("--gap", type=float, default=3.0,
                    help="percent of the last end between classes (default 3)")
    args = ap.parse_args()
    ends = read(args.dump)
    if not ends:
        sys.exit(f"{args.dump}: no records")
    for label, per_sm in sorted(ends.items()):
        runs = max(len(v) for v in per_sm.values())
        spread = max(max(v) - min(v) for v in per_sm.values())
        print(f"== {label}: {len(per_sm)} SMs, {runs} run(s), widest range on one SM {spread:.1f} us")
        for group in classes(per_sm, args.gap):
            means = [statistics.mean(per_sm[sm]) for sm in group]
            print(f"  {len(group):3d} SMs end {min(means):7.1f}-{max(means):7.1f} us: {runs_of(group)}")


if __name__ == "__main__":
    main()
