// Routed keys from node-postgres (docs/citus.md): idem_apply with a route
// bound as node-postgres binds a number, untyped, needs a cast
// (PostgreSQL cannot type a parameter for "any": 42P18, and nothing is
// recorded); with route => $n::bigint the
// key is stored with its route, a redelivery is a duplicate, the same key
// under another route another key; every call without a route is refused
// (0A000); a failing message is parked under its route by idem_try_apply
// and applied once by idem_dlq_replay by key and route.  In a
// database of its own, whose routed tables are made, not distributed, by
// the function idem_citus_distribute() makes them with on Citus, so that
// routed keys do not change the other tests' database.
//
// Connects with the usual PGHOST / PGPORT / PGUSER / PGDATABASE variables.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { routedDatabase } = require('./routed_db');

const DB = 'client_routed_node';
const CONSUMER = 'payments-node-routed';
const PAY_SQL = 'insert into public.payments (order_id, msg) values ($1::bigint, $2)';
const BOUNDED = { timeout: 60000 };

let db;

routedDatabase(DB, [
  'create table payments (order_id bigint, msg text)',
], (client) => { db = client; });

async function routedKeys() {
  const { rows } = await db.query(
    'select route::text, key from idem_consumer.routed_keys order by route, key');
  return rows.map((r) => `${r.route}:${r.key}`);
}

test('a number bound untyped cannot be a route without a cast, and records nothing', BOUNDED, async () => {
  await assert.rejects(
    db.query('select idem_apply($1, $2, $3, $4, route => $5)',
      ['r-1', CONSUMER, PAY_SQL, ['7', 'r-1'], 7]),
    (err) => err.code === '42P18' && /could not determine data type/.test(err.message));
  assert.deepStrictEqual(await routedKeys(), []);
});

test('cast to bigint: stored with its route, a duplicate again, another key under another route', BOUNDED, async () => {
  const call = 'select idem_apply($1, $2, $3, $4, route => $5::bigint) as applied';
  const apply = async (route) =>
    (await db.query(call, ['r-2', CONSUMER, PAY_SQL, [String(route), 'r-2'], route])).rows[0].applied;
  assert.strictEqual(await apply(7), true);
  assert.strictEqual(await apply(7), false);
  assert.strictEqual(await apply(8), true);
  assert.deepStrictEqual(await routedKeys(), ['7:r-2', '8:r-2']);
  const { rows } = await db.query('select count(*)::int as n from payments');
  assert.strictEqual(rows[0].n, 2);
  const probe = 'select idem_is_processed($1, $2, $3::bigint) as p';
  assert.strictEqual((await db.query(probe, ['r-2', CONSUMER, 7])).rows[0].p, true);
  assert.strictEqual((await db.query(probe, ['r-2', CONSUMER, 9])).rows[0].p, false);
});

test('a call without a route is refused with 0A000', BOUNDED, async () => {
  await assert.rejects(
    db.query('select idem_apply($1, $2, $3, $4)', ['r-3', CONSUMER, PAY_SQL, ['7', 'r-3']]),
    (err) => err.code === '0A000');
  await assert.rejects(
    db.query('select idem_is_processed($1, $2)', ['r-2', CONSUMER]),
    (err) => err.code === '0A000');
  assert.deepStrictEqual(await routedKeys(), ['7:r-2', '8:r-2']);
});

test('a batch: each key under its route, the new ones returned with their routes', BOUNDED, async () => {
  const batch = 'select key, route::text from idem_record_batch($1, $2, NULL, $3::bigint[]) order by 2, 1';
  const { rows: first } = await db.query(batch, [CONSUMER, ['b-1', 'b-2', 'b-1'], [7, 7, 8]]);
  assert.deepStrictEqual(first, [
    { key: 'b-1', route: '7' }, { key: 'b-2', route: '7' }, { key: 'b-1', route: '8' }]);
  const { rows: again } = await db.query(batch, [CONSUMER, ['b-2', 'b-3', 'b-1'], [7, 7, 8]]);
  assert.deepStrictEqual(again, [{ key: 'b-3', route: '7' }]);
  await assert.rejects(db.query(batch, [CONSUMER, ['b-4'], [7, 8]]), (err) => err.code === '22023');
});

test('a failing message is parked under its route, and its replay applies it once', BOUNDED, async () => {
  await db.query("alter table payments add constraint no_bad check (msg <> 'bad')");
  const tryApply = async () => (await db.query(
    'select idem_try_apply($1, $2, $3, $4, route => $5::bigint) as outcome',
    ['d-1', CONSUMER, PAY_SQL, ['9', 'bad'], 9])).rows[0].outcome;
  assert.strictEqual(await tryApply(), 'dead_lettered');
  assert.strictEqual(await tryApply(), 'dead_lettered');
  const { rows: entries } = await db.query(
    "select route::text, status, sqlstate from idem_routed_dead_letters where key = 'd-1'");
  assert.deepStrictEqual(entries, [{ route: '9', status: 'pending', sqlstate: '23514' }]);
  await db.query('alter table payments drop constraint no_bad');
  const replay = 'select idem_dlq_replay($1, $2, $3::bigint) as outcome';
  assert.strictEqual((await db.query(replay, ['d-1', CONSUMER, 9])).rows[0].outcome, 'applied');
  await assert.rejects(db.query(replay, ['d-1', CONSUMER, 9]), (err) => err.code === '55000');
  assert.strictEqual(await tryApply(), 'duplicate');
  const { rows } = await db.query("select count(*)::int as n from payments where msg = 'bad'");
  assert.strictEqual(rows[0].n, 1);
});
