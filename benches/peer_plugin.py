"""Our MLA decode (libmla.so, the C ABI of this repo) as a plugin peer of the peers' bench.

    python3 peers/bench_mla.py --plugin benches/peer_plugin.py --peers flashmla_bf16,flashinfer,mla_rs,mla_rs_fp8

The library is found at $MLA_LIB, else stage/lib/libmla.so next to this repo's root
(bash tests/gpu/stage.sh --peers puts it there). One runtime per process; one plan per
shape, made in make() (not timed). As the peers compute their scheduling metadata once per
decode step outside the timed call (FlashMLA's tile-scheduler metadata, FlashInfer's plan,
FA3's scheduler metadata), make() runs the step's schedule once (mla_schedule_step) and fn()
times one layer (mla_decode_run_layer: decode + combine). With STEP = True (the wrapper
peer_plugin_step.py, peer `mla_rs_step`) fn() times schedule + decode + combine
(mla_decode_run) instead. Either way fn() launches on torch's current stream with no
allocation and no synchronisation, so the harness can capture it in a CUDA graph.
MLA_TILE=m16n64|m64n64|wg64n64|m32n64 forces the plan's tile (A/Bs of the tile rule);
MLA_WAVES=1..4 the plan's waves of CTAs (A/Bs of the split target; 0 or unset: the default).
"""
import ctypes
import os
import subprocess
import weakref

import torch

NAME = "mla_rs"

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_LIB_PATH = os.environ.get("MLA_LIB", os.path.join(_ROOT, "stage", "lib", "libmla.so"))


def _commit():
    for path in (os.path.join(_ROOT, "stage", "COMMIT"),):
        if os.path.exists(path):
            return open(path).read().strip()
    try:
        return subprocess.run(["git", "-C", _ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


INFO = {"lib": _LIB_PATH, "commit": _commit()}

MLA_BF16, MLA_FP16, MLA_FP8_E4M3 = 0, 1, 2


class PlanConfig(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("max_batch", "heads", "s_q", "page_size", "max_seq_len", "q_dtype", "kv_dtype", "waves", "tile")]


class DecodeArgs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("q", "kv_cache", "page_table", "seq_lens", "out", "lse")] + \
               [(n, ctypes.c_uint32) for n in ("batch", "num_pages", "max_pages", "_pad")] + \
               [(n, ctypes.c_uint64) for n in ("page_table_stride", "kv_page_stride")] + \
               [(n, ctypes.c_float) for n in ("softmax_scale", "output_scale", "q_scale", "kv_scale")]


_lib = None
_rt = None


def _load():
    global _lib, _rt
    if _lib is None:
        lib = ctypes.CDLL(_LIB_PATH)
        lib.mla_runtime_create.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
        lib.mla_plan_create.argtypes = [ctypes.c_void_p, ctypes.POINTER(PlanConfig), ctypes.POINTER(ctypes.c_void_p)]
        lib.mla_decode_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(DecodeArgs), ctypes.c_void_p]
        lib.mla_decode_run_layer.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(DecodeArgs),
                                             ctypes.c_void_p]
        lib.mla_schedule_step.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32,
                                          ctypes.c_uint32, ctypes.c_void_p]
        lib.mla_last_error.restype = ctypes.c_char_p
        lib.mla_plan_destroy.argtypes = [ctypes.c_void_p]
        rt = ctypes.c_void_p()
        _check(lib, lib.mla_runtime_create(torch.cuda.current_device(), ctypes.byref(rt)), "mla_runtime_create")
        _lib, _rt = lib, rt
    return _lib


def _check(lib, status, what):
    if status != 0:
        raise RuntimeError(f"{what}: status {status}: {lib.mla_last_error().decode(errors='replace')}")


# Tile forced by a wrapper plugin (peer_plugin_m64.py); None: MLA_TILE, else the library default.
FORCE_TILE = None
# True (peer_plugin_step.py): fn() runs the whole step, schedule included.
STEP = False
# Environment set only around the plan's making (wrapper plugins' per-plan A/B switches).
FORCE_ENV = {}


