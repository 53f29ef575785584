"""A consumer group of three kafka-python members over six partitions, across a node restart
(run by tests/kafka.rs in two phases). argv: bootstrap address, phase.

before: members join one by one and the partitions are shared 6, 3/3, 2/2/2; each member
reads its partitions' records, each record read once and committed; a member leaves and the other two take its partitions over 3/3.
after (the node restarted meanwhile): three members join again, share 2/2/2, and read only
the records produced since, nothing committed before being delivered again.
"""

import logging
import sys
import threading

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import CommitFailedError

from waits import CHANGED, until  # tests/waits.py

bootstrap, phase = sys.argv[1], sys.argv[2]

# The group's story, printed (by tests/kafka.rs) only if the script fails.
logging.basicConfig(level=logging.WARNING, format="%(relativeCreated)d %(threadName)s %(name)s %(message)s")
logging.getLogger("kafka.coordinator").setLevel(logging.INFO)
TOPIC, GROUP, PARTITIONS = "six", "g6", 6
FAST = dict(session_timeout_ms=6000, heartbeat_interval_ms=300, max_poll_interval_ms=10000)

producer = KafkaProducer(bootstrap_servers=bootstrap)


def produce(tag, per_partition):
    for p in range(PARTITIONS):
        for i in range(per_partition):
            producer.send(TOPIC, value=f"{tag}-{p}-{i}".encode(), partition=p)
    producer.flush()




class Member(threading.Thread):
    """A kafka-python consumer polling in its own thread, committing what it read after each
    poll (synchronously: a record counts as read once its offset is committed)."""

    def __init__(self, name):
        super().__init__(daemon=True, name=name)
        self.consumer = KafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id=GROUP, auto_offset_reset="earliest", enable_auto_commit=False, **FAST)
        self.lock = threading.Lock()
        self.records = []
        self.assigned = set()
        self.running = True
        self.start()

    def run(self):
        while self.running:
            batch = self.consumer.poll(timeout_ms=200)
            read = [(r.partition, r.offset, r.value) for records in batch.values() for r in records]
            if read:
                try:
                    self.consumer.commit()
                except CommitFailedError:
                    read = []  # not committed: the partition's next holder reads them again
            with self.lock:
                self.records.extend(read)
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
            with CHANGED:
                CHANGED.notify_all()
        self.consumer.close()

    def stop(self):
        self.running = False
        self.join(30)
        assert not self.is_alive()

    def state(self):
        with self.lock:
            return list(self.records), set(self.assigned)


def view(members):
    return lambda: [(m.name, sorted(m.state()[1]), len(m.state()[0])) for m in members]


def shares(members, each):
    """Every partition held by exactly one member, `each` apiece."""
    def held():
        parts = [m.state()[1] for m in members]
        return all(len(p) == each for p in parts) and set().union(*parts) == set(range(PARTITIONS))
    return held


def read(members):
    return sorted(r for m in members for r in m.state()[0])


if phase == "before":
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])
    m1 = Member("m1")
    until("m1 to hold all six partitions", shares([m1], 6), 60, view([m1]))
    m2 = Member("m2")
    until("m1 and m2 to share the partitions 3/3", shares([m1, m2], 3), 60, view([m1, m2]))
    m3 = Member("m3")
    members = [m1, m2, m3]
    until("three members to share the partitions 2/2/2", shares(members, 2), 60, view(members))
    produce("first", 10)
    until("the 60 records", lambda: len(read(members)) >= 60, 60, view(members))
    records = read(members)
    assert [(p, o) for p, o, _ in records] == [(p, o) for p in range(PARTITIONS) for o in range(10)], records
    for m in members:
        records, held = m.state()
        assert {p for p, _, _ in records} == held, (m.name, held, records)
    # m3 leaves: m1 and m2 take its partitions over and read on from its commits.
    m3.stop()
    until("m1 and m2 to share the partitions 3/3 again", shares([m1, m2], 3), 60, view([m1, m2]))
    produce("second", 2)
    until("the 12 records produced after m3 left", lambda: len(read(members)) >= 72, 60, view(members))
    records = read(members)
    assert len(records) == 72 and len(set((p, o) for p, o, _ in records)) == 72, records
    m1.stop()
    m2.stop()
else:
    produce("after", 1)
    members = [Member(f"n{i}") for i in range(3)]
    until("three members to share the partitions 2/2/2", shares(members, 2), 60, view(members))
    until("the 6 records produced after the restart", lambda: len(read(members)) >= 6, 60, view(members))
    records = read(members)
    assert sorted(v for _, _, v in records) == sorted(f"after-{p}-0".encode() for p in range(PARTITIONS)), records
    assert [(p, o) for p, o, _ in records] == [(p, 12) for p in range(PARTITIONS)], records
    for m in members:
        m.stop()
print("ok")
