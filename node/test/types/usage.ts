// Compiled (never run) by types.test.js: the declarations in index.d.ts
// accept what the README shows and refuse what the package refuses.
import { Client, Pool } from 'pg';
import * as idem from '../..';

export async function usage(pool: Pool, client: Client): Promise<void> {
  const applied: boolean = await idem.apply(pool, {
    key: 'order-paid:1', consumer: 'payments', sql: 'UPDATE orders SET paid_amount = paid_amount + $1 WHERE id = $2',
    params: [12.5, 2n, null, undefined, true, new Date(), Buffer.from('x'), new Uint8Array(1), [1, [2]], { a: 1 }],
    eventTime: new Date(),
    system: 'kafka', destination: 'orders', partition: 3, messageId: 'orders-3-1200',
  });
  const outcome: idem.Outcome = await idem.tryApply(client, { key: 'k', consumer: 'c', sql: 'SELECT 1' },
    { retries: 2, minDelayMs: 1, maxDelayMs: 10, onRetry: (err, attempt) => console.log(err.code, attempt) });
  const result = await idem.recordBatch(pool, {
    consumer: 'payments', messages: [{ id: 1, amount: 2 }], key: (m) => `order-paid:${m.id}`,
    columns: [(m) => m.amount], sql: 'SELECT 1',
  });
  const newKeys: number | null = result.rowCount;
  const [keys, amounts] = idem.batchParams([{ id: 1 }], (m) => String(m.id), [(m) => m.id]);
  const n: number = await idem.transaction(pool, async (tx) => {
    await idem.apply(tx, { key: 'k', consumer: 'c', sql: 'SELECT 1' });
    return 1;
  }, { isolationLevel: 'repeatable read' });
  const text: string | null = idem.toText(new Date());
  const position: number | undefined = new idem.ParamError('x').position;
  console.log(applied, outcome, newKeys, keys, amounts, n, text, position, idem.isRetryable(null));

  // @ts-expect-error: a key is a string
  await idem.apply(pool, { key: 1, consumer: 'c', sql: 'SELECT 1' });
  // @ts-expect-error: sql is required
  await idem.apply(pool, { key: 'k', consumer: 'c' });
  // @ts-expect-error: an outcome is one of three labels
  const wrong: 'applied' | 'duplicate' = await idem.tryApply(pool, { key: 'k', consumer: 'c', sql: 'SELECT 1' });
  // @ts-expect-error: unknown isolation level
  await idem.transaction(pool, async () => 1, { isolationLevel: 'chaos' });
  // @ts-expect-error: a partition is a string or a number
  await idem.apply(pool, { key: 'k', consumer: 'c', sql: 'SELECT 1', partition: [3] });
  // @ts-expect-error: a function cannot be sent
  await idem.apply(pool, { key: 'k', consumer: 'c', sql: 'SELECT $1', params: [() => 1] });
  console.log(wrong);
}

interface Charge { id: string; amount: number }

export async function effects(pool: Pool, client: Client): Promise<void> {
  const e: idem.Effect<Charge> = await idem.beginEffect<Charge>(client,
    { consumer: 'payments', key: 'charge:1', request: { order: 1 }, lease: 30000 });
  if (e.action === 'execute' && e.fence !== null) {
    await idem.completeEffect(client, { consumer: 'payments', key: 'charge:1', fence: e.fence, result: { id: 'ch' },
      sql: 'UPDATE orders SET paid = true WHERE id = $1', params: [1] });
    const action: 'wait' | 'dead' = await idem.failEffect(pool,
      { consumer: 'payments', key: 'charge:1', fence: BigInt(e.fence), error: new Error('x'), retryable: false });
    const alive: boolean = await idem.heartbeatEffect(pool,
      { consumer: 'payments', key: 'charge:1', fence: 1, extend: '30 seconds' });
    console.log(action, alive);
  }
  const replayed: Charge | null = e.result;
  const when: Date | null = e.retryAt;
  const enqueued: boolean = await idem.enqueueEffect(client, { consumer: 'mail', key: 'mail:1', request: { to: 'a' } });
  const claimed = await idem.claimEffects<{ to: string }>(pool, { consumer: 'mail', maxCount: 5, lease: '1 minute' });
  const to: string | undefined = claimed[0]?.request?.to;
  const out = await idem.withEffect(pool,
    { consumer: 'payments', key: 'charge:2', request: { amount: 5 }, heartbeatEvery: 5000,
      retryable: (err) => err.status >= 500, unknownOutcome: (err) => err.name === 'TimeoutError' },
    async ({ providerKey, signal, outcomeUnknown }): Promise<Charge> => {
      console.log(providerKey, outcomeUnknown, signal.aborted);
      return { id: 'ch', amount: 5 };
    },
    async (tx, charge) => tx.query('UPDATE orders SET charge = $1', [charge.id]),
    { retries: 3 });
  if (out.action === 'execute' || out.action === 'replay') {
    const amount: number = out.result.amount;
    console.log(amount);
  } else if (out.action === 'unknown') {
    console.log(out.error);
  }
  const fenced: 'IE001' = new idem.FencedOffError('x').code;
  console.log(replayed, when, enqueued, to, fenced);

  // @ts-expect-error: an effect's action is one of five labels
  const bad: idem.EffectAction = 'completed';
  // @ts-expect-error: the fence is required to complete
  await idem.completeEffect(client, { consumer: 'payments', key: 'charge:1', result: 1 });
  // @ts-expect-error: a heartbeat returns a boolean
  const nope: string = await idem.heartbeatEffect(pool, { consumer: 'c', key: 'k', fence: '1', extend: 1000 });
  // @ts-expect-error: call must return a promise
  await idem.withEffect(pool, { consumer: 'c', key: 'k' }, () => 1);
  console.log(bad, nope);

  const kafka: idem.KafkaConsumerLike = {
    consume: async () => null, listOffsets: async () => new Map(), on: () => null, removeListener: () => null,
  };
  const run = idem.consumeKafka<idem.KafkaMessage<string, string>>({
    kafka, db: pool, consumer: 'ledger', topics: ['payments'], key: (m) => JSON.parse(m.value).id,
    columns: [(m) => m.partition, (m) => m.offset], sql: 'SELECT 1', maxBatch: 100,
  });
  const applied2: number = run.counts.applied;
  await run.done;
  console.log(applied2);
  // @ts-expect-error: the batch statement is required
  idem.consumeKafka({ kafka, db: pool, consumer: 'c', topics: ['t'], key: () => 'k' });
  // @ts-expect-error: topics is an array
  idem.consumeKafka({ kafka, db: pool, consumer: 'c', topics: 't', key: () => 'k', sql: 'SELECT 1' });
}
