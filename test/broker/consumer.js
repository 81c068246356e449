// One consumer process of the broker test: order-paid messages from
// RabbitMQ, each applied through idem-consumer's tryApply in a transaction
// of its own, acknowledged only after COMMIT.
//
// Environment: AMQP_URL, QUEUE, PREFETCH, the PG* variables, and PAUSE_AT,
// the deterministic point where this process stops to be killed:
//   "before:N"  the N-th message of this process has run its SQL, its
//               transaction is open, COMMIT not sent
//   "after:N"   the N-th message is committed, its ack not sent
//   ""          never
// It then prints {"pause": ...} and waits forever for the SIGKILL.
//
// Every committed delivery is printed as one JSON line on stdout (pipes are
// synchronous on Linux, so the line is out before the ack is sent):
//   {"key", "outcome", "redelivered", "dbMs", "activeMs"}
// dbMs is the time of the transaction (BEGIN, tryApply, COMMIT), activeMs
// the time since this process's first delivery.
'use strict';

const amqp = require('amqplib');
const { Client } = require('pg');
const idem = require('idem-consumer');

const PAY = `WITH p AS (INSERT INTO payments (event_id, order_id, amount) VALUES ($1, $2, $3)
                        RETURNING order_id, amount)
             UPDATE orders o SET paid_amount = o.paid_amount + p.amount FROM p WHERE o.id = p.order_id`;

const [pauseKind, pauseAtText] = (process.env.PAUSE_AT || '').split(':');
const pauseAt = Number(pauseAtText || 0);

const emit = (obj) => process.stdout.write(JSON.stringify(obj) + '\n');
const forever = () => new Promise(() => setInterval(() => {}, 1 << 30));

// A consumer outlives neither its driver nor its broker: a process left
// behind by a failed run must not hold connections or wait forever.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) process.exit(4);
}, 500);

async function main() {
  const db = new Client();
  await db.connect();
  const conn = await amqp.connect(process.env.AMQP_URL);
  conn.on('close', () => process.exit(3));
  conn.on('error', () => {});
  const ch = await conn.createChannel();
  await ch.prefetch(Number(process.env.PREFETCH || 20));

  let seq = 0;
  let chain = Promise.resolve();
  let firstDelivery = null;

  // Apply one delivery; the pause points are inside this function.
  async function handle(msg) {
    const t0 = process.hrtime.bigint();
    if (firstDelivery === null) firstDelivery = t0;
    const event = JSON.parse(msg.content.toString());
    const n = ++seq;
    const outcome = await idem.transaction(db, async (tx) => {
      const o = await idem.tryApply(tx, {
        key: `order-paid:${event.id}`,
        consumer: 'payments',
        sql: PAY,
        params: [event.id, event.orderId, event.amount],
        eventTime: new Date(event.producedAt),
      });
      if (pauseKind === 'before' && n === pauseAt) {
        emit({ pause: 'before', key: `order-paid:${event.id}` });
        await forever();
      }
      return o;
    });
    const t1 = process.hrtime.bigint();
    emit({
      key: `order-paid:${event.id}`, outcome, redelivered: msg.fields.redelivered,
      dbMs: Number(t1 - t0) / 1e6, activeMs: Number(t1 - firstDelivery) / 1e6,
    });
    if (pauseKind === 'after' && n === pauseAt) {
      emit({ pause: 'after', key: `order-paid:${event.id}` });
      await forever();
    }
    ch.ack(msg);
  }

  const { consumerTag } = await ch.consume(process.env.QUEUE, (msg) => {
    if (msg === null) return;  // the queue was deleted
    chain = chain.then(() => handle(msg)).catch((err) => {
      console.error(err);
      process.exit(2);
    });
  }, { noAck: false });

  // the driver stops a consumer that is done with SIGTERM: finish what was
  // started, let the acks out, close
  process.on('SIGTERM', async () => {
    await ch.cancel(consumerTag).catch(() => {});
    await chain;
    conn.removeAllListeners('close');
    await ch.close().catch(() => {});
    await conn.close().catch(() => {});
    await db.end();
    process.exit(0);
  });
  emit({ ready: true });
}

main().catch((err) => {
  console.error(err);
  process.exit(2);
});
