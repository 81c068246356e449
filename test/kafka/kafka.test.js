// idem_consumer behind a real Kafka broker (started by test/kafka/run), with
// the consumer group's positions kept in the database.
//
// A producer publishes EVENTS payment events on a topic of PARTITIONS
// partitions, keyed by account; every DUP_EVERY-th event is published a
// second time later (a producer retry: the same business key at a new
// offset).  A group of consumer processes (consumer.js: idem-consumer's
// consumeKafka) applies them in batches, each in one transaction that
// advances the positions of its partitions, records the keys and writes
// one ledger row per new event.  Meanwhile the driver, on a schedule drawn
// from a seeded generator, SIGKILLs members (at once, or from inside a
// batch's open transaction: KILL_IN_TX) and starts new ones, adds members
// and stops others gracefully (each a rebalance of the group), and
// restarts the broker once.  The broker's own offsets are never committed:
// each member reads a partition from the position stored in the database.
//
// At the end, with every member stopped: every event has exactly one
// ledger row, with its amount, and no other row exists (no double, no
// loss); each balance is the sum of its events; each stored position is
// the partition's log-end offset; no position ever moved backwards (a
// trigger of the test records every change of a position); no rewind is
// recorded; idem_stats counts each event applied once.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const path = require('node:path');
const readline = require('node:readline');
const { spawn, execFile } = require('node:child_process');
const { promisify } = require('node:util');
const { Admin, Consumer, Producer, stringSerializers } = require('@platformatic/kafka');
const { Client } = require('pg');

const BOOTSTRAP = process.env.KAFKA_BOOTSTRAP;
const EVENTS = Number(process.env.KAFKA_EVENTS || 6000);
const PARTITIONS = 6;
const ACCOUNTS = 60;
const DUP_EVERY = 10;              // events 5, 15, 25, ... are published twice
const MEMBERS = 3;
const SEED = Number(process.env.KAFKA_SEED || 20261206);
const TOPIC = 'payments';
const PRODUCE_MS = 25000;          // the events are spread over this long
const CHURN_STEP_MS = 2500;
const DEADLINE_MS = Number(process.env.KAFKA_DEADLINE_MS || 170000);

// a seeded generator, so that a run can be repeated
const { rng } = require('../lib/rng');
const random = rng(SEED);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const log = (line) => process.stdout.write(`kafka: ${line}\n`);

const event = (i) => ({ id: `pay-${i}`, account: i % ACCOUNTS, amount: 1 + (i % 97) });

const db = new Client();
const tally = {
  published: 0, duplicatePublishes: 0, kills: 0, killsInTx: 0, crashes: 0, joins: 0, leaves: 0,
  started: 0, brokerRestarts: 0, generations: new Set(), skipped: 0, overtaken: 0, applied: 0,
  messages: 0, streamRestarts: 0,
};
const members = new Map();         // pid -> { child, exited }
const errors = [];

async function topicReady(admin) {
  for (let i = 0; i < 100; i++) {
    const md = await admin.metadata({ topics: [TOPIC] }).catch(() => null);
    const t = md?.topics.get(TOPIC);
    if (t && t.partitions.length === PARTITIONS && t.partitions.every((p) => p.leader >= 0)) return;
    await sleep(100);
  }
  throw new Error(`topic ${TOPIC} has no leader for its ${PARTITIONS} partitions after 10 s`);
}

