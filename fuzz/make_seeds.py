"""Writes the committed seed corpus of the fuzz targets (fuzz/seeds/).

Run from the repository root with numpy and pyarrow installed:

    python fuzz/make_seeds.py

Every file is small (a few hundred bytes to a few KB) and deterministic:
tiny embedding tables of each shape the reader accepts (and a few it
rejects with a typed error), and NUL-separated argument lists for the CLI.
"""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")
TABLES = os.path.join(ROOT, "read_embeddings")
ARGS = os.path.join(ROOT, "cli_options")


def vectors(rows, dim, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, dim)).astype(dtype)


def fixed(values, value_type=pa.float32()):
    rows, dim = values.shape
    flat = pa.array(values.reshape(-1), type=value_type)
    return pa.FixedSizeListArray.from_arrays(flat, dim)


def listed(values, value_type=pa.float32(), large=False):
    rows, dim = values.shape
    flat = pa.array(values.reshape(-1), type=value_type)
    offsets = np.arange(0, rows * dim + 1, dim, dtype=np.int64 if large else np.int32)
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets), flat)


def write(name, table, **kwargs):
    kwargs.setdefault("compression", "NONE")
    pq.write_table(table, os.path.join(TABLES, name), **kwargs)


def tables():
    os.makedirs(TABLES, exist_ok=True)
    # Gallery shape: int64 ids, fixed_size_list<float32, 4>.
    write(
        "fsl_f32_int64.parquet",
        pa.table({"id": pa.array(range(6), pa.int64()), "embedding": fixed(vectors(6, 4, 1))}),
    )
    # Query shape: string ids, list<float32> (dimension learnt from the first
    # row), a scalar string ground-truth column.
    write(
        "list_f32_utf8_target.parquet",
        pa.table(
            {
                "id": pa.array([f"q{i}" for i in range(5)]),
                "embedding": listed(vectors(5, 3, 2)),
                "target_id": pa.array([f"g{i % 3}" for i in range(5)]),
            }
        ),
    )
    # List-of-ids ground truth, float16 fixed-size list, snappy, dictionary ids.
    write(
        "fsl_f16_utf8_target_list.parquet",
        pa.table(
            {
                "id": pa.array([f"item-{i}" for i in range(4)]),
                "embedding": fixed(vectors(4, 2, 3, np.float16), pa.float16()),
                "target_id": pa.array([[1, 2], [3], [], [4, 5, 6]], pa.list_(pa.int64())),
            }
        ),
        compression="snappy",
        use_dictionary=True,
    )
    # int32 ids, large_list<float64>, zstd, two row groups, data page v2.
    write(
        "large_list_f64_int32_zstd.parquet",
        pa.table({"id": pa.array(range(8), pa.int32()), "embedding": listed(vectors(8, 3, 4, np.float64), pa.float64(), large=True)}),
        compression="zstd",
        row_group_size=4,
        data_page_version="2.0",
    )
    # large_string ids, lz4 (LZ4_RAW), an extra column the reader skips.
    write(
        "fsl_f32_largeutf8_lz4.parquet",
        pa.table(
            {
                "text": pa.array(["a", "b", "c"]),
                "id": pa.array(["x", "y", "z"], pa.large_string()),
                "embedding": fixed(vectors(3, 5, 5)),
            }
        ),
        compression="lz4",
    )
    # Rejected with a typed error: a null embedding row, a zero vector, a
    # ragged list, a NaN, a null id, no rows, a wrong embedding type.
    emb = listed(vectors(3, 2, 6))
    write(
        "bad_null_embedding.parquet",
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "embedding": pa.array([[1.0, 2.0], None, [3.0, 4.0]], pa.list_(pa.float32()))}),
    )
    write(
        "bad_zero_vector.parquet",
        pa.table({"id": pa.array([1, 2], pa.int64()), "embedding": fixed(np.array([[1, 0], [0, 0]], np.float32))}),
    )
    write(
        "bad_ragged.parquet",
        pa.table({"id": pa.array(["a", "b"]), "embedding": pa.array([[1.0, 2.0], [3.0]], pa.list_(pa.float32()))}),
    )
    write(
        "bad_nan.parquet",
        pa.table({"id": pa.array([1, 2], pa.int64()), "embedding": fixed(np.array([[1, 2], [np.nan, 1]], np.float32))}),
    )
    write(
        "bad_null_id.parquet",
        pa.table({"id": pa.array(["a", None, "c"]), "embedding": emb}),
    )
    write(
        "bad_empty.parquet",
        pa.table({"id": pa.array([], pa.int64()), "embedding": fixed(np.zeros((0, 4), np.float32))}),
    )
    write(
        "bad_int_embedding.parquet",
        pa.table({"id": pa.array([1, 2], pa.int64()), "embedding": pa.array([[1, 2], [3, 4]], pa.list_(pa.int32()))}),
    )


