"""Real Kafka clients against a Mink node's Kafka listener (run by tests/kafka.rs).

argv: bootstrap address. Topic `raw` is created here (CreateTopics, 2 partitions); table
`kafka.people` (id BIGINT, name VARCHAR) exists already and is a typed topic.
"""

import json
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer, TopicPartition as KTopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.errors import TopicAlreadyExistsError

bootstrap = sys.argv[1]

# CreateTopics: a raw topic of two partitions; the same name again is refused.
admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="mink-test")
admin.create_topics([NewTopic("raw", num_partitions=2, replication_factor=1)])
try:
    admin.create_topics([NewTopic("raw", num_partitions=2, replication_factor=1)])
    raise AssertionError("a second CreateTopics of raw succeeded")
except TopicAlreadyExistsError:
    pass
assert "raw" in admin.list_topics(), admin.list_topics()
admin.close()

# kafka-python: keys, values, headers, a null value, explicit partitions, acks=all.
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=False)
sent = []
for i in range(20):
    partition = i % 2
    value = None if i == 7 else f"value-{i}".encode()
    meta = producer.send(
        "raw",
        key=f"k{i}".encode(),
        value=value,
        headers=[("h", f"{i}".encode())],
        partition=partition,
        timestamp_ms=1_700_000_000_000 + i,
    ).get(timeout=30)
    sent.append((partition, meta.offset, f"k{i}".encode(), value, 1_700_000_000_000 + i))
producer.flush()
producer.close()
offsets = sorted(o for p, o, *_ in sent if p == 0)
assert offsets == list(range(10)), offsets

consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
parts = [KTopicPartition("raw", 0), KTopicPartition("raw", 1)]
consumer.assign(parts)
consumer.seek_to_beginning()
got = []
deadline = time.monotonic() + 30
while len(got) < 20:
    assert time.monotonic() < deadline, f"consumed {len(got)} of 20"
    for tp, records in consumer.poll(timeout_ms=1000).items():
        for r in records:
            got.append((tp.partition, r.offset, r.key, r.value, r.timestamp))
            assert r.headers == [("h", r.key[1:])], r.headers
assert sorted(got) == sorted(sent), (sorted(got), sorted(sent))
assert consumer.beginning_offsets(parts) == {parts[0]: 0, parts[1]: 0}
assert consumer.end_offsets(parts) == {parts[0]: 10, parts[1]: 10}
# ListOffsets by time: the first record at or after it.
found = consumer.offsets_for_times({parts[1]: 1_700_000_000_004})[parts[1]]
assert (found.offset, found.timestamp) == (2, 1_700_000_000_005), found
consumer.close()

# confluent-kafka (librdkafka): compressed batches, keyed partitioning, delivery reports.
delivered = []
p = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd", "linger.ms": 5})
for i in range(100):
    p.produce("raw", key=f"c{i}", value=f"librdkafka-{i}", on_delivery=lambda e, m: delivered.append((e, m.partition(), m.offset())))
assert p.flush(30) == 0
assert len(delivered) == 100 and all(e is None for e, _, _ in delivered), delivered[:3]
for codec in ["lz4", "gzip", "snappy"]:
    q = Producer({"bootstrap.servers": bootstrap, "compression.type": codec})
    q.produce("raw", key=codec, value=codec, partition=0)
    assert q.flush(30) == 0
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "assign-only", "enable.auto.commit": False})
c.assign([TopicPartition("raw", 0, 0), TopicPartition("raw", 1, 0)])
values = []
deadline = time.monotonic() + 30
while len(values) < 123:
    assert time.monotonic() < deadline, f"consumed {len(values)} of 123"
    m = c.poll(1.0)
    if m is None:
        continue
    assert m.error() is None, m.error()
    values.append(m.value())
c.close()
assert sum(v.startswith(b"librdkafka-") for v in values if v) == 100
assert {b"lz4", b"gzip", b"snappy"} <= set(values)

# Idempotent producers (kafka-python's default once Metadata >= 4; librdkafka's on request):
# InitProducerId, then sequenced batches.
before = KafkaConsumer(bootstrap_servers=bootstrap).end_offsets([KTopicPartition("raw", 1)])
producer = KafkaProducer(bootstrap_servers=bootstrap)
assert producer.config["enable_idempotence"], producer.config["enable_idempotence"]
offsets = [producer.send("raw", value=f"idem-{i}".encode(), partition=1).get(timeout=30).offset for i in range(10)]
producer.close()
start = before[KTopicPartition("raw", 1)]
assert offsets == list(range(start, start + 10)), (start, offsets)
q = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all"})
errors = []
for i in range(10):
    q.produce("raw", value=f"idem-rd-{i}", partition=1, on_delivery=lambda e, m: errors.append(e) if e else None)
