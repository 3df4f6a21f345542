"""hubnorm: hubness reduction for embedding retrieval, the same engine as the
``hubnorm`` command-line tool.

Dual-encoder retrieval ranks a gallery by the inner product of embeddings; in
high dimensions a few gallery items ("hubs") become the nearest neighbour of
very many queries. hubnorm re-scores with statistics of a *bank* of training
queries (inverted softmax, QB-Norm, NNN, CSLS, DBNorm, Sinkhorn, dual
softmax, mutual proximity, local scaling, ...), streamed out of core.

Quick start::

    import hubnorm
    run = hubnorm.run("queries.parquet", "gallery.parquet", "bank.parquet",
                      methods=["none", "is", "nnn"], k=10)
    run.summary["methods"][1]      # hubness and recall of inverted softmax
    run.results                    # pyarrow.Table of the top-k lists
    run.write("out/")              # results.parquet, gallery_stats.parquet, summary.json

Every table argument is a path or URL of Parquet files (streamed out of core,
as the CLI streams it), a ``pyarrow.Table`` or ``RecordBatchReader``,
anything with ``__arrow_c_stream__`` (polars, pandas >= 2.2, DuckDB), a
polars ``LazyFrame`` (run by polars' streaming engine into a scratch
Parquet file the passes read out of core, removed when the call returns), a
``pandas.DataFrame`` (its ids may be a named index), or a 2-D float
``numpy`` array (ids 0..n-1; see
:func:`embeddings` for ids and ground truth). Tables have an ``id`` column and
an ``embedding`` column (fixed-size or variable lists of float16/32/64);
queries may have ``target_id`` (the ground truth) for recall figures. Other
names are given to every function that reads tables with ``columns=``, e.g.
``columns={"id": "doc_id", "embedding": "vector", "target": "label"}`` (as
the CLI's ``--id-column``, ``--embedding-column`` and ``--target-column``; a
target column named there must be present).

In-memory inputs cross into the engine through the Arrow C stream interface
without a copy: the passes read the producer's buffers (pyarrow, polars,
numpy through :func:`embeddings`) directly, as often as they need to. Copies
happen only where there is no Arrow layout to share: a ``pandas.DataFrame``
is converted by pyarrow once, a one-shot stream (a ``RecordBatchReader``)
is drained and its batches held in memory for the call (the passes read
their inputs more than once), and a results table given to :func:`report`
or :func:`hubness` is written to a scratch Parquet file (the engine reads
results files as files), as is a polars ``LazyFrame`` (sunk by polars, in the
system's temporary folder: ``TMPDIR``). Paths are streamed out of core, in
place. An error in an in-memory table names it ``memory://ROLE-N`` (e.g.
``memory://gallery-3``) with the row in that table; one in a LazyFrame's
rows names it ``lazyframe://ROLE`` (e.g. ``lazyframe://gallery``) with the
row in its result.

Errors raise :class:`InputError` (with ``.file``, ``.row``, ``.column``),
:class:`UsageError` or :class:`MemoryLimitError`, all :class:`HubnormError`.
Ctrl-C stops a running job (``KeyboardInterrupt``) without leaving partial
outputs; the stop is process-wide, as for the command-line tool: jobs
running in other threads of the process stop too (each raises
``KeyboardInterrupt``). Method parameters are keyword arguments named like the CLI's flags
(``beta=20``, ``nnn_k=128``, ``tau=0.01``, ...): see :func:`methods`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from . import _docs, _hubnorm
from ._errors import HubnormError, InputError, MemoryLimitError, UsageError

__version__ = _hubnorm.__version__
__all__ = [
    "Comparison",
    "HubnormError",
    "InputError",
    "MemoryLimitError",
    "Run",
    "UsageError",
    "compare",
    "embeddings",
    "export",
    "hubness",
    "methods",
    "report",
    "run",
    "search",
    "sql",
    "stats",
    "tune",
]

#: The three files ``run`` writes, as the CLI names them.
RUN_OUTPUTS = ("results.parquet", "gallery_stats.parquet", "summary.json")
#: The files ``compare`` writes besides ``run``'s.
COMPARE_OUTPUTS = ("compare.parquet", "compare.md", "report.parquet", "gallery_report.parquet")
#: The files ``report`` writes.
REPORT_OUTPUTS = ("report.parquet", "gallery_report.parquet")


def methods() -> list[dict[str, Any]]:
    """Every method hubnorm knows: ``name``, ``summary`` and ``parameters``
    (a list of ``(keyword, default, help)``). The keywords are what
    :func:`run`, :func:`stats` and :func:`search` take as ``**params``."""
    return _hubnorm.methods()


def embeddings(array: Any, ids: Any = None, targets: Any = None) -> pa.Table:
    """A table hubnorm reads, from a 2-D float ``numpy`` array (one row per
    item), with ``ids`` (ints or strings; default 0..n-1) and, for queries,
    ``targets`` (the gallery id each query should find).

    Contiguous float16/32/64 arrays become the table's embedding column
    without a copy (Arrow wraps the array's buffer)."""
    import numpy as np

    a = np.ascontiguousarray(array)
    if a.ndim != 2 or a.dtype.kind != "f" or a.shape[1] == 0:
        raise UsageError(f"embeddings: a 2-D float array with at least one column is needed, "
                         f"not {a.ndim}-D {a.dtype} of shape {a.shape}")
    values = pa.array(a.reshape(-1))
    column = pa.FixedSizeListArray.from_arrays(values, a.shape[1])
    ids = pa.array(np.arange(a.shape[0], dtype=np.int64) if ids is None else ids)
    if len(ids) != a.shape[0]:
        raise UsageError(f"embeddings: {len(ids)} ids for {a.shape[0]} rows")
    columns = {"id": ids, "embedding": column}
    if targets is not None:
        targets = pa.array(targets)
        if len(targets) != a.shape[0]:
            raise UsageError(f"embeddings: {len(targets)} targets for {a.shape[0]} rows")
        columns["target_id"] = targets
    return pa.table(columns)


class _Inputs:
    """Paths for the table arguments of one call: paths as they are,
    in-memory tables registered with the engine under a ``memory://`` path
    (their Arrow buffers shared, not copied) for as long as the call runs."""

    def __init__(self) -> None:
        self._held: list[Any] = []
        self._scratch: str | None = None
        self._files = 0
        # Scratch file -> the name the user knows its rows by.
        self._names: dict[str, str] = {}

    def __enter__(self) -> "_Inputs":
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self._held.clear()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if isinstance(error, HubnormError):
            _rename_files(error, self._names)

    def path(self, table: Any, role: str, *, as_file: bool = False) -> str | None:
        """The path the engine reads ``table`` by. ``as_file``: the engine
        reads this argument as a Parquet file (a results table), so an
        in-memory one is written to a scratch file."""
        if table is None:
            return None
        if isinstance(table, (str, os.PathLike)):
            return os.fspath(table)
        if _is_lazy_frame(table):
            # Run by polars' streaming engine into a scratch file, which the
            # passes then read out of core: the query's result never has to
            # be held in memory, as it would if it were collected.
            path = self._scratch_file(role)
            try:
                table.sink_parquet(path)
            except Exception as e:
                raise UsageError(f"{role}: the polars LazyFrame failed: {e}") from e
            self._names[path] = f"lazyframe://{role}"
            return path
        if as_file:
            path = self._scratch_file(role)
            _write_table(_as_arrow(table, role), path)
            self._names[path] = f"memory://{role}"
            return path
        held = _hubnorm.InMemoryTable(_as_arrow(table, role), role)
        self._held.append(held)
        return held.path


    def _scratch_file(self, role: str) -> str:
        """A new Parquet path for ``role`` in this call's scratch folder
        (numbered, and the role reduced to a safe name: in ``sql`` it is a
        table name the user chose)."""
        if self._scratch is None:
            self._scratch = tempfile.mkdtemp(prefix="hubnorm-inputs-")
        self._files += 1
        name = re.sub(r"[^A-Za-z0-9_-]", "_", role)
        return os.path.join(self._scratch, f"{self._files}-{name}.parquet")


def _rename_files(error: HubnormError, names: dict[str, str]) -> None:
    """``error`` naming each scratch file of ``names`` by its name instead
    (its rows are those of the table it was written from, in order)."""
    for path, name in names.items():
        error.args = tuple(a.replace(path, name) if isinstance(a, str) else a
                           for a in error.args)
        if getattr(error, "file", None) == path:
            error.file = name


def _is_lazy_frame(table: Any) -> bool:
    """Whether ``table`` is a polars ``LazyFrame`` (a query, not yet rows)."""
    kind = type(table)
    return kind.__module__.startswith("polars") and kind.__name__ == "LazyFrame"


class _Outputs:
    """The directory a run writes to: `out`, or a temporary one (removed
    again if the run fails; else it lives as long as the returned object)."""

    def __init__(self, out: str | os.PathLike | None, prefix: str) -> None:
        self.temporary = out is None
        self.directory = tempfile.mkdtemp(prefix=prefix) if self.temporary else os.fspath(out)

    def __enter__(self) -> tuple[str, bool]:
        return self.directory, self.temporary

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is not None and self.temporary:
            shutil.rmtree(self.directory, ignore_errors=True)


def _checkpointing(out: str | os.PathLike | None, checkpoint_interval: float | None,
                   resume: bool, tables: Sequence[Any]) -> dict[str, Any]:
    """A job's checkpointing, as the extension reads it, refused where a
    later call could not find the same job again: without ``out``, or with
    an input that is not a path (an in-memory table is a new one each call)."""
    if checkpoint_interval is None and not resume:
        return {"checkpoint_interval": None, "resume": False}
    if out is None:
        raise UsageError("checkpoint_interval and resume need out= (the checkpoint is kept there)")
    if any(t is not None and not isinstance(t, (str, os.PathLike)) for t in tables):
        raise UsageError(
            "checkpoint_interval and resume need every input as a path or URL: a later call "
            "cannot tell an in-memory table for the same one")
    return {"checkpoint_interval": checkpoint_interval, "resume": resume}


def _table_format(format: str, append: bool, out: str | os.PathLike | None) -> tuple[str, bool]:
    """How a call writes its tables (``format``, ``append``), as the
    extension reads and checks them; refused here where the call would
    otherwise make a temporary folder: a Delta table belongs where
    ``out=`` puts it."""
    if format == "delta" and out is None:
        raise UsageError("format='delta' needs out= (the tables are written there)")
    return format, append


def _is_url(path: str) -> bool:
    """Whether ``path`` names an object in a store (``s3://``, ``gs://``,
    ...), which only the engine reads with hubnorm's store settings."""
    scheme, separator, _ = path.partition("://")
    return bool(separator) and scheme != "file" and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*",
                                                                   scheme) is not None