CLI = {
    "run_methods": ["run", "--queries", "q.parquet", "--gallery", "g", "--bank", "b/*.parquet", "--out", "out",
                    "--methods", "is,dis,nnn,csls", "--beta", "30", "--nnn-k", "16", "--memory-limit", "256MiB"],
    "run_sinkhorn": ["run", "--queries", "q", "--gallery", "g", "--bank", "b", "--out", "o", "--method", "sn",
                     "--tau", "0.05", "--iterations", "3", "--tol", "1e-3", "--threads", "2", "--no-normalize"],
    "run_transductive": ["run", "--queries", "q", "--gallery", "g", "--transductive", "--out", "o",
                         "--method", "sinkhorn-pp", "--pseudo-queries", "0", "--seed", "7", "--bank-sample", "100"],
    "stats_gc": ["stats", "--gallery", "g", "--bank", "b", "--out", "s.parquet", "--method", "gc",
                 "--bank-sample", "10", "--seed", "3", "--id-column", "doc_id", "--embedding-column", "vec"],
    "stats_update": ["stats", "--gallery", "g", "--bank", "b", "--out", "s.parquet", "--update", "--quiet"],
    "search_dual": ["search", "--queries", "q", "--gallery", "g", "--stats", "s.parquet", "--out", "r.parquet",
                    "--method", "dual-is", "--beta1", "10", "--beta2", "2", "--k", "5", "--recall-at", "1,5",
                    "--skip-missing", "--target-column", "gt"],
    "compare_html": ["compare", "--queries", "q", "--gallery", "g", "--bank", "b", "--out", "o", "--hubness-k", "5",
                     "--html", "x.html", "--bootstrap", "0", "--methods", "none,dn,dsl", "--lambda", "0.3", "--theta", "0.02"],
    "report_k0": ["report", "--results", "r.parquet", "--gallery", "g", "--queries", "q", "--k", "0", "--out", "o"],
    "tune_split": ["tune", "--gallery", "g", "--bank", "b", "--validation-split", "0.2", "--grid", "beta=10,20",
                   "--grid", "nnn.k=16,64", "--metric", "r5", "--recall-at", "1,5", "--methods", "is,nnn", "--out", "o"],
    "tune_validation": ["tune", "--gallery", "g", "--bank", "b", "--validation", "v", "--metric", "mrr",
                        "--grid", "sn.t=1,2", "--tol", "0.01", "--out", "o"],
    "export_nnn": ["export", "--gallery", "g", "--stats", "s", "--method", "nnn", "--alpha", "0.5", "--nnn-k", "8",
                   "--out", "e.parquet", "--activation-k", "2"],
    "sql_tables": ["sql", "select 1", "--table", "a=b.parquet", "--format", "csv", "--memory-limit", "1GiB"],
    "bench_dims": ["bench", "--dims", "8,16", "--rows", "64"],
    "help": ["run", "--help"],
}


def cli():
    os.makedirs(ARGS, exist_ok=True)
    for name, args in CLI.items():
        with open(os.path.join(ARGS, name), "wb") as f:
            f.write(b"\0".join(a.encode() for a in args))


if __name__ == "__main__":
    tables()
    cli()
