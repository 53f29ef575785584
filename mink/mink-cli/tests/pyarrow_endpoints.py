"""Every ticket a FlightInfo hands out is readable, for every kind of table.

Run by tests/cli.rs against a `mink dev` node: python pyarrow_endpoints.py HOST:PORT
For a log table, a primary-key table, and a partitioned one of each: GetFlightInfo (and
ListFlights) endpoints, each read with DoGet at its location, give exactly the table's rows;
`total_records` is the row count of a log table and -1 (unknown) for a primary-key table.
The README's recipe (`do_get(info.endpoints[0].ticket)`) works on each.
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


schema = pa.schema(
    [
        pa.field("day", pa.string(), nullable=False),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("n", pa.int64()),
    ]
)
encoded = base64.b64encode(schema.serialize().to_pybytes()).decode()
action("create_database", {"name": "ep", "if_not_exists": True})
kinds = {
    "log": {},
    "log_partitioned": {"partition_keys": ["day"]},
    "pk": {"primary_key": ["day", "id"]},
    "pk_partitioned": {"primary_key": ["day", "id"], "partition_keys": ["day"]},
}
for name, extra in kinds.items():
    action(
        "create_table",
        {"database": "ep", "table": name, "schema": encoded, "options": {"bucket.num": "3"}, **extra},
    )


def batch(ids, n):
    return pa.record_batch(
        [
            pa.array(["2026-11-%02d" % (1 + i % 2) for i in ids]),
            pa.array(ids, pa.int64()),
            pa.array([n] * len(ids), pa.int64()),
        ],
        schema=schema,
    )


# Two writes of the same 40 keys: a log table keeps 80 rows, a primary-key table 40 (n = 2).
for name in kinds:
    writer, reader = client.do_put(flight.FlightDescriptor.for_path("ep", name), schema)
    for n in (1, 2):
        writer.write_batch(batch(list(range(40)), n))
        ack = json.loads(reader.read().to_pybytes())
        assert all("error" not in b for b in ack["buckets"]), ack
    writer.done_writing()
    writer.close()


def rows(table):
    return sorted(zip(*(table.column(c).to_pylist() for c in ("day", "id", "n"))))


expected_log = sorted([("2026-11-%02d" % (1 + i % 2), i, n) for n in (1, 2) for i in range(40)])
expected_pk = sorted([("2026-11-%02d" % (1 + i % 2), i, 2) for i in range(40)])


def read_endpoints(info):
    tables = []
    for e in info.endpoints:
        # Read where the endpoint says (the bucket's leader), as a Flight client does.
        at = flight.connect(e.locations[0]) if e.locations else client
        tables.append(at.do_get(e.ticket).read_all())
    return pa.concat_tables(tables)


listed = {tuple(p.decode() for p in f.descriptor.path): f for f in client.list_flights(b"ep")}
for name in kinds:
    primary = name.startswith("pk")
    expected = expected_pk if primary else expected_log
    info = client.get_flight_info(flight.FlightDescriptor.for_path("ep", name))
    buckets = 3 * (2 if name.endswith("partitioned") else 1)
    assert len(info.endpoints) == buckets, (name, info.endpoints)
    assert info.total_records == (-1 if primary else len(expected)), (name, info.total_records)
    got = read_endpoints(info)
    assert got.schema.equals(schema), (name, got.schema)
    assert rows(got) == expected, (name, rows(got))
    assert rows(read_endpoints(listed[("ep", name)])) == expected, name
    # The README's recipe: the first endpoint reads without an error.
    first = client.do_get(info.endpoints[0].ticket).read_all()
    assert first.schema.equals(schema), (name, first.schema)

print("ok")