def _read_output(path: str, format: str) -> pa.Table:
    """An output table as written: a local Parquet file, or an object's or a
    Delta table's latest version (read by the engine, which follows the
    table's log and the store's settings, with its string views made plain
    strings as in the Parquet files; Delta's own types stay: signed
    integers, variable lists)."""
    if format != "delta" and not _is_url(path):
        return pq.read_table(path)
    table = sql("SELECT * FROM output", {"output": path})
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    schema = pa.schema([f.with_type(plain.get(f.type, f.type)) for f in table.schema],
                       metadata=table.schema.metadata)
    return table.cast(schema)


def _run_args(inputs: _Inputs, queries: Any, gallery: Any, bank: Any, gallery_bank: Any,
              methods: list[str], k: int, transductive: bool, directory: str,
              overwrite: bool, checkpointing: dict[str, Any],
              table: tuple[str, bool]) -> dict[str, Any]:
    """A run's tables and choices, as the extension reads them."""
    return {
        **checkpointing,
        "format": table[0],
        "append": table[1],
        "queries": inputs.path(queries, "queries"),
        "gallery": inputs.path(gallery, "gallery"),
        "bank": inputs.path(bank, "bank"),
        "gallery_bank": inputs.path(gallery_bank, "gallery_bank"),
        "methods": methods,
        "k": _count("k", k, 1),
        "transductive": transductive,
        "out_dir": directory,
        "overwrite": overwrite,
    }


