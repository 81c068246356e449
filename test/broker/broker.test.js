// idem_consumer behind a real RabbitMQ broker (started by test/broker/run).
//
// A producer publishes order-paid events, some of them twice (a producer
// retry: the second copy is a new AMQP message with the same event).
// CONSUMERS consumer processes (consumer.js) take them with a prefetch
// window, apply each through idem-consumer's tryApply in a transaction, and
// ack after COMMIT.  Each consumer process is told where to stop, on a
// schedule drawn from a seeded generator: while the transaction of its N-th
// message is open (before COMMIT), or after that COMMIT and before the ack.
// The driver SIGKILLs it there and starts a new one.  The broker redelivers
// whatever the killed process had not acked: the paused message and the
// rest of its prefetch window.  Some events pay orders that do not exist
// yet (poisoned): tryApply parks them in the dead-letter queue; at the end
// the orders are created and the entries replayed.
//
// The accounting of duplicates.  Every published message is acked exactly
// once, after a delivery whose transaction committed.  A delivery whose
// process was killed before COMMIT committed nothing.  A delivery killed
// between COMMIT and ack committed, and its message is delivered again.  So
// the committed deliveries are PUBLISHED + KILLS_AFTER_COMMIT, and since
// every event is applied (or parked) exactly once, all the others are
// duplicates:
//   duplicates = PUBLISHED + KILLS_AFTER_COMMIT - EVENTS
//              = DUPLICATE_PUBLISHES + KILLS_AFTER_COMMIT
// idem_stats must show exactly that; neither side of it is computed from
// what idem_consumer answered.  The deliveries killed before COMMIT are
// rolled back with their connection: idem_stats counts each as failed.  The consumers' own view must agree: each
// committed delivery that got 'duplicate' (or 'dead_lettered' for an event
// parked earlier) is either a redelivery (redelivered = true: a message the
// broker handed out before) or a duplicate publish seen for the first
// time; their sum is the same number, and every message killed after its
// COMMIT was seen again as a redelivery whose key was already committed.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const amqp = require('amqplib');
const { Client } = require('pg');

const EVENTS = Number(process.env.BROKER_EVENTS || 3000);
const ORDERS = 200;
const POISON_EVERY = 600;          // events 7, 607, ... pay orders 100001 ... that do not exist yet
const DUP_EVERY = 10;              // events 3, 13, 23, ... are published twice
const CONSUMERS = Number(process.env.BROKER_CONSUMERS || 3);
const KILLS_PER_CONSUMER = 3;
const PREFETCH = 20;
const SEED = Number(process.env.BROKER_SEED || 20261203);
const QUEUE = 'order-paid';
const DEADLINE_MS = Number(process.env.BROKER_DEADLINE_MS || 150000);

// a seeded generator, so that a run can be repeated
const { rng } = require('../lib/rng');

const isPoisoned = (i) => i % POISON_EVERY === 7;
const POISONED_KEYS = new Set();
for (let i = 0; i < EVENTS; i++) if (isPoisoned(i)) POISONED_KEYS.add(`order-paid:e${i}`);
const POISONED = POISONED_KEYS.size;

function event(i) {
  return {
    id: `e${i}`,
    orderId: isPoisoned(i) ? 100001 + Math.floor(i / POISON_EVERY) : 1 + (i % ORDERS),
    amount: `${1 + (i % 50)}.25`,
    producedAt: new Date().toISOString(),
  };
}

const run = {};   // filled by the scenario, read by the assertions
const children = new Set();   // consumer processes alive
let stopping = false;         // no more restarts
let db;

test.before(async () => {
  db = new Client();
  await db.connect();
  // a fresh start: no keys, dead letters or counters of an earlier run
  await db.query('DROP TABLE IF EXISTS payments, orders');
  await db.query('DROP EXTENSION IF EXISTS idem_consumer');
  await db.query('CREATE EXTENSION idem_consumer');
  await db.query('CREATE TABLE orders (id bigint PRIMARY KEY, paid_amount numeric NOT NULL DEFAULT 0)');
  // no unique constraint on event_id: an event applied twice would show as two rows
  await db.query(`CREATE TABLE payments (event_id text NOT NULL, order_id bigint NOT NULL REFERENCES orders,
                                         amount numeric NOT NULL)`);
  await db.query('INSERT INTO orders (id) SELECT generate_series(1, $1::int)', [ORDERS]);
  await db.query("SELECT idem_stats_reset('payments')");
  await scenario();
});

test.after(async () => {
  // after a failed scenario, no consumer may survive the test
  stopping = true;
  for (const child of children) child.kill('SIGKILL');
  if (db) await db.end();
});

