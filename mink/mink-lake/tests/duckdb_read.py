"""Reads a Mink lake table with DuckDB's iceberg extension, from its metadata file, and prints
the row count and the sorted __offset values as JSON.

    python duckdb_read.py <metadata.json path>
"""

import json
import os
import sys
import sysconfig

import duckdb

metadata = sys.argv[1]
con = duckdb.connect()
extensions = os.path.join(sysconfig.get_paths()["purelib"], "duckdb_ext", "extensions")
con.execute(f"SET extension_directory = '{extensions}'")
con.execute("LOAD avro")
con.execute("LOAD iceberg")
rows = con.execute(
    "SELECT __offset FROM iceberg_scan(?) ORDER BY __offset", [metadata]
).fetchall()
print(json.dumps({"rows": len(rows), "offsets": [r[0] for r in rows]}))
