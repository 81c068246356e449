// Routed row demands from node-postgres (docs/expect-rows.md, with a route
// as in docs/citus.md): idem_apply and idem_try_apply with the route and
// expect_rows bound as node-postgres binds numbers, untyped, so cast:
// route => $n::bigint, expect_rows => $n::bigint.  Applied, then a
// duplicate (false); an update of a row that does not exist yet is IK002 and records
// nothing; the try form raises IK002 by default and, with IK002 not
// transient, parks the message with its demand (its key recorded with the
// entry), which its replay makes again (the row still missing: parked
// again; the row there: applied).
// Every check reads back what the database holds.  In a database of its
// own, whose routed tables are made, not distributed, by the function
// idem_citus_distribute() makes them with on Citus.
//
// Connects with the usual PGHOST / PGPORT / PGUSER / PGDATABASE variables.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { routedDatabase } = require('./routed_db');

const DB = 'client_routed_rows_node';
const CONSUMER = 'settle-node-routed';
const SETTLE_SQL = 'update public.orders_due set due = due - $2::int where order_id = $1::bigint';
const APPLY = 'select idem_apply($1, $2, $3, $4, route => $5::bigint, expect_rows => $6::bigint) as applied';
const TRY_APPLY = 'select idem_try_apply($1, $2, $3, $4,'
  + ' route => $5::bigint, expect_rows => $6::bigint)::text as outcome';
const REPLAY = 'select idem_dlq_replay($1, $2, $3::bigint) as outcome';
const BOUNDED = { timeout: 60000 };

let db;

routedDatabase(DB, [
  'create table orders_due (order_id bigint primary key, due int not null)',
  'insert into orders_due values (21, 10)',
], (client) => { db = client; });

// settle(key, orderId, amount): the message paying amount off the order,
// routed by the order's id, demanding one row
const settle = (key, orderId, amount) => [key, CONSUMER, SETTLE_SQL, [String(orderId), String(amount)], orderId, 1];

async function due(orderId) {
  const { rows } = await db.query('select due from orders_due where order_id = $1::bigint', [orderId]);
  return rows.length ? rows[0].due : undefined;
}

async function processed(key, route) {
  const { rows } = await db.query('select idem_is_processed($1, $2, $3::bigint) as p', [key, CONSUMER, route]);
  return rows[0].p;
}

async function stored(key) {
  const { rows } = await db.query(
    'select (select count(*)::int from idem_consumer.routed_keys where consumer = $2 and key = $1) as keys,'
    + ' (select count(*)::int from idem_routed_dead_letters where consumer = $2 and key = $1) as parked',
    [key, CONSUMER]);
  return rows[0];
}

async function parked(key) {
  const { rows } = await db.query(
    'select route::text, status, sqlstate, attempts, expect_rows::int from idem_routed_dead_letters'
    + ' where consumer = $1 and key = $2', [CONSUMER, key]);
  return rows;
}

test('row demands under a route: applied, a duplicate false, IK002 recording nothing; parked with its demand, replayed', BOUNDED, async () => {
  const first = await db.query(APPLY, settle('rr-1', 21, 4));
  assert.strictEqual(first.rows[0].applied, true);
  assert.strictEqual(await due(21), 6);
  const again = await db.query(APPLY, settle('rr-1', 21, 4));
  assert.strictEqual(again.rows[0].applied, false);
  assert.strictEqual(await due(21), 6);
  assert.strictEqual(await processed('rr-1', 21), true);
  assert.strictEqual(await processed('rr-1', 22), false);

  await assert.rejects(db.query(APPLY, settle('rr-2', 22, 4)),
    (err) => err.code === 'IK002' && /affected too few rows/.test(err.message));
  assert.strictEqual(await processed('rr-2', 22), false);
  assert.deepStrictEqual(await stored('rr-2'), { keys: 0, parked: 0 });
  assert.strictEqual(await due(22), undefined);

  // the try form: IK002 is transient by default, raised with nothing parked or recorded
  await assert.rejects(db.query(TRY_APPLY, settle('rr-3', 24, 3)), (err) => err.code === 'IK002');
  assert.deepStrictEqual(await stored('rr-3'), { keys: 0, parked: 0 });
  await db.query("set idem_consumer.transient_sqlstates = '40001'");
  try {
    const { rows: tried } = await db.query(TRY_APPLY, settle('rr-3', 24, 3));
    assert.deepStrictEqual(tried, [{ outcome: 'dead_lettered' }]);
    assert.deepStrictEqual(await parked('rr-3'),
      [{ route: '24', status: 'pending', sqlstate: 'IK002', attempts: 1, expect_rows: 1 }]);
    // the key is recorded with its entry (docs/expect-rows.md), the row not written
    assert.deepStrictEqual(await stored('rr-3'), { keys: 1, parked: 1 });
    assert.strictEqual(await processed('rr-3', 24), true);
    assert.strictEqual(await due(24), undefined);

    const missing = await db.query(REPLAY, ['rr-3', CONSUMER, 24]);
    assert.strictEqual(missing.rows[0].outcome, 'dead_lettered');
    assert.deepStrictEqual(await parked('rr-3'),
      [{ route: '24', status: 'pending', sqlstate: 'IK002', attempts: 2, expect_rows: 1 }]);
    assert.strictEqual(await due(24), undefined);

    await db.query('insert into orders_due values (24, 5)');
    const there = await db.query(REPLAY, ['rr-3', CONSUMER, 24]);
    assert.strictEqual(there.rows[0].outcome, 'applied');
    assert.strictEqual(await due(24), 2);
    assert.deepStrictEqual(await parked('rr-3'),
      [{ route: '24', status: 'replayed', sqlstate: 'IK002', attempts: 3, expect_rows: 1 }]);
    assert.deepStrictEqual(await stored('rr-3'), { keys: 1, parked: 1 });

    const { rows: redelivered } = await db.query(TRY_APPLY, settle('rr-3', 24, 3));
    assert.deepStrictEqual(redelivered, [{ outcome: 'duplicate' }]);
    const { rows: applied } = await db.query(TRY_APPLY, settle('rr-4', 21, 1));
    assert.deepStrictEqual(applied, [{ outcome: 'applied' }]);
    assert.strictEqual(await due(21), 5);
    assert.strictEqual(await due(24), 2);
  } finally {
    await db.query('reset idem_consumer.transient_sqlstates');
  }
});
