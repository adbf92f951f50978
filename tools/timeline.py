"""Where a timed call of the peers' harness spends its time: a kernel timeline of replayed calls.

    python3 tools/timeline.py [--kit stage/peers] [--peers flashmla_bf16,fa3_mla,mla_rs]
        [--shapes "H,S_q,B,L;..."] [--iters 40]

For each shape and peer the call is made as the peers' harness makes it (its `Peers` and
plugins, our `benches/peer_plugin.py`), captured in a CUDA graph, and replayed as
`triton.testing.do_bench` does: the 256 MB cache zeroed, a start event, the replay, an end
event. It prints the event-timed median under six settings of what comes before the call:
- `zero`: the harness's own (zero the cache: L2 full of dirty lines);
- `none`: nothing (the call's own data may sit in L2);
- `read`: read the cache instead (L2 full of clean lines);
- `fill`: write a nonzero constant instead (dirty lines that are not zeros);
- `bump`: add one to every word (read and written: dirty lines of changing data);
- `zero+idle`: zero, then wait for the GPU to drain before the replay is queued (the call pays
  its own launch and any clock ramp);
then, from a torch profiler (CUPTI) trace of the `zero` setting, each kernel's median duration
and the gaps between them: from the flush's end to the first kernel of the call, and between
the call's kernels (negative: they overlap, as programmatic dependent launch allows).

`--clocks S` adds, per peer and for the `zero`, `read` and `none` settings, S seconds of
replays in that setting while `nvidia-smi` samples the GPU every 10 ms: the median SM clock,
memory clock and power draw, and the clock-event reasons seen (power or thermal capping). A
compute-bound kernel follows the SM clock, so a peer whose loop holds a higher clock in one
setting than another (or than ours) shows it here.
"""
import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_shapes(text):
    shapes = []
    for item in text.split(";"):
        h, sq, b, seq = (int(x) for x in item.split(","))
        shapes.append((h, sq, b, seq))
    return shapes


def peer_call(peers, name, inputs, causal, scale, fp8_kv=None):
    """The zero-argument call the peers' harness times for peer `name` (its `Peers` made it
    available), on `inputs` = (q, kcache, block_table, seq_lens); `None` for a peer that this
    tool does not make (FlashMLA's bf16 kernel and plugin peers only). A plugin's fp8 peer
    gets the cache as the harness gives it, `fp8_kv` = (e4m3 cache, scale) from
    `bench_mla.quantize_fp8_per_tensor(kcache)` (made here when not passed)."""
    q, kc, bt, sl = inputs
    if name == "flashmla_bf16":
        return peers.make_flashmla_bf16(q, kc, bt, sl, causal, scale)
    if name in peers.plugin_peers:
        plugin, fp8 = peers.plugin_peers[name]
        if fp8:
            if fp8_kv is None:
                import bench_mla

                fp8_kv = bench_mla.quantize_fp8_per_tensor(kc)
            return plugin.make_fp8(q, fp8_kv[0], fp8_kv[1], bt, sl, causal, scale)
        return plugin.make(q, kc, bt, sl, causal, scale)
    return None


