"""Mink's Arrow Flight service through pyarrow.flight, an unmodified real client.

Run by tests/cli.rs against a `mink dev` node: python pyarrow_flight.py HOST:PORT
Exits non-zero (with the failing assertion) if anything is off.
"""

import base64
import json
import sys
import threading

import pyarrow as pa
import pyarrow.flight as flight

address = sys.argv[1]
client = flight.connect(f"grpc://{address}")


def action(kind, body):
    results = list(client.do_action(flight.Action(kind, json.dumps(body).encode())))
    assert len(results) == 1, results
    return json.loads(results[0].body.to_pybytes())


def expect_error(error_type, fn, needle=None):
    try:
        fn()
    except error_type as e:
        if needle is not None:
            assert needle in str(e), f"{needle!r} not in {e}"
        return e
    raise AssertionError(f"expected {error_type.__name__}")


# Admin: a database and a table whose schema is pyarrow's own serialization.
schema = pa.schema(
    [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("event", pa.string()),
        pa.field("score", pa.float64()),
        pa.field("tags", pa.list_(pa.string())),
        pa.field("at", pa.timestamp("us")),
    ]
)
action("create_database", {"name": "py", "if_not_exists": True})
created = action(
    "create_table",
    {
        "database": "py",
        "table": "events",
        "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
        "options": {"bucket.num": "3", "bucket.key": "user_id"},
    },
)
assert created["bucket_count"] == 3, created
assert [c["name"] for c in created["columns"]] == schema.names
assert "events" in action("list_tables", {"database": "py"})["tables"]
actions = {a.type for a in client.list_actions()}
assert {"create_table", "describe_table", "allocate_writer"} <= actions, actions

# Write: a routed DoPut with a path descriptor; one PutResult per batch, a result per bucket.
descriptor = flight.FlightDescriptor.for_path("py", "events")


def rows(ids):
    return pa.record_batch(
        [
            pa.array(ids, pa.int64()),
            pa.array([f"e{i}" for i in ids]),
            pa.array([i / 2 for i in ids], pa.float64()),
            pa.array([[str(i), "x"] for i in ids], pa.list_(pa.string())),
            pa.array([1_700_000_000_000_000 + i for i in ids], pa.timestamp("us")),
        ],
        schema=schema,
    )


writer, reader = client.do_put(descriptor, schema)
acks = []
for start in range(0, 300, 100):
    writer.write_batch(rows(list(range(start, start + 100))))
    acks.append(json.loads(reader.read().to_pybytes()))
writer.done_writing()
writer.close()
assert [a["batch"] for a in acks] == [0, 1, 2], acks
for a in acks:
    assert sum(r["rows"] for r in a["buckets"]) == 100, a
    assert all("error" not in r and r["end_offset"] - r["base_offset"] == r["rows"] for r in a["buckets"]), a

# Read: FlightInfo has an endpoint per bucket; reading them all gives every row once.
info = client.get_flight_info(descriptor)
assert info.schema.equals(schema), info.schema
assert len(info.endpoints) == 3 and info.total_records == 300, info
table = pa.concat_tables(client.do_get(e.ticket).read_all() for e in info.endpoints)
assert sorted(table.column("user_id").to_pylist()) == list(range(300))
assert table.schema.equals(schema)
assert client.get_schema(descriptor).schema.equals(schema)
listed = [f.descriptor.path for f in client.list_flights(b"py")]
assert [b"py", b"events"] in [list(p) for p in listed], listed

# A whole-table ticket with projection; per-batch app_metadata says where the rows are.
ticket = flight.Ticket(json.dumps({"database": "py", "table": "events", "columns": ["event", "user_id"]}).encode())
stream = client.do_get(ticket)
projected = stream.read_all()
assert projected.schema.names == ["event", "user_id"], projected.schema
assert projected.num_rows == 300
stream = client.do_get(flight.Ticket(json.dumps({"database": "py", "table": "events", "bucket": 1, "offset": 5}).encode()))
chunk = stream.read_chunk()
meta = json.loads(chunk.app_metadata.to_pybytes())
assert meta["bucket"] == 1 and meta["offset"] == 5, meta

# Tail: a reader waiting at the end of bucket 0 sees rows written after it started.
desc = action("describe_table", {"database": "py", "table": "events"})
b0 = next(b for b in desc["buckets"] if b["bucket"] == 0)
tail_ticket = {"database": "py", "table": "events", "bucket": 0, "latest": True, "tail": True, "tail_idle_ms": 5000}
seen = []


# The node sends a read's schema once it has planned it: from then on the tail follows from
# the end it planned at, so the write below comes after its start.
tail = client.do_get(flight.Ticket(json.dumps(tail_ticket).encode()))
assert tail.schema.names[0] == "user_id", tail.schema


def follow():
    c = tail.read_chunk()
    seen.append((json.loads(c.app_metadata.to_pybytes()), c.data.column(0).to_pylist()))


t = threading.Thread(target=follow)
t.start()
w, r = client.do_put(descriptor, schema)
w.write_batch(rows(list(range(1000, 1030))))
late_ack = json.loads(r.read().to_pybytes())
w.close()
t.join(10)
assert seen, "the tail saw nothing"
meta, ids = seen[0]
assert meta["offset"] == b0["end_offset"], (meta, b0)
bucket0 = next(x for x in late_ack["buckets"] if x["bucket"] == 0)
assert len(ids) == bucket0["rows"] and all(1000 <= i < 1030 for i in ids), (ids, bucket0)

