"""Loads a Mink lake table with pyiceberg through the SQL catalog Mink writes, and prints what
it sees as JSON: the columns (name, type, required), the partition fields, the location, the
rows (their count and offsets) and Mink's tiered offsets in the snapshot summary.

    python pyiceberg_read.py <catalog uri> <warehouse> <database> <table>
"""

import json
import sys

from pyiceberg.catalog.sql import SqlCatalog

uri, warehouse, database, table = sys.argv[1:5]
catalog = SqlCatalog("mink", uri=uri, warehouse=warehouse)
t = catalog.load_table(f"{database}.{table}")
schema = t.schema()
print(
    json.dumps(
        {
            "columns": [[f.name, str(f.field_type), f.required] for f in schema.fields],
            "partition": [
                [schema.find_field(p.source_id).name, str(p.transform)]
                for p in t.spec().fields
            ],
            "location": t.location(),
            "rows": t.scan().to_arrow().num_rows,
            "offsets": sorted(
                t.scan(selected_fields=("__offset",)).to_arrow().column("__offset").to_pylist()
            ),
            "summary": {
                k: v
                for k, v in (t.current_snapshot().summary.additional_properties.items()
                             if t.current_snapshot() else [])
                if k.startswith("mink.")
            },
        }
    )
)