assert q.flush(30) == 0 and not errors, errors

# A typed table: values are its rows as JSON objects; a record that is not one fails its batch.
producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False, retries=0)
typed_from = int(time.time() * 1000)
for row in [{"id": 1, "name": "ann"}, {"id": 2, "name": None}]:
    producer.send("people", value=json.dumps(row).encode(), partition=0).get(timeout=30)
for bad in [b"not json", b'{"id": "x"}', b'{"id": 3, "nope": 1}', b"[1]"]:
    try:
        producer.send("people", value=bad, partition=0).get(timeout=30)
        raise AssertionError(f"{bad!r} was stored")
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - the client's error type for INVALID_RECORD
        assert "InvalidRecord" in type(e).__name__ or "INVALID_RECORD" in str(e) or "87" in str(e), repr(e)
# One batch of two good rows and a bad one (sent together, flushed once): the batch fails
# whole, and neither good row is stored. The client names the bad record (INVALID_RECORD, with
# its index in the batch) and fails the others as part of that batch.
# A linger longer than the test: the three wait in one batch for the flush (the producer's
# sender took the first alone on a loaded machine, and it was stored).
lingering = KafkaProducer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False, retries=0, linger_ms=60000)
mixed = [lingering.send("people", value=v, partition=0) for v in [b'{"id": 8}', b'{"id": "x"}', b'{"id": 9}']]
lingering.flush()
failures = []
for f in mixed:
    try:
        f.get(timeout=30)
        raise AssertionError("a row of a batch with a bad record was stored")
    except AssertionError:
        raise
    except Exception as e:  # noqa: BLE001 - the client's error types
        failures.append(f"{type(e).__name__}: {e}")
assert "InvalidRecord" in failures[1], failures
assert all("part of a batch which had one more more invalid records" in f for f in failures[::2]), failures
lingering.close()
producer.close()
# An idempotent librdkafka producer whose batch is refused raises its epoch itself (KIP-360)
# and goes on: its next record is stored (every later one failed INVALID_PRODUCER_EPOCH).
reports = []
idem = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
for v in [b'{"id": "x"}', b'{"id": 3, "name": "cid"}']:
    idem.produce("people", v, partition=0, on_delivery=lambda err, msg: reports.append(err and err.name()))
    assert idem.flush(30) == 0
assert reports == ["INVALID_RECORD", None], reports
consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
consumer.assign([KTopicPartition("people", 0)])
consumer.seek_to_beginning()
rows = []
times = []
deadline = time.monotonic() + 30
while len(rows) < 3:
    assert time.monotonic() < deadline, f"consumed {rows}"
    for _, records in consumer.poll(timeout_ms=1000).items():
        rows.extend(json.loads(r.value) for r in records)
        times.extend(r.timestamp for r in records)
        assert all(r.timestamp_type == 1 for r in records), records  # LogAppendTime
assert rows == [{"id": 1, "name": "ann"}, {"id": 2}, {"id": 3, "name": "cid"}], rows
# A typed table's records carry the time the node appended them (LogAppendTime).
typed_to = int(time.time() * 1000)
assert all(typed_from <= t <= typed_to for t in times), (typed_from, times, typed_to)
# ListOffsets by time through the bucket's time index.
people = KTopicPartition("people", 0)
found = consumer.offsets_for_times({people: times[1]})[people]
assert (found.offset, found.timestamp) == (0 if times[0] == times[1] else 1, times[1]), found
found = consumer.offsets_for_times({people: 0})[people]
assert (found.offset, found.timestamp) == (0, times[0]), found
assert consumer.offsets_for_times({people: typed_to + 60_000})[people] is None
consumer.close()

# aiokafka (non-flexible versions only): a round trip on a topic of its own.
import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as ATopicPartition


