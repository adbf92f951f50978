"""Our decode timed per step, schedule included, as a second plugin peer `mla_rs_step`
(`peer_plugin.py` times one layer of a scheduled step, as the peers are timed):

    python3 peers/bench_mla.py --plugin benches/peer_plugin.py --plugin benches/peer_plugin_step.py

"""
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "mla_peer_plugin_step_base", os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_plugin.py"))
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)
_base.STEP = True

NAME = "mla_rs_step"
INFO = dict(_base.INFO, timed="schedule + decode + combine")
supports = _base.supports
make = _base.make
make_fp8 = _base.make_fp8
