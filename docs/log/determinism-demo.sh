#!/bin/bash
# Two runs of one seed on this machine, the second beside two busy loops (artificial load).
cd /work/wt41
export OMP_NUM_THREADS=1
P=${1:-cpu_smoke}; IT=${2:-2}
nice -n 10 .venv/bin/spotlight run --preset $P --iterations $IT --run-dir /tmp/wt41/det-$P-a --overwrite > /tmp/wt41/det-$P-a.log 2>&1
nice -n 10 python3 -c "while True: pass" & L1=$!
nice -n 10 python3 -c "while True: pass" & L2=$!
nice -n 10 .venv/bin/spotlight run --preset $P --iterations $IT --run-dir /tmp/wt41/det-$P-b --overwrite > /tmp/wt41/det-$P-b.log 2>&1
kill $L1 $L2
echo done
