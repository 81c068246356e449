// consumeKafka against a stand-in for a @platformatic/kafka Consumer (a
// stream of messages pushed by the test, assignments emitted by it) and
// the real database: a run starts from the stored positions, skips what is
// below them without a query, applies the rest once with the positions
// moved in the same transaction, defers to another member that went
// further, seeks a partition newly assigned to its stored position, and
// commits the broker's offsets only when asked.  The real broker is in
// test/kafka.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { EventEmitter } = require('node:events');
const { Readable } = require('node:stream');
const { connect, consumerName } = require('./db');
const idem = require('..');

const CONSUMER = consumerName('kafka');
const APPLY = `
INSERT INTO kafka_ledger (event_id, part, off)
SELECT m.key, m.part, m.off
  FROM unnest($2::text[], $3::integer[], $4::bigint[]) AS m (key, part, off)
 WHERE m.key IN (SELECT k FROM idem_record_batch($1, $2::text[]) AS k)`;

class FakeKafka extends EventEmitter {
  constructor(assignments) {
    super();
    this.assignments = assignments;
    this.stream = new Readable({ objectMode: true, read() {} });
    this.stream.offsetsToFetch = new Map();
    this.stream.close = async () => { this.stream.push(null); };
    this.commits = [];
  }

  async consume(options) {
    this.options = options;
    this.emit('consumer:group:join', { assignments: this.assignments });
    return this.stream;
  }

  async listOffsets() {
    return new Map([['orders', [100n, 100n, 100n]]]);
  }

  message(partition, offset, id = `ev-${partition}-${offset}`) {
    return {
      topic: 'orders', partition, offset: BigInt(offset), key: null, value: id, timestamp: 0n,
      headers: new Map(),
      commit: async () => { this.commits.push([partition, BigInt(offset) + 1n]); },
    };
  }
}

let db;
let other;
test.before(async () => {
  db = await connect();
  other = await connect();
  await db.query('DROP TABLE IF EXISTS kafka_ledger');
  await db.query('CREATE TABLE kafka_ledger (event_id text, part integer, off bigint)');
});
test.after(async () => {
  await db.query('DROP TABLE kafka_ledger');
  await db.end();
  await other.end();
});

const positions = async () => Object.fromEntries((await db.query(
  'SELECT "partition", "position" FROM idem_positions($1)', [CONSUMER])).rows
  .map((r) => [r.partition, Number(r.position)]));
const ledger = async () => (await db.query(
  'SELECT part, off FROM kafka_ledger ORDER BY part, off')).rows.map((r) => `${r.part}:${r.off}`);

// Runs consumeKafka until the batches pushed have been handled.
function start(kafka, extra = {}) {
  const batches = [];
  let wake = null;
  const run = idem.consumeKafka({
    kafka, db, consumer: CONSUMER, topics: ['orders'], key: (m) => m.value,
    columns: [(m) => m.partition, (m) => m.offset], sql: APPLY, logEndIntervalMs: 0,
    onBatch: (b) => { batches.push(b); if (wake) wake(); },
    ...extra,
  });
  const push = async (...messages) => {
    const n = batches.length;
    const handled = new Promise((resolve) => { wake = () => { if (batches.length > n) resolve(); }; });
    for (const m of messages) kafka.stream.push(m);
    await Promise.race([handled, run.done.then(() => { throw new Error('the run stopped'); })]);
    return batches[batches.length - 1];
  };
  return { run, push };
}

