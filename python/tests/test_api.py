"""The Python package against the CLI on data-samples/: the same files byte
for byte where files are written, the same tables otherwise; inputs as paths,
pyarrow tables and readers, numpy arrays, pandas and polars frames (lazy
ones too); the
error types; progress; Ctrl-C in a child interpreter, and resuming after it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import hubnorm

METHODS = "is,dis,nnn,csls,gc,dn,dual-is,dual-dis"


def bytes_of(path: Path) -> bytes:
    return Path(path).read_bytes()


def sample(samples: Path, name: str) -> str:
    return str(samples / f"{name}.parquet")


def test_run_writes_the_cli_files(cli, samples, tmp_path):
    cli("run", "--queries", sample(samples, "queries"), "--gallery", sample(samples, "gallery"),
        "--bank", sample(samples, "bank"), "--gallery-bank", sample(samples, "gallery_bank"),
        "--methods", METHODS, "--k", "10", "--beta", "25", "--out", str(tmp_path / "cli"))
    run = hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"), sample(samples, "bank"),
                      gallery_bank=sample(samples, "gallery_bank"), methods=METHODS, k=10, beta=25,
                      out=tmp_path / "py", progress=False)
    for name in hubnorm.RUN_OUTPUTS:
        assert bytes_of(tmp_path / "py" / name) == bytes_of(tmp_path / "cli" / name), name
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert run.summary == summary
    names = ["none"] + METHODS.split(",")
    assert [m["method"] for m in run.summary["methods"]] == names
    assert run.summary["methods"][1]["parameters"]["beta"] == 25
    assert run.results.num_rows == 600 * len(names) * 10
    assert run.gallery_stats.num_rows == 600
    # A run without out= keeps its files in a temporary directory; write()
    # copies them, byte for byte, and refuses to replace them.
    again = hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"),
                        sample(samples, "bank"), gallery_bank=sample(samples, "gallery_bank"),
                        methods=METHODS, k=10, beta=25, progress=False)
    written = again.write(tmp_path / "copy")
    for name in hubnorm.RUN_OUTPUTS:
        assert bytes_of(Path(written) / name) == bytes_of(tmp_path / "cli" / name), name
    with pytest.raises(hubnorm.UsageError, match="already exists"):
        again.write(tmp_path / "copy")
    # Over them with overwrite, and into its own directory (a no-op), the
    # files stay whole and no scratch file is left.
    again.write(tmp_path / "copy", overwrite=True)
    assert sorted(os.listdir(tmp_path / "copy")) == sorted(hubnorm.RUN_OUTPUTS)
    assert again.write(again.directory, overwrite=True) == again.directory
    for name in hubnorm.RUN_OUTPUTS:
        assert bytes_of(Path(again.directory) / name) == bytes_of(tmp_path / "cli" / name), name
    directory = again.directory
    del again
    assert not os.path.exists(directory)


def test_stats_and_search_write_the_cli_files(cli, samples, tmp_path):
    cli("stats", "--gallery", sample(samples, "gallery"), "--bank", sample(samples, "bank"),
        "--methods", "is,nnn", "--out", str(tmp_path / "cli_stats.parquet"), "--quiet")
    cli("search", "--queries", sample(samples, "queries"), "--gallery", sample(samples, "gallery"),
        "--stats", str(tmp_path / "cli_stats.parquet"), "--methods", "is,nnn", "--k", "5",
        "--out", str(tmp_path / "cli_results.parquet"), "--quiet")
    table = hubnorm.stats(sample(samples, "gallery"), sample(samples, "bank"), methods=["is", "nnn"],
                          out=tmp_path / "py_stats.parquet", progress=False)
    assert bytes_of(tmp_path / "py_stats.parquet") == bytes_of(tmp_path / "cli_stats.parquet")
    assert table.equals(pq.read_table(tmp_path / "cli_stats.parquet"))
    # The results record the stats file's path: the same file for both.
    results, summary = hubnorm.search(sample(samples, "queries"), sample(samples, "gallery"),
                                      stats=tmp_path / "cli_stats.parquet", methods="is,nnn", k=5,
                                      out=tmp_path / "py_results.parquet", progress=False)
    assert bytes_of(tmp_path / "py_results.parquet") == bytes_of(tmp_path / "cli_results.parquet")
    assert results.num_rows == 600 * 2 * 5
    assert [m["method"] for m in summary["methods"]] == ["is", "nnn"]
    # The figures the CLI prints: skew(N10), R@1 and MRR per method.
    printed = cli("search", "--queries", sample(samples, "queries"), "--gallery",
                  sample(samples, "gallery"), "--stats", str(tmp_path / "cli_stats.parquet"),
                  "--methods", "is,nnn", "--k", "5", "--out", str(tmp_path / "again.parquet")).stdout
    rows = [line.split() for line in printed.splitlines() if line.startswith(("is ", "nnn "))]
    for row, method in zip(rows, summary["methods"]):
        assert row[2] == f"{method['k_occurrence_skewness']:.3f}", (row, method)
        assert row[3] == f"{100 * method['R@1']:.2f}", (row, method)
        assert row[-1] == f"{method['MRR']:.4f}", (row, method)
    assert len(rows) == 2


def in_memory_forms(path: str):
    """The table at `path` as every in-memory input the package takes."""
    table = pq.read_table(path)
    yield "pyarrow.Table", table
    yield "RecordBatchReader", pa.RecordBatchReader.from_batches(table.schema, table.to_batches(100))
    pandas = pytest.importorskip("pandas")
    yield "pandas", pandas.DataFrame(table.to_pandas())
    categorical = table.to_pandas()
    categorical["id"] = categorical["id"].astype("category")
    yield "pandas, categorical ids", categorical
    yield "pandas, ids as the index", table.to_pandas().set_index("id")
    yield "pandas, ids in a MultiIndex", table.to_pandas().set_index(["id", "text"])
    polars = pytest.importorskip("polars")
    yield "polars", polars.from_arrow(table)
    yield "polars LazyFrame", polars.from_arrow(table).lazy().filter(polars.col("id").is_not_null())


def results_rows(table: pa.Table) -> pa.Table:
    return table.replace_schema_metadata(None)


def test_in_memory_inputs_give_the_path_results(samples):
    kwargs = dict(methods="is,nnn", k=5, progress=False)
    by_path = hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"),
                          sample(samples, "bank"), **kwargs)
    expected = results_rows(by_path.results)
    for label, gallery in in_memory_forms(sample(samples, "gallery")):
        run = hubnorm.run(sample(samples, "queries"), gallery, sample(samples, "bank"), **kwargs)
        assert results_rows(run.results).equals(expected), label
        assert run.summary["methods"] == by_path.summary["methods"], label
    # numpy arrays: ids 0..n-1 unless given, ground truth through embeddings().
    queries = pq.read_table(sample(samples, "queries"))
    gallery = pq.read_table(sample(samples, "gallery"))
    bank = pq.read_table(sample(samples, "bank"))
    matrix = lambda t: np.stack(t.column("embedding").to_numpy(zero_copy_only=False))
    q = hubnorm.embeddings(matrix(queries), ids=queries.column("id"),
                           targets=queries.column("target_id"))
    g = hubnorm.embeddings(matrix(gallery), ids=gallery.column("id"))
    run = hubnorm.run(q, g, matrix(bank), **kwargs)
    assert results_rows(run.results).equals(expected)
    assert run.summary["methods"] == by_path.summary["methods"]
    # Unsigned ids (numpy's uint64) come back as Int64.
    unsigned = hubnorm.embeddings(matrix(gallery), ids=np.arange(gallery.num_rows, dtype=np.uint64))
    run = hubnorm.run(matrix(queries), unsigned, matrix(bank), **kwargs)
    assert run.results.schema.field("gallery_id").type == pa.int64()
    assert run.results.column("gallery_id").to_pylist() == \
        [gallery.column("id").to_pylist().index(i) for i in expected.column("gallery_id").to_pylist()]


def test_tables_with_other_column_names_are_read_with_columns(samples, tmp_path):
    kwargs = dict(methods="is,nnn", k=5, progress=False)
    expected = hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"),
                           sample(samples, "bank"), **kwargs)
    names = {"id": "doc_id", "embedding": "vector", "target_id": "label"}
    renamed = {}
    for name in ("queries", "gallery", "bank"):
        table = pq.read_table(sample(samples, name))
        table = table.rename_columns([names.get(c, c) for c in table.column_names])
        renamed[name] = str(tmp_path / f"{name}.parquet")
        pq.write_table(table, renamed[name])
    columns = {"id": "doc_id", "embedding": "vector", "target": "label"}
    run = hubnorm.run(renamed["queries"], renamed["gallery"], renamed["bank"],
                      columns=columns, **kwargs)
    assert results_rows(run.results).equals(results_rows(expected.results))
    assert run.summary["methods"] == expected.summary["methods"]
    # The stats and the search read the same names.
    stats = tmp_path / "stats.parquet"
    hubnorm.stats(renamed["gallery"], renamed["bank"], out=stats, methods="is",
                  columns=columns, progress=False)
    found, _ = hubnorm.search(renamed["queries"], renamed["gallery"], stats=stats,
                              out=tmp_path / "results.parquet", methods="is", k=5,
                              columns=columns, progress=False)
    assert found.num_rows == 5 * pq.read_metadata(renamed["queries"]).num_rows
    # A target column named there must be there; unknown keys are refused.
    with pytest.raises(hubnorm.InputError, match="missing"):
        hubnorm.run(renamed["queries"], renamed["gallery"], renamed["bank"],
                    columns={**columns, "target": "nope"}, **kwargs)
    with pytest.raises(hubnorm.UsageError, match="columns: unknown key 'ids'"):
        hubnorm.run(renamed["queries"], renamed["gallery"], renamed["bank"],
                    columns={"ids": "doc_id"}, **kwargs)
    # Without columns=, the default names are looked for, and named.
    with pytest.raises(hubnorm.InputError, match="'id'"):
        hubnorm.run(renamed["queries"], renamed["gallery"], renamed["bank"], **kwargs)


def cpu_has_avx512_bf16() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return " avx512_bf16" in flags


def test_screened_precision_gives_the_exact_results(samples):
    args = (sample(samples, "queries"), sample(samples, "gallery"), sample(samples, "bank"))
    kwargs = dict(methods="is,nnn", k=5, progress=False)
    exact = hubnorm.run(*args, **kwargs)
    auto = hubnorm.run(*args, precision="auto", **kwargs)
    assert results_rows(auto.results).equals(results_rows(exact.results))
    if cpu_has_avx512_bf16():
        screened = hubnorm.run(*args, precision="screened", **kwargs)
        assert results_rows(screened.results).equals(results_rows(exact.results))
        assert screened.summary["screen"]["rescored_pairs"] < screened.summary["screen"]["screened_pairs"]
        footer = pq.read_metadata(os.path.join(screened.directory, "results.parquet")).metadata
        assert footer[b"hubnorm.precision"] == b"screened"
    else:
        with pytest.raises(hubnorm.UsageError, match="AVX512_BF16"):
            hubnorm.run(*args, precision="screened", **kwargs)
    with pytest.raises(hubnorm.UsageError, match="exact, screened or auto"):
        hubnorm.run(*args, precision="half", **kwargs)


def test_stats_screen_top_k_statistics_to_the_exact_file(samples, tmp_path):
    args = (sample(samples, "gallery"), sample(samples, "bank"))
    kwargs = dict(methods="nnn,csls,dissim-local", progress=False)
    exact = hubnorm.stats(*args, out=tmp_path / "exact.parquet", **kwargs)
    auto = hubnorm.stats(*args, out=tmp_path / "auto.parquet", precision="auto", **kwargs)
    assert auto.equals(exact)
    footer = pq.read_metadata(tmp_path / "auto.parquet").metadata
    assert footer[b"hubnorm.precision"] == (b"screened" if cpu_has_avx512_bf16() else b"exact")
    if not cpu_has_avx512_bf16():
        with pytest.raises(hubnorm.UsageError, match="AVX512_BF16"):
            hubnorm.stats(*args, out=tmp_path / "screened.parquet", precision="screened", **kwargs)
        assert not (tmp_path / "screened.parquet").exists()


def test_embeddings_wrap_a_contiguous_array_without_a_copy():
    a = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    table = hubnorm.embeddings(a)
    values = table.column("embedding").chunk(0).values
    assert values.buffers()[1].address == a.ctypes.data
    assert table.column("id").to_pylist() == list(range(50))
    with pytest.raises(hubnorm.UsageError, match="2-D float"):
        hubnorm.embeddings(np.zeros(5))


def test_in_memory_tables_cross_without_a_copy(samples):
    """The engine holds the producer's buffers: a numpy array's, through
    embeddings() and the Arrow C stream, and a pyarrow table's."""
    a = np.random.default_rng(2).standard_normal((300, 16)).astype(np.float32)
    held = hubnorm._hubnorm.InMemoryTable(hubnorm.embeddings(a), "gallery")
    assert held.path.startswith("memory://gallery-") and held.rows == 300
    assert a.ctypes.data in held.buffer_addresses()
    table = pq.read_table(sample(samples, "gallery"))
    held = hubnorm._hubnorm.InMemoryTable(table, "gallery")
    values = table.column("embedding").chunk(0).values
    assert values.buffers()[1].address in held.buffer_addresses()
    polars = pytest.importorskip("polars")
    frame = polars.from_arrow(table)
    held = hubnorm._hubnorm.InMemoryTable(frame, "gallery")
    assert held.rows == table.num_rows