def _usage_errors(job: Any) -> Any:
    """``job`` with an argument the extension cannot take as its type (a
    ``None`` table, a list of numbers as methods) raised as the package's
    :class:`UsageError`, naming the argument, rather than pyo3's
    ``TypeError`` about its own structs. Other TypeErrors (one raised by a
    progress callback, say) pass through."""
    @functools.wraps(job)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return job(*args, **kwargs)
        except TypeError as error:
            text = str(error)
            found = (re.search(r"failed to extract field \w+\.(\w+)", text)
                     or re.search(r"argument '(\w+)'", text))
            if found is None:
                raise
            name, cause = found.group(1), text.rsplit(": ", 1)[-1]
            raise UsageError(f"{name}: not a value of the expected type ({cause})") from error
    return checked


def _drained(reader: pa.RecordBatchReader, role: str) -> pa.Table:
    """The batches of a one-shot reader (the engine holds them anyway, as it
    reads its inputs several times), each checked against the schema the
    reader declares: the engine would read a batch of other types as the
    declared ones (``from_batches`` does not check them). What the reader's
    source raises (KeyboardInterrupt included) comes through as it is."""
    schema = reader.schema
    batches, row = [], 0
    for number, batch in enumerate(reader):
        if batch.schema.names != schema.names or batch.schema.types != schema.types:
            declared = dict(zip(schema.names, schema.types))
            column = next((f.name for f in batch.schema if declared.get(f.name) != f.type),
                          next((n for n in schema.names if n not in batch.schema.names), ""))
            got = ", ".join(f"{f.name}: {f.type}" for f in batch.schema)
            want = ", ".join(f"{f.name}: {f.type}" for f in schema)
            file = f"the in-memory {role}"
            raise InputError(
                f"bad input at {file}, row {row}, column '{column}': record batch {number} "
                f"holds ({got}) where the reader declares ({want})",
                file=file, row=row, column=column)
        batches.append(batch)
        row += batch.num_rows
    return pa.Table.from_batches(batches, schema=schema)


