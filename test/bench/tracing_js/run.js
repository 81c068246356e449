// One run of test/bench/tracing: argv variant calls round; prints the
// mean microseconds of one idem.apply() of a new key.
'use strict';

const path = require('node:path');
const Module = require('node:module');

const [variant, callsText, round] = process.argv.slice(2);
const calls = Number(callsText);
const nodePackage = path.join(__dirname, '..', '..', '..', 'node');
const fromPackage = (name) => require(require.resolve(name, { paths: [nodePackage] }));

if (variant === 'absent') {
  const resolve = Module._resolveFilename;
  Module._resolveFilename = function (request, ...rest) {
    if (request === '@opentelemetry/api') {
      const err = new Error(`Cannot find module '${request}'`);
      err.code = 'MODULE_NOT_FOUND';
      throw err;
    }
    return resolve.call(this, request, ...rest);
  };
} else if (variant === 'traced') {
  const api = fromPackage('@opentelemetry/api');
  const { AsyncLocalStorageContextManager } = fromPackage('@opentelemetry/context-async-hooks');
  const { W3CTraceContextPropagator } = fromPackage('@opentelemetry/core');
  const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = fromPackage('@opentelemetry/sdk-trace-base');
  const exporter = new InMemorySpanExporter();
  api.context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  api.propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  api.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  setInterval(() => exporter.reset(), 200).unref();
} else if (variant !== 'noop') {
  throw new Error(`unknown variant ${variant}`);
}

const { Client } = fromPackage('pg');
const idem = require(nodePackage);

(async () => {
  const client = new Client();
  await client.connect();
  const consumer = `bench-${variant}`;
  const msg = (n) => ({ key: `k-${round}-${n}`, consumer, sql: 'INSERT INTO traced_bench VALUES ($1::bigint)',
    params: [String(BigInt(round) * 1000000000n + BigInt(n) + (variant === 'absent' ? 0n : variant === 'noop' ? 1n : 2n) * 100000000n)],
    destination: 'orders', partition: 0, messageId: String(n) });
  for (let n = 0; n < 200; n++) await idem.apply(client, msg(-1 - n));   // warm up
  const t0 = process.hrtime.bigint();
  for (let n = 0; n < calls; n++) await idem.apply(client, msg(n));
  const us = Number(process.hrtime.bigint() - t0) / 1000 / calls;
  await client.end();
  console.log(us.toFixed(1));
})().catch((err) => { console.error(err); process.exit(1); });
