// Retries on 40001 and 40P01: real deadlocks and serialization failures
// staged between two connections; retries are bounded; other errors are
// raised at once; inside the caller's transaction nothing is retried.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { Pool } = require('pg');
const { connect, waitForLockWait, consumerName } = require('./db');
const idem = require('..');

const RETRY = consumerName('retry');
// locks row 1, then row 2 (a sequential scan of a two-row table, in order)
const BOTH = 'UPDATE retry_rows SET v = v + 1 WHERE id = ANY ($1::int[])';

let db;   // the consumer
let other; // the transaction that gets in its way
test.before(async () => {
  db = await connect();
  other = await connect();
  await db.query('DROP TABLE IF EXISTS retry_rows');
  await db.query('CREATE TABLE retry_rows (id int PRIMARY KEY, v int NOT NULL DEFAULT 0)');
  // the consumer's backend runs the deadlock check (after 300 ms), the other's never does
  await db.query("SET deadlock_timeout = '300ms'");
  await other.query("SET deadlock_timeout = '60s'");
});
test.beforeEach(async () => {
  await db.query('TRUNCATE retry_rows');
  await db.query('INSERT INTO retry_rows VALUES (1), (2)');
});
test.after(async () => {
  await db.query('DROP TABLE retry_rows');
  await db.end();
  await other.end();
});

const pid = async (client) => (await client.query('SELECT pg_backend_pid() AS p')).rows[0].p;
const values = async () => (await db.query('SELECT v FROM retry_rows ORDER BY id')).rows.map((r) => r.v);

// Make the consumer's statement deadlock with `other`: other locks row 2, the
// consumer locks row 1 and waits for row 2, other asks for row 1.  The
// consumer's check finds the cycle and its statement fails with 40P01.
async function deadlockOnce(run) {
  await other.query('BEGIN');
  await other.query('UPDATE retry_rows SET v = v + 10 WHERE id = 2');
  const retries = [];
  const consumerPid = await pid(db);
  const done = run((err, n) => retries.push([err.code, n]));
  await waitForLockWait(other, consumerPid);
  await other.query('UPDATE retry_rows SET v = v + 10 WHERE id = 1');  // waits until the consumer gives up
  await other.query('COMMIT');
  return { result: await done, retries };
}

test('apply sent on its own is retried in a new transaction after a deadlock', async () => {
  const msg = { key: 'r-1', consumer: RETRY, sql: BOTH, params: [[1, 2]] };
  const { result, retries } = await deadlockOnce((onRetry) =>
    idem.apply(db, msg, { onRetry, minDelayMs: 50 }));
  assert.strictEqual(result, true);
  assert.deepStrictEqual(retries, [['40P01', 1]]);
  // other's +10 on each row, and the message's +1 once
  assert.deepStrictEqual(await values(), [11, 11]);
  assert.strictEqual(await idem.apply(db, msg), false);
});

test('transaction() runs the whole unit again after a deadlock', async () => {
  let runs = 0;
  const { result, retries } = await deadlockOnce((onRetry) => idem.transaction(db, async (client) => {
    runs++;
    const applied = await idem.apply(client, { key: 'r-2', consumer: RETRY, sql: BOTH, params: [[1, 2]] });
    await client.query('UPDATE retry_rows SET v = v + 100 WHERE id = 1');
    return applied;
  }, { onRetry, minDelayMs: 50 }));
  assert.strictEqual(result, true);
  assert.strictEqual(runs, 2);
  assert.deepStrictEqual(retries, [['40P01', 1]]);
  assert.deepStrictEqual(await values(), [111, 11]);
});

test('inside the caller\'s own transaction the deadlock is raised, not retried', async () => {
  const retries = [];
  await db.query('BEGIN');
  const { result } = await deadlockOnce((onRetry) =>
    idem.apply(db, { key: 'r-3', consumer: RETRY, sql: BOTH, params: [[1, 2]] }, { onRetry })
      .then(() => 'no error', (err) => err.code));
  await db.query('ROLLBACK');
  assert.strictEqual(result, '40P01');
  assert.deepStrictEqual(retries, []);
  assert.deepStrictEqual(await values(), [10, 10]);
  const { rows } = await db.query("SELECT idem_is_processed('r-3', $1) AS p", [RETRY]);
  assert.strictEqual(rows[0].p, false);
});

test('a serialization failure under REPEATABLE READ is retried and the retry is a duplicate', async () => {
  const msg = { key: 'r-4', consumer: RETRY, sql: 'UPDATE retry_rows SET v = v + 1 WHERE id = 1' };
  let runs = 0;
  const retries = [];
  const result = await idem.transaction(db, async (client) => {
    runs++;
    await client.query('SELECT 1');  // the snapshot is taken here
    if (runs === 1) assert.strictEqual(await idem.apply(other, msg), true);  // committed after it
    return idem.apply(client, msg);
  }, { isolationLevel: 'repeatable read', onRetry: (err, n) => retries.push([err.code, n]) });
  assert.strictEqual(result, false);
  assert.strictEqual(runs, 2);
  assert.deepStrictEqual(retries, [['40001', 1]]);
  assert.deepStrictEqual(await values(), [1, 0]);
});

test('retries are bounded, and other errors are raised at once', async () => {
  let runs = 0;
  const failing = () => idem.transaction(db, async () => {
    runs++;
    throw Object.assign(new Error('could not serialize access'), { code: '40001' });
  }, { retries: 3, minDelayMs: 1 });
  await assert.rejects(failing(), (err) => err.code === '40001');
  assert.strictEqual(runs, 4);

  runs = 0;
  await assert.rejects(idem.transaction(db, async (client) => {
    runs++;
    await client.query('SELECT 1 / 0');
  }), (err) => err.code === '22012');
  assert.strictEqual(runs, 1);
  // and the connection is usable, outside any transaction
  assert.strictEqual(db.getTransactionStatus(), 'I');
  await assert.rejects(idem.transaction(db, async () => 1, { retries: -1 }), TypeError);
  await assert.rejects(idem.transaction(db, async () => 1, { isolationLevel: 'chaos' }), TypeError);
});

test('given a Pool, transaction() keeps one client for all its attempts and returns it', async () => {
  const pool = new Pool({ max: 3 });
  try {
    const pids = [];
    const result = await idem.transaction(pool, async (client) => {
      pids.push((await client.query('SELECT pg_backend_pid() AS p')).rows[0].p);
      await client.query('UPDATE retry_rows SET v = v + 1 WHERE id = 2');
      if (pids.length === 1) throw Object.assign(new Error('deadlock detected'), { code: '40P01' });
      return 'done';
    }, { minDelayMs: 1 });
    assert.strictEqual(result, 'done');
    assert.strictEqual(pids.length, 2);
    assert.strictEqual(pids[0], pids[1]);
    assert.strictEqual(pool.totalCount, 1);
    assert.strictEqual(pool.idleCount, 1);
    // the first attempt was rolled back
    assert.deepStrictEqual(await values(), [0, 1]);
  } finally {
    await pool.end();
  }
});
