// A consumer of order-paid messages that charges a card through the local
// payment provider (test/effects/run.js) with idem_consumer's external
// effects.  For each delivery:
//
//   idem_effect_begin        its own transaction, before the call
//   POST /charges            Idempotency-Key: the effect's provider_key
//   BEGIN; idem_effect_complete; pay the order; ack the delivery; COMMIT
//
// A stored result is replayed without calling; a busy or waiting effect is
// left for the broker to redeliver.  With probability CRASH the process
// SIGKILLs itself between the call and the complete, the moment the
// exactly-once problem is about.
//
// Environment: PG* for the database, PROVIDER_URL, CONSUMER, LEASE_MS,
// CRASH.
'use strict';

const http = require('node:http');
const { Client } = require('pg');

const CONSUMER = process.env.CONSUMER;
const LEASE = `${Number(process.env.LEASE_MS || 1000)} milliseconds`;
const CRASH = Number(process.env.CRASH || 0);
const provider = new URL(process.env.PROVIDER_URL);

// the broker: a delivery is invisible for a while after it is handed out,
// and handed out again if it is not acknowledged by then
const FETCH = `
  update fx_broker set visible_at = now() + interval '1500 milliseconds',
                       deliveries = deliveries + 1
   where id = (select id from fx_broker where not acked and visible_at <= now()
                order by id limit 1 for update skip locked)
  returning id, event_id, order_id, amount`;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// POSTs a charge and resolves with the provider's answer
function charge(idempotencyKey, body) {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: provider.hostname, port: provider.port, path: '/charges', method: 'POST',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data),
                 'idempotency-key': idempotencyKey },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk) => { text += chunk; });
      res.on('end', () => resolve(JSON.parse(text)));
    });
    req.on('error', reject);
    req.end(data);
  });
}

async function main() {
  const client = new Client();
  await client.connect();
  for (;;) {
    const { rows } = await client.query(FETCH);
    if (rows.length === 0) {
      await sleep(50);
      continue;
    }
    const m = rows[0];
    const key = `charge:${m.event_id}`;
    const request = { order: m.order_id, amount: m.amount };
    const { rows: [effect] } = await client.query(
      'select * from idem_effect_begin($1, $2, $3::jsonb, $4::interval)',
      [CONSUMER, key, JSON.stringify(request), LEASE]);

    if (effect.action === 'replay' || effect.action === 'dead') {
      await client.query('update fx_broker set acked = true where id = $1', [m.id]);
      continue;
    }
    if (effect.action !== 'execute') {
      // busy or wait: let the broker redeliver it a little later
      await client.query(
        "update fx_broker set visible_at = now() + interval '300 milliseconds' where id = $1", [m.id]);
      continue;
    }

    const result = await charge(effect.provider_key,
      { ...request, event: m.event_id, fence: effect.fence, unknown: effect.outcome_unknown });
    if (Math.random() < CRASH) {
      process.kill(process.pid, 'SIGKILL');
    }
    try {
      await client.query('begin');
      await client.query('select idem_effect_complete($1, $2, $3, $4::jsonb)',
        [CONSUMER, key, effect.fence, JSON.stringify({ charge: result.id })]);
      await client.query('update fx_orders set paid = paid + $1 where id = $2',
        [m.amount, m.order_id]);
      await client.query('update fx_broker set acked = true where id = $1', [m.id]);
      await client.query('commit');
    } catch (err) {
      await client.query('rollback');
      // fenced off: a worker that took over after our lease expired owns it
      if (err.code !== 'IE001') throw err;
    }
  }
}

main().catch((err) => {
  console.error(`consumer ${process.pid}: ${err.stack || err}`);
  process.exit(1);
});
