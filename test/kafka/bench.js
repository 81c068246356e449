// Messages per second from Kafka into PostgreSQL at durable commit, one
// consumer process, for three ways of consuming the same messages (run by
// test/bench/kafka, which starts the broker and a cluster with fsync and
// synchronous_commit on):
//
//   positions   consumeKafka: batches of up to BATCH messages, each one
//               transaction in one round trip that advances the positions,
//               records the keys (idem_record_batch) and applies the new
//               events
//   positions_only  consumeKafka as above with positions alone: the
//               batch statement is the business update, no key recorded,
//               as a consumer may run when the log holds no business
//               duplicates (docs/brokers.md, positions alone)
//   no_dedup    the reference: the same batches, formed by consumeKafka's
//               own readBatch(), each one statement of the business update
//               alone (its own transaction, one round trip), the broker's
//               offsets committed in the background as consumeKafka's
//               commitOffsets does: no deduplication at all
//   key_floor   the same as no_dedup, with the keys first inserted into a
//               table with a unique index (INSERT ... ON CONFLICT DO
//               NOTHING RETURNING) in the same statement, the business rows
//               of the new ones only: what storing a key costs PostgreSQL
//               itself, the floor of any deduplication that keeps its keys
//               in the database
//   per_message what is usually written by hand: per message BEGIN;
//               INSERT INTO processed_messages ... ON CONFLICT DO NOTHING;
//               the business statement if it was new; COMMIT; then the
//               broker's offset commit, awaited
//
// One topic of MESSAGES events on 6 partitions is filled beforehand; each
// run reads it from the start with a consumer group (and, for positions,
// an idem_consumer consumer) of its own, MESSAGES messages for positions,
// no_dedup and key_floor, the first PER_MESSAGE for per_message, which is
// slow.  The time is from the first message handled to the last commit
// (the database's, and for the others the broker's too): the group's join
// and the client's first fetch, 1 to 3 s whatever the variant, are no
// cost of a message.  ROUNDS rounds, the
// order of the variants rotating from one round to the next; prints each
// run, then the median messages per second of each variant and the
// median of the per-round ratios, as "BENCH name=value" lines.
'use strict';

const { Admin, Consumer, Producer, stringSerializers, stringDeserializers } = require('@platformatic/kafka');
const { Client, Pool } = require('pg');
const idem = require('idem-consumer');
const { readBatch } = require('idem-consumer/lib/kafka');

const BOOTSTRAP = process.env.KAFKA_BOOTSTRAP;
const MESSAGES = Number(process.env.BENCH_MESSAGES || 300000);
const PER_MESSAGE = Number(process.env.BENCH_PER_MESSAGE || 1000);
const BATCH = Number(process.env.BENCH_BATCH || 500);
const ROUNDS = Number(process.env.BENCH_ROUNDS || 5);
const PARTITIONS = 6;
const VARIANTS = (process.env.BENCH_VARIANTS || 'positions positions_only no_dedup key_floor per_message').split(' ');

const LEDGER = `INSERT INTO ledger (event_id, account, amount)
SELECT m.key, m.account, m.amount FROM unnest($1::text[], $2::integer[], $3::bigint[]) AS m (key, account, amount)`;
const WITH_KEYS = `INSERT INTO ledger (event_id, account, amount)
SELECT m.key, m.account, m.amount FROM unnest($2::text[], $3::integer[], $4::bigint[]) AS m (key, account, amount)
 WHERE m.key IN (SELECT k FROM idem_record_batch($1, $2::text[]) AS k)`;
// positions alone: $1, the consumer, is not needed without keys
const POSITIONS_ONLY = `INSERT INTO ledger (event_id, account, amount)
SELECT m.key, m.account, m.amount FROM unnest($2::text[], $3::integer[], $4::bigint[]) AS m (key, account, amount)
 WHERE $1::text IS NOT NULL`;
const PLAIN_KEYS = `WITH k AS (
    INSERT INTO plain_keys (key) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING key
)
INSERT INTO ledger (event_id, account, amount)
SELECT m.key, m.account, m.amount FROM unnest($1::text[], $2::integer[], $3::bigint[]) AS m (key, account, amount)
 WHERE m.key IN (SELECT key FROM k)`;
