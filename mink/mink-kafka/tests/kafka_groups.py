"""Consumer groups with real clients against a Mink node's Kafka listener (run by
tests/kafka.rs). argv: bootstrap address.

Two kafka-python consumers share a 4-partition topic, commit, one leaves and the other takes
its partitions over; a librdkafka consumer (roundrobin) joining later starts at the committed
offsets; the admin client lists and describes the group and its offsets.
"""

import sys
import threading
import time

from confluent_kafka import Consumer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

bootstrap = sys.argv[1]
import logging

from waits import CHANGED, until  # tests/waits.py

# The group's story, printed (by tests/kafka.rs) only if the script fails.
logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)d %(threadName)s %(name)s %(message)s")
logging.getLogger("kafka.coordinator").setLevel(logging.INFO)
TOPIC = "orders"
FAST = dict(session_timeout_ms=6000, heartbeat_interval_ms=300, max_poll_interval_ms=10000)

admin = KafkaAdminClient(bootstrap_servers=bootstrap)
admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)])
producer = KafkaProducer(bootstrap_servers=bootstrap)


def produce(n, tag):
    for i in range(n):
        producer.send(TOPIC, value=f"{tag}-{i}".encode(), partition=i % 4)
    producer.flush()




class Member(threading.Thread):
    """A kafka-python consumer polling in its own thread, as an application runs one."""

    def __init__(self):
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id="g1", auto_offset_reset="earliest", enable_auto_commit=False, **FAST)
        self.lock = threading.Lock()
        self.records = []
        self.assigned = set()
        self.running = True
        self.commands = []

    def run(self):
        while self.running:
            batch = self.consumer.poll(timeout_ms=200)
            with self.lock:
                for records in batch.values():
                    self.records.extend((r.partition, r.offset, r.value) for r in records)
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
                commands, self.commands = self.commands, []
            for c in commands:
                c()
            with CHANGED:
                CHANGED.notify_all()
        self.consumer.close()

    def do(self, command):
        """Runs `command` in the consumer's thread; its exception is raised here, at once."""
        done = threading.Event()
        failed = []

        def run():
            try:
                command()
            except Exception as e:  # noqa: BLE001 - handed to the caller
                failed.append(e)
            done.set()

        with self.lock:
            self.commands.append(run)
        assert done.wait(30), "the consumer thread did not run the command"
        if failed:
            raise failed[0]

    def stop(self):
        self.running = False
        self.join(30)
        assert not self.is_alive(), "the consumer did not close within 30 s"

    def state(self):
        with self.lock:
            return list(self.records), set(self.assigned)


produce(40, "first")
# Both start polling once both exist, so they join within the group's initial rebalance delay
# and share its first generation (a member joining later would start a second one, and its
# partitions' records would be read again from the start: nothing was committed yet).
c1, c2 = Member(), Member()
c1.start()
c2.start()


def shared():
    (r1, a1), (r2, a2) = c1.state(), c2.state()
    return len(r1) + len(r2) >= 40 and len(a1) == 2 and len(a2) == 2


until("both consumers to share the 4 partitions and read the 40 records", shared, state=lambda: (c1.state()[1], len(c1.state()[0]), c2.state()[1], len(c2.state()[0])))
(r1, parts1), (r2, parts2) = c1.state(), c2.state()
assert parts1.isdisjoint(parts2) and parts1 | parts2 == {0, 1, 2, 3}, (parts1, parts2)
# Each record once, from the consumer holding its partition.
assert sorted((p, o) for p, o, _ in r1 + r2) == sorted((p, o) for p in range(4) for o in range(10))
c1.do(c1.consumer.commit)
c2.do(c2.consumer.commit)

# c1 leaves: c2 takes every partition, and starts past what c1 committed.
c1.stop()
until("c2 to hold every partition", lambda: len(c2.state()[1]) == 4, state=c2.state)
produce(8, "second")
until("the 8 new records", lambda: len(c2.state()[0]) >= len(r2) + 8)
more = [v for _, _, v in c2.state()[0][len(r2):]]
assert sorted(more) == sorted(f"second-{i}".encode() for i in range(8)), more
c2.do(c2.consumer.commit)
c2.stop()

# A librdkafka consumer (roundrobin assignor) joins later: it starts at the committed offsets.
produce(4, "third")
c3 = Consumer({
    "bootstrap.servers": bootstrap,
    "group.id": "g1",
    "partition.assignment.strategy": "roundrobin",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
})
c3.subscribe([TOPIC])
third = []
deadline = time.monotonic() + 30
while len(third) < 4:
    assert time.monotonic() < deadline, f"c3 read {third}"
    m = c3.poll(0.2)
    if m is not None and m.error() is None:
        third.append(m.value())
assert sorted(third) == sorted(f"third-{i}".encode() for i in range(4)), third
c3.commit(asynchronous=False)

# The group and its offsets, as the clients see them.
committed = c3.committed([TopicPartition(TOPIC, p) for p in range(4)], timeout=30)
assert {tp.partition: tp.offset for tp in committed} == {0: 13, 1: 13, 2: 13, 3: 13}, committed
groups = admin.list_groups()
assert "g1" in repr(groups), groups
described = admin.describe_groups(["g1"])
assert "Stable" in repr(described) and "roundrobin" in repr(described), described
c3.close()
print("ok")

# A static member (group.instance.id) that closes and comes back is a member again at once: it
# sends no LeaveGroup, and the group waited for its earlier self's session (120 s here) to end.
STATIC = "g-static"


def static_member():
    c = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": STATIC,
        "group.instance.id": "worker-1",
        "session.timeout.ms": 120000,
        "auto.offset.reset": "earliest",
    })
    c.subscribe([TOPIC])
    deadline = time.monotonic() + 60
    while not c.assignment():
        assert time.monotonic() < deadline, "waited 60 s for the static member's assignment"
        c.poll(0.2)
    return c


static_member().close()
again = static_member()
again.close()
