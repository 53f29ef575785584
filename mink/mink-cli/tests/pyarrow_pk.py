"""Primary-key tables through pyarrow.flight, an unmodified real client: create, upsert, delete,
partial update, lookups, prefix lookups, snapshot scan, changelog; precise errors.

Run by tests/cli.rs against a `mink dev` node: python pyarrow_pk.py HOST:PORT
"""

import base64
import json
import sys

import pyarrow as pa
import pyarrow.flight as flight

address = sys.argv[1]
client = flight.connect(f"grpc://{address}")


def action(kind, body):
    results = list(client.do_action(flight.Action(kind, json.dumps(body).encode())))
    return json.loads(results[0].body.to_pybytes())


def expect_error(fn, needle):
    try:
        fn()
    except (flight.FlightError, pa.ArrowException) as e:
        assert needle in str(e), f"{needle!r} not in {e}"
        return
    raise AssertionError(f"expected an error with {needle!r}")


def get(ticket):
    return client.do_get(flight.Ticket(json.dumps(ticket).encode())).read_all()


def put(table, batch, columns=None):
    cmd = {"database": "shop", "table": table}
    if columns is not None:
        cmd["columns"] = columns
    writer, reader = client.do_put(
        flight.FlightDescriptor.for_command(json.dumps(cmd).encode()), batch.schema
    )
    writer.write_batch(batch)
    writer.done_writing()
    buf = reader.read()
    writer.close()  # raises the server's error, if any
    ack = json.loads(buf.to_pybytes())
    for b in ack["buckets"]:
        assert "error" not in b, ack
    return ack


schema = pa.schema(
    [
        pa.field("shop", pa.int64()),
        pa.field("item", pa.string()),
        pa.field("price", pa.float64()),
        pa.field("stock", pa.int64()),
    ]
)


def create(table, options):
    return action(
        "create_table",
        {
            "database": "shop",
            "table": table,
            "schema": base64.b64encode(schema.serialize().to_pybytes()).decode(),
            "primary_key": ["shop", "item"],
            "options": {"bucket.num": "2", "bucket.key": "shop", **options},
        },
    )


action("create_database", {"name": "shop", "if_not_exists": True})
created = create("items", {})
assert created["primary_key"] == ["shop", "item"], created
assert not [c for c in created["columns"] if c["name"] == "shop"][0]["nullable"], created


def batch(rows, kinds=None):
    arrays = [
        pa.array([r[0] for r in rows], pa.int64()),
        pa.array([r[1] for r in rows]),
        pa.array([r[2] for r in rows], pa.float64()),
        pa.array([r[3] for r in rows], pa.int64()),
    ]
    names = list(schema.names)
    if kinds is not None:
        arrays.append(pa.array(kinds))
        names.append("_row_kind")
    return pa.record_batch(arrays, names=names)


put(
    "items",
    batch(
        [
            (1, "apple", 1.0, 10),
            (1, "pear", 2.0, 5),
            (2, "apple", 1.5, 7),
            (1, "apple", 1.2, 9),
        ]
    ),
)
# A delete and an upsert in one batch.
put("items", batch([(1, "pear", None, None), (3, "fig", 4.0, 1)], ["delete", "upsert"]))
# A partial update: only the price of an existing row.
put(
    "items",
    pa.record_batch(
        [pa.array([2], pa.int64()), pa.array(["apple"]), pa.array([1.9], pa.float64())],
        names=["shop", "item", "price"],
    ),
)

found = get(
    {
        "database": "shop",
        "table": "items",
        "lookup": [
            {"shop": 2, "item": "apple"},
            {"shop": 1, "item": "pear"},
            {"shop": 1, "item": "apple"},
        ],
    }
)
assert found.to_pylist() == [
    {"shop": 2, "item": "apple", "price": 1.9, "stock": 7},
    {"shop": 1, "item": "apple", "price": 1.2, "stock": 9},
], found.to_pylist()

prefix = get(
    {
        "database": "shop",
        "table": "items",
        "prefix_lookup": [{"shop": 1}],
        "columns": ["item", "stock"],
    }
)
assert prefix.to_pylist() == [{"item": "apple", "stock": 9}], prefix.to_pylist()

snapshot = get({"database": "shop", "table": "items"})
assert sorted((r["shop"], r["item"]) for r in snapshot.to_pylist()) == [
    (1, "apple"),
    (2, "apple"),
    (3, "fig"),
], snapshot.to_pylist()

info = action("describe_table", {"database": "shop", "table": "items"})
changes = []
for b in info["buckets"]:
    log = get(
        {"database": "shop", "table": "items", "bucket": b["bucket"], "changelog": True}
    )
    assert log.schema.names[:3] == ["_change_type", "_log_offset", "_commit_timestamp"]
    changes += [(r["_change_type"], r["shop"], r["item"]) for r in log.to_pylist()]
assert ("delete", 1, "pear") in changes, changes
assert changes.count(("update_after", 1, "apple")) == 1, changes
assert ("update_before", 2, "apple") in changes, changes

# An aggregation table: stock sums up, the price keeps the maximum.
create(
    "totals",
    {
        "table.merge-engine": "aggregation",
        "fields.stock.agg": "sum",
        "fields.price.agg": "max",
    },
)
for rows in ([(1, "apple", 1.0, 10)], [(1, "apple", 3.0, 5)], [(1, "apple", 2.0, None)]):
    put("totals", batch(rows))
