// Messages per second from Kafka into PostgreSQL at durable commit, one
// consumer process, for three ways of consuming the same messages (run by
// test/bench/kafka, which starts the broker and a cluster with fsync and
// synchronous_commit on):
//
//   positions   consumeKafka: batches of up to BATCH messages, each one
//               transaction that advances the positions, records the keys
//               (idem_record_batch) and applies the new events
//   per_message what is usually written by hand: per message BEGIN;
//               INSERT INTO processed_messages ... ON CONFLICT DO NOTHING;
//               the business statements if it was new; COMMIT; then the
//               broker's offset commit
//   no_dedup    the batches of the first, each one transaction of the
//               business statements alone, then the broker's offset
//               commit: no deduplication at all (reference)
//
// Each variant reads a topic of its own, filled beforehand with its count of
// events on 6 partitions (30,000; 3,000 for per_message), from the start to
// the log end; the time is from the consumer's start to the last commit.  Prints one line per variant
// and "BENCH kafka_<variant>_mps=N".
'use strict';

const { Admin, Consumer, Producer, stringSerializers, stringDeserializers } = require('@platformatic/kafka');
const { Client, Pool } = require('pg');
const idem = require('idem-consumer');

const BOOTSTRAP = process.env.KAFKA_BOOTSTRAP;
// the per-message variant is slow: it reads fewer messages, its rate is steady
const COUNTS = { positions: Number(process.env.BENCH_MESSAGES || 30000),
  no_dedup: Number(process.env.BENCH_MESSAGES || 30000),
  per_message: Number(process.env.BENCH_PER_MESSAGE || 3000) };
let MESSAGES = 0;
const BATCH = Number(process.env.BENCH_BATCH || 500);
const PARTITIONS = 6;
const VARIANTS = (process.env.BENCH_VARIANTS || 'positions per_message no_dedup').split(' ');

const LEDGER = `INSERT INTO ledger (event_id, account, amount)
SELECT m.key, m.account, m.amount FROM unnest($1::text[], $2::integer[], $3::bigint[]) AS m (key, account, amount)`;
const WITH_KEYS = `INSERT INTO ledger (event_id, account, amount)
SELECT m.key, m.account, m.amount FROM unnest($2::text[], $3::integer[], $4::bigint[]) AS m (key, account, amount)
 WHERE m.key IN (SELECT k FROM idem_record_batch($1, $2::text[]) AS k)`;
const event = (i) => ({ id: `pay-${i}`, account: i % 60, amount: 1 + (i % 97) });