// Publish, consume with kills and restarts, wait for the queue to drain.
async function scenario() {
  const random = rng(SEED);
  const conn = await amqp.connect(process.env.AMQP_URL);
  const pub = await conn.createConfirmChannel();
  await pub.deleteQueue(QUEUE);
  await pub.assertQueue(QUEUE, { durable: false });

  // the schedule: each consumer slot is killed KILLS_PER_CONSUMER times,
  // before and after COMMIT in turn, at its 20th to 150th message
  const plans = [];
  for (let s = 0; s < CONSUMERS; s++) {
    const list = [];
    for (let k = 0; k < KILLS_PER_CONSUMER; k++)
      list.push(`${(s + k) % 2 === 0 ? 'before' : 'after'}:${20 + Math.floor(random() * 131)}`);
    list.push('');
    plans.push(list);
  }

  run.lines = [];
  run.kills = { before: [], after: [] };
  run.incarnations = [];
  run.errors = [];

  const start = (slot, incarnation) => {
    const pauseAt = plans[slot][incarnation];
    const child = spawn(process.execPath, [path.join(__dirname, 'consumer.js')], {
      env: { ...process.env, QUEUE, PREFETCH: String(PREFETCH), PAUSE_AT: pauseAt },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const me = { slot, incarnation, pauseAt, activeMs: 0, dbMs: 0, committed: 0 };
    run.incarnations.push(me);
    children.add(child);
    readline.createInterface({ input: child.stdout }).on('line', (line) => {
      const m = JSON.parse(line);
      if (m.pause) {
        run.kills[m.pause].push(m.key);
        child.kill('SIGKILL');
      } else if (m.key) {
        run.lines.push(m);
        me.activeMs = m.activeMs;
        me.dbMs += m.dbMs;
        me.committed++;
      }
    });
    child.on('exit', (code, signal) => {
      children.delete(child);
      if (signal === 'SIGKILL' && !stopping) start(slot, incarnation + 1);
      else if (!stopping || code !== 0) run.errors.push(`consumer ${slot}/${incarnation} exited: ${code ?? signal}`);
    });
  };
  for (let s = 0; s < CONSUMERS; s++) start(s, 0);

  // publish: events in order, the second copy of every DUP_EVERY-th event
  // some 50 events later, as a producer that retried after a lost confirm
  const t0 = Date.now();
  run.published = 0;
  const publish = (e) => {
    pub.publish('', QUEUE, Buffer.from(JSON.stringify(e)), { contentType: 'application/json' });
    run.published++;
  };
  const retries = [];
  for (let i = 0; i < EVENTS; i++) {
    const e = event(i);
    publish(e);
    if (i % DUP_EVERY === 3) retries.push([i + 50, e]);
    while (retries.length && retries[0][0] <= i) publish(retries.shift()[1]);
    if (i % 500 === 499) await pub.waitForConfirms();
  }
  for (const [, e] of retries) publish(e);
  await pub.waitForConfirms();
  run.duplicatePublishes = run.published - EVENTS;

  // every message is done when the committed deliveries, less those killed
  // before their ack, reach the messages published
  const killsAfter = () => run.kills.after.length;
  while (run.lines.length - killsAfter() < run.published) {
    if (Date.now() - t0 > DEADLINE_MS || run.errors.length) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  run.seconds = (Date.now() - t0) / 1000;

  stopping = true;
  await Promise.all([...children].map((child) => new Promise((resolve) => {
    child.on('exit', resolve);
    child.kill('SIGTERM');
  })));
  // with every consumer gone, an unacked message would be back in the queue
  const q = await pub.checkQueue(QUEUE);
  run.leftInQueue = q.messageCount;
  await pub.deleteQueue(QUEUE);
  await conn.close();

  const dbMs = run.incarnations.reduce((s, c) => s + c.dbMs, 0);
  const activeMs = run.incarnations.reduce((s, c) => s + c.activeMs, 0);
  console.log(`# broker: ${run.published} messages (${EVENTS} events, ${run.duplicatePublishes} published twice), ` +
    `${run.lines.length} committed deliveries, ${run.kills.before.length} kills before COMMIT, ` +
    `${run.kills.after.length} between COMMIT and ack, ${run.incarnations.length} consumer processes, seed ${SEED}`);
  console.log(`# broker: ${(run.published / run.seconds).toFixed(0)} messages/s through the broker ` +
    `(${run.seconds.toFixed(1)} s from the first publish to the last commit, ${CONSUMERS} consumers, prefetch ${PREFETCH})`);
  console.log(`# broker: consumers spent ${(100 * dbMs / activeMs).toFixed(1)}% of their time in the database ` +
    `(transaction of tryApply and COMMIT: ${(dbMs / run.lines.length).toFixed(2)} ms per delivery; ` +
    `${(activeMs / run.lines.length).toFixed(2)} ms per delivery from each process's first delivery to its last commit)`);
}

const stats = async () =>
  (await db.query(`SELECT applied::int, duplicates::int, dead_lettered::int, failed::int
                     FROM idem_stats WHERE consumer = 'payments'`)).rows[0];

test('every message was consumed, every planned kill happened and the consumers saw no error', () => {
  assert.deepStrictEqual(run.errors, []);
  assert.strictEqual(run.leftInQueue, 0);
  assert.strictEqual(run.lines.length - run.kills.after.length, run.published);
  assert.strictEqual(run.kills.before.length + run.kills.after.length, CONSUMERS * KILLS_PER_CONSUMER);
  assert.ok(run.kills.before.length > 0 && run.kills.after.length > 0);
  assert.ok(run.lines.some((l) => l.redelivered), 'the broker redelivered messages');
});

test('idem_stats: duplicates = duplicate publishes + kills between COMMIT and ack; failed = kills before COMMIT', async () => {
  const s = await stats();
  assert.strictEqual(s.applied, EVENTS - POISONED);
  assert.strictEqual(s.dead_lettered, POISONED);
  assert.strictEqual(s.duplicates, run.duplicatePublishes + run.kills.after.length);
  // a call whose process died before COMMIT was rolled back with its
  // connection: counted as failed, and as nothing else
  assert.strictEqual(s.failed, run.kills.before.length);
});

test('the consumers\' view: redeliveries of committed keys + duplicate publishes seen = idem_stats duplicates', async () => {
  // Lines of different processes reach the driver in any order, so a
  // delivery's place among its key's deliveries is read from its outcome:
  // one 'applied' per key, every other committed delivery 'duplicate'.  A
  // poisoned key answers 'dead_lettered' every time; its deliveries were
  // never concurrent (it is never published twice, and a message is
  // redelivered only after the process holding it died), so the first of
  // its lines is the one that parked it.
  const byKey = new Map();
  for (const l of run.lines) {
    if (!byKey.has(l.key)) byKey.set(l.key, []);
    byKey.get(l.key).push(l);
  }
  assert.strictEqual(byKey.size, EVENTS);
  let redeliveries = 0;
  let duplicatePublishesSeen = 0;
  for (const [key, lines] of byKey) {
    let repeats;
    if (POISONED_KEYS.has(key)) {
      assert.deepStrictEqual(lines.map((l) => l.outcome), Array(lines.length).fill('dead_lettered'), key);
      repeats = lines.slice(1);
    } else {
      assert.strictEqual(lines.filter((l) => l.outcome === 'applied').length, 1, key);
      repeats = lines.filter((l) => l.outcome !== 'applied');
      assert.ok(repeats.every((l) => l.outcome === 'duplicate'), key);
    }
    for (const l of repeats) {
      if (l.redelivered) redeliveries++;
      else duplicatePublishesSeen++;
    }
  }
  assert.strictEqual(redeliveries + duplicatePublishesSeen, (await stats()).duplicates);
  assert.ok(redeliveries >= run.kills.after.length);
  // each message killed after its COMMIT came back as a redelivery of a committed key
  for (const key of run.kills.after)
    assert.ok(byKey.get(key).some((l) => l.redelivered && l.outcome !== 'applied' &&
                                         l !== byKey.get(key)[0]), key);
  // each message killed before its COMMIT was applied (or parked) by a later delivery
  for (const key of run.kills.before)
    assert.ok(byKey.has(key), key);
  console.log(`# broker: ${redeliveries} redeliveries of committed keys + ${duplicatePublishesSeen} ` +
    `duplicate publishes seen first-hand = ${redeliveries + duplicatePublishesSeen} duplicates`);
});

test('poisoned messages wait in the dead-letter queue and replay once their orders exist', async () => {
  const { rows } = await db.query(`SELECT key, sqlstate, status FROM idem_dead_letters
                                    WHERE consumer = 'payments' ORDER BY key`);
  assert.deepStrictEqual(rows, [...POISONED_KEYS].sort().map((key) => ({ key, sqlstate: '23503', status: 'pending' })));
  const before = await stats();
  await db.query('INSERT INTO orders (id) SELECT 100001 + i FROM generate_series(0, $1::int - 1) i', [POISONED]);
  const { rows: replayed } = await db.query("SELECT outcome::text FROM idem_dlq_replay('payments', 100)");
  assert.deepStrictEqual(replayed.map((r) => r.outcome), Array(POISONED).fill('applied'));
  const { rows: left } = await db.query(
    "SELECT count(*)::int AS n FROM idem_dead_letters WHERE consumer = 'payments' AND status <> 'replayed'");
  assert.strictEqual(left[0].n, 0);
  // a replay is neither a duplicate nor a new dead letter
  const after = await stats();
  assert.strictEqual(after.duplicates, before.duplicates);
  assert.strictEqual(after.dead_lettered, before.dead_lettered);
});

test('every published event was applied exactly once and every balance is exact', async () => {
  const { rows: twice } = await db.query(
    'SELECT event_id, count(*)::int AS n FROM payments GROUP BY event_id HAVING count(*) <> 1');
  assert.deepStrictEqual(twice, []);
  const { rows: n } = await db.query('SELECT count(*)::int AS n FROM payments');
  assert.strictEqual(n[0].n, EVENTS);

  const expected = new Map();
  for (let i = 0; i < EVENTS; i++) {
    const e = event(i);
    expected.set(String(e.orderId), (expected.get(String(e.orderId)) || 0) + Number(e.amount));
  }
  const { rows } = await db.query('SELECT id::text, paid_amount::float8 AS paid FROM orders WHERE paid_amount <> 0');
  assert.strictEqual(rows.length, expected.size);
  for (const r of rows) assert.strictEqual(r.paid, expected.get(r.id), `order ${r.id}`);
});