def _as_arrow(table: Any, role: str) -> Any:
    """``table`` as something with ``__arrow_c_stream__`` (which the engine
    imports without copying), converting only what has no Arrow layout."""
    if isinstance(table, pa.RecordBatchReader):
        return _drained(table, role)
    if type(table).__module__.startswith("numpy"):
        return embeddings(table)
    if type(table).__module__.startswith("pandas"):
        # A frame's rows are numpy objects (an embedding column of arrays):
        # pyarrow converts them once, here. A named index (or MultiIndex)
        # that no column shadows is data (ids kept as the index), so its
        # levels become columns.
        names = list(getattr(table.index, "names", [None]))
        keep_index = all(n is not None and n not in table.columns for n in names)
        return pa.Table.from_pandas(table, preserve_index=keep_index)
    if hasattr(table, "__arrow_c_stream__"):
        return table
    raise UsageError(
        f"{role}: a path, a pyarrow Table or RecordBatchReader, an object with "
        f"__arrow_c_stream__, a polars LazyFrame or a 2-D numpy array is needed, "
        f"not {type(table).__name__}"
    )


def _write_table(table: Any, path: str) -> None:
    if not isinstance(table, (pa.Table, pa.RecordBatchReader)):
        table = pa.RecordBatchReader.from_stream(table)
    if isinstance(table, pa.Table):
        pq.write_table(table, path)
        return
    with pq.ParquetWriter(path, table.schema) as writer:
        for batch in table:
            writer.write_batch(batch)


def _count(name: str, value: Any, minimum: int = 0) -> int:
    """``value`` as a whole number of at least ``minimum``; otherwise a
    :class:`UsageError` naming the argument."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise UsageError(f"{name} must be a whole number of at least {minimum}, not {value!r}")
    return int(value)


#: The column names of ``columns=``, with their defaults; ``target`` is read
#: when present unless named.
_COLUMNS = {"id": "id", "embedding": "embedding", "target": None}


def _columns(columns: Mapping[str, str] | None) -> dict[str, str | None]:
    """``columns=`` checked and completed with the defaults, as
    ``--id-column``, ``--embedding-column`` and ``--target-column``."""
    given = dict(columns or {})
    unknown = sorted(set(given) - set(_COLUMNS))
    if unknown:
        raise UsageError(f"columns: unknown key {unknown[0]!r}; the keys are "
                         + ", ".join(_COLUMNS))
    for key, name in given.items():
        if not isinstance(name, str) or not name:
            raise UsageError(f"columns: {key!r} must name a column, not {name!r}")
    return {f"{key}_column": given.get(key, default) for key, default in _COLUMNS.items()}


def _options(memory_limit: str | int, threads: int, normalize: bool,
             tolerance: float | None = None, bank_sample: int | None = None, seed: int = 0,
             precision: str = "exact", skip_missing: bool = False,
             columns: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The options every job takes, as the extension reads them (a
    ``memory_limit`` given as a number is in bytes)."""
    if not isinstance(memory_limit, str):
        memory_limit = f"{_count('memory_limit', memory_limit, 1)}B"
    return {"memory_limit": memory_limit, "threads": _count("threads", threads),
            "normalize": bool(normalize), "tolerance": tolerance,
            "bank_sample": None if bank_sample is None else _count("bank_sample", bank_sample, 1),
            "seed": _count("seed", seed), "precision": precision,
            "skip_missing": bool(skip_missing), **_columns(columns)}


def _progress(enabled: bool):
    """A callback drawing the running phase: tqdm where installed (notebooks
    and terminals), else a line on stderr; ``None`` when disabled."""
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        tqdm = None
    bars: dict[str, Any] = {}

    def draw(phase: str, done: int, total: int, status: str) -> None:
        if tqdm is not None:
            bar = bars.get(phase)
            if bar is None:
                for old in bars.values():
                    old.close()
                bars.clear()
                bar = bars[phase] = tqdm(total=total or None, desc=phase, leave=False)
            bar.update(done - bar.n)
            if status:
                bar.set_postfix_str(status, refresh=False)
            if total and done >= total:
                bar.close()
        else:
            end = "\n" if total and done >= total else "\r"
            print(f"hubnorm: {phase} {done}/{total} {status}", end=end, file=sys.stderr, flush=True)

    return draw


