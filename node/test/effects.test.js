// External effects from node-postgres: begin, complete, fail, heartbeat,
// the outbox's enqueue and claim, and withEffect's whole inline cycle, with
// leases taken over for real (short leases that expire) and the heartbeat
// timer stopped so that a process using them exits by itself.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { Pool } = require('pg');
const { connect, consumerName } = require('./db');
const idem = require('..');

const FX = consumerName('fx');
const FX_POLICY = consumerName('fx-policy');
const FX_OUTBOX = consumerName('fx-outbox');
const T = { timeout: 30000 };

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let db;
let other;
let pool;
test.before(async () => {
  db = await connect();
  other = await connect();
  pool = new Pool({ max: 4 });
  await db.query('DROP TABLE IF EXISTS fx_orders');
  await db.query('CREATE TABLE fx_orders (id int PRIMARY KEY, paid numeric NOT NULL DEFAULT 0, charge text)');
  await db.query('INSERT INTO fx_orders (id) SELECT generate_series(1, 20)');
  // retries an hour away, so that a failed effect is still waiting when looked at
  await db.query("SELECT idem_set_effect_policy($1, 3, '1 hour', '2 hours')", [FX_POLICY]);
});
test.after(async () => {
  await db.query('DROP TABLE fx_orders');
  await db.end();
  await other.end();
  await pool.end();
});

const paid = async (id) =>
  (await db.query('SELECT paid::text AS p FROM fx_orders WHERE id = $1', [id])).rows[0].p;
const row = async (consumer, key) =>
  (await db.query('SELECT state, fence::text AS fence, lease_until, attempts FROM idem_effects WHERE consumer = $1 AND key = $2',
    [consumer, key])).rows[0];

test('execute, complete, then replay of the stored result', T, async () => {
  const args = { consumer: FX, key: 'charge:1', request: { order: 1, amount: 5 } };
  const e = await idem.beginEffect(db, args);
  assert.strictEqual(e.action, 'execute');
  assert.strictEqual(e.fence, '1');
  assert.strictEqual(e.attempt, 1);
  assert.strictEqual(e.outcomeUnknown, false);
  assert.match(e.providerKey, /^[0-9a-f-]{36}$/);
  assert.strictEqual(e.result, null);
  await idem.completeEffect(db, { ...args, fence: e.fence, result: { charge: 'ch_1' },
    sql: 'UPDATE fx_orders SET paid = paid + $1 WHERE id = $2', params: [5, 1] });
  const r = await idem.beginEffect(db, args);
  assert.strictEqual(r.action, 'replay');
  assert.deepStrictEqual(r.result, { charge: 'ch_1' });
  assert.strictEqual(r.fence, null);
  assert.strictEqual(r.providerKey, e.providerKey);
  assert.strictEqual(await paid(1), '5');
  // another request under the same key: IE002 from the server
  await assert.rejects(idem.beginEffect(db, { ...args, request: { order: 1, amount: 6 } }),
    (err) => err.code === 'IE002');
});

test('a second begin under a live lease is busy until the lease expires', T, async () => {
  const args = { consumer: FX, key: 'charge:busy', request: null, lease: 60000 };
  const e = await idem.beginEffect(db, args);
  assert.strictEqual(e.action, 'execute');
  const b = await idem.beginEffect(other, args);
  assert.strictEqual(b.action, 'busy');
  assert.strictEqual(b.fence, null);
  assert.ok(b.retryAt instanceof Date && b.retryAt.getTime() > Date.now() + 50000, String(b.retryAt));
  // a Pool works too: a client is checked out, outside any transaction
  assert.strictEqual((await idem.beginEffect(pool, args)).action, 'busy');
  await idem.completeEffect(db, { consumer: FX, key: 'charge:busy', fence: BigInt(e.fence), result: 1 });
  assert.deepStrictEqual((await idem.beginEffect(pool, args)).result, 1);
});

