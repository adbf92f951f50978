"""Our decode with fp8 e4m3 Q and an fp8 e4m3 cache, as the plugin peer `mla_rs_fp8q_fp8`:

    python3 peers/bench_mla.py --plugin benches/peer_plugin.py --plugin benches/peer_plugin_fp8q.py

make_fp8() quantises Q per tensor (q_scale = amax|q| / 448, round to nearest, as the harness
quantises the cache) outside the timed call, then times one layer of a scheduled step as
`peer_plugin.py` does. The bf16-cache peer `mla_rs_fp8q` declines every shape: fp8 Q runs
with an fp8 cache only.
"""
import importlib.util
import os

import torch

_spec = importlib.util.spec_from_file_location(
    "mla_peer_plugin_fp8q_base", os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_plugin.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

NAME = "mla_rs_fp8q"
INFO = dict(_base.INFO, q="fp8 e4m3, per-tensor scale, quantised in make_fp8 (untimed)")
E4M3_MAX = 448.0


def supports(B, L, H, s_q, page_size, causal):
    return False, "fp8 Q runs with an fp8 cache only (peer mla_rs_fp8q_fp8)"


def supports_fp8(B, L, H, s_q, page_size, causal):
    return _base.supports(B, L, H, s_q, page_size, causal)


def make(q, kcache, block_table, seq_lens, causal, scale):
    raise RuntimeError("fp8 Q runs with an fp8 cache only (peer mla_rs_fp8q_fp8)")


def _quantize(q):
    amax = float(torch.nan_to_num(q.abs(), nan=0.0, posinf=0.0, neginf=0.0).amax().float().item())
    q_scale = amax / E4M3_MAX if amax > 0 else 1.0
    q8 = (q.float() / q_scale).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).contiguous()
    return q8, q_scale


def make_fp8(q, kcache_fp8, kv_scale, block_table, seq_lens, causal, scale):
    q8, q_scale = _quantize(q)
    return _base._make(q8, kcache_fp8, _base.MLA_FP8_E4M3, float(kv_scale), block_table, seq_lens, scale,
                       q_dtype=_base.MLA_FP8_E4M3, q_scale=float(q_scale))