# Dictionary-encoded columns: stored per batch, read back with their dictionaries (a new one
# replaces the last when it changes).
dict_schema = pa.schema(
    [pa.field("id", pa.int64(), nullable=False), pa.field("color", pa.dictionary(pa.int32(), pa.string()))]
)
action(
    "create_table",
    {
        "database": "py",
        "table": "colors",
        "schema": base64.b64encode(dict_schema.serialize().to_pybytes()).decode(),
        "options": {"bucket.num": "1"},
    },
)
w, r = client.do_put(flight.FlightDescriptor.for_path("py", "colors"), dict_schema)
for ids, colors in (([1, 2], ["red", "blue"]), ([3], ["green"])):
    w.write_batch(
        pa.record_batch(
            [pa.array(ids, pa.int64()), pa.array(colors).dictionary_encode()], schema=dict_schema
        )
    )
w.done_writing()
r.read()
r.read()
w.close()
colors = client.do_get(flight.Ticket(json.dumps({"database": "py", "table": "colors"}).encode())).read_all()
assert colors.schema.field("color").type == dict_schema.field("color").type, colors.schema
assert colors.column("color").to_pylist() == ["red", "blue", "green"], colors

# Common Arrow types, nested included, round-trip through a log table and a primary-key table.
import datetime
import decimal

wide = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("amount", pa.decimal128(10, 2)),
        pa.field("point", pa.struct([("x", pa.float64()), ("y", pa.float64())])),
        pa.field("big", pa.large_string()),
        pa.field("blob", pa.binary()),
        pa.field("day", pa.date32()),
        pa.field("t", pa.time64("us")),
        pa.field("fixed", pa.binary(4)),
        pa.field("flag", pa.bool_()),
        pa.field("ts", pa.timestamp("ms", tz="UTC")),
        pa.field("tags", pa.large_list(pa.string())),
        pa.field("attrs", pa.map_(pa.string(), pa.int32())),
    ]
)
wide_rows = pa.Table.from_pylist(
    [
        {
            "id": 1,
            "amount": decimal.Decimal("12.34"),
            "point": {"x": 1.0, "y": 2.0},
            "big": "x",
            "blob": b"\x00\x01",
            "day": datetime.date(2024, 1, 2),
            "t": datetime.time(1, 2, 3),
            "fixed": b"abcd",
            "flag": True,
            "ts": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
            "tags": ["p", "q"],
            "attrs": [("a", 1)],
        },
        {"id": 2},
    ],
    schema=wide,
)


def roundtrip(table, rows, extra=None):
    action(
        "create_table",
        {
            "database": "py",
            "table": table,
            "schema": base64.b64encode(rows.schema.serialize().to_pybytes()).decode(),
            "options": {"bucket.num": "2", "bucket.key": "id"},
            **(extra or {}),
        },
    )
    w, r = client.do_put(flight.FlightDescriptor.for_path("py", table), rows.schema)
    for b in rows.to_batches():
        w.write_batch(b)
    w.done_writing()
    r.read()
    w.close()
    got = client.do_get(flight.Ticket(json.dumps({"database": "py", "table": table}).encode()))
    got = got.read_all().sort_by("id")
    assert got.schema.equals(rows.schema, check_metadata=False), (got.schema, rows.schema)
    assert got.to_pylist() == rows.to_pylist(), got.to_pylist()


roundtrip("wide", wide_rows)
# Primary-key tables refuse map columns (the working copy's row format has no maps).
roundtrip("wide_pk", wide_rows.drop_columns(["attrs"]), {"primary_key": ["id"]})

# Bad input: precise errors, and the node keeps serving.
expect_error(KeyError, lambda: client.get_flight_info(flight.FlightDescriptor.for_path("py", "nope")), "does not exist")
expect_error(pa.ArrowInvalid, lambda: client.do_get(flight.Ticket(b"not json")).read_all(), "ticket")
expect_error(pa.ArrowInvalid, lambda: action("create_table", {"database": "py"}), "create_table")
wrong = pa.schema([pa.field("user_id", pa.string())])
w, r = client.do_put(descriptor, wrong)
w.write_batch(pa.record_batch([pa.array(["x"])], schema=wrong))
expect_error(pa.ArrowInvalid, lambda: (w.done_writing(), r.read(), w.close()), "user_id")
nulls = pa.schema([pa.field("user_id", pa.int64())] + list(schema)[1:])
w, r = client.do_put(descriptor, nulls)
bad = rows([1, 2]).to_pydict()
bad["user_id"] = [1, None]
w.write_batch(pa.record_batch([pa.array(bad[n], f.type) for n, f in zip(nulls.names, nulls)], schema=nulls))
expect_error(pa.ArrowInvalid, lambda: (w.done_writing(), r.read(), w.close()), "not nullable")
# app_metadata alone is not a batch (a flatbuffer range error said so before).
w, r = client.do_put(descriptor, schema)
w.write_metadata(pa.py_buffer(b'{"bucket": 0}'))
expect_error(pa.ArrowInvalid, lambda: (w.done_writing(), r.read(), w.close()), "app_metadata alone carries no batch")
assert client.do_get(info.endpoints[0].ticket).read_all().num_rows > 0

print("pyarrow.flight: all checks passed")