@dataclass
class Run:
    """What :func:`run` made: the CLI's three outputs, kept in ``directory``
    (a temporary one unless ``out=`` was given)."""

    directory: str
    summary: dict[str, Any]
    _temporary: bool = field(default=False, repr=False)
    _files: tuple[str, ...] = field(default=RUN_OUTPUTS, repr=False)
    #: ``"parquet"``, or ``"delta"`` when the tables are Delta tables.
    format: str = field(default="parquet", kw_only=True)

    def _table(self, name: str) -> pa.Table:
        return _read_output(os.path.join(self.directory, name), self.format)

    @property
    def results(self) -> pa.Table:
        """The top-k lists: ``method, query_id, rank, gallery_id, score, raw_score``
        (of every version appended, for a Delta table written with ``append``)."""
        return self._table("results.parquet")

    @property
    def gallery_stats(self) -> pa.Table:
        """Per gallery item, each method's statistics (``gallery_stats.parquet``)."""
        return self._table("gallery_stats.parquet")

    def write(self, directory: str | os.PathLike, overwrite: bool = False) -> str:
        """Copies the output files into ``directory`` (created if missing),
        byte for byte as the CLI writes them; refuses to replace existing
        files unless ``overwrite``. Delta tables are not copied: they stay
        where ``out=`` put them."""
        if self.format == "delta":
            raise UsageError(f"the run's Delta tables are in {self.directory} already")
        if _is_url(self.directory):
            raise UsageError(f"the run's files are in {self.directory} already")
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        if os.path.samefile(directory, self.directory):
            return directory
        for name in self._files:
            target = os.path.join(directory, name)
            if os.path.exists(target) and not overwrite:
                raise UsageError(f"{target} already exists (pass overwrite=True to replace it)")
        # Each file is copied beside its target and renamed over it, so an
        # interrupted copy leaves no half-written file under the name.
        for name in self._files:
            partial = tempfile.NamedTemporaryFile(dir=directory, prefix=f".{name}.", delete=False)
            partial.close()
            try:
                shutil.copyfile(os.path.join(self.directory, name), partial.name)
                os.replace(partial.name, os.path.join(directory, name))
            except BaseException:
                os.unlink(partial.name)
                raise
        return directory

    def __del__(self) -> None:
        if self._temporary:
            shutil.rmtree(self.directory, ignore_errors=True)


def _names(methods: str | Iterable[str], *, allow_none: bool = False) -> list[str]:
    """Method names from a comma list or a sequence; an empty list is
    refused unless ``allow_none`` (where it means "the default")."""
    if isinstance(methods, str):
        names = [m.strip() for m in methods.split(",") if m.strip()]
    else:
        names = list(methods)
    if not names and not allow_none:
        raise UsageError("methods: name at least one method (see hubnorm.methods())")
    return names


@_usage_errors
def run(
    queries: Any,
    gallery: Any,
    bank: Any = None,
    *,
    gallery_bank: Any = None,
    methods: str | Sequence[str] = ("is",),
    k: int = 10,
    transductive: bool = False,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    memory_limit: str = "2GiB",
    threads: int = 0,
    normalize: bool = True,
    tolerance: float | None = None,
    bank_sample: int | None = None,
    seed: int = 0,
    precision: str = "exact",
    skip_missing: bool = False,
    checkpoint_interval: float | None = None,
    resume: bool = False,
    format: str = "parquet",
    append: bool = False,
    columns: Mapping[str, str] | None = None,
    progress: bool = True,
    **params: float,
) -> Run:
    """Both passes, as ``hubnorm run``: statistics of ``bank`` (and
    ``gallery_bank`` for the dual-bank methods) over ``gallery``, then the
    corrected top-``k`` lists of ``queries`` for every method in
    ``methods`` (names as in :func:`methods`; ``"none"`` is the plain inner
    product).

    ``out``: write the three files there (as the CLI; refused if they exist
    unless ``overwrite``); by default they go to a temporary directory that
    lives as long as the returned :class:`Run`. ``transductive=True`` uses
    the queries themselves as the bank ({transductive}; it peeks at the
    test set). ``memory_limit`` bounds the
    job's memory ("2GiB", "512MiB"); ``threads=0`` uses every core;
    ``normalize=False`` ranks by raw dot products instead of cosine;
    ``tolerance`` stops {iterating} early; ``bank_sample`` uses that
    many bank rows drawn with ``seed``. ``precision`` is the passes'
    arithmetic, as ``--precision``: ``"exact"`` (f32), ``"screened"`` (a
    bf16 screen and an f32 re-score of what it cannot rule out: the same
    results, faster, on CPUs with AVX512_BF16, for the methods that
    subtract a per-item correction, and pass 1's top-k statistics) or
    ``"auto"`` (screened where it can be). ``**params`` set method parameters by the CLI's flag names
    (``beta=20``, ``nnn_k=128``). ``skip_missing=True`` skips (and counts)
    queries none of whose ``target_id`` is in the gallery instead of
    refusing them. The summary's hubness figures are at k = 10 whatever
    ``k`` is, as the CLI's (:func:`compare` takes ``hubness_k``,
    :func:`hubness` any ``k`` up to the lists' length).

    ``checkpoint_interval``: save the finished work (pass 1's gallery
    chunks, Sinkhorn's iterations, pass 2's query blocks) into
    ``out/run.checkpoint/`` at most this many seconds apart (``0``: after
    each), as ``--checkpoint-interval``; ``None`` (the default) keeps no
    checkpoint. After an interruption (Ctrl-C, a crash), the same call with
    ``resume=True`` goes on from the saved work and writes the bytes an
    uninterrupted run writes; it refuses inputs or choices that changed
    since. Both need ``out`` and every input as a path or URL.

    ``format="delta"`` (a build with the feature ``delta``) writes each
    table as a Delta Lake table at its usual path under ``out``, one
    atomic commit each, as ``--format delta``: a new table, a new version
    with only these rows (``overwrite=True``), or one adding them
    (``append=True``: results and reports add rows, the statistics are
    replaced). The :class:`Run`'s tables are then read from the tables'
    latest versions.
    """
    table = _table_format(format, append, out)
    checkpointing = _checkpointing(out, checkpoint_interval, resume,
                                   (queries, gallery, bank, gallery_bank))
    with _Outputs(out, "hubnorm-run-") as (directory, temporary), _Inputs() as inputs:
        summary = _hubnorm.run(
            _run_args(inputs, queries, gallery, bank, gallery_bank, _names(methods), k,
                      transductive, directory, overwrite or temporary, checkpointing, table),
            params,
            _options(memory_limit, threads, normalize, tolerance, bank_sample, seed, precision,
                     skip_missing, columns),
            _progress(progress),
        )
    return Run(directory, json.loads(summary), temporary, format=format)