def test_a_lazy_frame_is_streamed_to_a_scratch_file_removed_after_the_call(samples, tmp_path,
                                                                           monkeypatch):
    """A LazyFrame (a polars scan here) is run by polars into a scratch
    Parquet file the passes read, gone once the call returns."""
    polars = pytest.importorskip("polars")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kwargs = dict(methods="is,nnn", k=5, progress=False)
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    expected = results_rows(hubnorm.run(q, g, b, **kwargs).results)
    lazy = polars.scan_parquet(g)
    assert results_rows(hubnorm.run(q, lazy, b, **kwargs).results).equals(expected)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("hubnorm-inputs-")]
    # A query polars cannot run: the package's error, naming the argument.
    with pytest.raises(hubnorm.UsageError, match="gallery: the polars LazyFrame failed"):
        hubnorm.run(q, lazy.select(polars.col("no_such_column")), b, **kwargs)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("hubnorm-inputs-")]
    # A bad row in its result: named by the argument and the row in the
    # result, not by the scratch file.
    table = pq.read_table(g)
    rows = table.column("embedding").to_pylist()
    rows[7] = rows[7][:10]
    bad = table.set_column(table.schema.get_field_index("embedding"), "embedding",
                           pa.array(rows, pa.list_(pa.float32())))
    with pytest.raises(hubnorm.InputError) as raised:
        hubnorm.run(q, polars.from_arrow(bad).lazy(), b, **kwargs)
    error = raised.value
    assert (error.file, error.row, error.column) == ("lazyframe://gallery", 7, "embedding"), error
    assert "lazyframe://gallery" in str(error) and "hubnorm-inputs-" not in str(error), error


