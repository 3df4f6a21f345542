#!/usr/bin/env python3
"""Make the small sample data in data-samples/ from the WordNet / MiniLM development set.

Usage:
    python make_samples.py [SOURCE_DIR]

SOURCE_DIR defaults to ../../shared/dev-data/wordnet-minilm relative to this script and must hold
gallery.parquet, queries.parquet, bank.parquet and gallery_bank.parquet. The four sample files are
written next to this script.

Selection (numpy.random.default_rng(0), draws made in this order):
  1. 600 gallery rows, uniformly without replacement;
  2. every query whose target_id is one of those gallery ids (so every query has its target);
  3. 1000 bank rows, uniformly without replacement;
  4. the gallery_bank rows at the same positions as the bank rows (the source pairs them row by row:
     the definition and the lemma names of the same synset), so the two banks stay aligned.
Selected rows keep their original order. The schema (id, text, [target_id,] embedding
fixed_size_list<float32>[384]) is kept as in the source; files are written with zstd compression and
no dictionary encoding on the embedding column.

Requires: pyarrow, numpy.
"""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SEED = 0
N_GALLERY = 600
N_BANK = 1000


def pick(rng, table, n):
    """n rows of table, uniformly without replacement, in their original order."""
    if n > table.num_rows:
        raise SystemExit(f"asked for {n} rows but the table has {table.num_rows}")
    idx = np.sort(rng.choice(table.num_rows, size=n, replace=False))
    return table.take(pa.array(idx, type=pa.int64()))


def write(table, path):
    dict_cols = [name for name in table.column_names if name != "embedding"]
    pq.write_table(
        table,
        path,
        compression="zstd",
        use_dictionary=dict_cols,
    )


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        here, "..", "..", "shared", "dev-data", "wordnet-minilm")
    src = os.path.normpath(src)

    def read(name):
        return pq.read_table(os.path.join(src, name + ".parquet"))

    gallery = read("gallery")
    queries = read("queries")
    bank = read("bank")
    gallery_bank = read("gallery_bank")

    rng = np.random.default_rng(SEED)
    g = pick(rng, gallery, N_GALLERY)
    q = queries.filter(pc.is_in(queries["target_id"], value_set=g["id"]))
    bank_rows = np.sort(rng.choice(bank.num_rows, size=N_BANK, replace=False))
    b = bank.take(pa.array(bank_rows, type=pa.int64()))
    gb = gallery_bank.take(pa.array(bank_rows, type=pa.int64()))

    out = {"gallery": g, "queries": q, "bank": b, "gallery_bank": gb}
    for name, table in out.items():
        path = os.path.join(here, name + ".parquet")
        write(table, path)
        print(f"{name}.parquet: {table.num_rows} rows, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
