#!/bin/bash
# dis pass 1 A/B: before (a1204f7) vs after (row_best for top-1 activation sets), alternating, 3 rounds.
cd /tmp/sn; D=~/.cache/hubnorm/bench-data/d384
echo "# $(date -u) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2) model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2)"
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-new2 bench --peak-only --threads $t 2>&1 | tail -1)"; done
for round in 1 2 3; do
  for t in 1 2; do
    for v in new2 best; do
      /usr/bin/time -f "round $round dis bank 100000 x gallery 20000 d=384 threads=$t $v: %e s wall %U s user %M KB" /tmp/hubnorm-$v stats --gallery gal20k.parquet --bank $D/bank_100000.parquet --method dis --out /tmp/snab/dis_${v}_$t.parquet --threads $t --memory-limit 1GiB --overwrite --quiet 2>&1 | tail -1
    done
    cmp /tmp/snab/dis_new2_$t.parquet /tmp/snab/dis_best_$t.parquet && echo "round $round threads=$t: outputs identical"
  done
done
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-new2 bench --peak-only --threads $t 2>&1 | tail -1)"; done
echo "# $(date -u) done"