def test_a_one_shot_stream_serves_every_pass(samples):
    """A RecordBatchReader can be read once; the passes read the gallery
    more than once, so its batches are held for the call."""
    kwargs = dict(methods="is,nnn", k=5, progress=False)
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    expected = results_rows(hubnorm.run(q, g, b, **kwargs).results)
    table = pq.read_table(g)
    stream = pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=97))
    assert results_rows(hubnorm.run(q, stream, b, **kwargs).results).equals(expected)


def test_object_store_outputs_come_back_as_the_local_ones(samples, s3, tmp_path):
    """Outputs written to an object store are read back from there (with
    hubnorm's store settings), as the same rows a local output holds."""
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    kwargs = dict(methods="is,nnn", k=5, progress=False)
    local = hubnorm.run(q, g, b, out=tmp_path / "run", **kwargs)
    remote = hubnorm.run(q, g, b, out=f"{s3}/run", **kwargs)
    assert results_rows(remote.results).equals(results_rows(local.results))
    assert remote.summary["methods"] == local.summary["methods"]
    stats = hubnorm.stats(g, b, methods="is", out=f"{s3}/stats.parquet", progress=False)
    assert stats.num_rows == 600
    tuned_table, tuned = hubnorm.tune(g, b, validation=q, methods="is", out=f"{s3}/tuned",
                                      progress=False)
    assert tuned_table.num_rows > 0 and "is" in json.dumps(tuned)


def test_a_stream_batch_unlike_its_declared_schema_is_refused(samples):
    """pyarrow's from_batches does not check its batches against the schema
    it declares; read as the declared types, a float64 batch would be taken
    for float32 values (or a large_string one crash the process). Such a
    batch is refused, and what the stream's source raises comes through."""
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    table = pq.read_table(g)
    first, second = table.slice(0, 100), table.slice(100)
    wider = pa.list_(pa.float64())
    for other in (
        second.set_column(2, "embedding", second.column("embedding").cast(wider)),
        second.set_column(0, "id", second.column("id").cast(pa.large_string())),
    ):
        batches = first.to_batches() + other.to_batches()
        stream = pa.RecordBatchReader.from_batches(table.schema, iter(batches))
        with pytest.raises(hubnorm.InputError) as raised:
            hubnorm.run(q, stream, b, methods="is", k=5, progress=False)
        changed = next(f.name for f in other.schema if f.type != table.schema.field(f.name).type)
        assert (raised.value.file, raised.value.row, raised.value.column) == (
            "the in-memory gallery", 100, changed)
        assert "record batch 1" in str(raised.value)

    def interrupted():
        yield from first.to_batches()
        raise KeyboardInterrupt("stopped by the user")

    with pytest.raises(KeyboardInterrupt):
        stream = pa.RecordBatchReader.from_batches(table.schema, interrupted())
        hubnorm.run(q, stream, b, methods="is", k=5, progress=False)