@_usage_errors
def stats(
    gallery: Any,
    bank: Any,
    *,
    out: str | os.PathLike,
    gallery_bank: Any = None,
    methods: str | Sequence[str] = ("is",),
    overwrite: bool = False,
    memory_limit: str = "2GiB",
    threads: int = 0,
    normalize: bool = True,
    tolerance: float | None = None,
    bank_sample: int | None = None,
    seed: int = 0,
    precision: str = "exact",
    checkpoint_interval: float | None = None,
    resume: bool = False,
    format: str = "parquet",
    columns: Mapping[str, str] | None = None,
    progress: bool = True,
    **params: float,
) -> pa.Table:
    """Pass 1, as ``hubnorm stats``: each gallery item's statistics for
    ``methods`` over ``bank``, written to ``out`` (``gallery_stats.parquet``)
    and returned as a table. Arguments as for :func:`run` (``precision``
    screens the statistics made of top-k lists: {screened_bank_pass}; the checkpoint of ``checkpoint_interval``
    and ``resume`` is ``OUT.checkpoint/`` beside ``out``; ``format="delta"``
    writes a Delta table, a new version of it with ``overwrite=True``)."""
    checkpointing = _checkpointing(out, checkpoint_interval, resume, (gallery, bank, gallery_bank))
    with _Inputs() as inputs:
        path = _hubnorm.stats(
            inputs.path(gallery, "gallery"),
            inputs.path(bank, "bank"),
            inputs.path(gallery_bank, "gallery_bank"),
            _names(methods),
            params,
            os.fspath(out),
            overwrite,
            format,
            checkpointing["checkpoint_interval"],
            checkpointing["resume"],
            _options(memory_limit, threads, normalize, tolerance, bank_sample, seed, precision,
                     columns=columns),
            _progress(progress),
        )
    return _read_output(path, format)


@_usage_errors
def search(
    queries: Any,
    gallery: Any,
    *,
    out: str | os.PathLike,
    stats: str | os.PathLike | None = None,
    methods: str | Sequence[str] = ("is",),
    k: int = 10,
    overwrite: bool = False,
    memory_limit: str = "2GiB",
    threads: int = 0,
    normalize: bool = True,
    precision: str = "exact",
    skip_missing: bool = False,
    format: str = "parquet",
    append: bool = False,
    columns: Mapping[str, str] | None = None,
    progress: bool = True,
    **params: float,
) -> tuple[pa.Table, dict[str, Any]]:
    """Pass 2, as ``hubnorm search``: the corrected top-``k`` lists of
    ``queries`` with the statistics of the file ``stats`` (from
    :func:`stats`; none for ``methods=["none"]``), written to ``out``
    (``results.parquet``). Returns the results and the summary (hubness
    and, with ground truth, recall figures). ``precision``, ``format`` and
    ``append`` as for :func:`run` (``append=True`` adds the new queries'
    lists to a Delta results table, and returns the table's rows)."""
    table = _table_format(format, append, out)
    with _Inputs() as inputs:
        summary = _hubnorm.search(
            inputs.path(queries, "queries"),
            inputs.path(gallery, "gallery"),
            None if stats is None else os.fspath(stats),
            _names(methods),
            params,
            _count("k", k, 1),
            os.fspath(out),
            overwrite,
            table,
            _options(memory_limit, threads, normalize, precision=precision,
                     skip_missing=skip_missing, columns=columns),
            _progress(progress),
        )
    return _read_output(os.fspath(out), format), json.loads(summary)


@dataclass
class Comparison(Run):
    """What :func:`compare` made: a :class:`Run` of every method, with the
    comparison (``compare.parquet``, ``compare.md``) and the reports."""

    left_out: list[str] = field(default_factory=list)
    html: str | None = None

    @property
    def table(self) -> pa.Table:
        """One row per method: hubness measures and quality figures side by side."""
        return self._table("compare.parquet")

    @property
    def report(self) -> pa.Table:
        """Per method, the hubness and quality report (``report.parquet``)."""
        return self._table("report.parquet")


