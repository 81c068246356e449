// Routed external effects from node-postgres (docs/effects.md, with a route
// as in docs/citus.md): idem_effect_begin, complete, fail, heartbeat,
// enqueue and claim with the route bound as route => $n::bigint.  The inline cycle (execute, complete with the
// business SQL of the route's row, replay of the stored result); a complete
// under a fence that a later lease superseded (IE001, its business SQL
// rolled back); a permanent failure parked in idem_routed_dead_letters
// (kind effect, IE003) and re-armed by idem_dlq_replay by key and route; the outbox
// (enqueue in the business transaction, a claim of one route and of every
// route); begin and claim refused inside a transaction block (25001); the
// unrouted effect functions refused (0A000).  Every check reads back what
// the database holds.  In a database of its own, whose routed tables are
// made, not distributed, by the function idem_citus_distribute() makes
// them with on Citus.
//
// Connects with the usual PGHOST / PGPORT / PGUSER / PGDATABASE variables.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { routedDatabase } = require('./routed_db');

const DB = 'client_routed_effects_node';
const CONSUMER = 'charges-node-routed';
const CHARGE_SQL = 'update public.accounts set charged = charged + $1::numeric where id = $2::bigint';
const BOUNDED = { timeout: 60000 };

let db;

routedDatabase(DB, [
  'create table accounts (id bigint primary key, charged numeric not null default 0)',
  'insert into accounts (id) select generate_series(1, 20)',
], (client) => { db = client; });

async function begin(key, route, request, lease = '30 seconds') {
  const { rows } = await db.query(
    'select * from idem_effect_begin($1, $2, route => $3::bigint, request => $4::jsonb,'
    + ' lease => $5::interval)',
    [CONSUMER, key, route, JSON.stringify(request), lease]);
  return rows[0];
}

function complete(key, fence, result, route, amount) {
  return db.query(
    'select idem_effect_complete($1, $2, $3, $4::jsonb, route => $5::bigint, sql => $6,'
    + ' params => $7::text[])',
    [CONSUMER, key, fence, JSON.stringify(result), route, CHARGE_SQL, [String(amount), String(route)]]);
}

async function effect(key) {
  const { rows } = await db.query(
    'select route::text, state, fence::int, attempts, result from idem_routed_effects'
    + ' where consumer = $1 and key = $2', [CONSUMER, key]);
  return rows;
}

async function charged(id) {
  const { rows } = await db.query('select charged::text from accounts where id = $1::bigint', [id]);
  return rows[0].charged;
}

test('inline: execute, complete with the business SQL of the route, then a replay of the stored result', BOUNDED, async () => {
  const first = await begin('ch-1', 7, { amount: 5 });
  assert.strictEqual(first.action, 'execute');
  assert.strictEqual(first.fence, '1');          // bigint: a string in node-postgres
  assert.strictEqual(first.attempt, 1);
  assert.strictEqual(first.outcome_unknown, false);
  assert.match(first.provider_key, /^[0-9a-f-]{36}$/);
  assert.deepStrictEqual(await effect('ch-1'),
    [{ route: '7', state: 'in_flight', fence: 1, attempts: 1, result: null }]);

  await complete('ch-1', first.fence, { charge: 'ch_1' }, 7, '5.00');
  assert.deepStrictEqual(await effect('ch-1'),
    [{ route: '7', state: 'completed', fence: 1, attempts: 1, result: { charge: 'ch_1' } }]);

  const again = await begin('ch-1', 7, { amount: 5 });
  assert.strictEqual(again.action, 'replay');
  assert.deepStrictEqual(again.result, { charge: 'ch_1' });
  assert.strictEqual(again.fence, null);
  assert.strictEqual(again.provider_key, first.provider_key);
  assert.strictEqual(await charged(7), '5.00');
  assert.strictEqual(await charged(8), '0');
});

test('a complete under a superseded fence is IE001 and its business SQL rolls back', BOUNDED, async () => {
  const late = await begin('ch-2', 8, { amount: 3 }, '1 millisecond');
  assert.strictEqual(late.action, 'execute');
  await db.query('select pg_sleep(0.05)');
  const taker = await begin('ch-2', 8, { amount: 3 });
  assert.strictEqual(taker.action, 'execute');
  assert.strictEqual(taker.fence, '2');
  assert.strictEqual(taker.attempt, 2);
  assert.strictEqual(taker.outcome_unknown, true);
  assert.strictEqual(taker.provider_key, late.provider_key);

  await assert.rejects(complete('ch-2', late.fence, { charge: 'late' }, 8, 3),
    (err) => err.code === 'IE001');
  assert.strictEqual(await charged(8), '0');
  const heartbeat = 'select idem_effect_heartbeat($1, $2, $3, $4::interval, route => $5::bigint) as ok';
  assert.strictEqual((await db.query(heartbeat, [CONSUMER, 'ch-2', late.fence, '1 minute', 8])).rows[0].ok, false);
  assert.strictEqual((await db.query(heartbeat, [CONSUMER, 'ch-2', taker.fence, '1 minute', 8])).rows[0].ok, true);

  await complete('ch-2', taker.fence, { charge: 'ch_2' }, 8, 3);
  assert.deepStrictEqual(await effect('ch-2'),
    [{ route: '8', state: 'completed', fence: 2, attempts: 2, result: { charge: 'ch_2' } }]);
  assert.strictEqual(await charged(8), '3');
});

