// Type declarations of idem-consumer (hand-written; the package is plain
// JavaScript and has no build step).  They use node-postgres's types and
// Node's Buffer: @types/pg and @types/node are dependencies of the package.

/// <reference types="node" />

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

/**
 * Where a message came from, for its OpenTelemetry span only (with
 * @opentelemetry/api installed): never sent to the server.
 */
export interface TraceFields {
  /** messaging.system, e.g. 'kafka', 'rabbitmq', 'aws_sqs'. */
  system?: string;
  /** messaging.destination.name: the topic or queue; names the span `process <destination>`. */
  destination?: string;
  /** messaging.destination.partition.id. */
  partition?: string | number;
  /** messaging.message.id: the broker's id of the message. */
  messageId?: string;
}

export interface Message extends TraceFields {
  /** Business idempotency key, e.g. `order-paid:${eventId}`. */
  key: string;
  /** Consumer name; keys are deduplicated per consumer. */
  consumer: string;
  /** One statement, with $1 ... $n bound to params; runs with the caller's rights. */
  sql: string;
  params?: ParamValue[] | null;
  /** When the message was produced (Date, timestamp text, or ms since the epoch); feeds the lag counters. */
  eventTime?: Date | string | number | null;
  /**
   * The least number of rows sql must affect (rows changed by INSERT,
   * UPDATE, DELETE, MERGE; rows returned by a SELECT); fewer raises IK002
   * and records nothing. Passed as idem_apply's expect_rows (extension
   * 1.2). Leave it out for no demand; null is refused.
   */
  expectRows?: number | bigint;
  /**
   * Your own fingerprint of the message, compared on redeliveries instead
   * of the hash of sql and params (the six-argument idem_apply of 1.1).
   * null or undefined: computed by the server.
   */
  fingerprint?: string | null;
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

/**
 * One consumer's counters (view idem_stats), decoded whatever type parsers
 * pg has: bigint counts as numbers (a count above 2^53 - 1 rejects with a
 * RangeError instead of rounding), times as Dates.
 */
export interface ConsumerStats {
  consumer: string;
  applied: number;
  duplicates: number;
  failed: number;
  deadLettered: number;
  duplicateRatio: number | null;
  latencyP50Ms: number | null;
  latencyP95Ms: number | null;
  latencyP99Ms: number | null;
  latencyMaxMs: number | null;
  lagLastMs: number | null;
  lagP95Ms: number | null;
  lastAppliedAt: Date | null;
  lastDuplicateAt: Date | null;
  statsReset: Date | null;
  /** Extension 1.1 and later. */
  effectsExecuted?: number;
  effectsReplayed?: number;
  effectsBusy?: number;
  effectsFencedOff?: number;
  effectsRequestMismatches?: number;
  effectsUnknownOutcomes?: number;
  effectsDead?: number;
  keyReuse?: number;
}

/** The counters of every consumer of the database connected to, by consumer name. */
export function stats(db: Queryable, consumer?: undefined, options?: RetryOptions): Promise<ConsumerStats[]>;
/** One consumer's counters, or null if it has none (not counted yet, or untracked). */
export function stats(db: Queryable, consumer: string, options?: RetryOptions): Promise<ConsumerStats | null>;

export interface Batch<M> extends TraceFields {
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

/** A lease or an extension: milliseconds, or PostgreSQL interval text ('30 seconds'). */
export type Interval = number | string;

/**
 * A fence as beginEffect and claimEffects return it: the bigint's decimal
 * text (as node-postgres returns bigint columns). A bigint or a safe
 * integer number is accepted too.
 */
export type Fence = string | bigint | number;

/** What idem_effect_begin tells the caller to do. */
export type EffectAction = 'execute' | 'replay' | 'busy' | 'wait' | 'dead';

/** The answer of idem_effect_begin, decoded (the caller's type parsers do not change it). */
export interface Effect<R = unknown> {
  action: EffectAction;
  /** The lease's fencing token (decimal text): set for 'execute' only. */
  fence: string | null;
  /** The same for every attempt of the effect: send it as Idempotency-Key. */
  providerKey: string;
  attempt: number;
  /** An earlier lease expired in flight: its holder may have called the provider. */
  outcomeUnknown: boolean;
  /** The stored result (parsed JSON): 'replay' only. */
  result: R | null;
  /** 'wait': when the effect is due again; 'busy': when the lease expires. */
  retryAt: Date | null;
  /** 'wait' and 'dead': the error of the last failed attempt. */
  lastError: string | null;
}

export interface EffectKey extends TraceFields {
  consumer: string;
  /** The effect's key, e.g. `charge:${event.id}` (keep it apart from message keys). */
  key: string;
}

export interface BeginEffectArgs extends EffectKey {
  /** Compared with the stored request on every begin (IE002 if different); sent as JSON, null/undefined: SQL NULL. */
  request?: unknown;
  /** Default: 30 seconds. */
  lease?: Interval;
}

export interface CompleteEffectArgs extends EffectKey {
  fence: Fence;
  /** Stored as JSON and replayed to later begins. */
  result?: unknown;
  /** Business SQL run in the same statement, as idem_apply runs it. */
  sql?: string | null;
  params?: ParamValue[] | null;
}

export interface FailEffectArgs extends EffectKey {
  fence: Fence;
  /** The error (its message for an Error). */
  error: string | Error;
  /** Default true: retry after a backoff; false: dead at once. */
  retryable?: boolean;
}

export interface HeartbeatEffectArgs extends EffectKey {
  fence: Fence;
  extend: Interval;
}

export interface EnqueueEffectArgs extends EffectKey {
  request: unknown;
}

export interface ClaimEffectsArgs {
  consumer: string;
  /** Default 10. */
  maxCount?: number;
  /** Default: 30 seconds. */
  lease?: Interval;
}

/** An outbox effect leased by claimEffects. */
export interface ClaimedEffect<Q = unknown> {
  key: string;
  request: Q | null;
  fence: string;
  providerKey: string;
  attempt: number;
  outcomeUnknown: boolean;
}

/**
 * Lease an effect before calling the provider, in a transaction of its own
 * (refused, with code '25001', on a client inside a transaction block).
 */
export function beginEffect<R = unknown>(db: Queryable, args: BeginEffectArgs, options?: RetryOptions): Promise<Effect<R>>;

/**
 * Store the result under the caller's fence (and run sql), in the caller's
 * transaction. A fence no longer current raises FencedOffError (IE001).
 */
export function completeEffect(db: Queryable, args: CompleteEffectArgs, options?: RetryOptions): Promise<void>;

/** Record a failed attempt: 'wait' (retried after a backoff) or 'dead' (dead-letter queue). */
export function failEffect(db: Queryable, args: FailEffectArgs, options?: RetryOptions): Promise<'wait' | 'dead'>;

/** Extend the lease to now + extend; false once fenced off. */
export function heartbeatEffect(db: Queryable, args: HeartbeatEffectArgs, options?: RetryOptions): Promise<boolean>;

/** Add an effect to the outbox in the caller's transaction; false if the key was enqueued before. */
export function enqueueEffect(db: Queryable, args: EnqueueEffectArgs, options?: RetryOptions): Promise<boolean>;

/** Lease up to maxCount due outbox effects, in a transaction of its own (refused inside one, like beginEffect). */
export function claimEffects<Q = unknown>(db: Queryable, args: ClaimEffectsArgs, options?: RetryOptions): Promise<Array<ClaimedEffect<Q>>>;

/** What withEffect hands the provider's call. */
export interface EffectCall {
  providerKey: string;
  fence: string;
  attempt: number;
  outcomeUnknown: boolean;
  /** Aborted (reason: a FencedOffError) when a heartbeat finds the lease taken over. */
  signal: AbortSignal;
}

export interface WithEffectSpec extends BeginEffectArgs {
  /** Milliseconds between heartbeats (default: a third of the lease; 0: none). Needed when lease is interval text. */
  heartbeatEvery?: number;
  /** Whether a call's error is worth retrying (default: always): false dead-letters the effect. */
  retryable?: (err: any) => boolean;
  /** Whether the provider may have acted despite the error (a timeout): then nothing is recorded and the lease expires. */
  unknownOutcome?: (err: any) => boolean;
}

export type EffectOutcome<R> =
  /** The call ran and its result is stored, with apply's update. */
  | { action: 'execute'; result: R; effect: Effect<R> }
  /** Completed before: the stored result; nothing was called. */
  | { action: 'replay'; result: R; effect: Effect<R> }
  /** Not called: busy (another worker's live lease), wait (due at effect.retryAt), dead (effect.lastError). */
  | { action: 'busy' | 'wait' | 'dead'; effect: Effect<R>; error?: undefined }
  /** The call failed and failEffect recorded it: retried later, or dead-lettered. */
  | { action: 'wait' | 'dead'; effect: Effect<R>; error: unknown }
  /** The call failed with an unknown outcome: left in flight until its lease expires. */
  | { action: 'unknown'; effect: Effect<R>; error: unknown };

/**
 * The inline cycle: begin (outside a transaction); replay a stored result
 * without calling; call(...) while a timer heartbeats the lease; then, in
 * one transaction, complete the effect and run apply(client, result). A
 * failed call is recorded with failEffect. Raises FencedOffError when the
 * lease was taken over.
 */
export function withEffect<R>(
  db: Queryable, spec: WithEffectSpec, call: (effect: EffectCall) => Promise<R>,
  apply?: ((client: Client | PoolClient, result: R, effect: Effect<R>) => Promise<unknown>) | null,
  options?: TransactionOptions): Promise<EffectOutcome<R>>;

/** An effect's lease is no longer current (code 'IE001'): nothing sent under its fence is recorded. */
export class FencedOffError extends Error {
  code: 'IE001';
  consumer?: string;
  key?: string;
  fence?: string;
  detail?: string;
}

/**
 * A message of a @platformatic/kafka Consumer, as consumeKafka reads it:
 * key and value as the Consumer's deserializers made them.
 */
export interface KafkaMessage<K = unknown, V = unknown> {
  topic: string;
  partition: number;
  offset: bigint;
  key: K;
  value: V;
  timestamp: bigint;
  headers: Map<unknown, unknown>;
  commit(): Promise<void> | void;
}

/**
 * The parts of a @platformatic/kafka Consumer that consumeKafka uses; the
 * caller creates it (groupId, bootstrapBrokers, deserializers) and closes it.
 */
export interface KafkaConsumerLike {
  consume(options: object): Promise<any>;
  listOffsets(options: { topics: string[] }): Promise<Map<string, bigint[]>>;
  on(event: string, listener: (...args: any[]) => void): unknown;
  removeListener(event: string, listener: (...args: any[]) => void): unknown;
  assignments?: Array<{ topic: string; partitions: number[] }> | null;
}

export interface KafkaConsumeOptions<M extends KafkaMessage = KafkaMessage> {
  kafka: KafkaConsumerLike;
  db: Queryable;
  /** The idem_consumer consumer whose keys and positions these are. */
  consumer: string;
  topics: string[];
  /** The message's business key (never topic:partition:offset). */
  key: (message: M) => string;
  /** One function per column of the batch statement: $3, $4, ... */
  columns?: Array<(message: M) => ParamValue>;
  /**
   * The batch statement, run on the messages at or above the stored
   * positions, each key once: $1 the consumer, $2 the keys (text[]), $3 ...
   * the columns' arrays; it records the keys with idem_record_batch($1, $2)
   * and applies the new ones.
   */
  sql: string;
  /** Most messages in one transaction (500). */
  maxBatch?: number;
  /** Also commit each partition's offset to the broker after COMMIT, in the background (false). */
  commitOffsets?: boolean;
  /** How often the log-end offsets are listed for the lag (1000 ms). */
  logEndIntervalMs?: number;
  /** Times a batch is tried again after another member moved a position past it (10). */
  maxBackwardsRetries?: number;
  /**
   * A stream that ends or fails (the broker restarting) is opened again from
   * the stored positions, after streamRestartDelayMs (1000), at most this
   * many times in a row without a batch (10); then done rejects.
   */
  maxStreamRestarts?: number;
  streamRestartDelayMs?: number;
  retry?: TransactionOptions;
  /**
   * After each batch: messages read; applied (at or above the positions);
   * skipped below the position known, or a second copy of an offset or of
   * a key in the batch, without a query; overtaken: below the position
   * another member stored meanwhile, which refused the advance (IP001).
   */
  onBatch?: (batch: { messages: number; applied: number; skipped: number; overtaken: number }) => void;
  /**
   * Inside the transaction, after the batch statement; the COMMIT then
   * waits for it, a second round trip per batch.
   */
  onApplied?: (messages: M[], result: QueryResult) => void;
}

export interface KafkaRun {
  /** Settles when the run stops: rejects on an error of the broker or the database. */
  done: Promise<void>;
  /** Stops after the batch in hand; close the Consumer afterwards. */
  close(): Promise<void>;
  counts: { batches: number; messages: number; skipped: number; overtaken: number; applied: number;
            assignments: number; backwards: number; streamRestarts: number };
  /** The positions as last read or written, by 'topic:partition'. */
  positions: Map<string, bigint>;
}

/**
 * Consume topics with a @platformatic/kafka Consumer, each batch in one
 * transaction sent in one round trip: idem_position_advance for its
 * partitions from the batch's first messages, the batch statement and
 * COMMIT. Each partition assigned is read from its stored position.
 */
export function consumeKafka<M extends KafkaMessage = KafkaMessage>(options: KafkaConsumeOptions<M>): KafkaRun;
