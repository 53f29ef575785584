"""The ADBC Flight SQL driver and Polars over mink-query's Flight SQL service: metadata calls,
queries, errors. Argument: the service's grpc:// URI. Prints "ok"."""

import datetime
import sys

import adbc_driver_flightsql.dbapi as flight_sql
import polars as pl

uri = sys.argv[1]
# Mink has no transactions: autocommit (ADBC warns when it cannot turn autocommit off).
conn = flight_sql.connect(uri, autocommit=True)
cur = conn.cursor()

cur.execute("SELECT id, name FROM app.users ORDER BY id")
table = cur.fetch_arrow_table()
assert table.to_pylist() == [
    {"id": 1, "name": "ann"},
    {"id": 2, "name": "bo"},
    {"id": 4, "name": "dan"},
], table.to_pylist()

cur.execute("SELECT kind, count(*) AS n FROM app.events WHERE id < 30 GROUP BY kind ORDER BY kind")
assert cur.fetchall() == [("buy", 9), ("click", 9), ("view", 9), (None, 3)], cur.fetchall()

# Metadata: catalogs, databases as schemas, tables with their columns, primary keys.
objects = conn.adbc_get_objects(depth="all").read_all().to_pylist()
assert [c["catalog_name"] for c in objects] == ["mink"], objects
schemas = {s["db_schema_name"]: s for s in objects[0]["catalog_db_schemas"]}
tables = {t["table_name"]: t for t in schemas["app"]["db_schema_tables"]}
assert set(tables) == {"events", "users", "nested", "berlin"}, tables
assert [c["column_name"] for c in tables["events"]["table_columns"]] == ["id", "kind", "amount"]
schema = conn.adbc_get_table_schema("users", db_schema_filter="app")
assert schema.names == ["id", "name"], schema
assert conn.adbc_get_table_types() == ["TABLE"], conn.adbc_get_table_types()
# The system tables are a schema of their own.
system = conn.adbc_get_objects(depth="tables", db_schema_filter="system").read_all().to_pylist()
system = [t["table_name"] for t in system[0]["catalog_db_schemas"][0]["db_schema_tables"]]
assert sorted(system) == ["buckets", "nodes", "queries", "tables"], system
schema = conn.adbc_get_table_schema("tables", db_schema_filter="system")
assert schema.names[:2] == ["database", "table"], schema
info = conn.adbc_get_info()
assert info["vendor_name"] == "Mink", info

# A dictionary column: the schema GetFlightInfo announces is the one DoGet streams.
cur.execute("SELECT id, d FROM app.nested")
assert cur.fetchall() == [(1, "x")]
# A large list arrives as a list (ADBC refused the stream: "inconsistent schema").
cur.execute("SELECT id, xs FROM app.nested")
assert cur.fetchall() == [(1, [1, 2])]

# Polars reads a query through the same connection.
frame = pl.read_database("SELECT id, amount FROM app.events WHERE id >= 95 ORDER BY id", connection=conn)
assert frame["amount"].to_list() == [950, 960, 970, 980, 990], frame

# Writes: INSERT as a query (its count as the row) and as an update (DoPut).
cur.execute("INSERT INTO app.events VALUES (5000, 'py', 1), (5001, 'py', 2)")
assert cur.fetchall() == [(2,)]
stmt = cur.adbc_statement
stmt.set_sql_query("INSERT INTO app.events (id, kind) VALUES (5002, 'py')")
assert stmt.execute_update() == 1
cur.execute("SELECT id, amount FROM app.events WHERE kind = 'py' ORDER BY id")
assert cur.fetchall() == [(5000, 1), (5001, 2), (5002, None)]

# Prepared statements with parameters: queries (? and $n), and an insert run once per row.
cur.execute("SELECT name FROM app.users WHERE id = ?", parameters=(2,))
assert cur.fetchall() == [("bo",)]
cur.execute("SELECT count(*) FROM app.events WHERE id >= $1 AND kind = $2", parameters=(90, "buy"))
assert cur.fetchall() == [(3,)]
cur.executemany("INSERT INTO app.events VALUES (?, ?, ?)", [(6000, "pp", 1), (6001, "pp", 2)])
cur.execute("SELECT sum(amount) FROM app.events WHERE kind = 'pp'")
assert cur.fetchall() == [(3,)]
# More values than parameters are refused, not ignored.
try:
    cur.execute("SELECT name FROM app.users WHERE id = ?", parameters=(1, 2))
    raise AssertionError("an extra parameter was ignored")
except flight_sql.ProgrammingError as e:
    assert "2 values bound to a statement with 1 parameter" in str(e), e
# Python ints are bound as BIGINT: cast to an INT column; one that does not fit is refused.
cur.execute("CREATE TABLE app.o (id BIGINT, item VARCHAR, qty INT, PRIMARY KEY (id))")
assert cur.fetchall() == [], "DDL answers no rows"
cur.execute("INSERT INTO app.o VALUES (?, ?, ?)", (11, "fig", 2))
cur.executemany("INSERT INTO app.o VALUES (?, ?, ?)", [(12, "kiwi", 3), (13, "lime", 4)])
cur.execute("SELECT id, item, qty FROM app.o ORDER BY id")
assert cur.fetchall() == [(11, "fig", 2), (12, "kiwi", 3), (13, "lime", 4)]
try:
    cur.execute("INSERT INTO app.o VALUES (?, ?, ?)", (14, "plum", 2**40))
    raise AssertionError("2^40 went into an INT")
