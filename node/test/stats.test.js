// stats(): the counters of idem_stats as numbers and Dates, whatever type
// parsers the caller's pg has.  Needs the library in
// shared_preload_libraries, as the test cluster has it.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { Client } = require('pg');
const { connect, consumerName } = require('./db');
const idem = require('..');

const STATS = consumerName('stats');

let db;
test.before(async () => {
  db = await connect();
  for (const key of ['s:1', 's:2', 's:1'])
    await idem.apply(db, { key, consumer: STATS, sql: 'SELECT 1', eventTime: new Date(Date.now() - 1000) });
  await assert.rejects(idem.apply(db, { key: 's:3', consumer: STATS, sql: 'SELECT 1 / 0' }));
});
test.after(async () => {
  await db.end();
});

test('stats(db, consumer): one consumer\'s counters as numbers and Dates', async () => {
  const s = await idem.stats(db, STATS);
  assert.strictEqual(s.consumer, STATS);
  assert.deepStrictEqual([s.applied, s.duplicates, s.failed, s.deadLettered, s.keyReuse], [2, 1, 1, 0, 0]);
  assert.strictEqual(typeof s.duplicateRatio, 'number');
  assert.ok(Math.abs(s.duplicateRatio - 1 / 3) < 1e-9);
  assert.ok(s.latencyP50Ms > 0 && s.latencyP50Ms <= s.latencyMaxMs);
  assert.ok(s.lagLastMs >= 1000);
  assert.ok(s.lastAppliedAt instanceof Date && Math.abs(Date.now() - s.lastAppliedAt.getTime()) < 60000);
  assert.ok(s.lastDuplicateAt instanceof Date);
  assert.ok(s.statsReset instanceof Date);
  assert.strictEqual(s.effectsExecuted, 0);
  assert.strictEqual(await idem.stats(db, consumerName('never-used')), null);
});

test('stats(db): every consumer, by name', async () => {
  const all = await idem.stats(db);
  assert.ok(Array.isArray(all));
  const names = all.map((s) => s.consumer);
  assert.deepStrictEqual(names, [...names].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)));
  assert.strictEqual(all.find((s) => s.consumer === STATS).applied, 2);
});

test('the caller\'s type parsers do not change the answer', async () => {
  const custom = new Client({
    types: {
      getTypeParser: (oid) => {
        if (oid === 20) return (v) => BigInt(v);      // int8 as BigInt
        if (oid === 1184) return (v) => `ts:${v}`;   // timestamptz as text
        return (v) => v;                             // everything else as text
      },
    },
  });
  await custom.connect();
  try {
    await custom.query("SET DateStyle = 'SQL, DMY'");
    assert.deepStrictEqual(await idem.stats(custom, STATS), await idem.stats(db, STATS));
  } finally {
    await custom.end();
  }
});

test('a count beyond 2^53 - 1 is refused rather than rounded', async () => {
  const fake = {
    query: async () => ({
      rows: [{ consumer: 'c', applied: '9007199254740993', 'last_applied_at ms': null }],
      fields: [{ name: 'consumer', dataTypeID: 25 }, { name: 'applied', dataTypeID: 20 },
        { name: 'last_applied_at ms', dataTypeID: 25 }],
    }),
  };
  await assert.rejects(idem.stats(fake, 'c'), (err) => err instanceof RangeError && /applied is 9007199254740993/.test(err.message));
  await assert.rejects(idem.stats(db, 42), TypeError);
});