test('heartbeat extends the lease, and is false once the effect was taken over', T, async () => {
  const args = { consumer: FX, key: 'charge:hb', request: { n: 1 }, lease: '200 milliseconds' };
  const first = await idem.beginEffect(db, args);
  assert.strictEqual(await idem.heartbeatEffect(db, { ...args, fence: first.fence, extend: '1 hour' }), true);
  const { lease_until: until } = await row(FX, 'charge:hb');
  assert.ok(until.getTime() > Date.now() + 50 * 60000, String(until));
  assert.strictEqual((await idem.beginEffect(other, args)).action, 'busy');
  // shorten it again, let it expire: the next begin takes the effect over
  assert.strictEqual(await idem.heartbeatEffect(db, { ...args, fence: first.fence, extend: 100 }), true);
  await sleep(250);
  const second = await idem.beginEffect(other, args);
  assert.strictEqual(second.action, 'execute');
  assert.strictEqual(second.fence, '2');
  assert.strictEqual(second.attempt, 2);
  assert.strictEqual(second.outcomeUnknown, true);
  assert.strictEqual(second.providerKey, first.providerKey);
  assert.strictEqual(await idem.heartbeatEffect(db, { ...args, fence: first.fence, extend: 1000 }), false);
  assert.strictEqual(await idem.heartbeatEffect(db, { ...args, fence: Number(second.fence), extend: 1000 }), true);
  await idem.failEffect(other, { ...args, fence: second.fence, error: 'given up', retryable: false });
});

test('complete with a stale fence raises IE001 and rolls back the business update', T, async () => {
  const args = { consumer: FX, key: 'charge:stale', request: { order: 2 }, lease: 100 };
  const first = await idem.beginEffect(db, args);
  await sleep(200);
  const second = await idem.beginEffect(other, args);
  assert.strictEqual(second.action, 'execute');
  await assert.rejects(idem.transaction(db, async (client) => {
    await client.query('UPDATE fx_orders SET paid = paid + 100 WHERE id = 2');
    await idem.completeEffect(client, { ...args, fence: first.fence, result: { charge: 'late' } });
  }), (err) => err instanceof idem.FencedOffError && err.code === 'IE001' && err.fence === '1' &&
    /fence 1 is no longer the current lease/.test(err.message) && err.cause.code === 'IE001');
  assert.strictEqual(db.getTransactionStatus(), 'I');
  assert.strictEqual(await paid(2), '0');
  // the one sent through sql in the same statement rolls back the same way
  await assert.rejects(idem.completeEffect(db, { ...args, fence: first.fence, result: 1,
    sql: 'UPDATE fx_orders SET paid = paid + 100 WHERE id = $1', params: [2] }), (err) => err.code === 'IE001');
  assert.strictEqual(await paid(2), '0');
  // the current holder completes, with its business update
  await idem.transaction(pool, async (client) => {
    await idem.completeEffect(client, { ...args, fence: second.fence, result: { charge: 'ch_2' } });
    await client.query('UPDATE fx_orders SET paid = paid + 7 WHERE id = 2');
  });
  assert.strictEqual(await paid(2), '7');
  await assert.rejects(idem.failEffect(db, { ...args, fence: second.fence, error: 'too late' }),
    (err) => err instanceof idem.FencedOffError);
});

test('fail: retryable waits until retry_at, permanent is dead', T, async () => {
  const args = { consumer: FX_POLICY, key: 'charge:retry', request: { order: 3 } };
  const e = await idem.beginEffect(db, args);
  assert.strictEqual(await idem.failEffect(db, { ...args, fence: e.fence, error: 'provider 503' }), 'wait');
  const w = await idem.beginEffect(db, args);
  assert.strictEqual(w.action, 'wait');
  assert.strictEqual(w.lastError, 'provider 503');
  // base delay one hour, of which a random half is jitter
  assert.ok(w.retryAt.getTime() > Date.now() + 25 * 60000 && w.retryAt.getTime() < Date.now() + 61 * 60000,
    String(w.retryAt));

  const dead = { consumer: FX_POLICY, key: 'charge:dead', request: { order: 4 } };
  const d = await idem.beginEffect(db, dead);
  assert.strictEqual(await idem.failEffect(db, { ...dead, fence: d.fence, error: new Error('card declined'),
    retryable: false }), 'dead');
  const again = await idem.beginEffect(db, dead);
  assert.strictEqual(again.action, 'dead');
  assert.strictEqual(again.lastError, 'card declined');
  assert.strictEqual((await row(FX_POLICY, 'charge:dead')).state, 'dead');
});