def l2_flushes(torch):
    """The harness's L2 flush (`zero`: zeroing a 256 MB buffer, as `do_bench` does), a
    read of the same buffer (`read`), a fill with a nonzero constant (`fill`) and an
    increment of every word (`bump`: read and written, data that changes each time), as
    callables."""
    cache = torch.zeros(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    sink = torch.empty(1, dtype=torch.int64, device="cuda")

    def zero():
        cache.zero_()

    def read():
        sink.copy_(cache.sum(dtype=torch.int64).view(1))

    def fill():
        cache.fill_(0x5A5A5A5A)

    def bump():
        cache.add_(1)
    return {"zero": zero, "read": read, "fill": fill, "bump": bump}


# Older drivers name the reasons `clocks_throttle_reasons`; the first set nvidia-smi takes wins.
SMI_FIELDS = ["clocks.sm,clocks.mem,power.draw,clocks_event_reasons.active",
              "clocks.sm,clocks.mem,power.draw,clocks_throttle_reasons.active",
              "clocks.sm,clocks.mem,power.draw"]


@functools.lru_cache(maxsize=None)
def smi_fields():
    """The first of `SMI_FIELDS` that this nvidia-smi accepts, or None (asked once)."""
    for fields in SMI_FIELDS:
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if r.returncode == 0:
            return fields
    return None


def sample_clocks(torch, g, before, seconds):
    """Replays `g` after `before` for `seconds` while `nvidia-smi` samples the GPU every
    10 ms; returns (median SM MHz, median memory MHz, median W, set of active clock-event
    reason masks, samples), or None without `nvidia-smi`."""
    dev = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    fields = smi_fields()
    if fields is None:
        return None
    smi = subprocess.Popen(["nvidia-smi", "-i", dev, f"--query-gpu={fields}",
                            "--format=csv,noheader,nounits", "-lms", "10"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    time.sleep(0.3)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(50):
            before()
            g.replay()
        torch.cuda.synchronize()
    smi.terminate()
    out, _ = smi.communicate()
    rows = []
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]),
                         parts[3] if len(parts) > 3 else "-"))
        except (ValueError, IndexError):
            continue
    # The first samples may predate the loop: keep the last 80% of them.
    rows = rows[len(rows) // 5:]
    if not rows:
        return None
    return (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows),
            statistics.median(r[2] for r in rows), sorted({r[3] for r in rows}), len(rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit", default=str(ROOT / "stage" / "peers"))
    ap.add_argument("--peers", default="flashmla_bf16,fa3_mla,mla_rs")
    ap.add_argument("--shapes", default="16,2,128,256;16,2,128,1024;128,1,64,256;128,1,64,1024")
    ap.add_argument("--iters", type=int, default=40)
    ap.add_argument("--page", type=int, default=64)
    ap.add_argument("--clocks", type=float, default=0.0,
                    help="seconds of replays per peer and setting while sampling clocks (0: off)")
    args = ap.parse_args()

    sys.path.insert(0, args.kit)
    import torch
    import bench_mla as bm

    plugins, failures = bm.load_plugins([str(ROOT / "benches" / "peer_plugin.py"),
                                         str(Path(args.kit) / "fa3_mla_plugin.py")], print)
    for k, v in failures.items():
        print(k, v)
    wanted = set(args.peers.split(","))
    peers = bm.Peers(wanted, lambda k, s: print(f"peer {k}: {s}"), plugins)
    flush = l2_flushes(torch)

    def idle():
        flush["zero"]()
        torch.cuda.synchronize()
    settings = {"zero": flush["zero"], "none": lambda: None, "read": flush["read"],
                "fill": flush["fill"], "bump": flush["bump"], "zero+idle": idle}

    def timed(g, before, n):
        ts = []
        for _ in range(n):
            before()
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            ts.append((s, e))
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e3 for s, e in ts)

    for h, sq, b, seq in parse_shapes(args.shapes):
        causal = sq > 1
        q, kc, bt, sl = bm.make_inputs(b, seq, h, sq, 1234, page=args.page)
        scale = bm.D_QK ** -0.5
        print(f"\n== H={h} S_q={sq} B={b} L={seq} page={args.page}")
        for name in args.peers.split(","):
            if not peers.ok(name):
                print(f"  {name}: not available: {peers.status.get(name)}")
                continue
            fn = peer_call(peers, name, (q, kc, bt, sl), causal, scale)
            if fn is None:
                print(f"  {name}: not handled here")
                continue
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            g.replay()
            torch.cuda.synchronize()
            for _ in range(3):
                timed(g, settings["zero"], 20)
            line = []
            for k, before in settings.items():
                line.append(f"{k} {timed(g, before, args.iters):7.1f}")
            print(f"  {name:14s} event-timed median us: " + "  ".join(line))
            for k in ("zero", "read", "none") if args.clocks > 0 else ():
                got = sample_clocks(torch, g, settings[k], args.clocks)
                if got is None:
                    print(f"  {'':14s} clocks ({k}): no nvidia-smi samples")
                    continue
                sm, mem, watts, reasons, n = got
                print(f"  {'':14s} clocks ({k}): SM {sm:.0f} MHz, memory {mem:.0f} MHz, "
                      f"{watts:.0f} W, clock-event reasons {reasons} ({n} samples)")

            acts = [torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(args.iters):
                    flush["zero"]()
                    g.replay()
                torch.cuda.synchronize()
            kern = []
            for ev in prof.events():
                if ev.device_type != torch.autograd.DeviceType.CUDA:
                    continue
                kern.append((ev.time_range.start, ev.time_range.end, ev.name))
            kern.sort()
            # Split into calls at each flush kernel (the fill of `cache`).
            calls, cur, flush_end = [], None, None
            for st, en, nm in kern:
                if "fill" in nm.lower() or "memset" in nm.lower():
                    if cur:
                        calls.append((flush_end, cur))
                    cur, flush_end = [], en
                elif cur is not None:
                    cur.append((st, en, nm))
            if cur:
                calls.append((flush_end, cur))
            calls = calls[2:]
            if not calls:
                print("  no calls in the trace")
                continue
            nk = statistics.mode(len(c) for _, c in calls)
            calls = [(f, c) for f, c in calls if len(c) == nk]
            names = [nm for _, _, nm in calls[0][1]]
            first_gap = statistics.median(c[0][0] - f for f, c in calls)
            span = statistics.median(c[-1][1] - f for f, c in calls)
            print(f"  {'':14s} trace: {len(calls)} calls of {nk} kernels; flush end -> first kernel "
                  f"{first_gap:.1f} us, flush end -> last kernel end {span:.1f} us")
            for i, nm in enumerate(names):
                dur = statistics.median(c[i][1] - c[i][0] for _, c in calls)
                gap = (statistics.median(c[i][0] - c[i - 1][1] for _, c in calls) if i else first_gap)
                print(f"  {'':14s}   {dur:7.1f} us  (start {gap:+6.1f} after the previous end)  {nm[:90]}")
        del q, kc, bt, sl
        torch.cuda.empty_cache()


if __name__ == "__main__":
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/peers_flashinfer")
    main()
