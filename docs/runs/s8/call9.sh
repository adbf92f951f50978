#!/usr/bin/env bash
# Session 8, device call 9: the schedule folded into the decode (branch fold-schedule).
# Correctness on its build (serving: the split counts the decode CTAs write against the CPU
# twin, zero-length padding, graph replays; C ABI, examples, corners, invariance, padded,
# repeat, the quick matrix; serving again with MLA_SCHED_FOLD=0, the schedule kernel path;
# memcheck on serving), then the peers' harness with main's libmla.so (stage/variants/base)
# and the branch's, two interleaved repeats.
set -uo pipefail
cd "$(dirname "$0")/../../.."
MLA_GPU_MATRIX=quick MLA_ONLY="serving capi bad-input invariance corners padded repeat matrix examples" MLA_TIMEOUT_MAX=150 MLA_SANITIZE=0 \
  bash tests/gpu/run.sh 2>&1 | grep -A40 "GPU suite summary"
L=stage/s8k; mkdir -p $L
echo "commit $(cat stage/COMMIT) base $(cat stage/variants/base.rev)" | tee $L/head.txt
sv() { tar czf "$OUT/s8k.tgz" -C stage s8k 2>/dev/null; }
MLA_SCHED_FOLD=0 timeout 120 stage/bin/test-gpu_serving --test-threads=1 --nocapture > $L/serving-nofold.log 2>&1
echo "serving MLA_SCHED_FOLD=0 rc=$? $(grep -E '^test result' $L/serving-nofold.log)" | tee -a $L/head.txt
timeout 120 compute-sanitizer --tool memcheck stage/bin/test-gpu_serving --test-threads=1 schedule > $L/memcheck-serving.log 2>&1
echo "memcheck serving rc=$? $(grep -E 'ERROR SUMMARY' $L/memcheck-serving.log | tail -1)" | tee -a $L/head.txt; sv
for rep in 1 2; do
  for v in base fold; do
    lib=$PWD/stage/lib/libmla.so; [[ $v == base ]] && lib=$PWD/stage/variants/base/lib/libmla.so
    MLA_LIB=$lib PYTHONUNBUFFERED=1 timeout 100 python3 stage/peers/bench_mla.py --plugin benches/peer_plugin.py \
      --peers mla_rs,mla_rs_fp8 --batches 1,8,64,128 --lens 4096,16384 --heads 128,16 --sq 1,2 --rep-ms 40 --deadline-s -1 \
      --json $L/harness-$v-$rep.json > $L/harness-$v-$rep.log 2>&1
    echo "harness $v $rep rc=$?" | tee -a $L/head.txt; sv
  done
done
python3 - <<'PY'
import json, glob, collections
for peer in ["mla_rs", "mla_rs_fp8"]:
    t = collections.defaultdict(dict)
    for f in sorted(glob.glob("stage/s8k/harness-*.json")):
        v = f.split("harness-")[1].rsplit(".", 1)[0]
        for r in json.load(open(f)).get("results", []):
            if r.get("peer") == peer and r.get("us"):
                t[(r["H"], r["s_q"], r["B"], r["L"])][v] = r["us"]
    cols = sorted({c for d in t.values() for c in d})
    print(peer, "H s_q B L", *cols, "fold/base")
    for k in sorted(t):
        d = t[k]
        b = min(d.get("base-1", 1e9), d.get("base-2", 1e9)); w = min(d.get("fold-1", 1e9), d.get("fold-2", 1e9))
        print(*k, *("%.1f" % d.get(c, float("nan")) for c in cols), "%.3f" % (w / b))
PY
grep -h "failing" $L/harness-*.log
cat $L/head.txt