total = get({"database": "shop", "table": "totals", "lookup": [{"shop": 1, "item": "apple"}]})
assert total.to_pylist() == [{"shop": 1, "item": "apple", "price": 3.0, "stock": 15}], total

# A delete that sends only the key columns deletes the row.
put(
    "items",
    pa.record_batch(
        [pa.array([3], pa.int64()), pa.array(["fig"]), pa.array(["delete"])],
        names=["shop", "item", "_row_kind"],
    ),
)
assert get({"database": "shop", "table": "items", "lookup": [{"shop": 3, "item": "fig"}]}).num_rows == 0
put("items", batch([(3, "fig", 4.0, 1)]))

# An auto-increment column: generated for new keys, kept on updates, never written.
ids_schema = pa.schema([pa.field("name", pa.string()), pa.field("uid", pa.int64())])
action(
    "create_table",
    {
        "database": "shop",
        "table": "ids",
        "schema": base64.b64encode(ids_schema.serialize().to_pybytes()).decode(),
        "primary_key": ["name"],
        "options": {"auto-increment.fields": "uid", "table.merge-engine": "first_row"},
    },
)
names = lambda *n: pa.record_batch([pa.array(list(n))], names=["name"])
put("ids", names("ann", "bob"))
put("ids", names("bob", "cat"))
uids = get({"database": "shop", "table": "ids", "lookup": [{"name": n} for n in ("ann", "bob", "cat")]})
assert sorted(uids.column("uid").to_pylist()) == [1, 2, 3], uids.to_pylist()

# Precise errors; the node keeps serving.
expect_error(lambda: create("bad", {"table.merge-engine": "newest"}), "table.merge-engine")
expect_error(
    lambda: create("bad", {"table.merge-engine": "aggregation", "table.changelog.image": "WAL"}),
    "needs FULL",
)
expect_error(
    lambda: put(
        "items",
        pa.record_batch(
            [pa.array([1], pa.int64()), pa.array([None], pa.string())], names=["shop", "item"]
        ),
    ),
    "not nullable",
)
expect_error(
    lambda: put(
        "items",
        pa.record_batch(
            [pa.array([1], pa.int64()), pa.array([5], pa.int64())], names=["shop", "stock"]
        ),
    ),
    "every primary key column",
)
expect_error(lambda: put("items", batch([(1, "x", 1.0, 1)], ["remove"])), "upsert or delete")
expect_error(
    lambda: get({"database": "shop", "table": "items", "lookup": [{"shop": 1}]}),
    "no value for \"item\"",
)
# What a lookup does not take is refused, not ignored: read fields, key columns past the key or
# the prefix, a null, a fraction for an integer column.
items = {"database": "shop", "table": "items"}
for extra, needle in [
    ({"filter": [{"column": "price", "op": ">", "value": 5}]}, "filter does not apply to a lookup"),
    ({"changelog": True}, "changelog does not apply"),
    ({"bucket": 0}, "bucket does not apply"),
]:
    expect_error(lambda: get({**items, "lookup": [{"shop": 1, "item": "apple"}], **extra}), needle)
expect_error(
    lambda: get({**items, "prefix_lookup": [{"shop": 1, "item": "zz"}]}),
    "key 0: \"item\" is not one of the key's columns",
)
expect_error(
    lambda: get({**items, "lookup": [{"shop": 1, "item": "apple", "x": 1}]}),
    "\"x\" is not one of the key's columns",
)
# A misspelt column alone is named, not taken for a key that lacks the real one.
expect_error(
    lambda: get({**items, "lookup": [{"shp": 1, "item": "apple"}]}),
    "key 0: \"shp\" is not one of the key's columns",
)
expect_error(lambda: get({**items, "lookup": [{"shop": None, "item": "apple"}]}), "\"shop\" is null")
expect_error(
    lambda: get({**items, "lookup": [{"shop": 1.5, "item": "apple"}]}),
    "not exactly a value of its type Int64",
)
expect_error(lambda: get({**items, "prefix_lookup": [{"shop": 1.9}]}), "not exactly a value")
# A table whose bucket key is its whole key serves no prefix lookups: said before the keys are read.
expect_error(
    lambda: get({"database": "shop", "table": "ids", "prefix_lookup": [{"nam": "a"}]}),
    "prefix lookups need a bucket key that is a proper prefix of the primary key",
)
# A descriptor's columns that are not the batch's: refused, nothing written.
expect_error(
    lambda: put(
        "items",
        pa.record_batch(
            [pa.array([1], pa.int64()), pa.array(["apple"]), pa.array([7.0])],
            names=["shop", "item", "price"],
        ),
        columns=["shop", "item", "stock"],
    ),
    "are not the batch's columns",
)
create("frozen", {"table.delete.behavior": "disable"})
expect_error(lambda: put("frozen", batch([(1, "x", 1.0, 1)], ["delete"])), "disabled")
expect_error(
    lambda: put("ids", pa.record_batch([pa.array(["dan"]), pa.array([7], pa.int64())], names=["name", "uid"])),
    "auto-increment",
)
assert get({"database": "shop", "table": "items"}).num_rows == 3
print("ok")
