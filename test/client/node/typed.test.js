// idem_consumer 1.2 from node-postgres: idem_apply with values of other
// types than text in params as ARRAY[$4::text, ...], a Date written by
// consumers in two time zones (node-postgres
// writes a Date in the process's local zone: each delivery runs in a
// process of its own, TZ=Europe/Berlin or TZ=UTC), decimal strings written
// another way and a jsonb object with its keys in another order are one
// message; another value is IK001; expect_rows raises IK002 for an event
// before its order and records nothing; the examples of docs/clients.md
// run.
//
// Connects with the usual PGHOST / PGPORT / PGUSER / PGDATABASE variables.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const fs = require('node:fs');
const path = require('node:path');
const { execFile } = require('node:child_process');
const { promisify } = require('node:util');
const { Client } = require('pg');

const CONSUMER = 'payments-node-typed';
const PAY_SQL =
  'with p as (insert into public.payments_node (amount, paid_at, doc, note, order_id)' +
  ' values ($1, $2, $3, $4, $5) returning order_id, amount)' +
  ' update public.orders_node o set paid = o.paid + p.amount from p where o.id = p.order_id';
const APPLY_V =
  'select idem_apply($1, $2, $3, ARRAY[$4::text, $5::text, $6::text, $7::text, $8::text])';
const ROWS_SQL = 'update public.orders_node set paid = paid + $1 where id = $2';
const PAID_AT = Date.UTC(2026, 0, 1, 9, 0, 0);
const BOUNDED = { timeout: 60000 };

// deliver(tz, sql, params): run one statement in a node process with TZ=tz
async function deliver(tz, sql, params) {
  const { stdout } = await promisify(execFile)(process.execPath,
    [path.join(__dirname, 'deliver.js'), JSON.stringify({ sql, params })],
    { env: { ...process.env, TZ: tz }, timeout: 30000 });
  return JSON.parse(stdout);
}

let admin;
async function paid(id) {
  const { rows } = await admin.query('select paid::text from orders_node where id = $1', [id]);
  return rows[0].paid;
}
async function processed(key) {
  const { rows } = await admin.query('select idem_is_processed($1, $2) as p', [key, CONSUMER]);
  return rows[0].p;
}

test.before(async () => {
  admin = new Client();
  await admin.connect();
  await admin.query('create extension if not exists idem_consumer');
  await admin.query('drop table if exists orders_node, payments_node');
  await admin.query('create table orders_node (id bigint primary key, paid numeric not null default 0)');
  await admin.query(`create table payments_node (n serial primary key, amount numeric,
      paid_at timestamptz, doc jsonb, note text, order_id bigint)`);
  await admin.query('insert into orders_node (id) select generate_series(1, 20)');
});

test.after(async () => {
  await admin.query('drop table orders_node, payments_node');
  await admin.end();
});

test('a Date from Berlin and from UTC, 10.0 and 10.00, jsonb keys in another order: one message', BOUNDED, async () => {
  const berlin = await deliver('Europe/Berlin', APPLY_V,
    ['n-a', CONSUMER, PAY_SQL, '10.0', { date: PAID_AT }, { card: 'visa', tags: ['x'] }, 'first', 1]);
  const utc = await deliver('UTC', APPLY_V,
    ['n-a', CONSUMER, PAY_SQL, '10.00', { date: PAID_AT }, { tags: ['x'], card: 'visa' }, 'first', 1]);
  // the two processes wrote the same instant differently
  assert.deepStrictEqual(berlin.sent, ['2026-01-01T10:00:00.000+01:00']);
  assert.deepStrictEqual(utc.sent, ['2026-01-01T09:00:00.000+00:00']);
  assert.strictEqual(berlin.value, true, JSON.stringify(berlin));
  assert.strictEqual(utc.value, false, JSON.stringify(utc));
  assert.strictEqual(await paid(1), '10.0');
  const { rows } = await admin.query('select count(*)::int as n from payments_node where order_id = 1');
  assert.strictEqual(rows[0].n, 1);
});

test('another value under the key is IK001 and runs nothing', BOUNDED, async () => {
  const first = await deliver('UTC', APPLY_V, ['n-b', CONSUMER, PAY_SQL, '5', { date: PAID_AT }, {}, 'b', 2]);
  assert.strictEqual(first.value, true, JSON.stringify(first));
  const amount = await deliver('UTC', APPLY_V, ['n-b', CONSUMER, PAY_SQL, '5.01', { date: PAID_AT }, {}, 'b', 2]);
  assert.strictEqual(amount.code, 'IK001', JSON.stringify(amount));
  const time = await deliver('Europe/Berlin', APPLY_V,
    ['n-b', CONSUMER, PAY_SQL, '5', { date: PAID_AT + 1000 }, {}, 'b', 2]);
  assert.strictEqual(time.code, 'IK001', JSON.stringify(time));
  assert.strictEqual(await paid(2), '5');
});

