// expectRows and the caller's fingerprint from node-postgres: a payment
// delivered before its order raises IK002 and records nothing, applies
// once the order exists; a fingerprint of one's own is compared on
// redeliveries instead of the SQL and parameters.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { connect, consumerName } = require('./db');
const idem = require('..');

const ROWS = consumerName('rows');
const ROWS_TRY = consumerName('rows-try');
const FP = consumerName('fp');

const PAY = "UPDATE rows_orders SET paid_amount = paid_amount + $1, status = 'PAID' WHERE id = $2";

let db;
test.before(async () => {
  db = await connect();
  await db.query('DROP TABLE IF EXISTS rows_orders');
  await db.query(`CREATE TABLE rows_orders (id bigint PRIMARY KEY, paid_amount numeric NOT NULL DEFAULT 0,
                                            status text NOT NULL DEFAULT 'NEW')`);
});
test.after(async () => {
  await db.query('DROP TABLE rows_orders');
  await db.end();
});

const processed = async (key, consumer) =>
  (await db.query('SELECT idem_is_processed($1, $2) AS p', [key, consumer])).rows[0].p;
const paid = async (id) =>
  (await db.query('SELECT paid_amount::text AS a FROM rows_orders WHERE id = $1', [id])).rows[0].a;

test('apply with expectRows: IK002 before the order exists, applied once it does', async () => {
  const msg = { key: 'rows:1', consumer: ROWS, sql: PAY, params: [10, 1], expectRows: 1 };
  await assert.rejects(idem.apply(db, msg),
    (err) => err.code === 'IK002' && /affected too few rows/.test(err.message) &&
      /affected 0 rows; expect_rows demands at least 1/.test(err.detail));
  assert.strictEqual(await processed('rows:1', ROWS), false);
  await db.query('INSERT INTO rows_orders (id) VALUES (1)');
  assert.strictEqual(await idem.apply(db, msg), true);
  assert.strictEqual(await idem.apply(db, msg), false);
  assert.strictEqual(await paid(1), '10');
});

test('no demand by default; a bigint demand; a demand above the rows affected is IK002', async () => {
  await db.query('INSERT INTO rows_orders (id) VALUES (2), (3), (4)');
  // no demand: an update of no row is applied
  assert.strictEqual(await idem.apply(db, { key: 'rows:3', consumer: ROWS, sql: PAY, params: [1, 404] }), true);
  assert.strictEqual(await idem.apply(db,
    { key: 'rows:4', consumer: ROWS, sql: 'SELECT id FROM rows_orders WHERE id IN (2, 3)', expectRows: 2n }), true);
  await assert.rejects(idem.apply(db,
    { key: 'rows:5', consumer: ROWS, sql: 'SELECT id FROM rows_orders WHERE id IN (2, 3)', expectRows: 3 }),
  (err) => err.code === 'IK002');
  assert.strictEqual(await processed('rows:5', ROWS), false);
});

test('a bad expectRows is refused: by the package before sending, or by the server', async () => {
  for (const expectRows of [null, '1', 1.5, NaN])
    await assert.rejects(idem.apply(db, { key: 'rows:bad', consumer: ROWS, sql: 'SELECT 1', expectRows }),
      (err) => err instanceof TypeError && /expectRows must be an integer/.test(err.message));
  await assert.rejects(idem.apply(db, { key: 'rows:bad', consumer: ROWS, sql: 'SELECT 1', expectRows: -1 }),
    (err) => err.code === '22023');
  assert.strictEqual(await processed('rows:bad', ROWS), false);
});

test('tryApply with expectRows: IK002 is transient by default, raised with nothing recorded', async () => {
  const msg = { key: 'rows:t1', consumer: ROWS_TRY, sql: PAY, params: [5, 20], expectRows: 1 };
  await assert.rejects(idem.tryApply(db, msg), (err) => err.code === 'IK002');
  assert.strictEqual(await processed('rows:t1', ROWS_TRY), false);
  const { rows } = await db.query('SELECT count(*)::int AS n FROM idem_dead_letters WHERE consumer = $1', [ROWS_TRY]);
  assert.strictEqual(rows[0].n, 0);
  await db.query('INSERT INTO rows_orders (id) VALUES (20)');
  assert.strictEqual(await idem.tryApply(db, msg), 'applied');
  assert.strictEqual(await idem.tryApply(db, msg), 'duplicate');
  assert.strictEqual(await paid(20), '5');
});

