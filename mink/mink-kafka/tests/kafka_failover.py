"""Kafka clients through a failover (run by mink-kafka's tests/kafka.rs, and by mink-cli's
tests/cluster.rs across a SIGKILL). argv: the nodes' Kafka addresses, comma-separated.

Before: an idempotent producer writes to a 4-partition topic whose partitions two nodes lead,
and a group consumer reads and commits. The test then stops the node holding the lease (it
leads some partitions and coordinates the group) and says so on stdin. After: the producer's
sends find the new leaders through Metadata, the consumer finds the new coordinator, rejoins,
and reads on from its committed offsets: every record once, none it committed again.
"""

import sys
import threading

from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

from waits import CHANGED, until  # tests/waits.py

bootstrap = sys.argv[1].split(",")
TOPIC = "moving"

admin = KafkaAdminClient(bootstrap_servers=bootstrap)
admin.create_topics([NewTopic(TOPIC, num_partitions=4, replication_factor=1)])
admin.close()
producer = KafkaProducer(bootstrap_servers=bootstrap, retries=20, request_timeout_ms=10000, retry_backoff_ms=200)
assert producer.config["enable_idempotence"]


def produce(tag):
    futures = [producer.send(TOPIC, value=f"{tag}-{i}".encode(), partition=i % 4) for i in range(40)]
    producer.flush(60)
    return [f.get(timeout=60) for f in futures]


class Member(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(
            TOPIC, bootstrap_servers=bootstrap, group_id="fg", auto_offset_reset="earliest",
            enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=300,
            request_timeout_ms=10000, retry_backoff_ms=200,
        )
        self.lock = threading.Lock()
        self.records = []
        self.commit_now = threading.Event()
        self.committed = threading.Event()
        self.running = True
        self.start()

    def run(self):
        while self.running:
            try:
                batch = self.consumer.poll(timeout_ms=200)
            except Exception as e:  # noqa: BLE001 - a dead node surfaces here; keep polling
                print("poll:", repr(e), file=sys.stderr)
                continue
            with self.lock:
                for records in batch.values():
                    self.records.extend((r.partition, r.offset, r.value) for r in records)
            if self.commit_now.is_set():
                try:
                    self.consumer.commit()
                    self.commit_now.clear()
                    self.committed.set()
                except Exception as e:  # noqa: BLE001 - retried on the next poll
                    print("commit:", repr(e), file=sys.stderr)
            with CHANGED:
                CHANGED.notify_all()
        self.consumer.close()

    def count(self):
        # Distinct records: after a rebalance a consumer reads again from the last commit
        # (at-least-once), so a record may come twice; it is stored once.
        with self.lock:
            return len(set((p, o) for p, o, _ in self.records))




first = produce("before")
member = Member()
until("the 40 records before", lambda: member.count() >= 40, 60)
member.commit_now.set()
until("the commit", member.committed.is_set, 60)
with member.lock:
    seen_before = len(member.records)
print("ready", flush=True)
sys.stdin.readline()  # the lease holder is gone

second = produce("after")
until("the 40 records after", lambda: member.count() >= 80, 60)
member.running = False
member.join(30)
by_offset = {}
for p, o, v in member.records:
    assert by_offset.setdefault((p, o), v) == v, (p, o, v, by_offset[(p, o)])
# Everything before was committed: the consumer resumes from its commits, so nothing read
# after the failover is from before it.
again = [v for _, _, v in member.records[seen_before:] if v.startswith(b"before-")]
assert not again, f"{len(again)} committed records delivered again: {again[:5]}"
values = sorted(by_offset.values())
expected = sorted([f"before-{i}".encode() for i in range(40)] + [f"after-{i}".encode() for i in range(40)])
assert values == expected, (len(values), values[:5])
offsets = sorted((m.partition, m.offset) for m in first + second)
assert offsets == sorted((p, o) for p in range(4) for o in range(20)), offsets
print("ok", flush=True)
