#!/bin/bash
# Samples a GPU box every 10 s while bundles run (benchmarks/run_bundles.sh): the load, the busiest
# processes, and each test process's threads (state, kernel wait channel, CPU): a busy reference
# tells itself from a stuck one.  usage: benchmarks/box_monitor.sh > $OUT/mon.txt &
while true; do
  echo "=== $(date +%T) $(cat /proc/loadavg)"
  ps -eo pid,nlwp,pcpu,etimes,rss,comm --sort=-pcpu | head -10
  for p in $(pgrep -f "pytest" | head -6); do
    echo "-- pid $p: $(tr '\0' ' ' </proc/$p/cmdline | cut -c1-150)"
    ps -Lo tid,pcpu,stat,wchan:24 -p $p | awk 'NR==1 || $2>0.5 || NR<6' | head -24
  done
  sleep 10
done