test('a permanent failure is parked under its route (kind effect) and its replay re-arms it', BOUNDED, async () => {
  const first = await begin('ch-3', 9, { amount: 4 });
  assert.strictEqual(first.action, 'execute');
  const { rows: [failed] } = await db.query(
    'select idem_effect_fail($1, $2, $3, $4, route => $5::bigint, retryable => false) as action',
    [CONSUMER, 'ch-3', first.fence, 'card declined', 9]);
  assert.strictEqual(failed.action, 'dead');
  const { rows: entries } = await db.query(
    'select route::text, kind, status, sqlstate, message from idem_routed_dead_letters'
    + ' where consumer = $1 and key = $2', [CONSUMER, 'ch-3']);
  assert.deepStrictEqual(entries,
    [{ route: '9', kind: 'effect', status: 'pending', sqlstate: 'IE003', message: 'card declined' }]);
  const dead = await begin('ch-3', 9, { amount: 4 });
  assert.strictEqual(dead.action, 'dead');
  assert.strictEqual(dead.last_error, 'card declined');

  const replay = 'select idem_dlq_replay($1, $2, $3::bigint) as outcome';
  assert.strictEqual((await db.query(replay, ['ch-3', CONSUMER, 9])).rows[0].outcome, 'applied');
  const [rearmed] = await effect('ch-3');
  assert.strictEqual(rearmed.state, 'waiting');
  const { rows: [entry] } = await db.query(
    'select status from idem_routed_dead_letters where consumer = $1 and key = $2', [CONSUMER, 'ch-3']);
  assert.strictEqual(entry.status, 'replayed');

  const again = await begin('ch-3', 9, { amount: 4 });
  assert.strictEqual(again.action, 'execute');
  assert.strictEqual(again.fence, '2');
  assert.strictEqual(again.attempt, 1);
  await complete('ch-3', again.fence, { charge: 'ch_3' }, 9, 4);
  assert.strictEqual(await charged(9), '4');
  assert.strictEqual((await effect('ch-3'))[0].state, 'completed');
});

test('outbox: enqueued in the business transaction, claimed from one route, then from every route', BOUNDED, async () => {
  const enqueue = 'select idem_effect_enqueue($1, $2, $3::jsonb, route => $4::bigint) as added';
  await db.query('begin');
  await db.query('update accounts set charged = charged + 1 where id = 10');
  const added = [];
  for (const [key, route] of [['o-1', 10], ['o-2', 11], ['o-3', 12], ['o-1', 10]])
    added.push((await db.query(enqueue, [CONSUMER, key, JSON.stringify({ n: key }), route])).rows[0].added);
  await db.query('commit');
  assert.deepStrictEqual(added, [true, true, true, false]);
  assert.strictEqual(await charged(10), '1');
  await db.query('begin');
  await db.query(enqueue, [CONSUMER, 'o-4', JSON.stringify({ n: 'o-4' }), 13]);
  await db.query('rollback');
  const { rows: stored } = await db.query(
    "select route::text, key, state from idem_routed_effects where key like 'o-%' order by key");
  assert.deepStrictEqual(stored, [
    { route: '10', key: 'o-1', state: 'pending' },
    { route: '11', key: 'o-2', state: 'pending' },
    { route: '12', key: 'o-3', state: 'pending' }]);

  const claim = 'select key, route::text, request, fence::int, attempt from idem_effect_claim($1, route => $2)';
  const claimOf = (from) => claim.replace('$2', from);
  await assert.rejects(db.query(claimOf('$2'), [CONSUMER, null]), (err) => err.code === '42P18');
  await assert.rejects(db.query(claimOf('NULL'), [CONSUMER]), (err) => err.code === '0A000');
  const { rows: one } = await db.query(claimOf('$2::bigint'), [CONSUMER, 10]);
  assert.deepStrictEqual(one, [{ key: 'o-1', route: '10', request: { n: 'o-1' }, fence: 1, attempt: 1 }]);
  const { rows: every } = await db.query(claimOf('$2::bigint') + ' order by key', [CONSUMER, null]);
  assert.deepStrictEqual(every, [
    { key: 'o-2', route: '11', request: { n: 'o-2' }, fence: 1, attempt: 1 },
    { key: 'o-3', route: '12', request: { n: 'o-3' }, fence: 1, attempt: 1 }]);
  const { rows: leased } = await db.query(
    "select key, state from idem_routed_effects where key like 'o-%' order by key");
  assert.deepStrictEqual(leased.map((r) => `${r.key}:${r.state}`),
    ['o-1:in_flight', 'o-2:in_flight', 'o-3:in_flight']);
  await complete('o-2', '1', { done: true }, 11, 2);
  assert.strictEqual(await charged(11), '2');
  assert.strictEqual((await effect('o-2'))[0].state, 'completed');
});

test('begin and claim refuse a transaction block (25001); the unrouted functions are refused (0A000)', BOUNDED, async () => {
  await db.query('begin');
  await assert.rejects(begin('tx-1', 7, { amount: 1 }), (err) => err.code === '25001');
  await db.query('rollback');
  await db.query('begin');
  await assert.rejects(db.query('select * from idem_effect_claim($1, route => $2::bigint)', [CONSUMER, null]),
    (err) => err.code === '25001');
  await db.query('rollback');
  assert.deepStrictEqual(await effect('tx-1'), []);

  await assert.rejects(db.query('select * from idem_effect_begin($1, $2)', [CONSUMER, 'u-1']),
    (err) => err.code === '0A000');
  await assert.rejects(db.query('select idem_effect_enqueue($1, $2, $3::jsonb)', [CONSUMER, 'u-2', '{}']),
    (err) => err.code === '0A000');
  await assert.rejects(db.query('select * from idem_effect_claim($1)', [CONSUMER]),
    (err) => err.code === '0A000');
  const { rows } = await db.query("select count(*)::int as n from idem_routed_effects where key like 'u-%'");
  assert.strictEqual(rows[0].n, 0);
});
