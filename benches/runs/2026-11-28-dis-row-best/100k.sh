#!/bin/bash
# dis pass 1 at 100k bank x 100k gallery, d = 384: after ac54f08, three runs per thread count.
D=~/.cache/hubnorm/bench-data/d384
echo "# $(date -u) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2) model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2)"
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-best bench --peak-only --threads $t 2>&1 | tail -1)"; done
for round in 1 2 3; do
  for t in 1 2; do
    /usr/bin/time -f "round $round dis 100000 x 100000 d=384 threads=$t: %e s wall %U s user %M KB" /tmp/hubnorm-best stats --gallery $D/gallery_100000.parquet --bank $D/bank_100000.parquet --method dis --out /tmp/snab/dis100k_$t.parquet --threads $t --memory-limit 1GiB --overwrite --quiet 2>&1 | tail -1
  done
done
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-best bench --peak-only --threads $t 2>&1 | tail -1)"; done
echo "# $(date -u) done"