test('tryApply with IK002 made permanent: parked with its demand, replayed once the row exists', async () => {
  const msg = { key: 'rows:t2', consumer: ROWS_TRY, sql: PAY, params: [3, 21], expectRows: 1 };
  await db.query("SET idem_consumer.transient_sqlstates = ''");
  try {
    assert.strictEqual(await idem.tryApply(db, msg), 'dead_lettered');
    assert.strictEqual(await idem.tryApply(db, msg), 'dead_lettered');
  } finally {
    await db.query('RESET idem_consumer.transient_sqlstates');
  }
  const { rows: dl } = await db.query(
    'SELECT id, sqlstate, expect_rows::text AS expect_rows FROM idem_dead_letters WHERE consumer = $1 AND key = $2',
    [ROWS_TRY, 'rows:t2']);
  assert.deepStrictEqual(dl.map((r) => [r.sqlstate, r.expect_rows]), [['IK002', '1']]);
  // the replay demands the row again: still missing, IK002 (transient by default)
  await assert.rejects(db.query('SELECT idem_dlq_replay($1::bigint)', [dl[0].id]), (err) => err.code === 'IK002');
  await db.query('INSERT INTO rows_orders (id) VALUES (21)');
  const { rows: rp } = await db.query('SELECT idem_dlq_replay($1::bigint)::text AS o', [dl[0].id]);
  assert.strictEqual(rp[0].o, 'applied');
  assert.strictEqual(await paid(21), '3');
});

test('fingerprint: parameters that vary between deliveries of one message are a duplicate', async () => {
  await db.query('INSERT INTO rows_orders (id) VALUES (30)');
  // the SQL records the delivery's time: every redelivery has other params
  const delivery = (fingerprint) => ({ key: 'fp:1', consumer: FP, fingerprint,
    sql: 'UPDATE rows_orders SET paid_amount = paid_amount + $1, status = $3 WHERE id = $2',
    params: [4, 30, `PAID ${Date.now()} ${Math.random()}`] });
  assert.strictEqual(await idem.apply(db, delivery('order-paid e-1 v1')), true);
  assert.strictEqual(await idem.apply(db, delivery('order-paid e-1 v1')), false);
  assert.strictEqual(await idem.tryApply(db, delivery('order-paid e-1 v1')), 'duplicate');
  assert.strictEqual(await idem.apply(db, { ...delivery('order-paid e-1 v1'), expectRows: 1 }), false);
  // another message under the key: another fingerprint, refused (IK001)
  await assert.rejects(idem.apply(db, delivery('order-paid e-2 v1')), (err) => err.code === 'IK001');
  // without a fingerprint the varying params look like another message
  await assert.rejects(idem.apply(db, delivery(undefined)), (err) => err.code === 'IK001');
  assert.strictEqual(await paid(30), '4');
  // with a demand for rows too
  assert.strictEqual(await idem.tryApply(db, { ...delivery('order-paid e-3'), key: 'fp:2', expectRows: 1 }),
    'applied');
  assert.strictEqual(await idem.apply(db, { ...delivery('order-paid e-3'), key: 'fp:2' }), false);
  await assert.rejects(idem.apply(db, { key: 'fp:3', consumer: FP, sql: 'SELECT 1', fingerprint: 7 }),
    (err) => err instanceof TypeError && /fingerprint must be a string/.test(err.message));
});

test('a role granted idem_apply calls it with every field', async () => {
  // 1.2 has one idem_apply: a fingerprint and a demand are its arguments
  const role = `rows_app_${process.pid}`;
  await db.query(`CREATE ROLE ${role}`);
  try {
    await db.query(`GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                    idem_consumer_create(text, regrole) TO ${role}`);
    await db.query(`SET ROLE ${role}`);
    const msg = { key: 'grant:1', consumer: consumerName('grant'), sql: 'SELECT 1' };
    assert.strictEqual(await idem.apply(db, msg), true);
    assert.strictEqual(await idem.apply(db, { ...msg, key: 'grant:2', fingerprint: 'f' }), true);
    assert.strictEqual(await idem.apply(db, { ...msg, key: 'grant:3', expectRows: 1 }), true);
    assert.strictEqual(await idem.apply(db, { ...msg, key: 'grant:4', expectRows: 1, fingerprint: 'f' }), true);
    await assert.rejects(idem.tryApply(db, { ...msg, key: 'grant:5' }), (err) => err.code === '42501');
  } finally {
    await db.query('RESET ROLE');
    await db.query(`DROP OWNED BY ${role}; DROP ROLE ${role}`);
  }
});