async def aio():
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        for i in range(5):
            await producer.send_and_wait("raw", f"aio-{i}".encode(), key=b"a", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = ATopicPartition("raw", 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        values = []
        deadline = time.monotonic() + 30
        while not any(v == b"aio-4" for v in values):
            assert time.monotonic() < deadline, f"aiokafka read {values} in 30 s"
            batch = await asyncio.wait_for(consumer.getmany(tp, timeout_ms=1000), 30)
            values.extend(r.value for r in batch.get(tp, []))
        assert [v for v in values if v.startswith(b"aio-")] == [f"aio-{i}".encode() for i in range(5)], values
    finally:
        await consumer.stop()


asyncio.run(aio())

# Every codec from the Python clients (librdkafka's are above), with headers, a null key and a
# null value, on topic `codecs`, read back by librdkafka.
admin = KafkaAdminClient(bootstrap_servers=bootstrap)
admin.create_topics([NewTopic("codecs", num_partitions=1, replication_factor=1)])
admin.close()
CODECS = ["gzip", "snappy", "lz4", "zstd"]
for codec in CODECS:
    kp = KafkaProducer(bootstrap_servers=bootstrap, compression_type=codec)
    kp.send("codecs", key=None, value=f"kafka-python-{codec}".encode(), headers=[("codec", codec.encode())], partition=0).get(timeout=30)
    kp.close()


async def aio_codecs():
    for codec in CODECS:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type=codec)
        await producer.start()
        try:
            value = None if codec == "zstd" else f"aiokafka-{codec}".encode()
            await producer.send_and_wait("codecs", value, key=b"aio", headers=[("codec", codec.encode())], partition=0)
        finally:
            await producer.stop()


asyncio.run(aio_codecs())
c = Consumer({"bootstrap.servers": bootstrap, "group.id": "codecs", "enable.auto.commit": False})
c.assign([TopicPartition("codecs", 0, 0)])
got = []
deadline = time.monotonic() + 30
while len(got) < 2 * len(CODECS):
    assert time.monotonic() < deadline, f"consumed {got}"
    m = c.poll(1.0)
    if m is None:
        continue
    assert m.error() is None, m.error()
    got.append((m.key(), m.value(), m.headers()))
c.close()
expected = [(None, f"kafka-python-{x}".encode(), [("codec", x.encode())]) for x in CODECS]
expected += [(b"aio", None if x == "zstd" else f"aiokafka-{x}".encode(), [("codec", x.encode())]) for x in CODECS]
assert got == expected, got

# Topic administration: configs, the cluster, partitions (fixed), deletion.
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions
from kafka.errors import InvalidPartitionsError

admin = KafkaAdminClient(bootstrap_servers=bootstrap)
configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "raw")])
# The table's own options (Kafka's defaults, derived ones such as retention.ms, are not shown
# by this client).
assert "'bucket.num': {'value': '2'" in repr(configs), configs
# librdkafka's admin shows the derived configs too: retention.ms from table.log.ttl (its
# default, 7 days), deletion as the cleanup policy.
from confluent_kafka.admin import AdminClient, ConfigResource as CConfigResource

cadmin = AdminClient({"bootstrap.servers": bootstrap})
for _, f in cadmin.describe_configs([CConfigResource("topic", "raw")]).items():
    entries = f.result(30)
    assert entries["retention.ms"].value == str(7 * 24 * 3600 * 1000), entries
    assert entries["retention.ms"].is_default, entries["retention.ms"]
    assert entries["cleanup.policy"].value == "delete", entries
cluster = admin.describe_cluster()
assert len(cluster["brokers"]) == 1, cluster
try:
    admin.create_partitions({"raw": NewPartitions(total_count=4)})
    raise AssertionError("partitions were added")
except InvalidPartitionsError as e:
    assert "fixed" in str(e), e
admin.create_topics([NewTopic("doomed", num_partitions=1, replication_factor=1)])
admin.delete_topics(["doomed"])
# compression.type: zstd and uncompressed are stored as Mink options; a codec Arrow does not
# store is refused with INVALID_CONFIG naming the choices.
from kafka.errors import InvalidConfigurationError


def compressed_topic(name, compression):
    return NewTopic(
        name,
        num_partitions=1,
        replication_factor=1,
        topic_configs={"compression.type": compression},
    )


admin.create_topics([compressed_topic("squeezed", "zstd")])
configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "squeezed")])
assert "'table.log.arrow.compression.type': {'value': 'ZSTD'" in repr(configs), configs
try:
    admin.create_topics([compressed_topic("lz4ed", "lz4")])
    raise AssertionError("compression.type lz4 was taken")
except InvalidConfigurationError as e:
    assert "producer, zstd or uncompressed" in str(e), e