test('beginEffect and claimEffects inside a transaction are refused before sending', T, async () => {
  await db.query('BEGIN');
  await assert.rejects(idem.beginEffect(db, { consumer: FX, key: 'charge:tx' }),
    (err) => err.code === '25001' && /beginEffect must run outside a transaction block/.test(err.message));
  await assert.rejects(idem.claimEffects(db, { consumer: FX }),
    (err) => err.code === '25001' && /claimEffects must run outside/.test(err.message));
  // nothing was sent: the transaction is not aborted
  assert.strictEqual(db.getTransactionStatus(), 'T');
  await db.query('ROLLBACK');
  assert.strictEqual(await row(FX, 'charge:tx'), undefined);
});

test('arguments are checked before anything is sent', T, async () => {
  await assert.rejects(idem.beginEffect(db, { consumer: FX, key: 1 }), TypeError);
  await assert.rejects(idem.beginEffect(db, { consumer: FX, key: 'k', lease: NaN }), idem.ParamError);
  await assert.rejects(idem.beginEffect(db, { consumer: FX, key: 'k', request: { n: 1n } }), idem.ParamError);
  await assert.rejects(idem.completeEffect(db, { consumer: FX, key: 'k', fence: null, result: 1 }), TypeError);
  await assert.rejects(idem.completeEffect(db, { consumer: FX, key: 'k', fence: '1', params: [1] }), TypeError);
  await assert.rejects(idem.failEffect(db, { consumer: FX, key: 'k', fence: '1', error: 'x', retryable: 'no' }),
    TypeError);
  await assert.rejects(idem.withEffect(pool, { consumer: FX, key: 'k', lease: '1 minute' }, async () => 1),
    /heartbeatEvery/);
  assert.strictEqual(await row(FX, 'k'), undefined);
  // nothing begun under a key: complete and heartbeat find no effect
  await assert.rejects(idem.heartbeatEffect(db, { consumer: FX, key: 'never', fence: 1, extend: 1000 }),
    (err) => err.code === '42704');
});

test('withEffect: one call, the business update with the complete, a replay without calling', T, async () => {
  let calls = 0;
  const seen = [];
  const charge = async ({ providerKey, fence, attempt, outcomeUnknown, signal }) => {
    calls++;
    seen.push({ providerKey, fence, attempt, outcomeUnknown, aborted: signal.aborted });
    await sleep(20);
    return { charge: `ch_${providerKey}`, amount: 12.5 };
  };
  const pay = (client, result) =>
    client.query('UPDATE fx_orders SET paid = paid + $1, charge = $2 WHERE id = 5', [result.amount, result.charge]);
  const spec = { consumer: FX, key: 'charge:with', request: { order: 5, amount: 12.5 }, lease: 5000 };

  const first = await idem.withEffect(pool, spec, charge, pay);
  assert.strictEqual(first.action, 'execute');
  assert.strictEqual(first.effect.action, 'execute');
  assert.deepStrictEqual(seen, [{ providerKey: first.effect.providerKey, fence: '1', attempt: 1,
    outcomeUnknown: false, aborted: false }]);
  assert.deepStrictEqual(first.result, { charge: `ch_${first.effect.providerKey}`, amount: 12.5 });

  // the redelivery: the stored result, no call, no second update
  const second = await idem.withEffect(pool, spec, charge, pay);
  assert.strictEqual(second.action, 'replay');
  assert.deepStrictEqual(second.result, first.result);
  const third = await idem.withEffect(db, spec, charge, pay);
  assert.strictEqual(third.action, 'replay');
  assert.strictEqual(calls, 1);
  assert.strictEqual(await paid(5), '12.5');
  assert.strictEqual(pool.totalCount, pool.idleCount);
});

