// recordBatch: the keys not recorded before, and the README's batch
// statement run on arrays built from the messages: a redelivered batch,
// or part of it, pays nothing again.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { connect, consumerName } = require('./db');
const idem = require('..');

const BATCH = consumerName('batch');
const PAY_BATCH = `
WITH msg AS (
    SELECT DISTINCT ON (m.key) m.key, m.order_id, m.amount
      FROM unnest($2::text[], $3::bigint[], $4::numeric[]) AS m(key, order_id, amount)
),
new_keys AS (
    SELECT key FROM idem_record_batch($1, $2::text[]) AS key
),
paid AS (
    SELECT msg.order_id, sum(msg.amount) AS amount
      FROM msg JOIN new_keys USING (key)
     GROUP BY msg.order_id
)
UPDATE batch_orders o
   SET paid_amount = o.paid_amount + paid.amount
  FROM paid
 WHERE o.id = paid.order_id`;

let db;
test.before(async () => {
  db = await connect();
  await db.query('DROP TABLE IF EXISTS batch_orders');
  await db.query('CREATE TABLE batch_orders (id bigint PRIMARY KEY, paid_amount numeric NOT NULL DEFAULT 0)');
  await db.query('INSERT INTO batch_orders (id) SELECT generate_series(1, 5)');
});
test.after(async () => {
  await db.query('DROP TABLE batch_orders');
  await db.end();
});

const event = (i) => ({ id: `b-${i}`, orderId: BigInt(1 + (i % 5)), amount: (i % 3) + 0.5 });
const batch = (messages) => ({
  consumer: BATCH, messages, sql: PAY_BATCH,
  key: (e) => `order-paid:${e.id}`, columns: [(e) => e.orderId, (e) => e.amount],
});

test('batchParams builds the keys and one text array per column', () => {
  const [keys, orders, amounts] = idem.batchParams([event(1), event(2)], (e) => e.id,
    [(e) => e.orderId, (e) => e.amount]);
  assert.deepStrictEqual(keys, ['b-1', 'b-2']);
  assert.deepStrictEqual(orders, ['2', '3']);
  assert.deepStrictEqual(amounts, ['1.5', '2.5']);
  assert.throws(() => idem.batchParams([event(1)], (e) => e.id, [() => NaN]),
    (err) => err instanceof idem.ParamError && err.position === 3 && /column 1 of message 0 is NaN/.test(err.message));
  assert.throws(() => idem.batchParams([event(1)], (e) => e.id, [() => 1, () => [1]]),
    (err) => err instanceof idem.ParamError && err.position === 4);
  assert.throws(() => idem.batchParams([event(1)], () => 7), /the key of message 0 must be a string/);
  // recordBatch reports the same errors as a rejected promise, sending nothing
  return assert.rejects(idem.recordBatch(db, { ...batch([event(1)]), columns: [() => Symbol('s')] }),
    (err) => err instanceof idem.ParamError && err.position === 3);
});

test('a batch pays each new message once; its redelivery pays nothing', async () => {
  const first = Array.from({ length: 40 }, (_, i) => event(i));
  // the same message twice in one batch counts once
  const res = await idem.recordBatch(db, batch([...first, first[3]]));
  assert.strictEqual(res.rowCount, 5);
  // a redelivery overlapping the first batch, with 20 new messages
  const second = Array.from({ length: 40 }, (_, i) => event(i + 20));
  await idem.recordBatch(db, batch(second));
  await idem.recordBatch(db, batch(second));

  const expected = new Map();
  for (let i = 0; i < 60; i++) {
    const e = event(i);
    expected.set(String(e.orderId), (expected.get(String(e.orderId)) || 0) + e.amount);
  }
  const { rows } = await db.query('SELECT id::text, paid_amount::float8 AS paid FROM batch_orders ORDER BY id');
  assert.deepStrictEqual(rows.map((r) => [r.id, r.paid]), [...expected].sort());
  const { rows: st } = await db.query('SELECT applied, duplicates FROM idem_stats WHERE consumer = $1', [BATCH]);
  // 41 + 40 + 40 keys passed; 60 were new
  assert.deepStrictEqual(st[0], { applied: '60', duplicates: '61' });
});

test('without a statement, recordBatch returns the keys not recorded before', async () => {
  const res = await idem.recordBatch(db, {
    consumer: BATCH, messages: ['b-1', 'x-1', 'x-2', 'x-1'], key: (k) => (k.startsWith('b') ? `order-paid:${k}` : k),
  });
  assert.deepStrictEqual(res.rows.map((r) => r.key).sort(), ['x-1', 'x-2']);
});
