// Compiled (never run) by types.test.js: the declarations in index.d.ts
// accept what the README shows and refuse what the package refuses.
import { Client, Pool } from 'pg';
import * as idem from '../..';

export async function usage(pool: Pool, client: Client): Promise<void> {
  const applied: boolean = await idem.apply(pool, {
    key: 'order-paid:1', consumer: 'payments', sql: 'UPDATE orders SET paid_amount = paid_amount + $1 WHERE id = $2',
    params: [12.5, 2n, null, undefined, true, new Date(), Buffer.from('x'), new Uint8Array(1), [1, [2]], { a: 1 }],
    eventTime: new Date(),
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
  // @ts-expect-error: a function cannot be sent
  await idem.apply(pool, { key: 'k', consumer: 'c', sql: 'SELECT $1', params: [() => 1] });
  console.log(wrong);
}