test('withEffect: busy while another holds the lease; a failed call waits or dies', T, async () => {
  const held = { consumer: FX_POLICY, key: 'charge:held', request: null, lease: 60000 };
  await idem.beginEffect(db, held);
  let calls = 0;
  const count = async () => { calls++; return 1; };
  const busy = await idem.withEffect(pool, held, count);
  assert.strictEqual(busy.action, 'busy');
  assert.ok(busy.effect.retryAt instanceof Date);

  const failing = async () => { calls++; throw Object.assign(new Error('HTTP 503'), { status: 503 }); };
  const retryable = (err) => err.status >= 500;
  const w = await idem.withEffect(pool, { consumer: FX_POLICY, key: 'charge:503', retryable }, failing);
  assert.strictEqual(w.action, 'wait');
  assert.strictEqual(w.error.message, 'HTTP 503');
  const w2 = await idem.withEffect(pool, { consumer: FX_POLICY, key: 'charge:503', retryable }, failing);
  assert.strictEqual(w2.action, 'wait');
  assert.strictEqual(w2.effect.lastError, 'HTTP 503');

  const declined = async () => { calls++; throw Object.assign(new Error('HTTP 402'), { status: 402 }); };
  const d = await idem.withEffect(pool, { consumer: FX_POLICY, key: 'charge:402', retryable }, declined);
  assert.strictEqual(d.action, 'dead');
  assert.strictEqual((await idem.withEffect(pool, { consumer: FX_POLICY, key: 'charge:402', retryable }, declined))
    .action, 'dead');
  assert.strictEqual(calls, 2);

  // an outcome the caller cannot know: left to the lease, no fail recorded
  const timeout = async () => { throw Object.assign(new Error('socket timeout'), { code: 'ETIMEDOUT' }); };
  const u = await idem.withEffect(pool, { consumer: FX_POLICY, key: 'charge:unknown', lease: 100,
    unknownOutcome: (err) => err.code === 'ETIMEDOUT' }, timeout);
  assert.strictEqual(u.action, 'unknown');
  assert.strictEqual((await row(FX_POLICY, 'charge:unknown')).state, 'in_flight');
  await sleep(200);
  const retried = await idem.withEffect(pool, { consumer: FX_POLICY, key: 'charge:unknown', lease: 100 },
    async ({ outcomeUnknown, attempt }) => ({ outcomeUnknown, attempt }));
  assert.deepStrictEqual(retried.result, { outcomeUnknown: true, attempt: 2 });
});

test('withEffect: the heartbeat keeps a long call\'s lease; fenced off, the call is aborted', T, async () => {
  // a call three times as long as the lease completes: the heartbeat kept it
  const long = { consumer: FX, key: 'charge:long', request: null, lease: 1000, heartbeatEvery: 100 };
  let busyMeanwhile;
  const ok = await idem.withEffect(pool, long, async () => {
    await sleep(1500);
    busyMeanwhile = (await idem.beginEffect(other, long)).action;
    await sleep(500);
    return 'done';
  }, (client, result) => client.query('UPDATE fx_orders SET charge = $1 WHERE id = 6', [result]));
  assert.strictEqual(ok.action, 'execute');
  assert.strictEqual(busyMeanwhile, 'busy');
  assert.strictEqual((await db.query('SELECT charge FROM fx_orders WHERE id = 6')).rows[0].charge, 'done');

  // the lease expires before the first beat and is taken over: the beat
  // says false, the call's signal aborts, nothing is recorded
  const lost = { consumer: FX, key: 'charge:lost', request: null, lease: 100, heartbeatEvery: 1000 };
  let applied = false;
  let takenOver;
  const started = Date.now();
  await assert.rejects(idem.withEffect(pool, lost, async ({ signal }) => {
    await sleep(200);
    takenOver = await idem.beginEffect(other, lost);
    await new Promise((resolve, reject) => {
      const timer = setTimeout(resolve, 8000);
      signal.addEventListener('abort', () => { clearTimeout(timer); reject(signal.reason); });
    });
    return 'too late';
  }, async () => { applied = true; }), (err) => err instanceof idem.FencedOffError && err.code === 'IE001' &&
    /fenced off while its call ran/.test(err.message));
  assert.ok(Date.now() - started < 4500, 'the call was aborted by the heartbeat');
  assert.strictEqual(takenOver.action, 'execute');
  assert.strictEqual(applied, false);
  const r = await row(FX, 'charge:lost');
  assert.strictEqual(r.state, 'in_flight');
  assert.strictEqual(r.fence, '2');
});