async function fill(topic) {
  const admin = new Admin({ clientId: 'bench', bootstrapBrokers: [BOOTSTRAP] });
  await admin.createTopics({ topics: [topic], partitions: PARTITIONS, replicas: 1 });
  for (let i = 0; i < 100; i++) {
    const t = (await admin.metadata({ topics: [topic] }).catch(() => null))?.topics.get(topic);
    if (t && t.partitions.every((p) => p.leader >= 0)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  await admin.close();
  // idempotent: a send retried under load writes no second copy, so that
  // every variant reads exactly MESSAGES messages
  const producer = new Producer({ clientId: 'bench', bootstrapBrokers: [BOOTSTRAP], serializers: stringSerializers,
    idempotent: true, acks: -1 });
  for (let at = 0; at < MESSAGES; at += 500) {
    const messages = [];
    for (let i = at; i < Math.min(at + 500, MESSAGES); i++) {
      const e = event(i);
      messages.push({ topic, key: `acct-${e.account}`, value: JSON.stringify(e) });
    }
    await producer.send({ messages });
  }
  await producer.close();
}

function newConsumer(group) {
  return new Consumer({ clientId: group, groupId: group, bootstrapBrokers: [BOOTSTRAP],
    deserializers: stringDeserializers, sessionTimeout: 10000, heartbeatInterval: 1000, maxWaitTime: 100 });
}

const columns = [(m) => JSON.parse(m.value).account, (m) => JSON.parse(m.value).amount];

async function positions(pool, topic) {
  const kafka = newConsumer(`g-${topic}`);
  let applied = 0;
  let resolve;
  const finished = new Promise((r) => { resolve = r; });
  const run = idem.consumeKafka({
    kafka, db: pool, consumer: `bench-${topic}`, topics: [topic], key: (m) => JSON.parse(m.value).id,
    columns, sql: WITH_KEYS, maxBatch: BATCH,
    onBatch: (b) => { applied += b.applied; if (applied >= MESSAGES) resolve(); },
  });
  await Promise.race([finished, run.done]);
  await run.close();
  await kafka.close(true);
}

// reads batches as consumeKafka does, and hands each to handle()
async function batches(topic, handle) {
  const kafka = newConsumer(`g-${topic}`);
  const stream = await kafka.consume({ topics: [topic], mode: 'earliest', autocommit: false });
  const seen = new Set();
  let batch = [];
  for await (const m of stream) {
    const k = `${m.partition}:${m.offset}`;
    if (seen.has(k)) continue;            // the client's own second delivery
    seen.add(k);
    batch.push(m);
    if (batch.length >= BATCH || stream.readableLength === 0) {
      await handle(batch);
      batch = [];
      if (seen.size >= MESSAGES) break;
    }
  }
  await kafka.close(true);
}

async function perMessage(pool, topic) {
  const db = await pool.connect();
  await batches(topic, async (messages) => {
    for (const m of messages) {
      const e = JSON.parse(m.value);
      await db.query('BEGIN');
      const { rowCount } = await db.query(
        'INSERT INTO processed_messages (key) VALUES ($1) ON CONFLICT DO NOTHING', [e.id]);
      if (rowCount === 1)
        await db.query('INSERT INTO ledger (event_id, account, amount) VALUES ($1, $2, $3)', [e.id, e.account, e.amount]);
      await db.query('COMMIT');
      await m.commit();
    }
  });
  db.release();
}

async function noDedup(pool, topic) {
  await batches(topic, async (messages) => {
    await idem.transaction(pool, (tx) => tx.query(LEDGER,
      idem.batchParams(messages, (m) => JSON.parse(m.value).id, columns)));
    const last = new Map();
    for (const m of messages) last.set(m.partition, m);
    await Promise.all([...last.values()].map((m) => m.commit()));
  });
}

async function main() {
  const admin = new Client();
  await admin.connect();
  await admin.query('CREATE EXTENSION IF NOT EXISTS idem_consumer');
  await admin.query('CREATE TABLE IF NOT EXISTS ledger (event_id text NOT NULL, account integer NOT NULL, amount bigint NOT NULL)');
  await admin.query('CREATE TABLE IF NOT EXISTS processed_messages (key text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())');
  const { rows: [settings] } = await admin.query("SELECT current_setting('fsync') AS f, current_setting('synchronous_commit') AS c");
  const pool = new Pool({ max: 2 });
  const run = { positions, per_message: perMessage, no_dedup: noDedup };
  for (const v of VARIANTS) {
    const topic = `bench-${v}-${Date.now()}`;
    MESSAGES = COUNTS[v];
    await fill(topic);
    await admin.query('TRUNCATE ledger, processed_messages');
    const t0 = process.hrtime.bigint();
    await run[v](pool, topic);
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    const { rows: [l] } = await admin.query('SELECT count(*)::int AS n, count(DISTINCT event_id)::int AS d FROM ledger');
    if (l.n !== MESSAGES || l.d !== MESSAGES) throw new Error(`${v}: ${l.n} ledger rows, ${l.d} events, not ${MESSAGES}`);
    console.log(`${v.padEnd(12)} ${(MESSAGES / s).toFixed(0).padStart(7)} messages/s (${MESSAGES} in ${s.toFixed(1)} s)`);
    console.log(`BENCH kafka_${v}_mps=${(MESSAGES / s).toFixed(0)}`);
  }
  console.log(`(one consumer process, batches of up to ${BATCH}, fsync=${settings.f}, synchronous_commit=${settings.c})`);
  await pool.end();
  await admin.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
