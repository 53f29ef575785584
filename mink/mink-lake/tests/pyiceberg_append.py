"""Appends one row to an Iceberg table with pyiceberg, as a writer other than Mink would:
null in each optional column, zero, "x" or the epoch in each required one, by type.

    python pyiceberg_append.py <catalog uri> <warehouse> <database> <table>
"""

import sys

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog

uri, warehouse, database, table = sys.argv[1:5]
t = SqlCatalog("mink", uri=uri, warehouse=warehouse).load_table(f"{database}.{table}")
schema = t.schema().as_arrow()


def one(field):
    if field.nullable:
        return pa.nulls(1, field.type)
    if pa.types.is_string(field.type) or pa.types.is_large_string(field.type):
        return pa.array(["x"], field.type)
    return pa.array([0], pa.int64()).cast(field.type)


t.append(pa.Table.from_arrays([one(f) for f in schema], schema=schema))
