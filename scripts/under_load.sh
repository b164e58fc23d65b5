#!/usr/bin/env bash
# Runs a command several times in a row while busy loops keep every core busy, to show that the tests
# assert behaviour and not speed (a CI machine or a user's is small and shared). Each run's exit status,
# the busy loops' survival and the load average are printed; it exits non-zero if any run failed.
# Usage: scripts/under_load.sh [-n RUNS] [-j LOOPS] -- COMMAND...   (defaults: 3 runs, one loop per core)
# e.g.   scripts/under_load.sh -n 3 -- scripts/test.sh
#        scripts/under_load.sh -n 3 -- ctest --test-dir build/default -L cpu -j2
set -uo pipefail
runs=3
loops=$(nproc)
while [ $# -gt 0 ]; do
  case $1 in
    -n) runs=$2; shift 2 ;;
    -j) loops=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "under_load.sh: unknown option '$1' (usage: -n RUNS -j LOOPS -- COMMAND...)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "under_load.sh: no command after --" >&2; exit 2; }
pids=()
for _ in $(seq "$loops"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
failed=0
for k in $(seq "$runs"); do
  start=$(date -u +%T)
  "$@" > "/tmp/under_load.$k.log" 2>&1
  rc=$?
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
  echo "run $k/$runs: $start-$(date -u +%T) rc $rc, busy loops alive $alive/${#pids[@]}, load $(cut -d' ' -f1-3 /proc/loadavg), log /tmp/under_load.$k.log"
  [ "$rc" -eq 0 ] || failed=1
done
exit "$failed"
