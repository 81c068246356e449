// End-to-end run of external effects: a local payment provider (an HTTP
// server on 127.0.0.1, random port) and CONSUMERS consumer processes
// (consumer.js) processing a stream of order-paid messages with
// redeliveries, which are SIGKILLed (by themselves between the call and
// the complete, and at random by this supervisor) and restarted.
//
// Provider modes:
//   honours  a repeated Idempotency-Key returns the first charge
//   ignores  every request is a new charge
//   hangs    honours keys, but holds the first answer for every fifth
//            event past the consumer's lease
//
// Usage: node run.js MODE [EVENTS] [CONSUMERS]   (PG* select the database)
// Prints one JSON line: the provider's ledger and what happened.
'use strict';

const http = require('node:http');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { Client } = require('pg');

const MODE = process.argv[2];
const EVENTS = Number(process.argv[3] || 200);
const CONSUMERS = Number(process.argv[4] || 4);
const ORDERS = 20;
const LEASE_MS = 1000;
const HANG_MS = 2500;
const DEADLINE_MS = 90000;
const CONSUMER = `charges-${MODE}`;

if (!['honours', 'ignores', 'hangs'].includes(MODE)) {
  console.error('usage: node run.js honours|ignores|hangs [EVENTS] [CONSUMERS]');
  process.exit(2);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// the provider's ledger
const charges = [];
const byKey = new Map();
const held = new Set();
let providerReplays = 0;
let hung = 0;

const provider = http.createServer((req, res) => {
  let text = '';
  req.setEncoding('utf8');
  req.on('data', (chunk) => { text += chunk; });
  req.on('end', () => {
    const body = JSON.parse(text);
    const key = req.headers['idempotency-key'];
    const answer = (charge) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(charge));
    };
    if (MODE !== 'ignores' && byKey.has(key)) {
      providerReplays++;
      answer(byKey.get(key));
      return;
    }
    const charge = { id: `ch_${charges.length + 1}`, key, event: body.event,
                     order: body.order, amount: body.amount };
    charges.push(charge);
    byKey.set(key, charge);
    if (MODE === 'hangs' && body.event % 5 === 0 && !held.has(key)) {
      held.add(key);
      hung++;
      setTimeout(() => answer(charge), HANG_MS);
      return;
    }
    answer(charge);
  });
});

async function setup(db) {
  await db.query('create extension if not exists idem_consumer');
  await db.query('drop table if exists fx_orders, fx_broker');
  await db.query('create table fx_orders (id int primary key, paid int not null default 0, due int not null)');
  await db.query(`create table fx_broker (id bigserial primary key, event_id int not null,
      order_id int not null, amount int not null, visible_at timestamptz not null default now(),
      acked boolean not null default false, deliveries int not null default 0)`);
  // event e pays order 1 + e % ORDERS the amount 1 + e % 7; three in ten
  // events are in the stream twice, the copy later on
  await db.query(`insert into fx_orders (id, due)
      select 1 + e % $1, sum(1 + e % 7) from generate_series(1, $2) e group by 1`, [ORDERS, EVENTS]);
  await db.query(`insert into fx_broker (event_id, order_id, amount)
      select e, 1 + e % $1, 1 + e % 7
        from (select e, e as pos from generate_series(1, $2) e
              union all
              select e, e + 10 from generate_series(1, $2) e where e % 10 < 3) s
       order by pos, e`, [ORDERS, EVENTS]);
}

async function main() {
  const db = new Client();
  await db.connect();
  await setup(db);
  await new Promise((resolve) => provider.listen(0, '127.0.0.1', resolve));
  const url = `http://127.0.0.1:${provider.address().port}`;

  let done = false;
  let restarts = 0;
  let killed = 0;
  const children = new Set();
  const startConsumer = () => {
    const child = spawn(process.execPath, [path.join(__dirname, 'consumer.js')], {
      env: { ...process.env, PROVIDER_URL: url, CONSUMER, LEASE_MS: String(LEASE_MS), CRASH: '0.05' },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    children.add(child);
    child.on('exit', () => {
      children.delete(child);
      if (!done) {
        restarts++;
        startConsumer();
      }
    });
  };
  for (let i = 0; i < CONSUMERS; i++) startConsumer();

  // and now and then, a consumer dies wherever it is
  const killer = setInterval(() => {
    if (Math.random() < 0.3 && children.size > 0) {
      const list = [...children];
      list[Math.floor(Math.random() * list.length)].kill('SIGKILL');
      killed++;
    }
  }, 700);

  const t0 = Date.now();
  for (;;) {
    const { rows: [r] } = await db.query('select count(*) filter (where not acked)::int as left from fx_broker');
    if (r.left === 0) break;
    if (Date.now() - t0 > DEADLINE_MS) {
      console.error(`run.js: ${r.left} deliveries still unacknowledged after ${DEADLINE_MS} ms`);
      process.exit(1);
    }
    await sleep(200);
  }
  done = true;
  clearInterval(killer);
  await Promise.all([...children].map((child) => new Promise((resolve) => {
    child.on('exit', resolve);
    child.kill('SIGKILL');
  })));
  provider.close();
  provider.closeAllConnections();

  const { rows: [d] } = await db.query('select count(*)::int as n, sum(deliveries)::int as deliveries from fx_broker');
  const { rows: orders } = await db.query('select id, due from fx_orders');
  await db.end();
  const charged = new Map();
  for (const c of charges) charged.set(c.order, (charged.get(c.order) || 0) + c.amount);
  const perKey = new Map();
  for (const c of charges) perKey.set(c.key, (perKey.get(c.key) || 0) + 1);
  console.log(JSON.stringify({
    mode: MODE, consumer: CONSUMER, events: EVENTS, messages: d.n, deliveries: d.deliveries,
    charges: charges.length, keys_charged: perKey.size,
    keys_charged_twice: [...perKey.values()].filter((n) => n > 1).length,
    charged_twice: [...perKey.entries()].filter(([, n]) => n > 1).map(([k]) => k),
    provider_orders_off: orders.filter((o) => charged.get(o.id) !== o.due).length,
    provider_replays: providerReplays, hung, restarts, killed, seconds: (Date.now() - t0) / 1000,
  }));
}

main().catch((err) => {
  console.error(err.stack || err);
  process.exit(1);
});
