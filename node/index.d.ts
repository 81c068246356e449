// Type declarations of idem-consumer (hand-written; the package is plain
// JavaScript and has no build step).

import type { Client, Pool, PoolClient, QueryResult, QueryResultRow } from 'pg';

/** A connection, a client checked out of a pool, or a pool (a client is checked out per call). */
export type Queryable = Client | PoolClient | Pool;

/**
 * A value a parameter can carry: converted to text as node-postgres converts
 * query parameters (numbers, bigint, boolean, Date, Buffer and typed arrays as
 * bytea, arrays as PostgreSQL arrays, objects as JSON or through toPostgres()).
 * null and undefined are SQL NULL.
 */
export type ParamValue =
  | string | number | bigint | boolean | Date | Buffer | ArrayBufferView | ArrayBuffer
  | null | undefined | ParamValue[] | { toPostgres(): unknown } | { [key: string]: unknown };

export interface Message {
  /** Business idempotency key, e.g. `order-paid:${eventId}`. */
  key: string;
  /** Consumer name; keys are deduplicated per consumer. */
  consumer: string;
  /** One statement, with $1 ... $n bound to params; runs with the caller's rights. */
  sql: string;
  params?: ParamValue[] | null;
  /** When the message was produced (Date, timestamp text, or ms since the epoch); feeds the lag counters. */
  eventTime?: Date | string | number | null;
}

export interface RetryOptions {
  /** Retries after the first attempt on 40001 and 40P01 (default 5). */
  retries?: number;
  /** Backoff: a random delay up to min(maxDelayMs, minDelayMs * 2^attempt) (defaults 5 and 500). */
  minDelayMs?: number;
  maxDelayMs?: number;
  /** Called before each retry with the error and the retry's number (1, 2, ...). */
  onRetry?: (err: Error & { code?: string }, attempt: number) => void;
}

export interface TransactionOptions extends RetryOptions {
  isolationLevel?: 'read committed' | 'repeatable read' | 'serializable';
}

export type Outcome = 'applied' | 'duplicate' | 'dead_lettered';

/**
 * Record the message's key and run its SQL: true if applied, false if the key
 * was recorded before. Sent outside a transaction, the call is retried on
 * 40001 and 40P01; inside the caller's transaction, the error is raised.
 */
export function apply(db: Queryable, message: Message, options?: RetryOptions): Promise<boolean>;

/** Like apply, but a permanent error of the SQL parks the message in the dead-letter queue. */
export function tryApply(db: Queryable, message: Message, options?: RetryOptions): Promise<Outcome>;

export interface Batch<M> {
  consumer: string;
  messages: M[];
  /** The message's idempotency key. */
  key: (message: M) => string;
  /** One function per column of the batch statement: $3, $4, ... */
  columns?: Array<(message: M) => ParamValue>;
  /**
   * The batch statement: $1 the consumer, $2 the keys (text[]), $3 ... the
   * columns' arrays (cast them: $3::bigint[]). Without it, the result's rows
   * are the keys not recorded before ({ key }).
   */
  sql?: string;
}

/** Record a batch's keys and run the batch statement on the new ones, in one statement. */
export function recordBatch<M, R extends QueryResultRow = any>(
  db: Queryable, batch: Batch<M>, options?: RetryOptions): Promise<QueryResult<R>>;

/** The arrays of a batch statement: the keys, then each column's values as text. */
export function batchParams<M>(
  messages: M[], key: (message: M) => string,
  columns?: Array<(message: M) => ParamValue>): [string[], ...Array<Array<string | null>>];

/**
 * Run fn between BEGIN and COMMIT; on 40001 or 40P01 (from fn or COMMIT),
 * roll back, wait, and run fn again in a new transaction, at most
 * options.retries times. Given a Pool, one client is checked out for all attempts.
 */
export function transaction<T>(
  db: Queryable, fn: (client: Client | PoolClient) => Promise<T>, options?: TransactionOptions): Promise<T>;

/** Whether an error is a serialization failure (40001) or a deadlock (40P01). */
export function isRetryable(err: unknown): boolean;

/** The text form of one value, or null for SQL NULL. */
export function toText(value: ParamValue, where?: string): string | null;

/** The text array idem_apply binds as $1 ... $n. */
export function paramsText(params: ParamValue[] | null | undefined): Array<string | null> | null;

/** A value that cannot be sent; position is the parameter's $n when known. */
export class ParamError extends TypeError {
  position?: number;
}

// Effect helpers (idem_effect_begin, heartbeat, complete, fail) are added
// here once the extension provides those functions.
