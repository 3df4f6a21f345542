"""Shared helpers of the peer benchmark: Parquet embedding I/O and the seeded data generator.

Used by bench.py (the driver) and peers.py (the peer jobs). Needs numpy and pyarrow only.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# ----------------------------------------------------------------------------------------------
# Reading embeddings
# ----------------------------------------------------------------------------------------------

READ_BATCH = 65536


def parquet_rows(path: str) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def parquet_dim(path: str, column: str = "embedding") -> int:
    pf = pq.ParquetFile(path)
    field = pf.schema_arrow.field(column)
    if pa.types.is_fixed_size_list(field.type):
        return field.type.list_size
    for batch in pf.iter_batches(batch_size=1, columns=[column]):
        return len(batch.column(0)[0])
    raise ValueError(f"{path}: empty table")


def _ids_to_numpy_or_list(chunks):
    arr = pa.concat_arrays(chunks) if chunks else pa.array([], pa.int64())
    if pa.types.is_integer(arr.type):
        return arr.to_numpy(zero_copy_only=False).astype(np.int64)
    return arr.to_pylist()


def load_embeddings(path: str, normalize: bool = True, id_column: str = "id",
                    column: str = "embedding", want_ids: bool = True,
                    extra_columns: tuple = ()):
    """Read (ids, X float32 (n, d), extras) in batches into one preallocated array.

    The whole table is never held as Arrow and numpy at once: the float32 matrix is filled batch by
    batch. Rows are L2-normalised in float32 like hubnorm's reader (unless normalize=False)."""
    pf = pq.ParquetFile(path)
    n = pf.metadata.num_rows
    d = parquet_dim(path, column)
    X = np.empty((n, d), dtype=np.float32)
    ids, extras = [], {c: [] for c in extra_columns}
    cols = [column] + ([id_column] if want_ids else []) + list(extra_columns)
    at = 0
    for batch in pf.iter_batches(batch_size=READ_BATCH, columns=cols):
        emb = batch.column(column)
        values = emb.flatten().to_numpy(zero_copy_only=False)
        rows = len(emb)
        X[at:at + rows] = values.reshape(rows, d)  # casts f16/f64 to f32
        at += rows
        if want_ids:
            ids.append(batch.column(id_column))
        for c in extra_columns:
            extras[c].append(batch.column(c))
    assert at == n, (path, at, n)
    if normalize:
        norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64)).astype(np.float32)
        X /= norms[:, None]
    out_ids = _ids_to_numpy_or_list(ids) if want_ids else None
    out_extras = {c: _ids_to_numpy_or_list(v) for c, v in extras.items()}
    return out_ids, X, out_extras


def load_ids(path: str, id_column: str = "id"):
    pf = pq.ParquetFile(path)
    chunks = [b.column(0) for b in pf.iter_batches(batch_size=READ_BATCH, columns=[id_column])]
    return _ids_to_numpy_or_list(chunks)


def id_index(ids):
    """Map id -> row index; fast path for int ids equal to 0..n-1."""
    if isinstance(ids, np.ndarray) and ids.dtype.kind == "i":
        if len(ids) == 0 or (ids[0] == 0 and np.array_equal(ids, np.arange(len(ids)))):
            return None  # identity
        return {int(v): i for i, v in enumerate(ids)}
    return {v: i for i, v in enumerate(ids)}


