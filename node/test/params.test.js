// Parameter values: converted as node-postgres users expect, checked by the
// server's own input functions, and a clear error for what cannot be sent.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { connect, consumerName } = require('./db');
const idem = require('..');

const PARAMS = consumerName('params');
const PARAMS_LAG = consumerName('params-lag');

let db;
test.before(async () => {
  db = await connect();
  await db.query('DROP TABLE IF EXISTS param_values');
  await db.query(`CREATE TABLE param_values (
      key text PRIMARY KEY, n numeric, f float8, i bigint, b boolean,
      ts timestamptz, tsl timestamp, bytes bytea, ints int[], texts text[], doc jsonb, t text)`);
});
test.after(async () => {
  await db.query('DROP TABLE param_values');
  await db.end();
});

const INSERT = `INSERT INTO param_values (key, n, f, i, b, ts, tsl, bytes, ints, texts, doc, t)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)`;

test('values arrive in the business SQL as node-postgres would send them', async () => {
  const when = new Date('2026-03-01T12:34:56.789Z');
  const params = ['p-1', 12.5, -0.25, 2n ** 62n + 1n, false, when, when,
    Buffer.from([0, 1, 254, 255]), [1, null, 3], ['a"b', 'c\\d', null, 'NULL', ''],
    { amount: 3, tags: ['x'] }, undefined];
  assert.strictEqual(await idem.apply(db, { key: 'p-1', consumer: PARAMS, sql: INSERT, params }), true);

  // the same values sent directly by node-postgres: the rows must be equal
  await db.query(INSERT, ['p-2', ...params.slice(1)]);
  const { rows } = await db.query(`SELECT key, n::text, f, i::text, b, ts, tsl, bytes, ints, texts, doc, t
                                     FROM param_values ORDER BY key`);
  assert.strictEqual(rows.length, 2);
  const [viaIdem, direct] = rows.map(({ key, ...rest }) => rest);
  assert.deepStrictEqual(viaIdem, direct);
  assert.deepStrictEqual(viaIdem, {
    n: '12.5', f: -0.25, i: '4611686018427387905', b: false, ts: when, tsl: when,
    bytes: Buffer.from([0, 1, 254, 255]), ints: [1, null, 3], texts: ['a"b', 'c\\d', null, 'NULL', ''],
    doc: { amount: 3, tags: ['x'] }, t: null,
  });
});

test('a typed array and toPostgres() convert too', () => {
  assert.strictEqual(idem.toText(new Uint8Array([16, 32])), '\\x1020');
  assert.strictEqual(idem.toText({ toPostgres: () => 'custom' }), 'custom');
  assert.strictEqual(idem.toText([[1, 2], [3, 4]]), '{{"1","2"},{"3","4"}}');
  assert.deepStrictEqual(idem.paramsText(null), null);
  assert.deepStrictEqual(idem.paramsText([]), []);
});

test('what cannot be sent is refused before anything reaches the server', async () => {
  const bad = [
    [NaN, /parameter \$2 is NaN/],
    [Infinity, /parameter \$2 is Infinity/],
    [() => 1, /parameter \$2 is a function, which cannot be sent/],
    [Symbol('s'), /parameter \$2 is a symbol/],
    [new Date('nonsense'), /parameter \$2 is an invalid Date/],
    [(() => { const o = {}; o.self = o; return o; })(), /parameter \$2 cannot be sent as JSON/],
    [(() => { const a = [1]; a.push(a); return a; })(), /parameter \$2\[1\] contains itself/],
  ];
  for (const [value, message] of bad) {
    await assert.rejects(
      idem.apply(db, { key: 'p-bad', consumer: PARAMS, sql: 'SELECT $1::text, $2::text', params: ['a', value] }),
      (err) => err instanceof idem.ParamError && err.position === 2 && message.test(err.message),
      String(message));
  }
  await assert.rejects(idem.apply(db, { key: 'p-bad', consumer: PARAMS, sql: 'SELECT 1', params: 'a' }),
    idem.ParamError);
  await assert.rejects(idem.apply(db, { key: 'p-bad', consumer: PARAMS, sql: 'SELECT 1', eventTime: new Date(NaN) }),
    /eventTime is an invalid Date/);
  await assert.rejects(idem.apply(db, { key: 42, consumer: PARAMS, sql: 'SELECT 1' }),
    /key must be a string, not number/);
  await assert.rejects(idem.apply(db, { key: 'p-bad', consumer: null, sql: 'SELECT 1' }),
    /consumer must be a string, not null/);
  const { rows } = await db.query("SELECT idem_is_processed('p-bad', $1) AS p", [PARAMS]);
  assert.strictEqual(rows[0].p, false);
});

test('eventTime is accepted as a Date, text or epoch milliseconds and feeds the lag', async () => {
  const sql = 'SELECT 1';
  const t = Date.now() - 60000;
  assert.strictEqual(await idem.apply(db, { key: 'e-1', consumer: PARAMS_LAG, sql, eventTime: new Date(t) }), true);
  assert.strictEqual(await idem.apply(db, { key: 'e-2', consumer: PARAMS_LAG, sql, eventTime: new Date(t).toISOString() }), true);
  assert.strictEqual(await idem.apply(db, { key: 'e-3', consumer: PARAMS_LAG, sql, eventTime: t }), true);
  const { rows } = await db.query('SELECT lag_last_ms FROM idem_stats WHERE consumer = $1', [PARAMS_LAG]);
  // produced a minute ago: the lag is a minute, give or take the test's own time
  assert.ok(rows[0].lag_last_ms >= 59000 && rows[0].lag_last_ms < 120000, `lag ${rows[0].lag_last_ms}`);
});