test('outbox: enqueue commits with the business transaction, claim leases it', T, async () => {
  await idem.transaction(db, async (client) => {
    assert.strictEqual(await idem.enqueueEffect(client, { consumer: FX_OUTBOX, key: 'mail:1', request: { to: 'a' } }), true);
    assert.strictEqual(await idem.enqueueEffect(client, { consumer: FX_OUTBOX, key: 'mail:1', request: { to: 'a' } }), false);
  });
  await db.query('BEGIN');
  await idem.enqueueEffect(db, { consumer: FX_OUTBOX, key: 'mail:rolled-back', request: { to: 'b' } });
  await db.query('ROLLBACK');
  const claimed = await idem.claimEffects(pool, { consumer: FX_OUTBOX, maxCount: 5, lease: 60000 });
  assert.deepStrictEqual(claimed.map((c) => [c.key, c.request, c.fence, c.attempt, c.outcomeUnknown]),
    [['mail:1', { to: 'a' }, '1', 1, false]]);
  assert.match(claimed[0].providerKey, /^[0-9a-f-]{36}$/);
  assert.deepStrictEqual(await idem.claimEffects(other, { consumer: FX_OUTBOX }), []);
  await idem.completeEffect(pool, { consumer: FX_OUTBOX, key: 'mail:1', fence: claimed[0].fence, result: { sent: true } });
  assert.strictEqual((await row(FX_OUTBOX, 'mail:1')).state, 'completed');
});

test('a process using withEffect exits by itself: the heartbeat timer is stopped', T, async () => {
  const script = `
    const { Pool } = require('pg');
    const idem = require(${JSON.stringify(path.join(__dirname, '..'))});
    (async () => {
      const pool = new Pool({ max: 2 });
      const spec = { consumer: ${JSON.stringify(FX)}, key: 'charge:exit', lease: 300, heartbeatEvery: 20 };
      const out = await idem.withEffect(pool, spec, async () => {
        await new Promise((r) => setTimeout(r, 150));
        return 'ok';
      });
      const failed = await idem.withEffect(pool, { ...spec, key: 'charge:exit-fail' }, async () => {
        await new Promise((r) => setTimeout(r, 100));
        throw new Error('no');
      });
      await pool.end();
      console.log(out.action, failed.action);
    })().catch((err) => { console.error(err); process.exitCode = 1; });`;
  const child = spawn(process.execPath, ['-e', script], { cwd: path.join(__dirname, '..'), stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (chunk) => { out += chunk; });
  const code = await new Promise((resolve) => {
    const timer = setTimeout(() => { child.kill('SIGKILL'); resolve('did not exit within 10 s'); }, 10000);
    child.on('exit', (c) => { clearTimeout(timer); resolve(c); });
  });
  assert.strictEqual(code, 0);
  assert.strictEqual(out.trim(), 'execute wait');
  const { rows } = await db.query('SELECT count(*)::int AS n FROM idem_effects WHERE consumer = $1 AND key = $2 AND fence > 1',
    [FX, 'charge:exit']);
  assert.strictEqual(rows[0].n, 0);
});