@_usage_errors
def compare(
    queries: Any,
    gallery: Any,
    bank: Any = None,
    *,
    gallery_bank: Any = None,
    methods: str | Sequence[str] | None = None,
    k: int = 10,
    hubness_k: int = 10,
    transductive: bool = False,
    out: str | os.PathLike | None = None,
    html: str | os.PathLike | None = None,
    overwrite: bool = False,
    memory_limit: str = "2GiB",
    threads: int = 0,
    normalize: bool = True,
    tolerance: float | None = None,
    bank_sample: int | None = None,
    seed: int = 0,
    precision: str = "exact",
    skip_missing: bool = False,
    checkpoint_interval: float | None = None,
    resume: bool = False,
    format: str = "parquet",
    append: bool = False,
    columns: Mapping[str, str] | None = None,
    progress: bool = True,
    **params: float,
) -> Comparison:
    """Every method side by side, as ``hubnorm compare``: a :func:`run` of
    ``methods`` (by default every method the inputs allow, each with its
    defaults; ``left_out`` says which were left out and why), with hubness
    at ``hubness_k``, the comparison table and the reports; ``html`` also
    writes the self-contained HTML page there. Other arguments as for
    :func:`run`."""
    table = _table_format(format, append, out)
    checkpointing = _checkpointing(out, checkpoint_interval, resume,
                                   (queries, gallery, bank, gallery_bank))
    with _Outputs(out, "hubnorm-compare-") as (directory, temporary), _Inputs() as inputs:
        summary, left_out = _hubnorm.compare(
            _run_args(inputs, queries, gallery, bank, gallery_bank,
                      [] if methods is None else _names(methods), k, transductive, directory,
                      overwrite or temporary, checkpointing, table),
            params,
            _count("hubness_k", hubness_k, 1),
            None if html is None else os.fspath(html),
            overwrite,
            _options(memory_limit, threads, normalize, tolerance, bank_sample, seed, precision,
                     skip_missing, columns),
            _progress(progress),
        )
    return Comparison(directory, json.loads(summary), temporary, RUN_OUTPUTS + COMPARE_OUTPUTS,
                      left_out, None if html is None else os.fspath(html), format=format)


@_usage_errors
def report(
    results: Any,
    gallery: Any,
    *,
    out: str | os.PathLike,
    queries: Any = None,
    stats: str | os.PathLike | None = None,
    k: int = 10,
    html: str | os.PathLike | None = None,
    overwrite: bool = False,
    memory_limit: str = "2GiB",
    threads: int = 0,
    normalize: bool = True,
    skip_missing: bool = False,
    format: str = "parquet",
    append: bool = False,
    columns: Mapping[str, str] | None = None,
    progress: bool = True,
) -> pa.Table:
    """Hubness (k-occurrence at ``k``) and, with ``queries`` that have
    ground truth, quality of a results table, as ``hubnorm report``:
    hubnorm's own or any table with ``query_id`` and ``gallery_id``
    (``method`` and ``rank`` used when present). Writes ``report.parquet``
    and ``gallery_report.parquet`` into ``out`` (and ``html``) and returns
    the report table. ``format`` and ``append`` as for :func:`run`."""
    table = _table_format(format, append, out)
    with _Inputs() as inputs:
        _hubnorm.report(
            inputs.path(results, "results", as_file=True),
            inputs.path(gallery, "gallery"),
            inputs.path(queries, "queries"),
            None if stats is None else os.fspath(stats),
            _count("k", k, 1),
            os.fspath(out),
            None if html is None else os.fspath(html),
            overwrite,
            table,
            _options(memory_limit, threads, normalize, skip_missing=skip_missing,
                     columns=columns),
            _progress(progress),
        )
    return _read_output(os.path.join(os.fspath(out), "report.parquet"), format)


@_usage_errors
def export(
    gallery: Any,
    stats: str | os.PathLike,
    *,
    out: str | os.PathLike,
    method: str = "is",
    overwrite: bool = False,
    memory_limit: str = "2GiB",
    threads: int = 0,
    normalize: bool = True,
    format: str = "parquet",
    append: bool = False,
    columns: Mapping[str, str] | None = None,
    progress: bool = True,
    **params: float,
) -> pa.Table:
    """The gallery for an inner-product vector index, as ``hubnorm export``:
    every (normalised) vector with h(g) of ``method`` appended (d + 1
    values), so that a normalised query vector with :data:`QUERY_SUFFIX`
    (-1) appended ranks by the corrected score s(q, g) - h(g). ``method`` takes
    the statistic ``stats`` holds for it (or ``**params``). Writes ``out``
    (``format`` and ``append`` as for :func:`run`) and returns it as a table."""
    table = _table_format(format, append, out)
    with _Inputs() as inputs:
        _hubnorm.export(
            inputs.path(gallery, "gallery"),
            os.fspath(stats),
            method,
            params,
            os.fspath(out),
            overwrite,
            table,
            _options(memory_limit, threads, normalize, columns=columns),
            _progress(progress),
        )
    return _read_output(os.fspath(out), format)


