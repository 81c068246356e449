// One member of the Kafka end-to-end test's consumer group (kafka.test.js):
// idem-consumer's consumeKafka on a @platformatic/kafka Consumer, each
// batch of payment events applied in one transaction: the positions of
// its partitions advanced, the keys recorded by idem_record_batch, one
// ledger row per new event and the accounts' balances.
//
// Prints one JSON line per event the driver counts: "ready", "join" (with
// the group's generation), "batch" (messages read, applied, skipped by
// position) and "closed".  KILL_IN_TX=N: SIGKILLs itself inside the
// transaction of its N-th batch that applies something, after the business
// statement and before COMMIT.  SIGTERM: closes the run and the Consumer,
// which leaves the group.
'use strict';

const { Consumer, stringDeserializers } = require('@platformatic/kafka');
const { Pool } = require('pg');
const idem = require('idem-consumer');

const KILL_IN_TX = Number(process.env.KILL_IN_TX || 0);
const say = (event) => process.stdout.write(`${JSON.stringify({ pid: process.pid, ...event })}\n`);

// one row per new event, then the balances, accounts in order so that two
// members that briefly share accounts lock them in the same order
const APPLY = `
WITH msg AS (
    SELECT DISTINCT ON (m.key) m.key, m.account, m.amount, m.part, m.off, m.by
      FROM unnest($2::text[], $3::integer[], $4::bigint[], $5::integer[], $6::bigint[], $7::integer[])
           AS m (key, account, amount, part, off, by)
),
new_keys AS (
    SELECT k AS key FROM idem_record_batch($1, $2::text[]) AS k
),
ins AS (
    INSERT INTO ledger (event_id, account, amount, kafka_partition, kafka_offset, applied_by)
    SELECT msg.key, msg.account, msg.amount, msg.part, msg.off, msg.by
      FROM msg JOIN new_keys USING (key)
    RETURNING account, amount
)
INSERT INTO balances AS b (account, total)
SELECT account, sum(amount) FROM ins GROUP BY account ORDER BY account
ON CONFLICT (account) DO UPDATE SET total = b.total + excluded.total`;

async function main() {
  const db = new Pool({ max: 2 });
  const kafka = new Consumer({
    clientId: `ledger-${process.pid}`,
    groupId: 'ledger',
    bootstrapBrokers: [process.env.KAFKA_BOOTSTRAP],
    deserializers: stringDeserializers,
    sessionTimeout: 6000,
    rebalanceTimeout: 10000,
    heartbeatInterval: 500,
    maxWaitTime: 200,
    retries: 60,
    retryDelay: 500,
  });
  kafka.on('consumer:group:join', (p) => say({ event: 'join', generation: p.generationId,
    partitions: (p.assignments || []).reduce((n, a) => n + a.partitions.length, 0) }));

  let applying = 0;
  const run = idem.consumeKafka({
    kafka,
    db,
    consumer: 'ledger',
    topics: ['payments'],
    key: (m) => JSON.parse(m.value).id,
    columns: [
      (m) => JSON.parse(m.value).account,
      (m) => JSON.parse(m.value).amount,
      (m) => m.partition,
      (m) => m.offset,
      () => process.pid,
    ],
    sql: APPLY,
    maxBatch: 200,
    // only a member that kills itself inside a transaction asks for the
    // batch statement's result before COMMIT: the others send each batch,
    // COMMIT included, in one round trip
    onApplied: KILL_IN_TX ? () => {
      if (++applying === KILL_IN_TX) {
        say({ event: 'kill-in-tx' });
        process.kill(process.pid, 'SIGKILL');
      }
    } : undefined,
    onBatch: (b) => say({ event: 'batch', ...b }),
  });
  say({ event: 'ready' });

  let stopping = false;
  process.on('SIGTERM', async () => {
    if (stopping) return;
    stopping = true;
    await run.close();
    await kafka.close(true).catch(() => {});
    await db.end();
    say({ event: 'closed', counts: run.counts });
    process.exit(0);
  });
  try {
    await run.done;
    if (!stopping) throw new Error('the run stopped by itself');
  } catch (err) {
    if (stopping) return;
    say({ event: 'error', message: String(err && err.stack || err) });
    process.exit(1);
  }
}

main().catch((err) => {
  say({ event: 'error', message: String(err && err.stack || err) });
  process.exit(1);
});
