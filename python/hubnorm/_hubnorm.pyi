"""Types of the Rust extension behind :mod:`hubnorm` (private: call the
package's functions, which document the arguments). Every job function
blocks until the job ends, with the GIL released; ``on_progress`` is called
with ``(phase, done, total, status)``; paths are local paths, object-store
URLs or the ``memory://`` paths of :class:`InMemoryTable`."""

from os import PathLike
from typing import Any, Callable, Mapping, Sequence, TypedDict

import pyarrow

__version__: str

Progress = Callable[[str, int, int, str], None] | None
Path = str | PathLike[str]

class Options(TypedDict):
    memory_limit: str
    threads: int
    normalize: bool
    tolerance: float | None
    bank_sample: int | None
    seed: int
    precision: str
    skip_missing: bool

class RunArgs(TypedDict):
    queries: str
    gallery: str
    bank: str | None
    gallery_bank: str | None
    methods: list[str]
    k: int
    transductive: bool
    out_dir: str
    overwrite: bool
    checkpoint_interval: float | None
    resume: bool
    format: str
    append: bool

class InMemoryTable:
    """An Arrow table (anything with ``__arrow_c_stream__``) registered with
    the engine under :attr:`path` until this object is dropped; its buffers
    are shared, not copied."""

    def __init__(self, data: Any, role: str) -> None: ...
    @property
    def path(self) -> str: ...
    @property
    def rows(self) -> int: ...
    def buffer_addresses(self) -> list[int]: ...

def run(args: RunArgs, params: Mapping[str, float], options: Options,
        on_progress: Progress) -> str:
    """The summary JSON."""

#: How a call writes its tables: ``(format, append)``, ``format`` being
#: ``"parquet"`` or ``"delta"``.
TableChoice = tuple[str, bool]

def stats(gallery: str, bank: str, gallery_bank: str | None, methods: Sequence[str],
          params: Mapping[str, float], out: Path, overwrite: bool, format: str,
          checkpoint_interval: float | None, resume: bool, options: Options,
          on_progress: Progress) -> str:
    """The path written."""

def search(queries: str, gallery: str, stats: Path | None, methods: Sequence[str],
           params: Mapping[str, float], k: int, out: Path, overwrite: bool,
           table: TableChoice, options: Options, on_progress: Progress) -> str:
    """The summary JSON."""

def compare(args: RunArgs, params: Mapping[str, float], hubness_k: int, html: Path | None,
            overwrite_html: bool, options: Options,
            on_progress: Progress) -> tuple[str, list[str]]:
    """The summary JSON and the methods left out, with why."""

def report(results: Path, gallery: str, queries: str | None, stats: Path | None, k: int,
           out_dir: Path, html: Path | None, overwrite: bool, table: TableChoice,
           options: Options, on_progress: Progress) -> None: ...

def export(gallery: str, stats: Path, method: str, params: Mapping[str, float], out: Path,
           overwrite: bool, table: TableChoice, options: Options,
           on_progress: Progress) -> tuple[int, int]:
    """Rows written and the dimension."""

def tune(gallery: str, bank: str, gallery_bank: str | None, validation: str | None,
         validation_split: float | None, validation_gallery: str | None,
         methods: Sequence[str], grid: Sequence[str], metric: str, out_dir: Path,
         html: Path | None, overwrite: bool, options: Options,
         on_progress: Progress) -> str:
    """tuned.json's text, each method with its parameters as ``keywords`` too."""

def sql(sql: str, tables: Sequence[tuple[str, str]], run_dir: Path | None,
        options: Options, on_progress: Progress) -> pyarrow.Table:
    """The last statement's rows."""

def methods() -> list[dict[str, Any]]: ...