test('a run reads from the stored positions, skips below them and applies the rest once', async () => {
  await db.query("SELECT idem_position_advance($1, 'orders', 0, 5)", [CONSUMER]);
  const kafka = new FakeKafka([{ topic: 'orders', partitions: [0, 1] }]);
  const { run, push } = start(kafka);

  await push(kafka.message(0, 3), kafka.message(0, 4), kafka.message(0, 5), kafka.message(0, 6),
    kafka.message(0, 6), kafka.message(0, 7), kafka.message(1, 0), kafka.message(1, 1));
  assert.deepStrictEqual(kafka.options.offsets, [{ topic: 'orders', partition: 0, offset: 5n }]);
  assert.strictEqual(kafka.options.mode, 'manual');
  assert.strictEqual(kafka.options.fallbackMode, 'earliest');
  assert.strictEqual(kafka.options.autocommit, false);
  assert.deepStrictEqual(await positions(), { 0: 8, 1: 2 });
  assert.deepStrictEqual(await ledger(), ['0:5', '0:6', '0:7', '1:0', '1:1']);
  // offsets 3 and 4 below the position and the second copy of 6: no query
  assert.deepStrictEqual(run.counts, { batches: 1, messages: 8, skipped: 3, overtaken: 0, applied: 5,
    assignments: 1, backwards: 0, streamRestarts: 0 });

  // the same messages again: all below the positions now
  const again = await push(kafka.message(0, 6), kafka.message(0, 7), kafka.message(1, 1));
  assert.deepStrictEqual(again, { messages: 3, applied: 0, skipped: 3, overtaken: 0 });

  // another member stored 10 on partition 0 meanwhile: 8 and 9 are its;
  // the batch from 8 is refused (IP001), the positions read again, and
  // the rest applied
  const lag = await db.query("SELECT idem_position_advance($1, 'orders', 0, 10)", [CONSUMER]);
  assert.strictEqual(Number(lag.rows[0].idem_position_advance), 8);
  const overtaken = await push(kafka.message(0, 8), kafka.message(0, 9), kafka.message(0, 10),
    kafka.message(0, 11));
  assert.deepStrictEqual(overtaken, { messages: 4, applied: 2, skipped: 0, overtaken: 2 });
  assert.strictEqual(run.counts.backwards, 1);

  // another member stored 20 on partition 1: the batch, wholly below it,
  // is refused, read again and skipped
  await other.query("SELECT idem_position_advance($1, 'orders', 1, 20)", [CONSUMER]);
  const behind = await push(kafka.message(1, 2), kafka.message(1, 3));
  assert.deepStrictEqual(behind, { messages: 2, applied: 0, skipped: 0, overtaken: 2 });
  assert.strictEqual(run.counts.backwards, 2);
  assert.deepStrictEqual(await positions(), { 0: 12, 1: 20 });
  assert.deepStrictEqual(await ledger(), ['0:5', '0:6', '0:7', '0:10', '0:11', '1:0', '1:1']);

  // the log-end offset reported with the advance gives the lag
  const { rows: [p0] } = await db.query(
    'SELECT log_end_offset, lag FROM idem_positions($1) WHERE "partition" = 0', [CONSUMER]);
  assert.deepStrictEqual([Number(p0.log_end_offset), Number(p0.lag)], [100, 88]);

  // a partition newly assigned is read from its stored position
  await other.query("SELECT idem_position_advance($1, 'orders', 2, 7)", [CONSUMER]);
  kafka.emit('consumer:group:join', { assignments: [{ topic: 'orders', partitions: [0, 2] }] });
  for (let i = 0; i < 100 && !kafka.stream.offsetsToFetch.has('orders:2'); i++)
    await new Promise((r) => setTimeout(r, 10));
  assert.strictEqual(kafka.stream.offsetsToFetch.get('orders:2'), 7n);
  // partition 0 stayed with this member: where the stream reads it is left alone
  assert.strictEqual(kafka.stream.offsetsToFetch.has('orders:0'), false);
  assert.deepStrictEqual(kafka.commits, [], 'no broker commit unless asked');

  // a key published twice, both copies in one batch: applied once
  const twice = await push(kafka.message(0, 12, 'ev-twice'), kafka.message(0, 13, 'ev-twice'));
  assert.deepStrictEqual(twice, { messages: 2, applied: 1, skipped: 1, overtaken: 0 });
  assert.strictEqual((await db.query("SELECT count(*)::int AS n FROM kafka_ledger WHERE event_id = 'ev-twice'")).rows[0].n, 1);

  await run.close();
  await run.done;
});

test('commitOffsets commits each partition after COMMIT, at the next offset to read', async () => {
  const kafka = new FakeKafka([{ topic: 'orders', partitions: [0] }]);
  const { run, push } = start(kafka, { commitOffsets: true });
  await push(kafka.message(0, 14), kafka.message(0, 15), kafka.message(1, 20));
  assert.deepStrictEqual(kafka.commits.sort(), [[0, 16n], [1, 21n]]);
  await run.close();
});

