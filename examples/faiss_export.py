"""Serve hubnorm's corrected ranking from a FAISS inner-product index.

`hubnorm.export` appends h(g) to every gallery vector; a normalised query
with -1 appended then scores <[q, -1], [g, h(g)]> = s(q, g) - h(g), the
corrected score, in any inner-product index. This script builds the
statistics, exports, searches with `faiss.IndexFlatIP`, and checks the lists
against hubnorm's own `search` (run by python/tests as a test).

    pip install ./python faiss-cpu numpy
    python examples/faiss_export.py [data-samples/] [--method is] [--k 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import faiss
import numpy as np
import pyarrow.parquet as pq

import hubnorm


def same_lists(expected: list[tuple[str, float]], got: list[tuple[str, float]],
               tolerance: float = 1e-5) -> bool:
    """The same scores rank by rank (f32 sums in another order: to
    `tolerance`), and the same ids except where two scores tie within it
    (at the last rank, with an item just outside the list)."""
    if len(expected) != len(got):
        return False
    if any(abs(e[1] - g[1]) > tolerance for e, g in zip(expected, got)):
        return False
    for rank, (e, g) in enumerate(zip(expected, got)):
        if e[0] != g[0]:
            neighbours = [expected[j][1] for j in (rank - 1, rank + 1) if 0 <= j < len(expected)]
            last = rank == len(expected) - 1
            if not last and not any(abs(e[1] - n) <= tolerance for n in neighbours):
                return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", default="data-samples")
    parser.add_argument("--method", default="is")
    parser.add_argument("--k", type=int, default=10)
    args = parser.parse_args()
    path = lambda name: os.path.join(args.data, f"{name}.parquet")

    with tempfile.TemporaryDirectory() as scratch:
        stats = os.path.join(scratch, "gallery_stats.parquet")
        hubnorm.stats(path("gallery"), path("bank"), methods=args.method, out=stats, progress=False)
        gallery = hubnorm.export(path("gallery"), stats, method=args.method,
                                 out=os.path.join(scratch, "gallery_export.parquet"), progress=False)
        ids = gallery["id"].to_pylist()
        vectors = np.stack(gallery["embedding"].to_numpy(zero_copy_only=False)).astype("float32")
        index = faiss.IndexFlatIP(vectors.shape[1])  # or any inner-product index (HNSW, IVF)
        index.add(vectors)

        queries = pq.read_table(path("queries"))
        q = np.stack(queries["embedding"].to_numpy(zero_copy_only=False)).astype("float64")
        q = q / np.linalg.norm(q, axis=1, keepdims=True)  # as hubnorm normalises
        q = np.hstack([q, np.full((len(q), 1), hubnorm.QUERY_SUFFIX)]).astype("float32")
        scores, rows = index.search(q, args.k)  # scores = s(q, g) - h(g)

        results, _ = hubnorm.search(path("queries"), path("gallery"), stats=stats,
                                    methods=args.method, k=args.k,
                                    out=os.path.join(scratch, "results.parquet"), progress=False)
    mine = results.filter(results["method"].to_numpy(zero_copy_only=False) == args.method)
    by_query: dict[str, list[tuple[str, float]]] = {}
    for query_id, gallery_id, score in zip(mine["query_id"].to_pylist(),
                                           mine["gallery_id"].to_pylist(),
                                           mine["score"].to_pylist()):
        by_query.setdefault(query_id, []).append((gallery_id, score))

    differing = 0
    for i, query_id in enumerate(queries["id"].to_pylist()):
        expected = by_query[query_id]
        got = [(ids[r], float(s)) for r, s in zip(rows[i], scores[i])]
        differing += not same_lists(expected, got)
    print(f"{len(by_query)} queries, top-{args.k} of {args.method}: FAISS IndexFlatIP over the export "
          f"gives hubnorm's lists for all but {differing}")
    return 0 if differing == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
