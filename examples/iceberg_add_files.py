"""Register hubnorm's Parquet outputs in an Apache Iceberg catalog.

The Rust Iceberg crates do not yet build on DataFusion 55, so hubnorm
writes no Iceberg table itself. Its Parquet outputs register as they are:
pyiceberg's `add_files` adds existing Parquet files to an Iceberg table
without rewriting them (the table's schema is taken from the first file).

    pip install 'pyiceberg[sql-sqlite]' pyarrow
    python examples/iceberg_add_files.py WAREHOUSE_DIR OUT/results.parquet [more.parquet ...]

Here the catalog is SQLite in WAREHOUSE_DIR; a REST, Glue or Hive catalog
takes the same `add_files` call. Tested by tests/lake.rs
(`iceberg_registers_the_parquet_outputs`).
"""

import os
import sys

import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog


def main() -> None:
    warehouse, files = sys.argv[1], [os.path.abspath(f) for f in sys.argv[2:]]
    os.makedirs(warehouse, exist_ok=True)
    catalog = SqlCatalog(
        "hubnorm",
        uri=f"sqlite:///{os.path.abspath(warehouse)}/catalog.db",
        warehouse=f"file://{os.path.abspath(warehouse)}",
    )
    catalog.create_namespace_if_not_exists("hubnorm")
    name = "hubnorm.results"
    if not catalog.table_exists(name):
        catalog.create_table(name, schema=pq.read_schema(files[0]))
    table = catalog.load_table(name)
    table.add_files(file_paths=files)
    rows = table.scan().to_arrow().num_rows
    print(f"{name}: {rows} rows in {len(files)} file(s), snapshot {table.current_snapshot().snapshot_id}")


if __name__ == "__main__":
    main()
