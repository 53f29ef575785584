"""SQL against `mink dev`'s Flight SQL endpoint (argument: its grpc:// URI): a lake table
created, written and tiered in SQL, read as the union of the lake snapshot (which the engine
reads from object storage itself) and the log. Prints "ok"."""

import sys
import time

import adbc_driver_flightsql.dbapi as flight_sql

conn = flight_sql.connect(sys.argv[1], autocommit=True)
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

# Tiering runs on its schedule: wait (with a deadline) until the lake holds every row.
deadline = time.monotonic() + 60
while True:
    tiered = rows("SELECT sum(tiered_offset) FROM system.buckets WHERE \"table\" = 'clicks'")[0][0]
    if tiered == 30:
        break
    assert time.monotonic() < deadline, f"waited for the lake to hold 30 rows; it holds {tiered}"
    time.sleep(0.2)

cur.executemany("INSERT INTO lake.clicks VALUES (?, ?)", [(i, "new") for i in range(30, 35)])
assert rows("SELECT count(*) FROM lake.clicks") == [(35,)]
# The lake holds the first 30 rows, and those of the last 5 (one statement each) that the
# rounds since (every second) have tiered.
lake = rows("SELECT count(*) FROM lake.clicks$lake")[0][0]
assert 30 <= lake <= 35, lake
assert rows("SELECT count(*) FROM lake.clicks WHERE page = 'p1'") == [(10,)]
plan = "\n".join(r[1] for r in rows("EXPLAIN SELECT count(*) FROM lake.clicks"))
assert "MinkLakeExec: table=lake.clicks" in plan, plan
conn.close()
print("ok")