function startMember(env = {}) {
  const child = spawn(process.execPath, [path.join(__dirname, 'consumer.js')], {
    env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'],
  });
  const member = { child, exited: null, expectedExit: false };
  member.exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  members.set(child.pid, member);
  tally.started++;
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    let e;
    try { e = JSON.parse(line); } catch (_) { log(`member ${child.pid}: ${line}`); return; }
    if (e.event === 'join') tally.generations.add(e.generation);
    else if (e.event === 'batch') {
      tally.messages += e.messages; tally.applied += e.applied; tally.skipped += e.skipped;
      tally.overtaken += e.overtaken;
    } else if (e.event === 'kill-in-tx') tally.killsInTx++;
    else if (e.event === 'error') errors.push(`member ${child.pid}: ${e.message.slice(0, 2000)}`);
    else if (e.event === 'closed') tally.streamRestarts += e.counts.streamRestarts;
  });
  member.exited.then(({ code, signal }) => {
    members.delete(child.pid);
    if (member.expectedExit) return;
    if (signal === 'SIGKILL') {
      tally.kills++;              // KILL_IN_TX: it killed itself
    } else {
      tally.crashes++;
      log(`member ${child.pid} exited (${code ?? signal}) on its own; starting another`);
    }
    if (!stopAll) startMember();
  });
  return member;
}

function anyMember() {
  const pids = [...members.keys()];
  return pids.length ? members.get(pids[Math.floor(random() * pids.length)]) : null;
}

async function kill(member) {
  member.expectedExit = true;
  member.child.kill('SIGKILL');
  await member.exited;
  tally.kills++;
}

async function stopMember(member) {
  member.expectedExit = true;
  member.child.kill('SIGTERM');
  const t = setTimeout(() => member.child.kill('SIGKILL'), 20000);
  await member.exited;
  clearTimeout(t);
}

let stopAll = false;

async function restartBroker() {
  log('restarting the broker');
  await promisify(execFile)('bash', [process.env.KAFKA_BROKER_CTL, 'restart', process.env.KAFKA_DIR],
    { timeout: 180000 });
  tally.brokerRestarts++;
}

// Publishes every event, and the duplicate of every DUP_EVERY-th one 40
// events after its first copy, retrying a send that fails (the broker
// restarting) with a new producer.
async function produce() {
  const queue = [];
  for (let i = 0; i < EVENTS; i++) {
    queue.push(i);
    if (i >= 40 && (i - 40) % DUP_EVERY === 5) queue.push(i - 40);
  }
  const chunk = 100;
  const pause = PRODUCE_MS / Math.ceil(queue.length / chunk);
  let producer = null;
  const seen = new Set();
  for (let at = 0; at < queue.length; at += chunk) {
    const messages = queue.slice(at, at + chunk).map((i) => {
      const e = event(i);
      if (seen.has(i)) tally.duplicatePublishes++;
      seen.add(i);
      return { topic: TOPIC, key: `acct-${e.account}`, value: JSON.stringify(e) };
    });
    for (let attempt = 0; ; attempt++) {
      try {
        producer ||= new Producer({ clientId: 'payments-producer', bootstrapBrokers: [BOOTSTRAP],
          serializers: stringSerializers, acks: -1, retries: 20, retryDelay: 250 });
        await producer.send({ messages });
        break;
      } catch (err) {
        // a batch sent twice would be duplicates at new offsets, which the
        // keys absorb; the counts below are taken from the topic itself
        await producer?.close(true).catch(() => {});
        producer = null;
        if (attempt >= 20) throw err;
        await sleep(500);
      }
    }
    tally.published += messages.length;
    await sleep(pause);
  }
  await producer.close();
}

// The churn, one action every CHURN_STEP_MS until production is done, in
// this order (the members acted on are drawn from the seeded generator):
// a member SIGKILLed and a new one started; one started (a join); one
// SIGKILLed and replaced by one that kills itself inside the transaction
// of its first or second batch that applies something; one stopped
// (a leave); the broker restarted once, at the fifth step.
const SCHEDULE = ['kill', 'join', 'kill-in-tx', 'leave', 'broker', 'kill', 'join', 'kill-in-tx', 'leave'];