const event = (i) => ({ id: `pay-${i}`, account: i % 60, amount: 1 + (i % 97) });

async function fill(topic, count) {
  const admin = new Admin({ clientId: 'bench', bootstrapBrokers: [BOOTSTRAP] });
  await admin.createTopics({ topics: [topic], partitions: PARTITIONS, replicas: 1 });
  for (let i = 0; i < 100; i++) {
    const t = (await admin.metadata({ topics: [topic] }).catch(() => null))?.topics.get(topic);
    if (t && t.partitions.every((p) => p.leader >= 0)) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  await admin.close();
  // idempotent: a send retried under load writes no second copy, so that
  // every run reads exactly the messages sent
  const producer = new Producer({ clientId: 'bench', bootstrapBrokers: [BOOTSTRAP], serializers: stringSerializers,
    idempotent: true, acks: -1 });
  for (let at = 0; at < count; at += 1000) {
    const messages = [];
    for (let i = at; i < Math.min(at + 1000, count); i++) {
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

// when the run at hand handled its first message and made its last
// commit, between which it is timed
let firstAt = null;
let lastAt = null;
const last = () => { lastAt = process.hrtime.bigint(); };
const first = () => { if (firstAt === null) firstAt = process.hrtime.bigint(); };

// the business columns, as a caller writes them: each parses the message
const key = (m) => { first(); return JSON.parse(m.value).id; };
const columns = [(m) => JSON.parse(m.value).account, (m) => JSON.parse(m.value).amount];

async function positions(pool, topic, group, count, sql = WITH_KEYS) {
  const kafka = newConsumer(group);
  let applied = 0;
  let resolve;
  const finished = new Promise((r) => { resolve = r; });
  const run = idem.consumeKafka({
    kafka, db: pool, consumer: group, topics: [topic], key, columns, sql, maxBatch: BATCH,
    onBatch: (b) => { applied += b.applied; if (applied >= count) { last(); resolve(); } },
  });
  await Promise.race([finished, run.done]);
  await run.close();
  await kafka.close(true);
}

// The batches of consumeKafka (readBatch), each handed to handle(); the
// broker's offsets committed in the background, the latest of each
// partition, one commit at a time, as consumeKafka's commitOffsets does.
async function batches(topic, group, count, handle) {
  const kafka = newConsumer(group);
  const stream = await kafka.consume({ topics: [topic], mode: 'earliest', autocommit: false });
  stream.on('readable', () => {});
  const toCommit = new Map();
  let committing = null;
  const commitLoop = async () => {
    while (toCommit.size > 0) {
      const last = [...toCommit.values()];
      toCommit.clear();
      await Promise.all(last.map((m) => m.commit()));
    }
    committing = null;
  };
  let read = 0;
  while (read < count) {
    const batch = await readBatch(stream, BATCH, () => false);
    if (batch.length === 0) throw new Error('the stream ended');
    await handle(batch);
    read += batch.length;
    for (const m of batch) toCommit.set(m.partition, m);
    if (!committing) committing = commitLoop();
  }
  await committing;
  last();
  await stream.close();
  await kafka.close(true);
}

async function noDedup(pool, topic, group, count) {
  await batches(topic, group, count, (messages) => pool.query(LEDGER, idem.batchParams(messages, key, columns)));
}

async function keyFloor(pool, topic, group, count) {
  await batches(topic, group, count, (messages) => pool.query(PLAIN_KEYS, idem.batchParams(messages, key, columns)));
}

// per message, as written by hand, the broker's commit awaited
async function perMessage(pool, topic, group, count) {
  const db = await pool.connect();
  const kafka = newConsumer(group);
  const stream = await kafka.consume({ topics: [topic], mode: 'earliest', autocommit: false });
  let read = 0;
  for await (const m of stream) {
    first();
    const e = JSON.parse(m.value);
    await db.query('BEGIN');
    const { rowCount } = await db.query(
      'INSERT INTO processed_messages (key) VALUES ($1) ON CONFLICT DO NOTHING', [e.id]);
    if (rowCount === 1)
      await db.query('INSERT INTO ledger (event_id, account, amount) VALUES ($1, $2, $3)', [e.id, e.account, e.amount]);
    await db.query('COMMIT');
    await m.commit();
    if (++read >= count) { last(); break; }
  }
  await kafka.close(true);
  db.release();
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

async function main() {
  const admin = new Client();
  await admin.connect();
  await admin.query('CREATE EXTENSION IF NOT EXISTS idem_consumer');
  await admin.query('CREATE TABLE IF NOT EXISTS ledger (event_id text NOT NULL, account integer NOT NULL, amount bigint NOT NULL)');
  await admin.query('CREATE TABLE IF NOT EXISTS processed_messages (key text PRIMARY KEY, processed_at timestamptz NOT NULL DEFAULT now())');
  await admin.query('CREATE TABLE IF NOT EXISTS plain_keys (key text COLLATE "C" PRIMARY KEY)');
  const { rows: [settings] } = await admin.query("SELECT current_setting('fsync') AS f, current_setting('synchronous_commit') AS c");
  const pool = new Pool({ max: 2 });
  const positionsOnly = (pool, topic, group, count) => positions(pool, topic, group, count, POSITIONS_ONLY);
  const run = { positions, positions_only: positionsOnly, no_dedup: noDedup, key_floor: keyFloor, per_message: perMessage };
  const topic = `bench-${Date.now()}`;
  const t = process.hrtime.bigint();
  await fill(topic, MESSAGES);
  console.log(`${MESSAGES} events on ${PARTITIONS} partitions in ${(Number(process.hrtime.bigint() - t) / 1e9).toFixed(1)} s`);
  const rates = Object.fromEntries(VARIANTS.map((v) => [v, []]));
  for (let round = 0; round < ROUNDS; round++) {
    const order = VARIANTS.map((_, i) => VARIANTS[(i + round) % VARIANTS.length]);
    for (const v of order) {
      const count = v === 'per_message' ? Math.min(PER_MESSAGE, MESSAGES) : MESSAGES;
      const group = `bench-${v}-${round}-${Date.now()}`;
      await admin.query('TRUNCATE ledger, processed_messages, plain_keys');
      await admin.query('CHECKPOINT');
      firstAt = null;
      await run[v](pool, topic, group, count);
      const s = Number(lastAt - firstAt) / 1e9;
      const { rows: [l] } = await admin.query(
        'SELECT count(*)::int AS n, count(DISTINCT event_id)::int AS d FROM ledger');
      // no_dedup applies what the client delivers, a second copy too
      if (l.d !== count || (v !== 'no_dedup' && l.n !== count))
        throw new Error(`${v}: ${l.n} ledger rows, ${l.d} events, not ${count}`);
      rates[v].push(count / s);
      console.log(`round ${round + 1} ${v.padEnd(12)} ${(count / s).toFixed(0).padStart(7)} messages/s (${count} in ${s.toFixed(1)} s)`);
    }
  }
  console.log(`medians of ${ROUNDS} rounds (one consumer process, batches of up to ${BATCH}, fsync=${settings.f}, synchronous_commit=${settings.c}):`);
  for (const v of VARIANTS) {
    const m = median(rates[v]);
    console.log(`  ${v.padEnd(12)} ${m.toFixed(0).padStart(7)} messages/s`);
    console.log(`BENCH kafka_${v}_mps=${m.toFixed(0)}`);
  }
  // ratios within each round, then their median
  const ratio = (a, b) => median(rates[a].map((x, i) => x / rates[b][i]));
  const goals = [['positions', 'no_dedup', 0.95], ['positions_only', 'no_dedup', 0.95], ['positions', 'per_message', 2],
    ['key_floor', 'no_dedup', null], ['positions', 'key_floor', null]];
  for (const [a, b, goal] of goals) {
    if (!rates[a] || !rates[b]) continue;
    const r = ratio(a, b);
    console.log(`  ${a} / ${b}: ${r.toFixed(2)}x ${goal ? `(goal >= ${goal}x: ${r >= goal ? 'met' : 'MISSED'})` : '(ref)'}`);
    console.log(`BENCH kafka_${a}_over_${b}=${r.toFixed(3)}`);
  }
  await pool.end();
  await admin.end();
}

main().catch((err) => { console.error(err); process.exit(1); });