#: The value to append to every normalised query vector searched against
#: :func:`export`'s vectors.
QUERY_SUFFIX = -1.0


@_usage_errors
def tune(
    gallery: Any,
    bank: Any,
    *,
    out: str | os.PathLike,
    validation: Any = None,
    validation_split: float | None = None,
    validation_gallery: Any = None,
    gallery_bank: Any = None,
    methods: str | Sequence[str] = (),
    grid: Sequence[str] = (),
    metric: str = "r1",
    seed: int = 0,
    html: str | os.PathLike | None = None,
    overwrite: bool = False,
    memory_limit: str = "2GiB",
    threads: int = 0,
    normalize: bool = True,
    tolerance: float | None = None,
    precision: str = "exact",
    columns: Mapping[str, str] | None = None,
    progress: bool = True,
) -> tuple[pa.Table, dict[str, Any]]:
    """Each method's parameters chosen on validation queries, as
    ``hubnorm tune``: ``validation`` (queries with ground truth in the
    gallery) or ``validation_split`` (that fraction of the bank, drawn with
    ``seed``, searched in ``validation_gallery`` or the gallery). ``methods``
    (default: every method with parameters the inputs allow), ``grid`` axes
    as on the command line (``"beta=10,20,40"``, ``"nnn.k=64,128"``),
    ``metric`` ``r1``/``r5``/``r10``/``mrr``. Writes ``tune.parquet`` and
    ``tuned.json`` into ``out``; returns the grid and the chosen
    configuration: ``tuned["methods"]`` lists each method with its
    ``parameters`` as stats files and the CLI's ``--config`` name them, and
    the same values as ``keywords``, what :func:`run` takes:
    ``run(..., methods=[m["method"]], **m["keywords"])``."""
    with _Inputs() as inputs:
        tuned = _hubnorm.tune(
            inputs.path(gallery, "gallery"),
            inputs.path(bank, "bank"),
            inputs.path(gallery_bank, "gallery_bank"),
            inputs.path(validation, "validation"),
            validation_split,
            inputs.path(validation_gallery, "validation_gallery"),
            _names(methods, allow_none=True),
            list(grid),
            metric,
            os.fspath(out),
            None if html is None else os.fspath(html),
            overwrite,
            _options(memory_limit, threads, normalize, tolerance, seed=seed, precision=precision,
                     columns=columns),
            _progress(progress),
        )
    return _read_output(os.path.join(os.fspath(out), "tune.parquet"), "parquet"), json.loads(tuned)


@_usage_errors
def sql(
    query: str,
    tables: Mapping[str, Any] | None = None,
    *,
    run: str | os.PathLike | None = None,
    memory_limit: str = "2GiB",
    threads: int = 0,
) -> pa.Table:
    """The rows of the last statement of ``query`` (statements separated by
    ``;``), as ``hubnorm sql``: DataFusion SQL with hubnorm's functions
    installed (``hub_cosine``, ``hub_corrected_score``, ``hub_kocc``, the
    table functions ``hubnorm_stats(...)`` and ``hubnorm_search(...)``, ...),
    over ``tables`` (name to a path or an in-memory table) and the output
    and input tables of the ``run`` directory.

    The rows come back as Arrow record batches, without a copy."""
    with _Inputs() as inputs:
        named = [(name, inputs.path(table, name)) for name, table in (tables or {}).items()]
        return _hubnorm.sql(query, named, None if run is None else os.fspath(run),
                            _options(memory_limit, threads, True), None)


@_usage_errors
def hubness(results: Any, gallery: Any, *, k: int = 10) -> dict[str, dict[str, float]]:
    """Hubness of top-k lists: per method (``"results"`` when the table has
    no ``method`` column), the k-occurrence measures at ``k`` (skewness,
    hub occurrence, antihub rate, Gini, Robin Hood, ...). ``results`` is
    hubnorm's results table or anyone's with ``query_id`` and
    ``gallery_id`` (``rank`` used when present); ``gallery`` is needed
    because items no list retrieved count too (antihubs). A shortcut of
    :func:`report`."""
    scratch = tempfile.mkdtemp(prefix="hubnorm-hubness-")
    try:
        table = report(results, gallery, out=os.path.join(scratch, "report"), k=k, progress=False)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    measures: dict[str, dict[str, float]] = {}
    for row in table.to_pylist():
        measures.setdefault(row["method"], {})[row["measure"]] = row["value"]
    return measures


# Each function's docstring gains the registry's methods and parameters,
# and its lists of methods by property.
_docs.complete(run, stats, search, compare)
