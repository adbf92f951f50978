"""Our decode on the `wgmma` tile with the small-row decode's `cp.async` form wherever the TMA
form would run (plans made with MLA_TMA32_FORM=cp), as a plugin peer `mla_rs_cp`: the other half
of an A/B whose plain half is `mla_rs_wg` (peer_plugin_wg.py), in one run of the peers' bench.

"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "mla_peer_plugin_cp_base", os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_plugin.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_base.FORCE_TILE = "wg64n64"
_base.FORCE_ENV = {"MLA_TMA32_FORM": "cp"}

NAME = "mla_rs_cp"
INFO = dict(_base.INFO, tile="wg64n64", form="cp")
supports = _base.supports
make = _base.make
make_fp8 = _base.make_fp8
