'use strict';
// The Kafka broker of test/kafka/broker, on its own: a topic of several
// partitions, messages produced and read back, and a restart that keeps
// them.
const test = require('node:test');
const assert = require('node:assert');
const { execFileSync } = require('node:child_process');
const { Admin, Producer, Consumer, stringSerializers, stringDeserializers } = require('@platformatic/kafka');

const BOOTSTRAP = process.env.KAFKA_BOOTSTRAP;

function restartBroker() {
  execFileSync('bash', [process.env.KAFKA_BROKER_CTL, 'restart', process.env.KAFKA_DIR],
    { stdio: 'inherit', timeout: 180_000 });
}

// A topic just created has no leader for a moment: producing then fails.
async function topicReady(admin, topic, partitions) {
  for (let i = 0; i < 100; i++) {
    const md = await admin.metadata({ topics: [topic] }).catch(() => null);
    const t = md?.topics.get(topic);
    if (t && t.partitions.length === partitions && t.partitions.every((p) => p.leader >= 0)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`topic ${topic} has no leader for its ${partitions} partitions after 10 s`);
}

async function readAll(topic, count) {
  const consumer = new Consumer({
    clientId: 'read-all', groupId: `read-all-${Date.now()}`, bootstrapBrokers: [BOOTSTRAP],
    deserializers: stringDeserializers,
  });
  // the client can deliver a message twice (a fetch in flight when the
  // group's assignment arrives): what a consumer sees is told apart by
  // partition and offset
  const seen = new Map();
  try {
    const stream = await consumer.consume({ topics: [topic], mode: 'earliest', autocommit: false });
    for await (const m of stream) {
      seen.set(`${m.partition}:${m.offset}`, m.value);
      if (seen.size === count) break;
    }
  } finally {
    await consumer.close(true);
  }
  return [...seen.values()].sort();
}

test('a topic of 3 partitions keeps its messages across a broker restart', { timeout: 120_000 }, async () => {
  const admin = new Admin({ clientId: 'admin', bootstrapBrokers: [BOOTSTRAP] });
  await admin.createTopics({ topics: ['smoke'], partitions: 3, replicas: 1 });
  await topicReady(admin, 'smoke', 3);
  await admin.close();
  const producer = new Producer({ clientId: 'smoke', bootstrapBrokers: [BOOTSTRAP], serializers: stringSerializers });
  const sent = [];
  for (let i = 0; i < 30; i++) sent.push(`m${String(i).padStart(2, '0')}`);
  await producer.send({ messages: sent.map((v) => ({ topic: 'smoke', key: v, value: v })) });
  await producer.close();
  assert.deepStrictEqual(await readAll('smoke', 30), sent);
  restartBroker();
  assert.deepStrictEqual(await readAll('smoke', 30), sent);
});
