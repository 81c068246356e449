// Owns: running work against a pg Client, PoolClient or Pool, in a
// transaction of its own when asked, and retrying it on serialization
// failures and deadlocks with a bounded, jittered exponential backoff.
'use strict';

const { withTraceComment } = require('./trace');
const { pipeline } = require('./pipeline');

// SQLSTATEs after which the same work, in a fresh transaction, may succeed.
const RETRYABLE = new Set(['40001', '40P01']);

const DEFAULTS = { retries: 5, minDelayMs: 5, maxDelayMs: 500 };

// Whether an error is a serialization failure or a deadlock.
function isRetryable(err) {
  return !!err && RETRYABLE.has(err.code);
}

// A Pool hands out clients; a Client or PoolClient is one connection.
function isPool(db) {
  return !!db && typeof db.connect === 'function' && typeof db.query === 'function' &&
    typeof db.release !== 'function' && typeof db.totalCount === 'number';
}

// Full jitter: a random delay up to min(max, min * 2^attempt), so that
// retrying consumers do not collide again in lockstep.
function backoffMs(attempt, opts) {
  const cap = Math.min(opts.maxDelayMs, opts.minDelayMs * 2 ** attempt);
  return Math.random() * cap;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// The caller's options over the defaults, checked.
function options(opts) {
  const o = { ...DEFAULTS, ...(opts || {}) };
  if (!Number.isInteger(o.retries) || o.retries < 0)
    throw new TypeError('retries must be a non-negative integer');
  return o;
}

// Run fn(client, checkedOut) on a client of db: a Pool's client is checked
// out and released (destroyed if the work broke it).
async function withClient(db, fn) {
  if (!isPool(db)) return fn(db, false);
  const client = await db.connect();
  let broken;
  try {
    return await fn(client, true);
  } catch (err) {
    // a lost connection (no SQLSTATE, or class 08 or 57P) leaves the client
    // unusable: destroy it rather than pool it again
    const code = err && err.code;
    if (!(err instanceof TypeError) && (!code || code.startsWith('08') || code.startsWith('57P')))
      broken = err;
    throw err;
  } finally {
    client.release(broken);
  }
}

// Call attempt() until it succeeds, fails for good, or the retries run out.
async function retrying(attempt, opts) {
  for (let n = 0; ; n++) {
    try {
      return await attempt(n);
    } catch (err) {
      if (!isRetryable(err) || n >= opts.retries) throw err;
      if (opts.onRetry) opts.onRetry(err, n + 1);
      await sleep(backoffMs(n, opts));
    }
  }
}

// Whether a statement sent now on client would be its own transaction, so
// that retrying it is a fresh transaction.  Inside the caller's transaction
// a failed statement aborts it, and only the caller can retry the whole.
// A client just checked out of a pool is outside any; otherwise ask
// node-postgres (getTransactionStatus, pg 8.21 and later).
function autocommit(client, checkedOut) {
  if (typeof client.getTransactionStatus === 'function') {
    const status = client.getTransactionStatus();
    if (status) return status === 'I';
  }
  return checkedOut;
}

// Send one statement, retried as its own transaction when it is one; its
// text carries the active trace context (lib/trace.js).
function statement(db, query, opts) {
  const o = options(opts);
  const traced = withTraceComment(query);
  return withClient(db, (client, checkedOut) =>
    autocommit(client, checkedOut) ? retrying(() => client.query(traced), o) : client.query(traced));
}

const ISOLATION = new Set(['read committed', 'repeatable read', 'serializable']);

// The statement that opens a transaction at o.isolationLevel.
function beginStatement(o) {
  if (!o.isolationLevel) return 'BEGIN';
  const level = String(o.isolationLevel).toLowerCase();
  if (!ISOLATION.has(level)) throw new TypeError(`unknown isolation level: ${o.isolationLevel}`);
  return `BEGIN ISOLATION LEVEL ${level.toUpperCase()}`;
}

// Roll back after err, and rethrow it.
async function rollback(client, err) {
  try {
    await client.query('ROLLBACK');
  } catch (_) {
    // the connection is gone; the original error says why
  }
  throw err;
}

// Run fn(client) between BEGIN and COMMIT; on 40001 or 40P01 (from fn or
// from COMMIT) roll back, wait, and run fn again in a new transaction.
async function transaction(db, fn, opts) {
  const o = options(opts);
  const begin = beginStatement(o);
  return withClient(db, (client) => retrying(async () => {
    await client.query(begin);
    let result;
    try {
      result = await fn(client);
      await client.query('COMMIT');
    } catch (err) {
      await rollback(client, err);
    }
    return result;
  }, o));
}

// Run statements ({ text, values }) between BEGIN and COMMIT in one round
// trip (lib/pipeline.js), retried as transaction() is, and resolve to
// their results.  inside(results), when given, runs before the COMMIT,
// which is then a round trip of its own.
async function pipelinedTransaction(db, statements, opts, inside) {
  const o = options(opts);
  const begin = { text: beginStatement(o) };
  const commit = { text: 'COMMIT' };
  return withClient(db, (client) => retrying(async () => {
    try {
      const results = await pipeline(client, inside ? [begin, ...statements] : [begin, ...statements, commit]);
      if (!inside) return results.slice(1, -1);
      await inside(results.slice(1));
      await client.query(commit);
      return results.slice(1);
    } catch (err) {
      return rollback(client, err);
    }
  }, o));
}

module.exports = { isRetryable, isPool, withClient, statement, transaction, pipelinedTransaction, DEFAULTS };