test('an event before its order: IK002, nothing recorded; after the order it applies', BOUNDED, async () => {
  const call = 'select idem_apply($1, $2, $3, $4::text[], expect_rows => $5::bigint) as applied';
  const args = ['n-c', CONSUMER, ROWS_SQL, ['7.50', '101'], 1];
  await assert.rejects(admin.query(call, args), (err) => err.code === 'IK002');
  assert.strictEqual(await processed('n-c'), false);
  await admin.query('insert into orders_node (id) values (101)');
  assert.strictEqual((await admin.query(call, args)).rows[0].applied, true);
  assert.strictEqual((await admin.query(call, args)).rows[0].applied, false);
  assert.strictEqual(await paid(101), '7.50');

  const tryCall = 'select idem_try_apply($1, $2, $3, $4::text[], expect_rows => $5::bigint) as outcome';
  const tryArgs = ['n-c2', CONSUMER, ROWS_SQL, ['2.25', '102'], 1];
  await assert.rejects(admin.query(tryCall, tryArgs), (err) => err.code === 'IK002');
  assert.strictEqual(await processed('n-c2'), false);
  await admin.query('insert into orders_node (id) values (102)');
  assert.deepStrictEqual((await admin.query(tryCall, tryArgs)).rows[0], { outcome: 'applied' });
  assert.deepStrictEqual((await admin.query(tryCall, tryArgs)).rows[0], { outcome: 'duplicate' });
  assert.strictEqual(await paid(102), '2.25');
});

test('typed values with expect_rows: IK002 before the order, then applied; 3.5 and 3.50 are one message', BOUNDED, async () => {
  const call = 'select idem_apply($1, $2, $3, ARRAY[$4::text, $5::text], expect_rows => 1) as applied';
  const args = (key, amount, id) => [key, CONSUMER, ROWS_SQL, amount, id];
  await assert.rejects(admin.query(call, args('n-c3', 3.5, 103)), (err) => err.code === 'IK002');
  assert.strictEqual(await processed('n-c3'), false);
  await admin.query('insert into orders_node (id) values (103)');
  assert.strictEqual((await admin.query(call, args('n-c3', 3.5, 103))).rows[0].applied, true);
  assert.strictEqual((await admin.query(call, args('n-c3', '3.50', 103))).rows[0].applied, false);
  await assert.rejects(admin.query(call, args('n-c3', '3.51', 103)), (err) => err.code === 'IK001');
  assert.strictEqual(await paid(103), '3.5');

  const tryCall = 'select idem_try_apply($1, $2, $3, ARRAY[$4::text, $5::text], expect_rows => 1) as outcome';
  await assert.rejects(admin.query(tryCall, args('n-c4', '1.25', 104)), (err) => err.code === 'IK002');
  assert.strictEqual(await processed('n-c4'), false);
  await admin.query('insert into orders_node (id) values (104)');
  assert.deepStrictEqual((await admin.query(tryCall, args('n-c4', '1.25', 104))).rows[0], { outcome: 'applied' });
  assert.deepStrictEqual((await admin.query(tryCall, args('n-c4', '1.250', 104))).rows[0], { outcome: 'duplicate' });
  assert.strictEqual(await paid(104), '1.25');
});

test('the node-postgres example of docs/clients.md runs as written', BOUNDED, async () => {
  const doc = fs.readFileSync(path.join(__dirname, '..', '..', '..', 'docs', 'clients.md'), 'utf8');
  const block = doc.match(/```js\n([\s\S]*?)```/)[1];
  const snippets = block.split(/^\/\/ .*$/m).filter((s) => s.trim());
  assert.strictEqual(snippets.length, 3);
  await admin.query('drop table if exists payments, orders');
  await admin.query('create table orders (id bigint primary key, paid numeric not null default 0)');
  await admin.query('create table payments (amount numeric, paid_at timestamptz, order_id bigint)');
  await admin.query('insert into orders values (5)');
  try {
    const AsyncFunction = (async () => {}).constructor;
    for (const [n, snippet] of snippets.entries()) {
      await new AsyncFunction('client', 'key', 'amount', 'orderId', 'paidAt', snippet)(
        admin, `docs-node-${n}`, '10.00', 5, new Date(PAID_AT));
    }
    assert.strictEqual((await admin.query('select paid::text from orders where id = 5')).rows[0].paid, '20.00');
    assert.strictEqual((await admin.query('select count(*)::int as n from payments')).rows[0].n, 1);
  } finally {
    await admin.query('drop table payments, orders');
  }
});
