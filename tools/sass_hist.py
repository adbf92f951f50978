#!/usr/bin/env python3
"""SASS instruction histogram of one kernel: the whole function and each loop.

    python3 tools/sass_hist.py mla_decode_mma16_fp8kv_bf16q [path/to/image.cubin] [--top N]

Disassembles the cubin (default: the newest built sm_90a image under target/release/build)
with nvdisasm (MLA_NVDISASM, else next to MLA_PTXAS, else the .venv wheel, else on PATH), cuts out the kernel's
.text section, and prints the opcode counts of the whole function and of every loop (a
backward branch and the code between its target label and it), largest loop first. Used to
count what a block of the main loop costs (conversions, MMAs, moves) before and after a
kernel change, without a GPU.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys


def find_nvdisasm():
    if os.environ.get("MLA_NVDISASM"):
        return os.environ["MLA_NVDISASM"]
    ptxas = os.environ.get("MLA_PTXAS")
    if ptxas:
        cand = os.path.join(os.path.dirname(ptxas), "nvdisasm")
        if os.path.exists(cand):
            return cand
    for pattern in [".venv/lib/python3*/site-packages/nvidia/cu13/bin/nvdisasm"]:
        hits = glob.glob(pattern)
        if hits:
            return hits[0]
    found = shutil.which("nvdisasm")
    if found:
        return found
    sys.exit("nvdisasm not found: set MLA_NVDISASM or MLA_PTXAS (pip install nvidia-cuda-nvdisasm)")


def newest_cubin():
    hits = glob.glob("target/release/build/mla-*/out/mla_sm_90a.cubin")
    if not hits:
        sys.exit("no built sm_90a cubin under target/release/build: cargo build --release first")
    return max(hits, key=os.path.getmtime)


INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_.]+)?)")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b.*`\((\.L_x_\d+)\)")


def kernel_lines(sass, kernel):
    start = None
    lines = sass.splitlines()
    for i, line in enumerate(lines):
        if re.match(rf"\s*\.section\s+\.text\.{re.escape(kernel)},", line):
            start = i
            break
    if start is None:
        sys.exit(f"kernel {kernel} not in the image")
    out = []
    for line in lines[start + 1:]:
        if re.match(r"\s*\.section\s", line):
            break
        out.append(line)
    return out


def histogram(lines):
    return collections.Counter(m.group(2) for m in map(INSN.search, lines) if m)


def show(title, counts, top):
    print(f"{title}: {sum(counts.values())} instructions")
    for op, n in counts.most_common(top):
        print(f"  {n:6d} {op}")


def main():
    ap = argparse.ArgumentParser(description="SASS opcode counts of one kernel, whole and per loop.")
    ap.add_argument("kernel")
    ap.add_argument("cubin", nargs="?", help="default: the newest built sm_90a image")
    ap.add_argument("--top", type=int, default=16, help="opcodes shown per table")
    args = ap.parse_args()
    cubin = args.cubin or newest_cubin()
    sass = subprocess.run([find_nvdisasm(), cubin], capture_output=True, text=True, check=True).stdout
    lines = kernel_lines(sass, args.kernel)
    print(f"{args.kernel} in {cubin}")
    show("whole function", histogram(lines), args.top)
    labels = {}
    loops = []
    for i, line in enumerate(lines):
        m = LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
        b = BRANCH.search(line)
        if b and b.group(1) in labels:
            loops.append((labels[b.group(1)], i))
    loops.sort(key=lambda r: r[0] - r[1])
    for a, b in loops[:4]:
        body = lines[a:b + 1]
        first = INSN.search("\n".join(body))
        where = f"from /*{first.group(1)}*/" if first else ""
        show(f"loop {where}", histogram(body), args.top)


if __name__ == "__main__":
    main()
