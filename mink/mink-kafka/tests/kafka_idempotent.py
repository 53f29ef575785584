"""An idempotent librdkafka producer whose first acknowledgements are lost (run by
tests/kafka.rs, behind a proxy that closes the connection instead of passing them on).
argv: bootstrap address (the proxy).

Every record is acknowledged without error, and reading the topic back gives each once.
"""

import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

bootstrap = sys.argv[1]
TOPIC, N = "t", 200

errors = []
acked = []


def delivered(err, msg):
    if err is not None:
        errors.append(err)
    else:
        acked.append(msg.value())


p = Producer({
    "bootstrap.servers": bootstrap,
    "enable.idempotence": True,
    "acks": "all",
    "linger.ms": 5,
    "batch.num.messages": 20,
    "reconnect.backoff.ms": 10,
    "retry.backoff.ms": 10,
})
for i in range(N):
    p.produce(TOPIC, value=f"r{i:03}".encode(), partition=i % 2, on_delivery=delivered)
    p.poll(0)
left = p.flush(60)
assert left == 0, f"{left} records never acknowledged"
assert not errors, errors
assert sorted(acked) == sorted(f"r{i:03}".encode() for i in range(N)), acked

c = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False})
c.assign([TopicPartition(TOPIC, p, 0) for p in range(2)])
read = []
deadline = time.monotonic() + 30
while len(read) < N:
    assert time.monotonic() < deadline, f"read {len(read)} of {N}"
    m = c.poll(0.2)
    if m is not None and m.error() is None:
        read.append(m.value())
assert sorted(read) == sorted(f"r{i:03}".encode() for i in range(N)), read
c.close()
print("ok")