async function churn(producing) {
  let done = false;
  producing.then(() => { done = true; }, () => { done = true; });
  for (let step = 0; !done; step++) {
    await sleep(CHURN_STEP_MS);
    let action = SCHEDULE[step % SCHEDULE.length];
    if (action === 'broker' && step >= SCHEDULE.length) action = 'kill';
    if (action === 'leave' && members.size <= 2) action = 'join';
    const m = anyMember();
    if ((action === 'kill' || action === 'kill-in-tx') && !m) action = 'join';
    if (action === 'broker') {
      await restartBroker();
    } else if (action === 'kill') {
      await kill(m);
      startMember();
    } else if (action === 'kill-in-tx') {
      await kill(m);
      startMember({ KILL_IN_TX: String(1 + Math.floor(random() * 2)) });
    } else if (action === 'join') {
      startMember();
      tally.joins++;
    } else {
      await stopMember(m);
      tally.leaves++;
    }
  }
}

async function logEndOffsets() {
  const reader = new Consumer({ clientId: 'log-end', groupId: 'log-end', bootstrapBrokers: [BOOTSTRAP] });
  try {
    return (await reader.listOffsets({ topics: [TOPIC] })).get(TOPIC).map(BigInt);
  } finally {
    await reader.close();
  }
}

async function storedPositions() {
  const { rows } = await db.query(
    'SELECT "partition", "position" FROM idem_positions WHERE consumer = \'ledger\' AND topic = $1', [TOPIC]);
  const positions = new Array(PARTITIONS).fill(null);
  for (const r of rows) positions[r.partition] = BigInt(r.position);
  return positions;
}