def test_errors_carry_the_cli_facts(samples, tmp_path):
    # A ragged embedding: file, row and column of the bad value.
    table = pq.read_table(sample(samples, "gallery"))
    rows = table.column("embedding").to_pylist()
    rows[7] = rows[7][:10]
    bad = table.set_column(table.schema.get_field_index("embedding"), "embedding",
                           pa.array(rows, pa.list_(pa.float32())))
    bad_path = tmp_path / "bad_gallery.parquet"
    pq.write_table(bad, bad_path)
    with pytest.raises(hubnorm.InputError) as raised:
        hubnorm.run(sample(samples, "queries"), bad_path, sample(samples, "bank"), progress=False,
                    out=tmp_path / "out")
    error = raised.value
    assert error.file == str(bad_path)
    assert error.row == 7 and error.column == "embedding", (error.row, error.column, str(error))
    assert "bad_gallery.parquet" in str(error)
    assert isinstance(error, hubnorm.HubnormError) and isinstance(error, ValueError)
    assert not (tmp_path / "out" / "results.parquet").exists()
    # The same table in memory, in batches of 5 rows: named by its memory://
    # path, with the row in the table.
    chunked = pa.Table.from_batches(bad.to_batches(max_chunksize=5))
    with pytest.raises(hubnorm.InputError) as raised:
        hubnorm.run(sample(samples, "queries"), chunked, sample(samples, "bank"), progress=False)
    assert raised.value.file.startswith("memory://gallery-"), raised.value.file
    assert (raised.value.row, raised.value.column) == (7, "embedding"), str(raised.value)
    with pytest.raises(hubnorm.UsageError, match="unknown method|nope"):
        hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"), sample(samples, "bank"),
                    methods="is,nope", progress=False)
    with pytest.raises(hubnorm.UsageError, match="no method takes a parameter"):
        hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"), sample(samples, "bank"),
                    bta=3, progress=False)
    with pytest.raises(hubnorm.MemoryLimitError):
        hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"), sample(samples, "bank"),
                    memory_limit="1MiB", progress=False)
    with pytest.raises(hubnorm.InputError, match="no such file"):
        hubnorm.run(tmp_path / "missing.parquet", sample(samples, "gallery"),
                    sample(samples, "bank"), progress=False)


def test_progress_is_drawn_unless_turned_off(samples, capfd):
    hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"), sample(samples, "bank"),
                progress=False)
    assert capfd.readouterr().err == ""
    hubnorm.run(sample(samples, "queries"), sample(samples, "gallery"), sample(samples, "bank"),
                progress=True)
    assert "pass" in capfd.readouterr().err


def test_help_explains_the_methods_and_parameters():
    doc = hubnorm.run.__doc__
    assert "methods" in doc and "memory_limit" in doc and "transductive" in doc
    # Every method with its summary and its parameters' keywords and defaults.
    assert "``nnn``" in doc and "nnn_k=128" in doc and "``sn``" in doc and "tau=0.01" in doc
    assert "``dbsn``" in hubnorm.compare.__doc__
    # Lists of methods by property come from the registry, placeholders filled.
    assert "``tolerance`` stops ``sn`` and ``dbsn`` early" in " ".join(doc.split())
    assert "(``is``, ``sn``, ``dsl`` and ``sinkhorn-pp``; it peeks" in " ".join(doc.split())
    assert "``nnn``, ``csls``, ``ls``, ``nicdm`` and ``dissim-local``" in " ".join(hubnorm.stats.__doc__.split())
    for function in (hubnorm.run, hubnorm.stats, hubnorm.search, hubnorm.compare):
        assert "{" not in function.__doc__.split("Methods (")[0], function.__name__
    # Defaults are the keywords' (sinkhorn-pp's pseudo_queries is m - 1, as the CLI flag).
    pp = [p for m in hubnorm.methods() if m["name"] == "sinkhorn-pp" for p in m["parameters"]]
    assert ("pseudo_queries", 127.0) in [(name, default) for name, default, _ in pp]
    names = {m["name"] for m in hubnorm.methods()}
    assert {"is", "nnn", "sn", "dbsn", "mp", "sinkhorn-pp"} <= names
    beta = [p for m in hubnorm.methods() if m["name"] == "is" for p in m["parameters"]]
    assert beta[0][0] == "beta" and beta[0][1] == 20.0


