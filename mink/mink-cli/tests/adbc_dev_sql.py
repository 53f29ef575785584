"""SQL against `mink dev`'s Flight SQL endpoint (arguments: its grpc:// URI, then the node's
Flight address, whose metadata changes the test waits on): a lake table
created, written and tiered in SQL, read as the union of the lake snapshot (which the engine
reads from object storage itself) and the log. Prints "ok"."""

import json
import sys
import time

import adbc_driver_flightsql.dbapi as flight_sql
import pyarrow as pa
import pyarrow.flight as flight

conn = flight_sql.connect(sys.argv[1], autocommit=True)
node = flight.connect(f"grpc://{sys.argv[2]}")


def until_change(left):
    """Returns once the node's metadata moves past what it has applied now (a call carrying
    mink-min-applied-index one past it), or after `left` seconds."""
    applied = json.loads(
        list(node.do_action(flight.Action("describe_cluster", b"{}")))[0].body.to_pybytes()
    )["applied_index"]
    options = flight.FlightCallOptions(
        timeout=left, headers=[(b"mink-min-applied-index", str(applied + 1).encode())]
    )
    try:
        list(node.do_action(flight.Action("describe_cluster", b"{}"), options))
    except (flight.FlightError, pa.ArrowException):
        pass  # nothing changed in time: the caller's deadline decides

cur = conn.cursor()


def rows(sql):
    cur.execute(sql)
    return cur.fetchall()


cur.execute("CREATE SCHEMA lake")
cur.execute(
    "CREATE TABLE lake.clicks (id BIGINT NOT NULL, page VARCHAR) WITH ("
    "'bucket.num' = '2', 'table.datalake.enabled' = 'true', 'table.datalake.freshness' = '1s')"
)
cur.executemany("INSERT INTO lake.clicks VALUES (?, ?)", [(i, f"p{i % 3}") for i in range(30)])

# Tiering runs on its schedule: wait, on each metadata change, until the lake holds every row.
deadline = time.monotonic() + 60
while True:
    tiered = rows("SELECT sum(tiered_offset) FROM system.buckets WHERE \"table\" = 'clicks'")[0][0]
    if tiered == 30:
        break
    left = deadline - time.monotonic()
    assert left > 0, f"waited for the lake to hold 30 rows; it holds {tiered}"
    until_change(left)

cur.executemany("INSERT INTO lake.clicks VALUES (?, ?)", [(i, "new") for i in range(30, 35)])
assert rows("SELECT count(*) FROM lake.clicks") == [(35,)]
# The lake holds the first 30 rows, and those of the last 5 (one statement each) that the
# rounds since (every second) have tiered.
lake = rows("SELECT count(*) FROM lake.clicks$lake")[0][0]
assert 30 <= lake <= 35, lake
assert rows("SELECT count(*) FROM lake.clicks WHERE page = 'p1'") == [(10,)]
# The lake's files are read by mink dev's SQL service itself (count(*) alone would come from
# the exact row counts, reading nothing).
plan = "\n".join(r[1] for r in rows("EXPLAIN SELECT max(id) FROM lake.clicks"))
assert "MinkLakeExec: table=lake.clicks" in plan, plan
conn.close()
print("ok")