def map_ids(values, index):
    """Row indices of `values` (an Arrow array, list or numpy array) under id_index()."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_integer(values.type):
            values = values.to_numpy(zero_copy_only=False).astype(np.int64)
        else:
            values = values.to_pylist()
    if index is None:
        return np.asarray(values, dtype=np.int64)
    return np.fromiter((index[v] for v in values), dtype=np.int64, count=len(values))


# ----------------------------------------------------------------------------------------------
# Generated data
# ----------------------------------------------------------------------------------------------

GEN_VERSION = 1
GEN_SEED = 20251123
CHUNK = 65536  # generation chunk and Parquet row group
N_CENTRES = 300
OFFSET = 0.45  # weight of the shared direction: items near the global mean become hubs
MODALITY_GAP = 0.25  # query-side offset (queries and bank are the "other modality")
ITEM_NOISE = 0.8  # noise norm of a point around its centre
QUERY_NOISE = 1.4  # noise norm of a query (and a bank row) around its item

STREAM_GALLERY, STREAM_BANK, STREAM_QUERIES = 1, 2, 3


class Mixture:
    """A seeded mixture of N_CENTRES unit centres with Zipf-like weights, plus a shared offset.

    Row r of a stream depends only on (seed, stream, chunk of r), so every file of a stream is a
    prefix of the longer ones: gallery_10000 is the first 10,000 rows of gallery_1000000."""

    def __init__(self, d: int, seed: int = GEN_SEED):
        self.d, self.seed = d, seed
        rng = np.random.default_rng([seed, d, 0])
        c = rng.standard_normal((N_CENTRES, d)).astype(np.float32)
        self.centres = c / np.linalg.norm(c, axis=1, keepdims=True)
        w = 1.0 / np.arange(1, N_CENTRES + 1) ** 0.8
        self.weights = w / w.sum()
        mu = rng.standard_normal(d).astype(np.float32)
        self.mean = OFFSET * mu / np.linalg.norm(mu)
        gap = rng.standard_normal(d).astype(np.float32)
        self.gap = MODALITY_GAP * gap / np.linalg.norm(gap)

    @staticmethod
    def _normalise(x):
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x

    def chunk(self, stream: int, c: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.d, stream, c])
        z = rng.choice(N_CENTRES, size=CHUNK, p=self.weights)
        x = rng.standard_normal((CHUNK, self.d), dtype=np.float32)
        x *= ITEM_NOISE / np.sqrt(self.d)
        x += self.centres[z]
        x += self.mean
        x = self._normalise(x)
        if stream == STREAM_BANK:  # bank rows are drawn like test queries, around fresh items
            x += rng.standard_normal((CHUNK, self.d), dtype=np.float32) * (QUERY_NOISE / np.sqrt(self.d))
            x += self.gap
            x = self._normalise(x)
        return x

    def rows(self, stream: int, n: int):
        """Yield (start, block) over the first n rows of a stream, one chunk at a time."""
        for c in range((n + CHUNK - 1) // CHUNK):
            block = self.chunk(stream, c)
            start = c * CHUNK
            yield start, block[: min(CHUNK, n - start)]


def _schema(d: int, with_target: bool) -> pa.Schema:
    fields = [pa.field("id", pa.int64()), pa.field("embedding", pa.list_(pa.float32(), d))]
    if with_target:
        fields.append(pa.field("target_id", pa.int64()))
    return pa.schema(fields)


def _batch(schema, ids, X, targets=None):
    d = X.shape[1]
    emb = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1), pa.float32()), d)
    cols = [pa.array(ids, pa.int64()), emb]
    if targets is not None:
        cols.append(pa.array(targets, pa.int64()))
    return pa.record_batch(cols, schema=schema)


def _sidecar(path):
    return path + ".meta.json"


def _is_current(path, meta) -> bool:
    try:
        with open(_sidecar(path)) as f:
            return json.load(f) == meta and os.path.exists(path)
    except (OSError, ValueError):
        return False


def _finish(tmp, path, meta):
    os.replace(tmp, path)
    with open(_sidecar(path), "w") as f:
        json.dump(meta, f)


def write_stream(path: str, d: int, stream: int, n: int, log=print) -> str:
    """Gallery or bank file: the first n rows of a stream (ids 0..n-1), generated once."""
    meta = {"generator": GEN_VERSION, "seed": GEN_SEED, "d": d, "stream": stream, "rows": n}
    if _is_current(path, meta):
        return path
    log(f"generating {path} ({n} x {d})")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mix = Mixture(d)
    schema = _schema(d, False)
    tmp = path + f".tmp-{os.getpid()}"
    with pq.ParquetWriter(tmp, schema, compression="snappy") as w:
        for start, block in mix.rows(stream, n):
            w.write_batch(_batch(schema, np.arange(start, start + len(block)), block),
                          row_group_size=CHUNK)
    _finish(tmp, path, meta)
    return path


def write_queries(path: str, d: int, n_gallery: int, n_queries: int, log=print) -> str:
    """Queries: noisy copies (plus the modality gap) of n_queries distinct gallery items among the
    first n_gallery; target_id = that item's id. Generated by one pass over the gallery stream."""
    meta = {"generator": GEN_VERSION, "seed": GEN_SEED, "d": d, "stream": STREAM_QUERIES,
            "gallery_rows": n_gallery, "rows": n_queries}
    if _is_current(path, meta):
        return path
    log(f"generating {path} ({n_queries} x {d}, targets among {n_gallery} gallery items)")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    mix = Mixture(d)
    rng = np.random.default_rng([GEN_SEED, d, STREAM_QUERIES, n_gallery, n_queries])
    targets = rng.choice(n_gallery, size=n_queries, replace=False).astype(np.int64)
    noise = rng.standard_normal((n_queries, d), dtype=np.float32) * (QUERY_NOISE / np.sqrt(d))
    Q = np.empty((n_queries, d), dtype=np.float32)
    order = np.argsort(targets, kind="stable")
    sorted_t = targets[order]
    for start, block in mix.rows(STREAM_GALLERY, n_gallery):
        lo, hi = np.searchsorted(sorted_t, [start, start + len(block)])
        sel = order[lo:hi]
        Q[sel] = block[targets[sel] - start]
    Q += noise
    Q += mix.gap
    Q /= np.linalg.norm(Q, axis=1, keepdims=True)
    schema = _schema(d, True)
    tmp = path + f".tmp-{os.getpid()}"
    with pq.ParquetWriter(tmp, schema, compression="snappy") as w:
        for s in range(0, n_queries, CHUNK):
            e = min(n_queries, s + CHUNK)
            w.write_batch(_batch(schema, np.arange(s, e), Q[s:e], targets[s:e]), row_group_size=CHUNK)
    _finish(tmp, path, meta)
    return path
