"""Our decode on the `wgmma` tile, as a plugin peer `mla_rs_wg`: 16- and 32-row shapes take the
small-row decode in its TMA form at every batch (plans made with MLA_TMA32_FORM=tma; the
library's default takes the `cp.async` form from 8 sequences, and the 16-row tile at 16 rows
outside large plans), for one-run A/Bs against other forms of it (peer_plugin_cp.py):

    MLA_PEER_LIST=fa3_mla,flashinfer,mla_rs,mla_rs_wg,mla_rs_cp bash benches/run_peers.sh

"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "mla_peer_plugin_wg_base", os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_plugin.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_base.FORCE_TILE = "wg64n64"
_base.FORCE_ENV = {"MLA_TMA32_FORM": "tma"}

NAME = "mla_rs_wg"
INFO = dict(_base.INFO, tile="wg64n64", form="tma")
supports = _base.supports
make = _base.make
make_fp8 = _base.make_fp8
