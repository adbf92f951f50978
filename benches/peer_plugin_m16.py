"""Our decode with the 16-row tile (rows = H * s_q <= 16), as a second plugin peer `mla_rs_m16`,
so that both tiles appear in one run of the peers' bench:

    python3 peers/bench_mla.py --plugin benches/peer_plugin.py --plugin benches/peer_plugin_m16.py

Shapes with more than 16 rows run the default tile here too.
"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "mla_peer_plugin_m16_base", os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_plugin.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_base.FORCE_TILE = "m16n64"

NAME = "mla_rs_m16"
INFO = dict(_base.INFO, tile="m16n64 where H*s_q <= 16")
supports = _base.supports
make = _base.make
make_fp8 = _base.make_fp8
