// Spans with OpenTelemetry: each call of a message, a batch or an effect
// is one CONSUMER span with the messaging attributes and its outcome,
// never the parameters; the statements carry the trace context to the
// server as an sqlcommenter comment, which pg_stat_activity shows while
// the call runs; without @opentelemetry/api the package loads and works.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const api = require('@opentelemetry/api');
const { AsyncLocalStorageContextManager } = require('@opentelemetry/context-async-hooks');
const { W3CTraceContextPropagator } = require('@opentelemetry/core');
const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = require('@opentelemetry/sdk-trace-base');
const { connect, consumerName } = require('./db');
const idem = require('..');

const CONSUMER = consumerName('traced');
const exporter = new InMemorySpanExporter();
let db;
let watcher;

test.before(async () => {
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  api.propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  db = await connect();
  watcher = await connect();
  await db.query('DROP TABLE IF EXISTS traced_log');
  await db.query('CREATE TABLE traced_log (n int PRIMARY KEY)');
});
test.after(async () => {
  await db.query('DROP TABLE traced_log');
  await db.end();
  await watcher.end();
  api.trace.disable();
  api.propagation.disable();
  api.context.disable();
});

const lastSpan = () => exporter.getFinishedSpans().at(-1);

test('apply: one CONSUMER span per call, its outcome and the messaging attributes, no parameters', async () => {
  exporter.reset();
  const msg = { key: 'k-1', consumer: CONSUMER, sql: 'INSERT INTO traced_log VALUES ($1::int)', params: ['4711'],
    destination: 'orders', partition: 3, messageId: 'm-17', system: 'kafka' };
  assert.strictEqual(await idem.apply(db, msg), true);
  assert.strictEqual(await idem.apply(db, msg), false);
  const [first, second] = exporter.getFinishedSpans();
  assert.strictEqual(first.name, 'process orders');
  assert.strictEqual(first.kind, api.SpanKind.CONSUMER);
  assert.deepStrictEqual(first.attributes, {
    'messaging.operation.type': 'process',
    'messaging.operation.name': 'idem_apply',
    'messaging.system': 'kafka',
    'messaging.consumer.group.name': CONSUMER,
    'messaging.destination.name': 'orders',
    'messaging.destination.partition.id': '3',
    'messaging.message.id': 'm-17',
    'idem_consumer.key': 'k-1',
    'idem_consumer.outcome': 'applied',
  });
  assert.strictEqual(second.attributes['idem_consumer.outcome'], 'duplicate');
  assert.ok(!JSON.stringify(first.attributes).includes('4711'), 'a parameter is on the span');
});

test('tryApply: dead_lettered; a reused key: reused, with the error', async () => {
  exporter.reset();
  const bad = { key: 'k-2', consumer: CONSUMER, sql: 'INSERT INTO traced_log VALUES (1 / 0)' };
  assert.strictEqual(await idem.tryApply(db, bad), 'dead_lettered');
  assert.strictEqual(lastSpan().attributes['idem_consumer.outcome'], 'dead_lettered');
  assert.strictEqual(lastSpan().name, 'process idem_try_apply');
  await assert.rejects(idem.apply(db, { key: 'k-1', consumer: CONSUMER,
    sql: 'INSERT INTO traced_log VALUES ($1::int)', params: ['4712'] }), { code: 'IK001' });
  assert.strictEqual(lastSpan().attributes['idem_consumer.outcome'], 'reused');
  assert.strictEqual(lastSpan().status.code, api.SpanStatusCode.ERROR);
  assert.strictEqual(lastSpan().events[0].name, 'exception');
});

test('the statement carries the span\'s trace context to the server: pg_stat_activity shows it', async () => {
  exporter.reset();
  const pid = (await db.query('SELECT pg_backend_pid() AS pid')).rows[0].pid;
  const running = idem.apply(db, { key: 'k-3', consumer: CONSUMER, sql: 'SELECT pg_sleep(0.5)' });
  let seen;
  for (let i = 0; i < 100 && !seen; i++) {
    const { rows } = await watcher.query("SELECT query FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", [pid]);
    if (rows[0] && rows[0].query.includes('traceparent')) seen = rows[0].query;
    else await new Promise((r) => setTimeout(r, 20));
  }
  assert.strictEqual(await running, true);
  const span = lastSpan();
  const traceparent = `00-${span.spanContext().traceId}-${span.spanContext().spanId}-01`;
  assert.ok(seen, 'no statement with a trace context in pg_stat_activity');
  assert.ok(seen.endsWith(`/*traceparent='${traceparent}'*/`), seen);
});

test('a batch and an effect are spans too; an application span is their parent', async () => {
  exporter.reset();
  const tracer = api.trace.getTracer('app');
  await tracer.startActiveSpan('handle batch', async (parent) => {
    await idem.recordBatch(db, { consumer: CONSUMER, messages: [{ id: 'b-1' }, { id: 'b-2' }], key: (m) => m.id });
    const effect = await idem.beginEffect(db, { consumer: CONSUMER, key: 'e-1' });
    assert.strictEqual(effect.action, 'execute');
    parent.end();
  });
  const spans = exporter.getFinishedSpans();
  const parent = spans.find((s) => s.name === 'handle batch');
  const batch = spans.find((s) => s.attributes['messaging.operation.name'] === 'idem_record_batch');
  const begin = spans.find((s) => s.attributes['messaging.operation.name'] === 'idem_effect_begin');
  assert.strictEqual(batch.attributes['messaging.batch.message_count'], 2);
  assert.strictEqual(begin.attributes['idem_consumer.outcome'], 'execute');
  for (const child of [batch, begin]) {
    assert.strictEqual(child.spanContext().traceId, parent.spanContext().traceId);
    assert.strictEqual((child.parentSpanContext || child.parentSpanId && { spanId: child.parentSpanId }).spanId,
      parent.spanContext().spanId);
  }
});

test('without @opentelemetry/api the package loads and applies, its calls unwrapped and its statements without a comment', () => {
  // a child process in which the API cannot be found
  const hide = `const Module = require('module'); const resolve = Module._resolveFilename;
    Module._resolveFilename = function (request, ...rest) {
      if (request === '@opentelemetry/api') { const e = new Error('not found'); e.code = 'MODULE_NOT_FOUND'; throw e; }
      return resolve.call(this, request, ...rest); };`;
  const script = `${hide}
    const { Client } = require('pg');
    const idem = require(${JSON.stringify(path.join(__dirname, '..'))});
    const { tracing, withTraceComment } = require(${JSON.stringify(path.join(__dirname, '..', 'lib', 'trace.js'))});
    const { apply } = require(${JSON.stringify(path.join(__dirname, '..', 'lib', 'apply.js'))});
    (async () => {
      const c = new Client(); await c.connect();
      const applied = await idem.apply(c, { key: 'k-4', consumer: ${JSON.stringify(CONSUMER)}, sql: 'SELECT 1' });
      const query = { text: 'SELECT 1' };
      console.log(JSON.stringify({ tracing, applied, unwrapped: idem.apply === apply,
        uncommented: withTraceComment(query) === query }));
      await c.end();
    })().catch((e) => { console.error(e); process.exit(1); });`;
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 30000,
    cwd: path.join(__dirname, '..') });
  assert.strictEqual(r.status, 0, r.stderr);
  assert.deepStrictEqual(JSON.parse(r.stdout), { tracing: false, applied: true, unwrapped: true, uncommented: true });
});