except flight_sql.ProgrammingError as e:
    assert "qty" in str(e), e

# Bulk ingest appends to an existing table through INSERT's writer, columns matched by name.
import pyarrow as pa

rows = pa.table({"kind": ["ing", "ing"], "id": [7000, 7001], "amount": [5, 6]})
assert cur.adbc_ingest("events", rows, mode="append", db_schema_name="app") == 2
assert cur.adbc_ingest("events", pa.table({"id": [7002], "kind": ["ing"]}), mode="append", db_schema_name="app") == 1
# An empty table: ADBC sends an empty DoPut, a write of no rows ("Command is missing" before).
assert cur.adbc_ingest("events", pa.table({"id": pa.array([], pa.int64())}), mode="append", db_schema_name="app") == 0
cur.execute("SELECT id, amount FROM app.events WHERE kind = 'ing' ORDER BY id")
assert cur.fetchall() == [(7000, 5), (7001, 6), (7002, None)]
pl.DataFrame({"id": [7003], "kind": ["ing"], "amount": [7]}).write_database(
    "app.events", connection=conn, engine="adbc", if_table_exists="append"
)
cur.execute("SELECT sum(amount) FROM app.events WHERE kind = 'ing'")
assert cur.fetchall() == [(18,)]
# One ingest message over gRPC's default 4 MiB (about 6 MB: it was refused, nothing stored).
big = pl.DataFrame({"id": range(100_000, 160_000), "kind": ["big/" + "x" * 96] * 60_000})
big.write_database("app.events", connection=conn, engine="adbc", if_table_exists="append")
cur.execute("SELECT count(*) FROM app.events WHERE kind LIKE 'big/%'")
assert cur.fetchall() == [(60_000,)]
for mode in ["create", "replace", "create_append"]:
    try:
        cur.adbc_ingest("events", rows, mode=mode, db_schema_name="app")
        raise AssertionError(f"ingest mode {mode} was accepted")
    except flight_sql.NotSupportedError as e:
        assert "bulk ingest" in str(e), e
# Floats into an integer column are refused, not truncated (1.9 was stored as 1).
try:
    cur.adbc_ingest("events", pa.table({"id": [7004], "kind": ["ing"], "amount": [1.9]}), mode="append", db_schema_name="app")
    raise AssertionError("a float column went into an integer one")
except flight_sql.Error as e:
    assert "amount" in str(e) and "refused" in str(e), e
try:
    cur.execute("INSERT INTO app.o VALUES (?, ?, ?)", (16, "date", 2.7))
    raise AssertionError("2.7 went into an INT")
except flight_sql.ProgrammingError as e:
    assert "qty" in str(e) and "not exactly" in str(e), e
# A datetime without a zone bound to a Europe/Berlin column is read in UTC, as a TIMESTAMP
# literal is (it was stored as Berlin's wall time, an hour earlier).
cur.execute("INSERT INTO app.berlin VALUES (?, ?)", (1, datetime.datetime(2024, 1, 1, 10, 0)))
cur.execute("SELECT b FROM app.berlin WHERE id = 1")
(stored,) = cur.fetchone()
utc = datetime.timezone.utc
assert stored.astimezone(utc) == datetime.datetime(2024, 1, 1, 10, 0, tzinfo=utc), stored
try:
    cur.adbc_ingest("nope", rows, mode="append", db_schema_name="app")
    raise AssertionError("ingest into a table that does not exist was accepted")
except flight_sql.Error as e:
    assert "nope" in str(e), e

# A write runs when it is executed: a cursor closed without fetching its count loses nothing.
with conn.cursor() as c:
    c.execute("INSERT INTO app.users VALUES (7, 'gil'), (8, 'hal')")
with conn.cursor() as c:
    c.execute("DELETE FROM app.users WHERE id = 4")
with conn.cursor() as c:
    c.execute("DELETE FROM app.users WHERE id = ?", parameters=(8,))
cur.execute("SELECT id FROM app.users ORDER BY id")
assert cur.fetchall() == [(1,), (2,), (7,)]

# Errors carry DataFusion's message.
try:
    cur.execute("SELECT * FROM app.nope")
    raise AssertionError("an unknown table was not refused")
except flight_sql.ProgrammingError as e:
    assert "table 'mink.app.nope' not found" in str(e), e

conn.close()

# Mink has no authentication: a username and password are refused, not ignored.
try:
    with flight_sql.connect(uri, db_kwargs={"username": "u", "password": "p"}, autocommit=True) as c:
        with c.cursor() as cc:
            cc.execute("SELECT 1")
    raise AssertionError("credentials were accepted")
except flight_sql.Error as e:
    assert "no authentication" in str(e), e

print("ok")
