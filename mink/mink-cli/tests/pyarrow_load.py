"""Plain pyarrow.flight writes into a cluster through one node, as a load during failures.

python pyarrow_load.py HOST:PORT DATABASE TABLE FIRST_ID BATCHES OUT.json [STOP]

Writes BATCHES batches of ten rows (ids FIRST_ID, FIRST_ID+1, ...) to a keyless log table
through a routed DoPut (no writer id: the node puts each batch in one bucket and forwards it
to that bucket's leader), one stream at a time, 20 ms apart. Records which ids were
acknowledged and which got an error (their outcome is unknown: they may or may not be stored)
in OUT.json as {"acked": [...], "unknown": [...]}. A broken stream is opened again. Stops
early once the file STOP exists.
"""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.flight as flight

address, database, table, first, batches, out = sys.argv[1:7]
stop = sys.argv[7] if len(sys.argv) > 7 else None
first, batches = int(first), int(batches)
schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())])
descriptor = flight.FlightDescriptor.for_path(database, table)
acked, unknown = [], []
client = flight.connect(f"grpc://{address}")
stream = None
for b in range(batches):
    if stop is not None and os.path.exists(stop):
        break
    ids = list(range(first + b * 10, first + b * 10 + 10))
    batch = pa.record_batch([pa.array(ids, pa.int64()), pa.array(["m"] * 10)], schema=schema)
    try:
        if stream is None:
            stream = client.do_put(descriptor, schema)
        writer, reader = stream
        writer.write_batch(batch)
        ack = json.loads(reader.read().to_pybytes())
        if all("error" not in r for r in ack["buckets"]):
            acked.extend(ids)
        else:
            unknown.extend(ids)
    except (flight.FlightError, OSError):
        unknown.extend(ids)
        stream = None
        time.sleep(0.1)
    time.sleep(0.02)
if stream is not None:
    try:
        stream[0].done_writing()
        stream[0].close()
    except flight.FlightError:
        pass
with open(out, "w") as f:
    json.dump({"acked": acked, "unknown": unknown}, f)
print(f"{len(acked)} rows acknowledged, {len(unknown)} with an error")
