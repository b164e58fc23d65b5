#!/bin/bash
# After the fix: ferry bench under ferry trace exits 0 with an exit record; the smoke's bench and kineto
# parts pass with the defaults and with the deferred conversion.
c=.carry; f=$PWD/$c/ferry
dirs=$(python3 -c 'import glob, os, nvidia
print(":".join(d for p in nvidia.__path__ for d in sorted(glob.glob(os.path.join(p, "*", "lib")))))' 2>/dev/null)
B=(bench ingest --backend cuda --levels L1 --steps 3)
run() { local name=$1; shift; rm -rf /tmp/d-$name; LD_LIBRARY_PATH="$dirs" "$@" > $OUT/diag-$name.txt 2>&1; echo "$name: rc $?" | tee -a $OUT/rc.txt; }
run traced "$f" trace -o /tmp/d-traced -- "$f" "${B[@]}"
run lite "$f" trace --lite -o /tmp/d-lite -- "$f" "${B[@]}"
run egress "$f" trace -o /tmp/d-egress -- "$f" bench egress --backend cuda --levels L1 --steps 3
for d in traced lite egress; do echo "== $d"; "$f" analyze /tmp/d-$d 2>&1 | sed -n 1,3p; done | tee -a $OUT/rc.txt
SMOKE_PARTS="bench kineto" OUT=/tmp/sm1 timeout 150 scripts/gpu.sh trace-inject smoke > /tmp/smoke.log 2>&1; echo "smoke rc $?" | tee -a $OUT/rc.txt
cp /tmp/sm1/summary-smoke.txt $OUT/smoke-summary.txt
FERRY_TRACE_DEFER_CONVERSION=1 SMOKE_PARTS="bench kineto" OUT=/tmp/sm2 timeout 150 scripts/gpu.sh trace-inject smoke > /tmp/deferred.log 2>&1; echo "deferred smoke rc $?" | tee -a $OUT/rc.txt
cp /tmp/sm2/summary-smoke.txt $OUT/deferred-summary.txt
for d in $(ls -td /tmp/trace-inject.*); do grep -h "exit record\|exit 0\|cupti_conversion\|deferred" $d/*-analysis.txt | head -6; done | tee -a $OUT/rc.txt
tail -3 /tmp/smoke.log /tmp/deferred.log
