// idem_consumer from node-postgres: one round trip per message, parameters
// passed as a text array, errors surfacing with their SQLSTATE, and a
// consumer loop with redeliveries leaving exact balances.
//
// Connects with the usual PGHOST / PGPORT / PGUSER / PGDATABASE variables.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { Client, Pool } = require('pg');

const PAY_SQL =
  "update orders set paid_amount = paid_amount + $1, status = 'PAID' where id = $2";

async function applyOrderPaid(client, event) {
  const res = await client.query(
    'select idem_apply($1, $2, $3, $4::text[], $5) as applied',
    [`order-paid:${event.id}`, 'node-payments', PAY_SQL,
     [String(event.amount), String(event.orderId)], event.producedAt]);
  return res.rows[0].applied;
}

let admin;

test.before(async () => {
  admin = new Client();
  await admin.connect();
  await admin.query('create extension if not exists idem_consumer');
  await admin.query('drop table if exists orders');
  await admin.query(`create table orders (
      id bigint primary key,
      paid_amount numeric not null default 0,
      status text not null default 'NEW')`);
  await admin.query('insert into orders (id) select generate_series(1, 50)');
});

test.after(async () => {
  await admin.query('drop table orders');
  await admin.end();
});

test('a delivery applies once, its redelivery is skipped', async () => {
  const event = { id: 'n-1', amount: 12.5, orderId: 1, producedAt: new Date() };
  assert.strictEqual(await applyOrderPaid(admin, event), true);
  assert.strictEqual(await applyOrderPaid(admin, event), false);
  const { rows } = await admin.query('select paid_amount, status from orders where id = 1');
  assert.deepStrictEqual(rows[0], { paid_amount: '12.5', status: 'PAID' });
});

test('errors keep their SQLSTATE and leave the key unrecorded', async () => {
  await assert.rejects(
    admin.query("select idem_apply('n-err', 'node-payments', 'update orders set paid_amount = 1 / 0')"),
    (err) => err.code === '22012');
  await assert.rejects(
    admin.query("select idem_apply('n-err', 'node-payments', $1, $2::text[])",
      [PAY_SQL, ['1']]),
    (err) => err.code === '22023' && /number of params/.test(err.message));
  const { rows } = await admin.query("select idem_is_processed('n-err', 'node-payments') as p");
  assert.strictEqual(rows[0].p, false);
});

test('a transaction that rolls back takes the key with it', async () => {
  const event = { id: 'n-rb', amount: 1, orderId: 2, producedAt: null };
  await admin.query('begin');
  assert.strictEqual(await applyOrderPaid(admin, event), true);
  await admin.query('rollback');
  assert.strictEqual(await applyOrderPaid(admin, event), true);
  const { rows } = await admin.query('select paid_amount from orders where id = 2');
  assert.strictEqual(rows[0].paid_amount, '1');
});

test('concurrent consumers with redeliveries leave exact balances', async () => {
  const pool = new Pool({ max: 8 });
  const events = [];
  for (let i = 1; i <= 400; i++)
    events.push({ id: `c-${i}`, amount: 1 + (i % 7), orderId: 10 + (i % 40), producedAt: new Date() });
  // every event is delivered three times, in an interleaved order, by 8 connections
  const deliveries = [...events, ...events.slice().reverse(), ...events];
  const results = await Promise.all(deliveries.map(async (event) => {
    const client = await pool.connect();
    try {
      return await applyOrderPaid(client, event);
    } finally {
      client.release();
    }
  }));
  await pool.end();
  assert.strictEqual(results.filter(Boolean).length, events.length);

  const expected = new Map();
  for (const e of events)
    expected.set(e.orderId, (expected.get(e.orderId) || 0) + e.amount);
  const { rows } = await admin.query('select id, paid_amount from orders where id between 10 and 49 order by id');
  for (const row of rows)
    assert.strictEqual(Number(row.paid_amount), expected.get(Number(row.id)), `order ${row.id}`);
});