assert "lz4ed" not in admin.list_topics(), admin.list_topics()
# The configs DescribeConfigs reports are taken at creation: retention.ms as table.log.ttl,
# cleanup.policy delete (every topic's); compaction is refused, naming what to do instead.
admin.create_topics(
    [
        NewTopic(
            "kept",
            num_partitions=1,
            replication_factor=1,
            topic_configs={"retention.ms": "3600000", "cleanup.policy": "delete"},
        )
    ]
)
for _, f in cadmin.describe_configs([CConfigResource("topic", "kept")]).items():
    entries = f.result(30)
    assert entries["retention.ms"].value == "3600000", entries
    assert not entries["retention.ms"].is_default, entries["retention.ms"]
for configs in ({"cleanup.policy": "compact"}, {"retention.ms": "0"}):
    try:
        admin.create_topics(
            [NewTopic("compacted", num_partitions=1, replication_factor=1, topic_configs=configs)]
        )
        raise AssertionError(f"{configs} was taken")
    except InvalidConfigurationError as e:
        assert "primary-key table" in str(e) or "above 0" in str(e), e
assert "compacted" not in admin.list_topics(), admin.list_topics()
assert "doomed" not in admin.list_topics(), admin.list_topics()

# Many topics: librdkafka sizes its Metadata parse buffer from the answer's bytes, which once
# overflowed past a dozen topics (list_topics failed, regex subscriptions got nothing).
from confluent_kafka import KafkaException
from confluent_kafka.admin import NewTopic as CNewTopic

many = [f"many-{i:02}" for i in range(30)]
for _, f in cadmin.create_topics([CNewTopic(t, 1, 1) for t in many]).items():
    f.result(30)
listed = cadmin.list_topics(timeout=30).topics
assert set(many) <= set(listed), sorted(listed)
assert all(listed[t].error is None for t in many), {t: listed[t].error for t in many}
pattern = Consumer({"bootstrap.servers": bootstrap, "group.id": "regex", "auto.offset.reset": "earliest"})
assigned = []
pattern.subscribe(["^many-0.*"], on_assign=lambda c, ps: assigned.extend(p.topic for p in ps))
deadline = time.monotonic() + 30
while len(assigned) < 10:
    assert time.monotonic() < deadline, f"assigned {assigned}"
    pattern.poll(0.5)
pattern.close()
assert sorted(assigned) == many[:10], assigned

# DeleteGroups: a group with no members goes (and is unknown after); one with members stays.
from confluent_kafka import KafkaError

member = Consumer({"bootstrap.servers": bootstrap, "group.id": "busy", "auto.offset.reset": "earliest"})
joined = []
member.subscribe(["many-00"], on_assign=lambda c, ps: joined.extend(ps))
deadline = time.monotonic() + 30
while not joined:
    assert time.monotonic() < deadline, "the busy group's member was not assigned"
    member.poll(0.5)
member.commit(offsets=[TopicPartition("many-00", 0, 0)], asynchronous=False)
for group, expected in [("regex", None), ("regex", KafkaError.GROUP_ID_NOT_FOUND), ("busy", KafkaError.NON_EMPTY_GROUP)]:
    try:
        for _, f in cadmin.delete_consumer_groups([group]).items():
            f.result(30)
        assert expected is None, f"{group} was deleted"
    except KafkaException as e:
        assert e.args[0].code() == expected, (group, e)
member.close()
for _, f in cadmin.delete_consumer_groups(["busy"]).items():
    f.result(30)
groups = {g.group_id for g in cadmin.list_consumer_groups().result(30).valid}
assert not {"regex", "busy"} & groups, groups

# A transactional producer fails at once with a fatal error (transactions are out of scope),
# instead of retrying to find a transaction coordinator until its timeout.
tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": "tx-1"})
try:
    tx.init_transactions(60)
    raise AssertionError("transactions were initialised")
except KafkaException as e:
    error = e.args[0]
    assert error.fatal() or "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in error.name(), error
    assert "transactions" in error.str(), error

# Kafka's rules for topic names.
from kafka.errors import InvalidTopicError

try:
    admin.create_topics([NewTopic("sp ace", num_partitions=1, replication_factor=1)])
    raise AssertionError("a topic name with a space was taken")
except InvalidTopicError as e:
    assert "a topic name is ASCII letters" in str(e), e
admin.close()
print("ok")
