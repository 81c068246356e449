// apply and tryApply from node-postgres: outcomes, errors with their
// SQLSTATE and nothing recorded, a Pool as well as a Client.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { Pool } = require('pg');
const { connect, consumerName } = require('./db');
const idem = require('..');

const PKG = consumerName('pkg');
const PKG_TRY = consumerName('pkg-try');

const PAY = "UPDATE pkg_orders SET paid_amount = paid_amount + $1, status = 'PAID' WHERE id = $2";
const PAY_CHECKED = `WITH p AS (INSERT INTO pkg_payments (order_id, amount) VALUES ($2, $1) RETURNING order_id, amount)
  UPDATE pkg_orders o SET paid_amount = o.paid_amount + p.amount FROM p WHERE o.id = p.order_id`;

let db;
test.before(async () => {
  db = await connect();
  await db.query('DROP TABLE IF EXISTS pkg_payments, pkg_orders');
  await db.query(`CREATE TABLE pkg_orders (id bigint PRIMARY KEY, paid_amount numeric NOT NULL DEFAULT 0,
                                           status text NOT NULL DEFAULT 'NEW')`);
  await db.query('CREATE TABLE pkg_payments (order_id bigint NOT NULL REFERENCES pkg_orders, amount numeric NOT NULL)');
  await db.query('INSERT INTO pkg_orders (id) SELECT generate_series(1, 10)');
});
test.after(async () => {
  await db.query('DROP TABLE pkg_payments, pkg_orders');
  await db.end();
});

const paid = async (id) =>
  (await db.query('SELECT paid_amount::text AS a FROM pkg_orders WHERE id = $1', [id])).rows[0].a;

test('apply: true once, false for the redelivery; the SQL ran once', async () => {
  const msg = { key: 'pkg:1', consumer: PKG, sql: PAY, params: [7.5, 1], eventTime: new Date() };
  assert.strictEqual(await idem.apply(db, msg), true);
  assert.strictEqual(await idem.apply(db, msg), false);
  assert.strictEqual(await paid(1), '7.5');
});

test('apply through a Pool checks a client out and back in', async () => {
  const pool = new Pool({ max: 2 });
  try {
    const msg = { key: 'pkg:pool', consumer: PKG, sql: PAY, params: ['2', '2'] };
    const results = await Promise.all([1, 2, 3, 4].map(() => idem.apply(pool, msg)));
    assert.deepStrictEqual(results.sort(), [false, false, false, true]);
    assert.strictEqual(pool.totalCount, pool.idleCount);
  } finally {
    await pool.end();
  }
  assert.strictEqual(await paid(2), '2');
});

test('errors of the server keep their SQLSTATE and record nothing', async () => {
  await assert.rejects(idem.apply(db, { key: 'pkg:err', consumer: PKG, sql: 'SELECT 1 / 0' }),
    (err) => err.code === '22012');
  await assert.rejects(idem.apply(db, { key: '', consumer: PKG, sql: 'SELECT 1' }),
    (err) => err.code === '22023');
  await assert.rejects(idem.apply(db, { key: 'pkg:err', consumer: PKG, sql: PAY, params: [1] }),
    (err) => err.code === '22023' && /number of params/.test(err.message));
  await assert.rejects(idem.apply(db, { key: 'pkg:err', consumer: PKG, sql: PAY, params: ['x', 1] }),
    (err) => err.code === '22P02');
  const { rows } = await db.query("SELECT idem_is_processed('pkg:err', $1) AS p", [PKG]);
  assert.strictEqual(rows[0].p, false);
});

test('inside the caller\'s transaction, a rollback takes the key with it', async () => {
  const msg = { key: 'pkg:rb', consumer: PKG, sql: PAY, params: [1, 3] };
  await db.query('BEGIN');
  assert.strictEqual(await idem.apply(db, msg), true);
  await db.query('ROLLBACK');
  assert.strictEqual(await idem.apply(db, msg), true);
  assert.strictEqual(await paid(3), '1');
});

test('tryApply: applied, duplicate, dead_lettered, and a replay after the fix', async () => {
  const ok = { key: 'pkg:t1', consumer: PKG_TRY, sql: PAY_CHECKED, params: [5, 4] };
  assert.strictEqual(await idem.tryApply(db, ok), 'applied');
  assert.strictEqual(await idem.tryApply(db, ok), 'duplicate');
  // order 99 does not exist: a permanent error (23503), parked
  const poisoned = { key: 'pkg:t2', consumer: PKG_TRY, sql: PAY_CHECKED, params: [6, 99] };
  assert.strictEqual(await idem.tryApply(db, poisoned), 'dead_lettered');
  assert.strictEqual(await idem.tryApply(db, poisoned), 'dead_lettered');
  const { rows: dl } = await db.query(
    'SELECT id, sqlstate, status FROM idem_dead_letters WHERE consumer = $1', [PKG_TRY]);
  assert.deepStrictEqual(dl.map((r) => [r.sqlstate, r.status]), [['23503', 'pending']]);
  await db.query('INSERT INTO pkg_orders (id) VALUES (99)');
  const { rows: rp } = await db.query('SELECT idem_dlq_replay($1::bigint)::text AS o', [dl[0].id]);
  assert.strictEqual(rp[0].o, 'applied');
  assert.strictEqual(await idem.tryApply(db, poisoned), 'duplicate');
  assert.strictEqual(await paid(99), '6');
  assert.strictEqual(await paid(4), '5');
});

test('tryApply raises transient errors and mistakes in the call', async () => {
  await assert.rejects(idem.tryApply(db, { key: 'pkg:t3', consumer: PKG_TRY, sql: 'SELECT 1; SELECT 2' }),
    (err) => err.code === '42601');
  await assert.rejects(idem.tryApply(db, { key: 'pkg:t3', consumer: PKG_TRY, sql: 'COMMIT' }),
    (err) => err.code === '2D000');
  const { rows } = await db.query("SELECT idem_is_processed('pkg:t3', $1) AS p", [PKG_TRY]);
  assert.strictEqual(rows[0].p, false);
});
