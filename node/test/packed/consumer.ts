// Compiled (never run) by packed-types.test.js in a fresh project that
// installed the packed tarball, typescript and pg, and nothing else: what
// an application written in TypeScript sees of the package.  It uses every
// export.
import { Pool, PoolClient } from 'pg';
import * as idem from 'idem-consumer';

export async function consume(pool: Pool, client: PoolClient): Promise<void> {
  const msg: idem.Message = {
    key: 'order-paid:1', consumer: 'payments',
    sql: 'UPDATE orders SET paid_amount = paid_amount + $1 WHERE id = $2',
    params: [12.5, 2n, Buffer.from('x')], eventTime: new Date(), expectRows: 1, fingerprint: 'order-paid 1',
  };
  const applied: boolean = await idem.apply(pool, msg);
  const bigDemand: boolean = await idem.apply(pool, { ...msg, expectRows: 1n });
  const outcome: idem.Outcome = await idem.tryApply(client, msg, { retries: 2 });
  const batch = await idem.recordBatch(pool, { consumer: 'payments', messages: [{ id: 1 }], key: (m) => `k:${m.id}` });
  const [keys] = idem.batchParams([{ id: 1 }], (m) => String(m.id));
  const n: number = await idem.transaction(pool, async (tx) => (await idem.apply(tx, msg)) ? 1 : 0);
  const text: string | null = idem.toText(new Date());
  const params: Array<string | null> | null = idem.paramsText([1, null]);
  const retry: boolean = idem.isRetryable(new idem.ParamError('x'));
  const all: idem.ConsumerStats[] = await idem.stats(pool);
  const one: idem.ConsumerStats | null = await idem.stats(client, 'payments');
  const applies: number | undefined = one?.applied;
  const last: Date | null | undefined = one?.lastAppliedAt;
  console.log(applied, bigDemand, outcome, batch.rowCount, keys, n, text, params, retry,
    all.length, applies, last);

  const e = await idem.beginEffect<{ id: string }>(pool, { consumer: 'payments', key: 'charge:1', request: { a: 1 } });
  if (e.action === 'execute' && e.fence !== null) {
    await idem.heartbeatEffect(pool, { consumer: 'payments', key: 'charge:1', fence: e.fence, extend: 30000 });
    await idem.completeEffect(client, { consumer: 'payments', key: 'charge:1', fence: e.fence, result: { id: 'ch' } });
    const action: 'wait' | 'dead' = await idem.failEffect(pool,
      { consumer: 'payments', key: 'charge:1', fence: e.fence, error: 'x' });
    console.log(action);
  }
  const enqueued: boolean = await idem.enqueueEffect(client, { consumer: 'mail', key: 'mail:1', request: {} });
  const claimed: idem.ClaimedEffect[] = await idem.claimEffects(pool, { consumer: 'mail' });
  const out = await idem.withEffect(pool, { consumer: 'payments', key: 'charge:2' },
    async ({ providerKey }) => providerKey, async (tx, result) => tx.query('SELECT $1::text', [result]));
  const fenced: 'IE001' = new idem.FencedOffError('x').code;
  console.log(enqueued, claimed.length, out.action, fenced);

  const kafka: idem.KafkaConsumerLike = {
    consume: async () => null, listOffsets: async () => new Map(), on: () => null, removeListener: () => null,
  };
  const run: idem.KafkaRun = idem.consumeKafka({
    kafka, db: pool, consumer: 'ledger', topics: ['payments'], key: (m) => String(m.value),
    columns: [(m) => m.partition, (m) => m.offset], sql: 'SELECT 1', commitOffsets: true,
    onBatch: ({ applied, skipped }) => console.log(applied, skipped),
  });
  const at: bigint | undefined = run.positions.get('payments:0');
  await run.close();
  console.log(at, run.counts.overtaken);

  // @ts-expect-error: expectRows is a number or a bigint
  await idem.apply(pool, { ...msg, expectRows: '1' });
  // @ts-expect-error: tryApply resolves to an outcome, not a boolean
  const wrong: boolean = await idem.tryApply(pool, msg);
  console.log(wrong);
}