def _tile_for(rows):
    """C ABI tile: 0 = the library's default for the shape; with "m16n64" asked for, the 16-row
    tile (1) up to 32 rows (two row tiles); with "m64n64", the 64-row tile (2); with "wg64n64",
    the 64-row `wgmma` tile (3); with "m32n64", the 32-row tile (4) from 17 to 32 rows."""
    want = FORCE_TILE if FORCE_TILE is not None else os.environ.get("MLA_TILE")
    if want == "m16n64" and rows <= 32:
        return 1
    if want == "m64n64":
        return 2
    if want == "wg64n64":
        return 3
    if want == "m32n64" and 16 < rows <= 32:
        return 4
    return 0


def supports(B, L, H, s_q, page_size, causal):
    if s_q > 1 and not causal:
        return False, "s_q > 1 runs with the causal rule only"
    if H > 128 or s_q > 8:
        return False, "heads <= 128 and s_q <= 8"
    if page_size & (page_size - 1) or page_size > 256:
        return False, "page size must be a power of two <= 256"
    return True, ""


def _make(q, kcache, kv_dtype, kv_scale, block_table, seq_lens, scale, q_dtype=MLA_BF16, q_scale=1.0):
    lib = _load()
    B, s_q, H, _ = q.shape
    num_pages, page = kcache.shape[0], kcache.shape[1]
    max_pages = block_table.shape[1]
    L = int(seq_lens.max().item())
    cfg = PlanConfig(max_batch=B, heads=H, s_q=s_q, page_size=page, max_seq_len=max(L, max_pages * page),
                     q_dtype=q_dtype, kv_dtype=kv_dtype, waves=int(os.environ.get("MLA_WAVES", "0")),
                     tile=_tile_for(H * s_q))
    plan = ctypes.c_void_p()
    saved = {k: os.environ.get(k) for k in FORCE_ENV}
    os.environ.update(FORCE_ENV)
    try:
        _check(lib, lib.mla_plan_create(_rt, ctypes.byref(cfg), ctypes.byref(plan)), "mla_plan_create")
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    out = torch.empty((B, s_q, H, 512), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((B, s_q, H), dtype=torch.float32, device=q.device)
    args = DecodeArgs(q=q.data_ptr(), kv_cache=kcache.data_ptr(), page_table=block_table.data_ptr(),
                      seq_lens=seq_lens.data_ptr(), out=out.data_ptr(), lse=lse.data_ptr(),
                      batch=B, num_pages=num_pages, max_pages=max_pages, _pad=0,
                      page_table_stride=block_table.stride(0), kv_page_stride=kcache.stride(0),
                      softmax_scale=scale, output_scale=1.0, q_scale=q_scale, kv_scale=kv_scale)
    keep = (q, kcache, block_table, seq_lens, out, lse, plan, args)
    if STEP:
        run, what = lib.mla_decode_run, "mla_decode_run"
    else:
        # The step's schedule, once, outside the timed call (the lengths do not change).
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        _check(lib, lib.mla_schedule_step(_rt, plan, seq_lens.data_ptr(), B, max_pages, stream),
               "mla_schedule_step")
        torch.cuda.current_stream().synchronize()
        run, what = lib.mla_decode_run_layer, "mla_decode_run_layer"
    byref = ctypes.byref(args)

    def fn():
        status = run(_rt, plan, byref, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if status != 0:
            _check(lib, status, what)
        return keep[4]
    # The plan (and its workspace) lives as long as fn.
    weakref.finalize(fn, lib.mla_plan_destroy, plan)
    return fn


def make(q, kcache, block_table, seq_lens, causal, scale):
    return _make(q, kcache, MLA_BF16, 1.0, block_table, seq_lens, scale)


def make_fp8(q, kcache_fp8, kv_scale, block_table, seq_lens, causal, scale):
    return _make(q, kcache_fp8, MLA_FP8_E4M3, float(kv_scale), block_table, seq_lens, scale)
