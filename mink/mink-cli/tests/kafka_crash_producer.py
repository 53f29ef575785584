"""An idempotent librdkafka producer that keeps producing while tests/cli.rs kills the node
with SIGKILL and restarts it on the same address, one of its batches' acknowledgement held
back by a proxy meanwhile. argv: bootstrap address (the proxy), record count.

Creates topic `t` (2 partitions), produces the records `r00000`..., printing
`acked N` as acknowledgements arrive, and fails unless every record is acknowledged without
error (librdkafka retries what was in flight at the kill, with the same sequence numbers).
"""

import sys

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

bootstrap, n = sys.argv[1], int(sys.argv[2])
admin = AdminClient({"bootstrap.servers": bootstrap})
for f in admin.create_topics([NewTopic("t", num_partitions=2, replication_factor=1)]).values():
    f.result(30)

errors, acked = [], []


def delivered(err, msg):
    if err is not None:
        errors.append(str(err))
    else:
        acked.append(msg.value())
        if len(acked) % 100 == 0:
            print(f"acked {len(acked)}", flush=True)


p = Producer({
    "bootstrap.servers": bootstrap,
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 500,
    "message.timeout.ms": 120000,
})
for i in range(n):
    p.produce("t", value=f"r{i:05}".encode(), partition=i % 2, on_delivery=delivered)
    p.poll(0)
left = p.flush(120)
assert left == 0, f"{left} records never acknowledged"
assert not errors, errors[:5]
assert sorted(acked) == [f"r{i:05}".encode() for i in range(n)], "acknowledgements differ"
print("done", flush=True)
