#!/bin/bash
# Pass 1 (`stats --method is`, default 2 GiB limit) A/B: old (95b0c0a: the gallery
# read in one chunk before the tiles start) vs new (read ahead in pieces while the
# bank is cached), alternating, 3 rounds. Bank: the first 10k rows of bank_100000
# (/tmp/sn/bank10k.parquet), or all 100k.
D=~/.cache/hubnorm/bench-data/d384
echo "# $(date -u) $(grep -m1 'model name' /proc/cpuinfo) family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2) model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2)"
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-new bench --peak-only --threads $t 2>&1 | tail -1)"; done
for round in 1 2 3; do
  for cfg in "10k 1000000 1" "10k 1000000 2" "10k 100000 2" "100k 100000 2"; do
    set -- $cfg; b=$1; g=$2; t=$3
    if [ $b = 10k ]; then B=/tmp/sn/bank10k.parquet; else B=$D/bank_100000.parquet; fi
    for v in old new; do
      /usr/bin/time -f "round $round bank=$b gallery=$g threads=$t $v: %e s wall %U s user %S s sys %M KB" /tmp/hubnorm-$v stats --gallery $D/gallery_$g.parquet --bank $B --method is --out /tmp/raab/${v}.parquet --threads $t --overwrite --quiet 2>&1 | tail -1
    done
    cmp /tmp/raab/old.parquet /tmp/raab/new.parquet && echo "round $round bank=$b gallery=$g threads=$t: outputs identical"
  done
done
for t in 1 2; do echo "peak threads=$t: $(/tmp/hubnorm-new bench --peak-only --threads $t 2>&1 | tail -1)"; done
echo "# $(date -u) done"
