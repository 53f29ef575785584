"""Lake-enabled tables through pyarrow.flight, an unmodified real client: a primary-key table
tiered into the lake reads the same rows from its KV tablets (the default), as the union read
(lake snapshot merged with the changelog after it) and, once fully tiered, from the lake alone;
a log table reads its lake, its log and both; a log read of a primary-key table is refused.

Run by tests/cli.rs against a `mink dev` node: python pyarrow_lake.py HOST:PORT
"""

import base64
import json
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight

address = sys.argv[1]
client = flight.connect(f"grpc://{address}")


def action(kind, body):
    results = list(client.do_action(flight.Action(kind, json.dumps(body).encode())))
    return json.loads(results[0].body.to_pybytes())


def get(ticket):
    return client.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all()


def put(table, batch):
    cmd = {"database": "lake", "table": table}
    writer, reader = client.do_put(
        flight.FlightDescriptor.for_command(json.dumps(cmd).encode()), batch.schema
    )
    writer.write_batch(batch)
    writer.done_writing()
    reader.read()
    writer.close()


def create(table, schema, options, primary_key=()):
    return action(
        "create_table",
        {
            "database": "lake",
            "table": table,
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
            "primary_key": list(primary_key),
            "options": {
                "bucket.num": "2",
                "table.datalake.enabled": "true",
                "table.datalake.freshness": "1s",
                **options,
            },
        },
    )


def until_tiered(table, deadline_s=30):
    """Waits, on each metadata change of the node (a call carrying mink-min-applied-index one
    past what the node had applied returns once it moves), until every bucket is tiered to its
    end; fails naming what it saw."""
    deadline = time.monotonic() + deadline_s
    while True:
        info = action("describe_table", {"database": "lake", "table": table})
        behind = [
            (b["bucket"], b.get("tiered_offset"), b["end_offset"])
            for b in info["buckets"]
            if (b.get("tiered_offset") or 0) < b["end_offset"]
        ]
        if not behind:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"{table}: buckets not tiered after {deadline_s}s: {behind}")
        applied = action("describe_cluster", {})["applied_index"]
        options = flight.FlightCallOptions(
            timeout=left, headers=[(b"mink-min-applied-index", str(applied + 1).encode())]
        )
        try:
            list(client.do_action(flight.Action("describe_cluster", b"{}"), options))
        except (flight.FlightError, pa.ArrowException):
            pass  # nothing changed in time: the deadline above decides


def rows(table, **ticket):
    t = get({"database": "lake", "table": table, **ticket})
    return sorted(tuple(r.values()) for r in t.to_pylist())


action("create_database", {"name": "lake", "if_not_exists": True})

# A primary-key table: upserts and deletes, some tiered, some only in the log.
users = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])
create("users", users, {"bucket.key": "id"}, primary_key=["id"])


def change(ops):
    put(
        "users",
        pa.record_batch(
            [
                pa.array([o[0] for o in ops], pa.int64()),
                pa.array([o[1] or "-" for o in ops]),
                pa.array(["upsert" if o[1] else "delete" for o in ops]),
            ],
            names=["id", "name", "_row_kind"],
        ),
    )


change([(i, "a") for i in range(30)])
change([(i, "b") for i in range(5)] + [(i, None) for i in range(5, 10)])
until_tiered("users")
change([(1, "after"), (2, None), (40, "new")])
current = rows("users")
assert (1, "after") in current and (40, "new") in current and (2, "-") not in current, current
assert rows("users", source="union") == current, (rows("users", source="union"), current)
union = get({"database": "lake", "table": "users", "source": "union", "columns": ["name", "id"]})
assert union.schema.names == ["name", "id"], union.schema
until_tiered("users")
assert rows("users", source="lake") == current
# A filter in the ticket: tested after the merge on the union read, the same on every side.
named_b = [{"column": "name", "op": "=", "value": "b"}]
want_b = [r for r in current if r[1] == "b"]
assert want_b and len(want_b) < len(current), current
for source in (None, "union", "lake"):
    got = rows("users", filter=named_b, **({"source": source} if source else {}))
    assert got == want_b, (source, got, want_b)

try:
    get({"database": "lake", "table": "users", "source": "log"})
    raise AssertionError("a log read of a primary-key table was not refused")
except (flight.FlightError, pa.ArrowException) as e:
    assert "primary-key table" in str(e), e

# A log table: the lake below the tiered offset, the log, and both.
events = pa.schema([pa.field("id", pa.int64(), nullable=False)])
create("events", events, {"bucket.key": "id"})
put("events", pa.record_batch([pa.array(range(100), pa.int64())], names=["id"]))
until_tiered("events")
put("events", pa.record_batch([pa.array(range(100, 120), pa.int64())], names=["id"]))
all_rows = [(i,) for i in range(120)]
assert rows("events") == all_rows
assert rows("events", source="union") == all_rows
assert rows("events", source="log") == all_rows
lake = rows("events", source="lake")
assert set(lake) <= set(all_rows) and len(lake) >= 100, lake
between = [{"column": "id", "op": ">=", "value": 90}, {"column": "id", "op": "<", "value": 110}]
assert rows("events", filter=between) == [(i,) for i in range(90, 110)]
assert rows("events", source="lake", filter=between) == [r for r in lake if 90 <= r[0] < 110]
try:
    get({"database": "lake", "table": "events", "filter": [{"column": "nope", "op": "is_null"}]})
    raise AssertionError("a filter on a missing column was not refused")
except (flight.FlightError, pa.ArrowException) as e:
    assert 'filter on "nope": no such column' in str(e), e
print("ok")
