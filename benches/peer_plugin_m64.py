"""Our decode with the other tile choice, as a second plugin peer `mla_rs_m64`: the 64-row tile
everywhere (the library's default picks the 16-row tile for H * s_q <= 16), so that both tiles
appear in one run of the peers' bench:

    python3 peers/bench_mla.py --plugin benches/peer_plugin.py --plugin benches/peer_plugin_m64.py

"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "mla_peer_plugin_m64_base", os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_plugin.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_base.FORCE_TILE = "m64n64"

NAME = "mla_rs_m64"
INFO = dict(_base.INFO, tile="m64n64")
supports = _base.supports
make = _base.make
make_fp8 = _base.make_fp8