def start_interruptible_run(setup: str, run_call: str) -> subprocess.Popen:
    """A child interpreter that runs `setup`, then `run_call` (a
    `hubnorm.run(...)`), exiting with 130 and printing "interrupted: MESSAGE"
    on KeyboardInterrupt; returned once it is about to call."""
    script = textwrap.dedent(setup) + textwrap.dedent(f"""
        import sys
        print("started", flush=True)
        try:
            {run_call}
        except KeyboardInterrupt as e:
            print("interrupted:", e, flush=True)
            sys.exit(130)
        print("finished", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "started"
    return child


def test_no_method_parameter_is_shadowed_by_a_keyword_of_the_functions():
    # A parameter named like a function's own keyword (k, seed, format, ...)
    # would bind to that keyword and never reach the method.
    import inspect
    parameters = {keyword for m in hubnorm.methods() for keyword, _, _ in m["parameters"]}
    assert {"beta", "nnn_k"} <= parameters
    for function in (hubnorm.run, hubnorm.stats, hubnorm.search, hubnorm.compare,
                     hubnorm.export, hubnorm.tune):
        own = set(inspect.signature(function).parameters)
        assert not parameters & own, (function.__name__, parameters & own)


def test_ctrl_c_stops_a_run_without_outputs(tmp_path):
    """SIGINT to an interpreter inside a long run: KeyboardInterrupt, exit
    status of an interrupted Python, and no output file."""
    child = start_interruptible_run("""
        import numpy as np, hubnorm
        rng = np.random.default_rng(3)
        gallery = hubnorm.embeddings(rng.standard_normal((20000, 128), dtype=np.float32))
        bank = hubnorm.embeddings(rng.standard_normal((20000, 128), dtype=np.float32))
        queries = hubnorm.embeddings(rng.standard_normal((200, 128), dtype=np.float32))
    """, f"hubnorm.run(queries, gallery, bank, methods='sn', iterations=200, "
         f"out={str(tmp_path / 'out')!r}, progress=False)")
    time.sleep(3)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 130, (out, err)
    assert "interrupted" in out, (out, err)
    leftovers = list((tmp_path / "out").glob("*")) if (tmp_path / "out").exists() else []
    assert not [p for p in leftovers if p.name in hubnorm.RUN_OUTPUTS], leftovers


def test_a_failing_progress_callback_stops_its_own_job_only(monkeypatch):
    """A progress callback that raises stops its job with the exception;
    a job in another thread, running meanwhile, finishes with the results
    it has alone (the stop is not process-wide, as Ctrl-C's is)."""
    import threading

    rng = np.random.default_rng(5)
    big = {name: hubnorm.embeddings(rng.standard_normal((rows, 48), dtype=np.float32))
           for name, rows in [("gallery", 120_000), ("bank", 4000), ("queries", 2000)]}
    job = dict(methods="is", k=5, memory_limit="64MiB", threads=1)
    alone = hubnorm.run(big["queries"], big["gallery"], big["bank"], progress=False, **job)

    running = threading.Event()

    def callbacks(enabled):
        if threading.current_thread() is threading.main_thread():
            def fail(*_):
                raise ValueError("the callback gave up")
            return fail
        return lambda *_: running.set()

    monkeypatch.setattr(hubnorm, "_progress", callbacks)
    other = {}

    def run_other():
        try:
            other["run"] = hubnorm.run(big["queries"], big["gallery"], big["bank"], **job)
        except BaseException as error:  # noqa: BLE001 - the test reports it
            other["error"] = error

    thread = threading.Thread(target=run_other)
    thread.start()
    assert running.wait(120), "the other job reported no progress"
    # The same job here, stopped at its first progress, mid-pass: its stop
    # is on while the other job reads.
    with pytest.raises(ValueError, match="the callback gave up"):
        hubnorm.run(big["queries"], big["gallery"], big["bank"], **job)
    assert thread.is_alive(), "the other job ended before the stop: make it longer"
    thread.join(600)
    assert "error" not in other, other.get("error")
    assert other["run"].results.equals(alone.results)


def test_an_interrupted_run_resumes_to_the_uninterrupted_files(tmp_path):
    """A run keeping a checkpoint (checkpoint_interval=0), SIGINT once it
    saved finished work: KeyboardInterrupt saying resume=True; a new
    checkpointed call without it refuses to discard the checkpoint, one with
    it writes the uninterrupted run's files byte for byte and removes the
    checkpoint."""
    rng = np.random.default_rng(11)
    paths = {}
    for name, rows in [("gallery", 30000), ("bank", 30000), ("queries", 1000)]:
        paths[name] = str(tmp_path / f"{name}.parquet")
        pq.write_table(hubnorm.embeddings(rng.standard_normal((rows, 128), dtype=np.float32)),
                       paths[name])
    job = dict(methods="is,nnn", k=10, memory_limit="64MiB", threads=1, progress=False)
    hubnorm.run(paths["queries"], paths["gallery"], paths["bank"], out=tmp_path / "reference", **job)

    out = tmp_path / "out"
    child = start_interruptible_run(
        "import hubnorm",
        f"hubnorm.run({paths['queries']!r}, {paths['gallery']!r}, {paths['bank']!r}, "
        f"out={str(out)!r}, checkpoint_interval=0, **{job!r})")
    saved = out / "run.checkpoint" / "pass1"
    deadline = time.monotonic() + 120
    while not list(saved.glob("rows-*.parquet")) and child.poll() is None:
        assert time.monotonic() < deadline, "no pass-1 chunk saved"
        time.sleep(0.01)
    child.send_signal(signal.SIGINT)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 130, (stdout, stderr)
    assert "resume=True" in stdout and "--resume" not in stdout, stdout

    with pytest.raises(hubnorm.UsageError, match="resume=True"):
        hubnorm.run(paths["queries"], paths["gallery"], paths["bank"], out=out, overwrite=True,
                    checkpoint_interval=0, **job)
    hubnorm.run(paths["queries"], paths["gallery"], paths["bank"], out=out, resume=True, **job)
    for name in hubnorm.RUN_OUTPUTS:
        assert bytes_of(out / name) == bytes_of(tmp_path / "reference" / name), name
    assert not (out / "run.checkpoint").exists()
    with pytest.raises(hubnorm.UsageError, match="out="):
        hubnorm.run(paths["queries"], paths["gallery"], paths["bank"], resume=True, **job)
    with pytest.raises(hubnorm.UsageError, match="path"):
        hubnorm.run(paths["queries"], pq.read_table(paths["gallery"]), paths["bank"],
                    out=tmp_path / "memory", checkpoint_interval=0, **job)


def peak_growth_of_run(setup: str, tables: str, limit_mib: int) -> float:
    """MiB by which a child interpreter's peak RSS grows during
    `hubnorm.run(<tables>, methods="is,nnn", memory_limit=<limit>)` after
    `setup` ran (96 000 gallery items, checked)."""
    script = textwrap.dedent(setup) + textwrap.dedent(f"""
        import resource
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        run = hubnorm.run({tables}, methods="is,nnn", k=10, memory_limit="{limit_mib}MiB",
                          threads=2, progress=False)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(base, peak, run.summary["gallery"])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    base_kib, peak_kib, gallery = map(int, done.stdout.split())
    assert gallery == 96_000
    return (peak_kib - base_kib) / 1024


def test_a_path_larger_than_the_memory_limit_stays_within_it(tmp_path):
    """A gallery file of 2.9× `memory_limit`, read by path: the child
    interpreter's peak RSS grows by at most the limit plus 48 MiB (thread
    stacks, the allocator's slack, the results' reading) over its RSS once
    hubnorm is imported."""
    limit_mib = 48
    rng = np.random.default_rng(5)
    dim = 384
    paths = {}
    for role, rows in (("gallery", 96_000), ("bank", 4_000), ("queries", 300)):
        paths[role] = str(tmp_path / f"{role}.parquet")
        schema = pa.schema([("id", pa.int64()), ("embedding", pa.list_(pa.float32(), dim))])
        with pq.ParquetWriter(paths[role], schema) as writer:
            for start in range(0, rows, 8_000):
                n = min(8_000, rows - start)
                values = pa.array(rng.standard_normal(n * dim, dtype=np.float32))
                writer.write_table(pa.table({
                    "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
                    "embedding": pa.FixedSizeListArray.from_arrays(values, dim),
                }, schema=schema))
    gallery_mib = 96_000 * dim * 4 / 2**20
    assert gallery_mib > 2.5 * limit_mib
    grown_mib = peak_growth_of_run(
        "import hubnorm",
        f"{paths['queries']!r}, {paths['gallery']!r}, {paths['bank']!r}",
        limit_mib,
    )
    assert grown_mib <= limit_mib + 48, (
        f"peak RSS grew by {grown_mib:.0f} MiB for a {limit_mib} MiB limit "
        f"(gallery {gallery_mib:.0f} MiB)")


def test_an_in_memory_gallery_larger_than_the_memory_limit_is_not_copied(tmp_path):
    """A numpy gallery of 2.9× `memory_limit`: the run reads its buffer in
    place, so the peak RSS grows by no more than for a path (the limit plus
    48 MiB), far less than the gallery's size."""
    limit_mib = 48
    setup = """
        import numpy as np, hubnorm
        rng = np.random.default_rng(5)
        gallery = rng.standard_normal((96_000, 384), dtype=np.float32)
        bank = hubnorm.embeddings(rng.standard_normal((4_000, 384), dtype=np.float32))
        queries = hubnorm.embeddings(rng.standard_normal((300, 384), dtype=np.float32))
    """
    grown_mib = peak_growth_of_run(setup, "queries, gallery, bank", limit_mib)
    gallery_mib = 96_000 * 384 * 4 / 2**20
    assert grown_mib <= limit_mib + 48, (
        f"peak RSS grew by {grown_mib:.0f} MiB for a {limit_mib} MiB limit "
        f"(gallery {gallery_mib:.0f} MiB in memory)")


def test_compare_report_and_export_write_the_cli_files(cli, samples, tmp_path):
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    cli("compare", "--queries", q, "--gallery", g, "--bank", b, "--methods", "is,nnn,csls",
        "--k", "5", "--hubness-k", "5", "--out", str(tmp_path / "cli_compare"))
    comparison = hubnorm.compare(q, g, b, methods="is,nnn,csls", k=5, hubness_k=5,
                                 out=tmp_path / "py_compare", progress=False)
    for name in hubnorm.RUN_OUTPUTS + hubnorm.COMPARE_OUTPUTS:
        assert bytes_of(tmp_path / "py_compare" / name) == bytes_of(tmp_path / "cli_compare" / name), name
    assert set(comparison.table["method"].to_pylist()) == {"none", "is", "nnn", "csls"}
    assert comparison.report.num_rows > 0
    # Without methods: every method the inputs allow, and why the others are left out.
    everything = hubnorm.compare(q, g, b, k=5, progress=False)
    assert "dual-is" in " ".join(everything.left_out), everything.left_out
    assert len(everything.summary["methods"]) > 8
    # The page goes where the user said: an existing file there is kept
    # unless overwrite=True, even when the run's files go to a scratch folder.
    page = tmp_path / "page.html"
    page.write_text("the user's page")
    with pytest.raises(hubnorm.UsageError, match="already exists"):
        hubnorm.compare(q, g, b, methods="is", k=5, html=page, progress=False)
    assert page.read_text() == "the user's page"
    hubnorm.compare(q, g, b, methods="is", k=5, html=page, overwrite=True, progress=False)
    assert page.read_text().startswith("<!DOCTYPE html>")

    cli("report", "--results", str(tmp_path / "cli_compare" / "results.parquet"), "--gallery", g,
        "--queries", q, "--k", "5", "--out", str(tmp_path / "cli_report"))
    table = hubnorm.report(tmp_path / "cli_compare" / "results.parquet", g, queries=q, k=5,
                           out=tmp_path / "py_report", progress=False)
    for name in hubnorm.REPORT_OUTPUTS:
        assert bytes_of(tmp_path / "py_report" / name) == bytes_of(tmp_path / "cli_report" / name), name
    assert set(table["method"].to_pylist()) == {"none", "is", "nnn", "csls"}

    stats = str(tmp_path / "cli_compare" / "gallery_stats.parquet")
    cli("export", "--gallery", g, "--stats", stats, "--method", "nnn", "--out",
        str(tmp_path / "cli_export.parquet"))
    exported = hubnorm.export(g, stats, method="nnn", out=tmp_path / "py_export.parquet",
                              progress=False)
    assert bytes_of(tmp_path / "py_export.parquet") == bytes_of(tmp_path / "cli_export.parquet")
    assert exported.num_rows == 600
    assert exported.schema.field("embedding").type.list_size == 385


def sorted_rows(table: pa.Table, keys: Sequence[str]) -> list[dict]:
    """The rows of `table` as Python values (an unsigned and a signed
    integer compare equal), in the order of `keys`."""
    return table.sort_by([(k, "ascending") for k in keys]).to_pylist()


def test_delta_outputs_take_new_versions_and_read_back_as_the_parquet_rows(cli, samples, tmp_path):
    """format="delta" on run, stats, search, compare, report and export, as
    the CLI's --format delta: each table a Delta table holding the Parquet
    call's rows, refused when it exists, a new version with overwrite or
    append; the CLI reads what the package wrote."""
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    kwargs = dict(methods="is,nnn", k=5, progress=False)
    try:
        run = hubnorm.run(q, g, b, out=tmp_path / "delta", format="delta", **kwargs)
    except hubnorm.UsageError as e:
        if "cargo feature `delta`" in str(e) and os.environ.get("HUBNORM_REQUIRE_DELTA") != "1":
            pytest.skip("the extension was built without the feature `delta`")
        raise
    plain = hubnorm.run(q, g, b, out=tmp_path / "plain", **kwargs)
    result_keys = ["method", "query_id", "rank"]
    for name in ("results.parquet", "gallery_stats.parquet"):
        assert (tmp_path / "delta" / name / "_delta_log").is_dir(), name
        assert (tmp_path / "plain" / name).is_file(), name
    assert run.format == "delta"
    assert sorted_rows(run.results, result_keys) == sorted_rows(plain.results, result_keys)
    assert sorted_rows(run.gallery_stats, ["gallery_id"]) == sorted_rows(plain.gallery_stats, ["gallery_id"])
    assert run.summary == json.loads((tmp_path / "delta" / "summary.json").read_text())
    counted = cli("sql", "--table", f"r={tmp_path / 'delta' / 'results.parquet'}",
                  "SELECT count(*) AS n FROM r", "--format", "csv").stdout
    assert counted.split() == ["n", str(600 * 3 * 5)], counted
    with pytest.raises(hubnorm.UsageError, match=r"already exists \(pass overwrite=True"):
        hubnorm.run(q, g, b, out=tmp_path / "delta", format="delta", **kwargs)
    with pytest.raises(hubnorm.UsageError, match="Delta tables are in"):
        run.write(tmp_path / "copy")
    # append: results add a version's rows, the statistics are replaced.
    appended = hubnorm.run(q, g, b, out=tmp_path / "delta", format="delta", append=True, **kwargs)
    assert appended.results.num_rows == 2 * plain.results.num_rows
    assert appended.gallery_stats.num_rows == plain.gallery_stats.num_rows
    replaced = hubnorm.run(q, g, b, out=tmp_path / "delta", format="delta", overwrite=True, **kwargs)
    assert replaced.results.num_rows == plain.results.num_rows
    for bad, message in ((dict(format="delta"), "needs out="), (dict(append=True), "needs format='delta'"),
                         (dict(format="csv"), "'parquet' or 'delta'")):
        with pytest.raises(hubnorm.UsageError, match=message):
            hubnorm.run(q, g, b, **(kwargs | bad))

    # stats, search (whose append adds new queries' lists) and export.
    stats = hubnorm.stats(g, b, methods="is,nnn", out=tmp_path / "stats", format="delta",
                          progress=False)
    assert sorted_rows(stats, ["gallery_id"]) == sorted_rows(plain.gallery_stats, ["gallery_id"])
    results, _ = hubnorm.search(q, g, stats=tmp_path / "stats", out=tmp_path / "results",
                                format="delta", **kwargs)
    assert sorted_rows(results, result_keys) == sorted_rows(
        plain.results.filter(pc.field("method") != "none"), result_keys)
    more, _ = hubnorm.search(q, g, stats=tmp_path / "stats", out=tmp_path / "results",
                             format="delta", append=True, **kwargs)
    assert more.num_rows == 2 * results.num_rows
    exported = hubnorm.export(g, tmp_path / "stats", method="nnn", out=tmp_path / "export",
                              format="delta", progress=False)
    plain_export = hubnorm.export(g, tmp_path / "plain" / "gallery_stats.parquet", method="nnn",
                                  out=tmp_path / "export.parquet", progress=False)
    assert sorted_rows(exported, ["id"]) == sorted_rows(plain_export, ["id"])
    # A path is a Delta output for its call only: a later Parquet call to
    # the same path (the table removed) writes a file.
    shutil.rmtree(tmp_path / "export")
    hubnorm.export(g, tmp_path / "stats", method="nnn", out=tmp_path / "export", progress=False)
    assert (tmp_path / "export").is_file()

    # compare and report.
    comparison = hubnorm.compare(q, g, b, out=tmp_path / "compare", format="delta", **kwargs)
    assert (tmp_path / "compare" / "compare.parquet" / "_delta_log").is_dir()
    assert set(comparison.table["method"].to_pylist()) == {"none", "is", "nnn"}
    report = hubnorm.report(tmp_path / "plain" / "results.parquet", g, queries=q, k=5,
                            out=tmp_path / "report", format="delta", progress=False)
    plain_report = hubnorm.report(tmp_path / "plain" / "results.parquet", g, queries=q, k=5,
                                  out=tmp_path / "plain_report", progress=False)
    report_keys = [c for c in ("method", "measure") if c in plain_report.column_names]
    assert sorted_rows(report, report_keys) == sorted_rows(plain_report, report_keys)


def test_the_faiss_example_serves_hubnorms_lists(samples):
    """examples/faiss_export.py: FAISS IndexFlatIP over `export` gives
    hubnorm's own `search` lists."""
    if os.environ.get("HUBNORM_REQUIRE_FAISS") != "1":  # .ci/run installs faiss-cpu
        pytest.importorskip("faiss")
    example = Path(__file__).resolve().parents[2] / "examples" / "faiss_export.py"
    for method in ("is", "nnn"):
        done = subprocess.run([sys.executable, str(example), str(samples), "--method", method],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "for all but 0" in done.stdout, done.stdout


def test_tune_writes_the_cli_files(cli, samples, tmp_path):
    g, b = sample(samples, "gallery"), sample(samples, "bank")
    q = sample(samples, "queries")
    cli("tune", "--gallery", g, "--bank", b, "--validation", q, "--methods", "is,nnn",
        "--grid", "beta=10,30", "--out", str(tmp_path / "cli"))
    grid, tuned = hubnorm.tune(g, b, validation=q, methods="is,nnn", grid=["beta=10,30"],
                               out=tmp_path / "py", progress=False)
    for name in ("tune.parquet", "tuned.json"):
        assert bytes_of(tmp_path / "py" / name) == bytes_of(tmp_path / "cli" / name), name
    assert grid.num_rows >= 3
    assert {m["method"] for m in tuned["methods"]} >= {"is", "nnn"}
    # Each chosen method runs with its keywords: nnn's k is `nnn_k`, not
    # run's own `k`, and gives the lists of the parameters tuned.json names.
    for m in tuned["methods"]:
        run = hubnorm.run(q, g, b, methods=[m["method"]], progress=False, **m["keywords"])
        ran = next(r for r in run.summary["methods"] if r["method"] == m["method"])
        assert ran["parameters"] == m["parameters"], (m, ran["parameters"])
    nnn = next(m for m in tuned["methods"] if m["method"] == "nnn")
    assert set(nnn["keywords"]) == {"alpha", "nnn_k"}, nnn
    with pytest.raises(hubnorm.UsageError, match="one of them"):
        hubnorm.tune(g, b, out=tmp_path / "none", progress=False)


def test_the_notebook_example_runs(samples):
    """examples/compare_methods.py, run as a script: every method compared,
    the page written."""
    example = Path(__file__).resolve().parents[2] / "examples" / "compare_methods.py"
    done = subprocess.run([sys.executable, str(example), str(samples)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "skewness" in done.stdout and "dual-dis" in done.stdout, done.stdout
    page = done.stdout.split("open ")[-1].split(" in a browser")[0]
    assert os.path.getsize(page) > 10_000


def test_sql_returns_the_cli_rows(cli, samples, tmp_path):
    query = ("SELECT g.id, hub_cosine(q.embedding, g.embedding) AS s FROM q JOIN g "
             "ON hub_cosine(q.embedding, g.embedding) > 0.8 ORDER BY s DESC, g.id LIMIT 20")
    q, g = sample(samples, "queries"), sample(samples, "gallery")
    cli("sql", "--table", f"q={q}", "--table", f"g={g}", "--format", "parquet",
        "--out", str(tmp_path / "cli.parquet"), query)
    expected = pq.read_table(tmp_path / "cli.parquet")
    rows = hubnorm.sql(query, {"q": q, "g": g})
    assert rows.equals(expected)
    assert rows.num_rows == 20
    # In-memory tables, and a run directory's tables.
    assert hubnorm.sql(query, {"q": pq.read_table(q), "g": g}).equals(expected)
    run = hubnorm.run(q, g, sample(samples, "bank"), methods="is", k=3, progress=False)
    counted = hubnorm.sql("SELECT method, count(*) AS n FROM results GROUP BY method ORDER BY method",
                          run=run.directory)
    assert counted.to_pylist() == [{"method": "is", "n": 1800}, {"method": "none", "n": 1800}]
    with pytest.raises(hubnorm.HubnormError, match="nope"):
        hubnorm.sql("SELECT * FROM nope")


def test_hubness_of_a_results_table_is_the_summarys(samples):
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    run = hubnorm.run(q, g, b, methods="is,nnn", k=10, progress=False)
    measures = hubnorm.hubness(run.results, g, k=10)
    for method in run.summary["methods"]:
        figures = measures[method["method"]]
        hub = method["hubness"]
        for name in ("skewness", "antihub_rate", "hub_occurrence", "gini", "robin_hood"):
            assert figures[name] == pytest.approx(hub[name], rel=1e-12, abs=1e-12), (method["method"], name)


def test_arguments_are_checked_in_the_packages_words(samples, tmp_path):
    """Wrong types and values of the arguments raise UsageError naming the
    keyword; the engine's messages speak of keywords, not of CLI flags."""
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    for bad in ({"k": -1}, {"k": 1.5}, {"threads": -1}, {"bank_sample": 0}, {"seed": "x"},
                {"memory_limit": 0}):
        (name, value), = bad.items()
        with pytest.raises(hubnorm.UsageError, match=f"^{name} must be a whole number"):
            hubnorm.run(q, g, b, progress=False, **bad)
    with pytest.raises(hubnorm.UsageError, match="beta must be a number, not 'x'"):
        hubnorm.run(q, g, b, beta="x", progress=False)
    with pytest.raises(hubnorm.UsageError, match="name at least one method"):
        hubnorm.run(q, g, b, methods=[], progress=False)
    with pytest.raises(hubnorm.UsageError, match=r"usage: k=5000 is larger than the gallery"):
        hubnorm.run(q, g, b, k=5000, progress=False)
    with pytest.raises(hubnorm.UsageError, match=r"nnn_k=5000 .*bank"):
        hubnorm.run(q, g, b, methods="nnn", nnn_k=5000, progress=False)
    # A parameter none of the methods has would be ignored: refused.
    with pytest.raises(hubnorm.UsageError,
                       match=r"nnn_k is a parameter of nnn, none of which is among the methods \(is\)"):
        hubnorm.run(q, g, b, methods="is", nnn_k=5, progress=False)
    with pytest.raises(hubnorm.UsageError, match="name the methods whose parameters you set"):
        hubnorm.compare(q, g, b, beta=30, progress=False)
    with pytest.raises(hubnorm.UsageError, match=r"tolerance stops the iterations of sn and dbsn"):
        hubnorm.run(q, g, b, methods="is", tolerance=0.01, progress=False)
    # A type the engine cannot take: UsageError naming the keyword, not
    # pyo3's TypeError about its structs.
    for bad in ({"gallery": None}, {"precision": None}):
        (name, value), = bad.items()
        args = {"queries": q, "gallery": g, "bank": b, **bad}
        with pytest.raises(hubnorm.UsageError, match=f"^{name}: not a value of the expected type"):
            hubnorm.run(args.pop("queries"), args.pop("gallery"), args.pop("bank"),
                        progress=False, **args)
    # A memory limit in bytes is a limit like "1MiB".
    with pytest.raises(hubnorm.MemoryLimitError, match="memory_limit=1.0 MiB is below"):
        hubnorm.run(q, g, b, memory_limit=1 << 20, progress=False)
    # Without a bank (and not transductive), and with both.
    with pytest.raises(hubnorm.UsageError, match="a query bank is needed: bank=PATH"):
        hubnorm.run(q, g, methods="none", progress=False)
    with pytest.raises(hubnorm.UsageError, match="bank cannot be used with transductive=True"):
        hubnorm.run(q, g, b, methods="is", transductive=True, progress=False)
    assert hubnorm.run(q, g, methods="is", transductive=True, progress=False).summary
    # out= naming a file: the run writes a folder of three files.
    existing = tmp_path / "existing.parquet"
    existing.write_bytes(b"mine")
    with pytest.raises(hubnorm.UsageError, match="existing.parquet is a file, where the output"):
        hubnorm.run(q, g, b, out=existing, progress=False)
    assert existing.read_bytes() == b"mine"
    # `--` inside a path is not a flag to translate.
    dashed = tmp_path / "a--b" / "existing.parquet"
    dashed.parent.mkdir()
    dashed.write_bytes(b"mine")
    with pytest.raises(hubnorm.UsageError, match="a--b/existing.parquet is a file"):
        hubnorm.run(q, g, b, out=dashed, progress=False)


def test_skip_missing_skips_queries_whose_targets_are_not_in_the_gallery(samples):
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    queries = pq.read_table(q)
    targets = queries.column("target_id").to_pylist()
    targets[3] = ["no-such-item"] if isinstance(targets[3], list) else "no-such-item"
    lost = queries.set_column(queries.schema.get_field_index("target_id"), "target_id",
                              pa.array(targets, queries.schema.field("target_id").type))
    with pytest.raises(hubnorm.InputError, match="skip_missing=True") as raised:
        hubnorm.run(lost, g, b, methods="none", progress=False)
    assert (raised.value.row, raised.value.column) == (3, "target_id")
    run = hubnorm.run(lost, g, b, methods="none", skip_missing=True, progress=False)
    assert run.summary["methods"][0]["queries_skipped"] == 1, run.summary["methods"][0]


def test_hubness_refuses_k_beyond_the_lists(samples):
    q, g, b = (sample(samples, n) for n in ("queries", "gallery", "bank"))
    run = hubnorm.run(q, g, b, methods="none", k=5, progress=False)
    assert set(hubnorm.hubness(run.results, g, k=5)) == {"none"}
    with pytest.raises(hubnorm.UsageError, match=r"k=10 is longer than the lists .*none: 5 entries"):
        hubnorm.hubness(run.results, g, k=10)