test('a batch is one round trip to the database: advance, batch statement and COMMIT together', async () => {
  const kafka = new FakeKafka([{ topic: 'orders', partitions: [0, 1] }]);
  // every query the run sends, once its start has read the positions
  const sent = [];
  const counting = Object.create(db);
  counting.query = (...args) => { sent.push(args[0]); return db.query(...args); };
  const { run, push } = start(kafka, { db: counting });
  const first = await push(kafka.message(0, 30), kafka.message(0, 31), kafka.message(1, 40));
  assert.deepStrictEqual(first, { messages: 3, applied: 3, skipped: 0, overtaken: 0 });
  sent.length = 0;
  const second = await push(kafka.message(0, 32), kafka.message(1, 41), kafka.message(1, 42));
  assert.deepStrictEqual(second, { messages: 3, applied: 3, skipped: 0, overtaken: 0 });
  assert.strictEqual(sent.length, 1, 'one query per batch');
  assert.deepStrictEqual((await positions()), { 0: 33, 1: 43, 2: 7 });
  // a failing batch statement leaves nothing behind, and the client usable
  await run.close();
  const failing = start(new FakeKafka([{ topic: 'orders', partitions: [0] }]),
    { db: counting, sql: 'SELECT $1::text, 1 / 0 FROM unnest($2::text[], $3::integer[], $4::bigint[])' });
  failing.push(kafka.message(0, 33)).catch(() => {});
  await assert.rejects(failing.run.done, { code: '22012' });
  assert.deepStrictEqual((await positions())[0], 33);
  assert.strictEqual((await db.query('SELECT 1 AS one')).rows[0].one, 1);
  // the advance is prepared once on a connection, where the failing batch
  // found it, and a connection that prepares it in a batch that fails
  // keeps it too: the next batch binds it by its name
  const prepared = async (client) => (await client.query(
    "SELECT name FROM pg_prepared_statements WHERE name LIKE 'idem_consumer%'")).rows.map((r) => r.name);
  assert.deepStrictEqual(await prepared(db), ['idem_consumer_kafka_advance']);
  const fresh = await connect();
  try {
    const failingFresh = start(new FakeKafka([{ topic: 'orders', partitions: [0] }]),
      { db: fresh, sql: 'SELECT $1::text, 1 / 0 FROM unnest($2::text[], $3::integer[], $4::bigint[])' });
    failingFresh.push(kafka.message(0, 33)).catch(() => {});
    await assert.rejects(failingFresh.run.done, { code: '22012' });
    assert.deepStrictEqual(await prepared(fresh), ['idem_consumer_kafka_advance']);
    const after = start(new FakeKafka([{ topic: 'orders', partitions: [0] }]), { db: fresh });
    assert.deepStrictEqual(await after.push(kafka.message(3, 0)), { messages: 1, applied: 1, skipped: 0, overtaken: 0 });
    await after.run.close();
  } finally {
    await fresh.end();
  }

  // onApplied runs inside the transaction, with the batch statement's
  // result, and the COMMIT waits for it: a second round trip
  const called = [];
  const applying = start(new FakeKafka([{ topic: 'orders', partitions: [0] }]), { db: counting,
    onApplied: (messages, result) => called.push([messages.length, result.rowCount, db.getTransactionStatus()]) });
  await applying.push(kafka.message(0, 33));
  sent.length = 0;
  const third = await applying.push(kafka.message(0, 34), kafka.message(0, 35));
  assert.deepStrictEqual(third, { messages: 2, applied: 2, skipped: 0, overtaken: 0 });
  assert.deepStrictEqual(called, [[1, 1, 'T'], [2, 2, 'T']]);
  assert.strictEqual(sent.length, 2, 'the statements, then COMMIT');
  await applying.run.close();

  // a client without node-postgres's protocol connection (as pg-native)
  // gets the same statements one after the other
  const plain = { query: (...args) => { sent.push(args[0]); return db.query(...args); } };
  const sequential = start(new FakeKafka([{ topic: 'orders', partitions: [0] }]), { db: plain });
  const fourth = await sequential.push(kafka.message(0, 36), kafka.message(0, 37));
  assert.deepStrictEqual(fourth, { messages: 2, applied: 2, skipped: 0, overtaken: 0 });
  assert.deepStrictEqual(sent.slice(-4).map((q) => (q.text || q).trim().split(/\s/)[0]),
    ['BEGIN', 'SELECT', 'INSERT', 'COMMIT']);
  assert.deepStrictEqual((await positions())[0], 38);
  await sequential.run.close();
});

test('messages of partitions interleaved and out of offset order are applied in order, each once', async () => {
  const kafka = new FakeKafka([{ topic: 'orders', partitions: [4, 5] }]);
  const { run, push } = start(kafka);
  const first = await push(kafka.message(5, 5), kafka.message(4, 10), kafka.message(5, 4), kafka.message(4, 8),
    kafka.message(5, 5), kafka.message(4, 9));
  assert.deepStrictEqual(first, { messages: 6, applied: 5, skipped: 1, overtaken: 0 });
  // below the position, out of order too: skipped without a query
  const second = await push(kafka.message(4, 12), kafka.message(4, 7), kafka.message(4, 11));
  assert.deepStrictEqual(second, { messages: 3, applied: 2, skipped: 1, overtaken: 0 });
  const p = await positions();
  assert.deepStrictEqual([p[4], p[5]], [13, 6]);
  assert.deepStrictEqual((await ledger()).filter((r) => /^[45]:/.test(r)), ['4:8', '4:9', '4:10', '4:11', '4:12', '5:4', '5:5']);
  await run.close();
});

test('consumeKafka refuses bad options before anything runs', () => {
  const kafka = new FakeKafka([]);
  const base = { kafka, db, consumer: 'c', topics: ['t'], key: (m) => m.value, sql: 'SELECT 1' };
  for (const [change, message] of [
    [{ kafka: {} }, /kafka must be a @platformatic\/kafka Consumer/],
    [{ db: null }, /db must be a pg Pool or Client/],
    [{ consumer: '' }, /consumer must be a non-empty string/],
    [{ topics: [] }, /topics must be a non-empty array of strings/],
    [{ key: 'id' }, /key must be a function of a message/],
    [{ sql: undefined }, /sql must be a string/],
    [{ maxBatch: 0 }, /maxBatch must be a positive integer/],
  ]) assert.throws(() => idem.consumeKafka({ ...base, ...change }), { name: 'TypeError', message: message });
});
