#!/bin/bash
# Streamed sn pass 1 A/B: old (5aafb5f, targets read every sweep) vs new
# (targets kept between sweeps when they fit one chunk), alternating, 3 rounds.
# Inputs as in ../2026-11-28-sinkhorn-slabs (first 10k bank rows, 20k gallery rows).
cd /tmp/sn
echo "# $(date -u) $(grep -m1 'model name' /proc/cpuinfo) family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2) model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2)"
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-new bench --peak-only --threads $t 2>&1 | tail -1)"; done
for round in 1 2 3; do
  for cfg in "384 1" "384 2" "768 2"; do
    set -- $cfg; d=$1; t=$2
    if [ $d = 384 ]; then G=gal20k.parquet; B=bank10k.parquet; else G=gal20k_768.parquet; B=bank10k_768.parquet; fi
    for v in old new; do
      /usr/bin/time -f "round $round d=$d threads=$t $v: %e s wall %U s user %M KB" /tmp/hubnorm-$v stats --gallery $G --bank $B --method sn --out /tmp/snab3/${v}_${d}_${t}.parquet --threads $t --memory-limit 256MiB --overwrite --quiet 2>&1 | tail -1
    done
    cmp /tmp/snab3/old_${d}_${t}.parquet /tmp/snab3/new_${d}_${t}.parquet && echo "round $round d=$d threads=$t: outputs identical"
  done
done
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-new bench --peak-only --threads $t 2>&1 | tail -1)"; done
echo "# $(date -u) done"
