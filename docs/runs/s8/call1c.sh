#!/usr/bin/env bash
# Session 8, device call 1c: branch combine-rows (narrow combine, 4 rows per CTA; host and
# kernels): its own combine, serving and quick-matrix tests, then the peers' harness on
# H=128/16 B=64/128 L=4096/16384 S_q=1/2 with main's and the branch's libmla.so, two
# interleaved repeats each.
set -uo pipefail
cd "$(dirname "$0")/../../.."
L=stage/s8c; mkdir -p $L
[[ -f stage/bin.tgz ]] && tar xzf stage/bin.tgz -C stage && rm stage/bin.tgz
V=stage/variants/crows
[[ -f $V/bin.tgz ]] && tar xzf $V/bin.tgz -C $V && rm $V/bin.tgz
export MLA_SEED=$(date +%s%N | cut -c1-18)
echo "commit $(cat stage/COMMIT) crows $(cat stage/variants/crows.rev) seed $MLA_SEED" | tee $L/head.txt
sv() { tar czf "$OUT/s8c.tgz" -C stage s8c 2>/dev/null; }
timeout 60 $V/bin/test-gpu_combine --test-threads=1 --nocapture > $L/combine.log 2>&1
echo "crows combine rc=$? $(grep -E '^test result' $L/combine.log)" | tee -a $L/head.txt
timeout 120 $V/bin/test-gpu_serving --test-threads=1 --nocapture > $L/serving.log 2>&1
echo "crows serving rc=$? $(grep -E '^test result' $L/serving.log)" | tee -a $L/head.txt
MLA_GPU_MATRIX=quick timeout 90 $V/bin/test-gpu_decode --test-threads=1 --nocapture case_matrix > $L/matrix.log 2>&1
echo "crows matrix-quick rc=$? $(grep -oE '[0-9]+ decodes checked, [0-9]+ failed' $L/matrix.log | tail -1)" | tee -a $L/head.txt; sv
for rep in 1 2; do
  for v in main crows; do
    lib=$PWD/stage/lib/libmla.so; [[ $v == crows ]] && lib=$PWD/$V/lib/libmla.so
    MLA_LIB=$lib PYTHONUNBUFFERED=1 timeout 100 python3 stage/peers/bench_mla.py --plugin benches/peer_plugin.py \
      --peers mla_rs --batches 64,128 --lens 4096,16384 --heads 128,16 --sq 1,2 --rep-ms 50 --deadline-s -1 \
      --json $L/harness-$v-$rep.json > $L/harness-$v-$rep.log 2>&1
    echo "harness $v $rep rc=$?" | tee -a $L/head.txt; sv
  done
done
python3 - <<'PY'
import json, glob, collections
t = collections.defaultdict(dict)
for f in sorted(glob.glob("stage/s8c/harness-*.json")):
    v = f.split("harness-")[1].rsplit(".", 1)[0]
    for r in json.load(open(f)).get("results", []):
        if r.get("peer") == "mla_rs" and r.get("us"):
            t[(r["B"], r["L"], r["H"], r["s_q"])][v] = r["us"]
cols = sorted({c for d in t.values() for c in d})
print("shape", *cols)
for k in sorted(t):
    print(k, *("%.1f" % t[k].get(c, float("nan")) for c in cols))
PY
cat $L/head.txt