test('a consumer group killed, rebalanced and cut off from its broker applies every event exactly once',
  { timeout: DEADLINE_MS + 30000 }, async (t) => {
    const t0 = Date.now();
    await db.connect();
    // whatever fails, nothing is left running
    t.after(async () => {
      stopAll = true;
      for (const m of members.values()) m.child.kill('SIGKILL');
      await db.end().catch(() => {});
    });
    await db.query('CREATE EXTENSION idem_consumer');
    await db.query(`CREATE TABLE ledger (
        row_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id text NOT NULL,
        account integer NOT NULL, amount bigint NOT NULL, kafka_partition integer NOT NULL,
        kafka_offset bigint NOT NULL, applied_by integer NOT NULL)`);
    await db.query('CREATE TABLE balances (account integer PRIMARY KEY, total bigint NOT NULL)');
    // every change of a stored position, to tell that none went backwards
    await db.query(`CREATE TABLE position_moves (topic text, "partition" integer,
        from_position bigint, to_position bigint)`);
    await db.query(`CREATE FUNCTION record_move() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.position_moves VALUES (NEW.topic, NEW."partition", OLD."position", NEW."position");
            RETURN NEW;
        END $$`);
    await db.query(`CREATE TRIGGER record_move AFTER UPDATE OF "position" ON idem_consumer.positions
        FOR EACH ROW EXECUTE FUNCTION record_move()`);

    const admin = new Admin({ clientId: 'admin', bootstrapBrokers: [BOOTSTRAP] });
    await admin.createTopics({ topics: [TOPIC], partitions: PARTITIONS, replicas: 1 });
    await topicReady(admin);

    for (let i = 0; i < MEMBERS; i++) startMember();
    const producing = produce();
    await Promise.all([producing, churn(producing)]);
    log(`produced ${tally.published} messages in ${((Date.now() - t0) / 1000).toFixed(1)} s`);

    // at least two members to finish; then wait for the positions to reach the log end
    while (members.size < 2) startMember();
    const ends = await logEndOffsets();
    let positions;
    for (;;) {
      positions = await storedPositions();
      if (positions.every((p, i) => p === ends[i])) break;
      if (Date.now() - t0 > DEADLINE_MS) break;
      if (errors.length) break;
      await sleep(500);
    }
    const converged = Date.now();
    stopAll = true;
    await Promise.all([...members.values()].map(stopMember));
    await admin.close();

    assert.deepStrictEqual(errors, [], 'no member failed');
    const total = ends.reduce((a, b) => a + b, 0n);
    log(`${total} messages on ${PARTITIONS} partitions (${EVENTS} events, ${tally.duplicatePublishes} published twice), seed ${SEED}`);
    log(`${tally.started} member processes: ${tally.kills} SIGKILLed (${tally.killsInTx} of them inside a batch's transaction), ${tally.leaves} stopped, ${tally.joins} added, ${tally.crashes} exited on their own; ${tally.generations.size} group generations; ${tally.brokerRestarts} broker restart; ${tally.streamRestarts} streams opened again by the members stopped at the end`);
    log(`members read ${tally.messages} messages: ${tally.applied} passed to the batch statement, ${tally.skipped} skipped without a query (below the position known, or a second copy in the batch), ${tally.overtaken} below the position another member stored meanwhile`);
    log(`all positions at the log end ${((converged - t0) / 1000).toFixed(1)} s after the start`);

    await t.test('each stored position is the log-end offset of its partition', () => {
      assert.deepStrictEqual(positions.map(String), ends.map(String));
    });
    await t.test('the ledger holds every event exactly once, with its amount', async () => {
      const { rows } = await db.query('SELECT event_id, count(*)::int AS n, min(amount) AS amount, min(account) AS account FROM ledger GROUP BY event_id');
      const byId = new Map(rows.map((r) => [r.event_id, r]));
      let doubles = 0;
      let losses = 0;
      let wrong = 0;
      for (let i = 0; i < EVENTS; i++) {
        const e = event(i);
        const r = byId.get(e.id);
        if (!r) { losses++; continue; }
        if (r.n !== 1) doubles++;
        if (Number(r.amount) !== e.amount || r.account !== e.account) wrong++;
        byId.delete(e.id);
      }
      log(`ledger: ${rows.length} events, ${doubles} applied twice or more, ${losses} lost, ${byId.size} unknown, ${wrong} with another amount`);
      assert.deepStrictEqual({ doubles, losses, unknown: byId.size, wrong }, { doubles: 0, losses: 0, unknown: 0, wrong: 0 });
    });
    await t.test('each balance is the sum of its events', async () => {
      const expected = new Map();
      for (let i = 0; i < EVENTS; i++) {
        const e = event(i);
        expected.set(e.account, (expected.get(e.account) || 0) + e.amount);
      }
      const { rows } = await db.query('SELECT account, total FROM balances ORDER BY account');
      assert.deepStrictEqual(new Map(rows.map((r) => [r.account, Number(r.total)])),
        new Map([...expected].sort((a, b) => a[0] - b[0])));
    });
    await t.test('no position moved backwards, none was rewound', async () => {
      const { rows: [m] } = await db.query(`SELECT count(*)::int AS moves,
          count(*) FILTER (WHERE to_position < from_position)::int AS backwards FROM position_moves`);
      const { rows: [r] } = await db.query('SELECT count(*)::int AS n FROM idem_consumer.position_rewinds');
      log(`${m.moves} position moves, ${m.backwards} backwards, ${r.n} rewinds`);
      assert.ok(m.moves > 0);
      assert.deepStrictEqual({ backwards: m.backwards, rewinds: r.n }, { backwards: 0, rewinds: 0 });
    });
    await t.test('idem_stats counts each event applied once', async () => {
      const { rows: [s] } = await db.query("SELECT applied FROM idem_stats WHERE consumer = 'ledger'");
      assert.strictEqual(Number(s.applied), EVENTS);
    });
    await t.test('the run had kills, kills inside a transaction, rebalances and a broker restart', () => {
      assert.ok(tally.kills >= 3, `${tally.kills} kills`);
      assert.ok(tally.killsInTx >= 1, `${tally.killsInTx} kills inside a transaction`);
      assert.ok(tally.generations.size >= 4, `${tally.generations.size} generations`);
      assert.strictEqual(tally.brokerRestarts, 1);
    });
  });
