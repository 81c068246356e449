// Owns: the calls of external effects (idem_effect_begin, complete, fail,
// heartbeat, enqueue, claim), with their arguments checked and converted
// before anything reaches the server and their answers decoded the same
// whatever type parsers the caller's pg has; and withEffect, the inline
// cycle: begin, call the provider while a timer heartbeats the lease,
// then complete with the business update in one transaction.
'use strict';

const { paramsText, ParamError } = require('./params');
const { isPool, statement, transaction } = require('./retry');

// An effect whose lease is no longer current: taken over by another worker
// after it expired, or completed or failed already.  Nothing the holder
// sends under that fence is recorded.
class FencedOffError extends Error {
  constructor(message, { consumer, key, fence, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = 'FencedOffError';
    this.code = 'IE001';
    this.consumer = consumer;
    this.key = key;
    this.fence = fence;
    if (cause && cause.detail) this.detail = cause.detail;
  }
}

function checkString(name, value) {
  if (typeof value !== 'string')
    throw new TypeError(`${name} must be a string, not ${value === null ? 'null' : typeof value}`);
  return value;
}

// A fence as sent: the decimal text of the bigint.  beginEffect hands it
// out as a string; a bigint or a safe integer number is accepted too.
function fenceText(fence) {
  if (typeof fence === 'string' || typeof fence === 'bigint') return String(fence);
  if (typeof fence === 'number' && Number.isSafeInteger(fence)) return String(fence);
  throw new TypeError('fence must be the string beginEffect returned (or a bigint or safe integer), ' +
    `not ${fence === null ? 'null' : typeof fence}`);
}

// An interval: a number of milliseconds, or PostgreSQL interval text
// ('30 seconds').  undefined leaves the function's default.
function intervalText(value, name) {
  if (typeof value === 'string') return value;
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new ParamError(`${name} is ${value}; give milliseconds or interval text`, undefined);
    return `${value} milliseconds`;
  }
  throw new TypeError(`${name} must be milliseconds (a number) or interval text, not ${value === null ? 'null' : typeof value}`);
}

// A JSON value as jsonb text; null and undefined are SQL NULL.
function jsonText(value, name) {
  if (value === undefined || value === null) return null;
  let text;
  try {
    text = JSON.stringify(value);
  } catch (err) {
    throw new ParamError(`${name} cannot be sent as JSON: ${err.message}`, undefined);
  }
  if (text === undefined) throw new ParamError(`${name} is a ${typeof value}, which has no JSON form`, undefined);
  return text;
}

function argsObject(args, what) {
  if (!args || typeof args !== 'object') throw new TypeError(`the ${what} arguments must be an object`);
  return args;
}

// begin and claim commit their lease in a transaction of their own: the
// server refuses them (25001) inside a transaction block.  Say so before
// sending when the client's transaction status is known (pg 8.21 and later).
function refuseTransaction(db, what) {
  if (isPool(db) || typeof db.getTransactionStatus !== 'function') return;
  const status = db.getTransactionStatus();
  if (status === 'T' || status === 'E') {
    const err = new Error(`${what} must run outside a transaction block: its lease has to be committed ` +
      'before the provider is called (call it on a Pool, or on a client before BEGIN)');
    err.code = '25001';
    throw err;
  }
}

// IE001 from the server, as a FencedOffError that says what happened.
function fencedOff(err, what, consumer, key, fence) {
  if (!err || err.code !== 'IE001') return err;
  return new FencedOffError(`${what} of effect "${key}" (consumer "${consumer}") was refused: ` +
    `fence ${fence} is no longer the current lease (another worker took the effect over after the lease ` +
    'expired, or it was completed or failed already); nothing of its transaction is recorded',
  { consumer, key, fence, cause: err });
}

const bool = (text) => (text === null ? null : text === 'true');
const int = (text) => (text === null ? null : Number(text));
const json = (text) => (text === null ? null : JSON.parse(text));
const epochMs = (text) => (text === null ? null : new Date(Math.floor(Number(text))));

// Every column as text, decoded here: the caller's type parsers do not
// change what the helpers return.
const BEGIN_COLUMNS = `e.action::text AS action, e.fence::text AS fence, e.provider_key,
  e.attempt::text AS attempt, e.outcome_unknown::text AS outcome_unknown, e.result::text AS result,
  (extract(epoch FROM e.retry_at) * 1000)::text AS retry_at, e.last_error`;

function decodeEffect(row) {
  return {
    action: row.action,
    fence: row.fence,
    providerKey: row.provider_key,
    attempt: int(row.attempt),
    outcomeUnknown: bool(row.outcome_unknown),
    result: json(row.result),
    retryAt: epochMs(row.retry_at),
    lastError: row.last_error,
  };
}

// Lease an effect before calling the provider, in a transaction of its own:
// execute (with a fence), replay (with the stored result), busy, wait, dead.
async function beginEffect(db, args, opts) {
  const { consumer, key, request, lease } = argsObject(args, 'beginEffect');
  const values = [checkString('consumer', consumer), checkString('key', key), jsonText(request, 'request')];
  if (lease !== undefined) values.push(intervalText(lease, 'lease'));
  refuseTransaction(db, 'beginEffect');
  const call = lease === undefined ? 'idem_effect_begin($1, $2, $3::jsonb)'
    : 'idem_effect_begin($1, $2, $3::jsonb, $4::interval)';
  const res = await statement(db, { text: `SELECT ${BEGIN_COLUMNS} FROM ${call} AS e`, values }, opts);
  return decodeEffect(res.rows[0]);
}

// Store the effect's result under the caller's fence, and run sql with
// params if given, in the caller's transaction.
async function completeEffect(db, args, opts) {
  const { consumer, key, fence, result, sql, params } = argsObject(args, 'completeEffect');
  const values = [checkString('consumer', consumer), checkString('key', key), fenceText(fence),
    jsonText(result, 'result')];
  let text = 'SELECT idem_effect_complete($1, $2, $3::bigint, $4::jsonb)';
  if (sql !== undefined && sql !== null) {
    values.push(checkString('sql', sql), paramsText(params));
    text = 'SELECT idem_effect_complete($1, $2, $3::bigint, $4::jsonb, $5, $6::text[])';
  } else if (params !== undefined && params !== null) {
    throw new TypeError('params without sql: give the business statement they belong to');
  }
  try {
    await statement(db, { text, values }, opts);
  } catch (err) {
    throw fencedOff(err, 'completeEffect', consumer, key, values[2]);
  }
}

// Record a failed attempt: 'wait' (retried after a backoff) or 'dead'
// (parked in the dead-letter queue).
async function failEffect(db, args, opts) {
  const { consumer, key, fence, error, retryable = true } = argsObject(args, 'failEffect');
  if (typeof retryable !== 'boolean') throw new TypeError('retryable must be a boolean');
  const values = [checkString('consumer', consumer), checkString('key', key), fenceText(fence),
    checkString('error', error instanceof Error ? error.message : error), retryable];
  try {
    const res = await statement(db, {
      text: 'SELECT idem_effect_fail($1, $2, $3::bigint, $4, $5::boolean)::text AS action', values }, opts);
    return res.rows[0].action;
  } catch (err) {
    throw fencedOff(err, 'failEffect', consumer, key, values[2]);
  }
}

// Extend a live lease to now + extend: false once the caller is fenced off.
async function heartbeatEffect(db, args, opts) {
  const { consumer, key, fence, extend } = argsObject(args, 'heartbeatEffect');
  const values = [checkString('consumer', consumer), checkString('key', key), fenceText(fence),
    intervalText(extend, 'extend')];
  const res = await statement(db, {
    text: 'SELECT idem_effect_heartbeat($1, $2, $3::bigint, $4::interval)::text AS alive', values }, opts);
  return res.rows[0].alive === 'true';
}

// Add an effect to the outbox in the caller's (business) transaction:
// false if the key was enqueued before.
async function enqueueEffect(db, args, opts) {
  const { consumer, key, request } = argsObject(args, 'enqueueEffect');
  const values = [checkString('consumer', consumer), checkString('key', key), jsonText(request, 'request')];
  const res = await statement(db, {
    text: 'SELECT idem_effect_enqueue($1, $2, $3::jsonb)::text AS enqueued', values }, opts);
  return res.rows[0].enqueued === 'true';
}

// Lease up to maxCount due outbox effects of a consumer, each with a new
// fence; like begin, in a transaction of its own.
async function claimEffects(db, args, opts) {
  const { consumer, maxCount, lease } = argsObject(args, 'claimEffects');
  if (maxCount !== undefined && !Number.isInteger(maxCount)) throw new TypeError('maxCount must be an integer');
  const values = [checkString('consumer', consumer), maxCount === undefined ? 10 : maxCount];
  if (lease !== undefined) values.push(intervalText(lease, 'lease'));
  refuseTransaction(db, 'claimEffects');
  const call = lease === undefined ? 'idem_effect_claim($1, $2::integer)'
    : 'idem_effect_claim($1, $2::integer, $3::interval)';
  const res = await statement(db, {
    text: `SELECT c.key, c.request::text AS request, c.fence::text AS fence, c.provider_key,
             c.attempt::text AS attempt, c.outcome_unknown::text AS outcome_unknown FROM ${call} AS c`,
    values }, opts);
  return res.rows.map((row) => ({
    key: row.key,
    request: json(row.request),
    fence: row.fence,
    providerKey: row.provider_key,
    attempt: int(row.attempt),
    outcomeUnknown: bool(row.outcome_unknown),
  }));
}

const DEFAULT_LEASE_MS = 30000;

// Heartbeat the lease every everyMs until stopped, one call at a time; the
// first false means fenced off: onFenced() runs and the beats end.  A beat
// that fails (a lost connection) is tried again at the next tick.
function startHeartbeat(db, args, everyMs, onFenced, opts) {
  const state = { fenced: false, beats: 0 };
  let timer = null;
  let running = null;
  let stopped = false;
  const tick = () => {
    timer = null;
    running = heartbeatEffect(db, args, opts).then((alive) => {
      state.beats++;
      if (!alive && !stopped) {
        state.fenced = true;
        onFenced();
      }
    }, () => {}).then(() => {
      running = null;
      if (!stopped && !state.fenced) timer = setTimeout(tick, everyMs);
    });
  };
  if (everyMs > 0) timer = setTimeout(tick, everyMs);
  return {
    state,
    async stop() {
      stopped = true;
      if (timer) clearTimeout(timer);
      timer = null;
      if (running) await running;
    },
  };
}

// The inline cycle of one effect: begin; replay a stored result; call the
// provider while the lease is heartbeaten; complete it with apply's
// business update in one transaction, or record the failure.
async function withEffect(db, spec, call, apply, opts) {
  const { consumer, key, request, lease, heartbeatEvery, retryable = () => true, unknownOutcome } =
    argsObject(spec, 'withEffect');
  if (typeof call !== 'function') throw new TypeError('call must be a function');
  if (apply !== undefined && apply !== null && typeof apply !== 'function')
    throw new TypeError('apply must be a function of (client, result, effect)');
  if (typeof retryable !== 'function') throw new TypeError('retryable must be a function of the error');
  if (unknownOutcome !== undefined && typeof unknownOutcome !== 'function')
    throw new TypeError('unknownOutcome must be a function of the error');
  let every = heartbeatEvery;
  if (every === undefined) {
    if (typeof lease === 'string')
      throw new TypeError('heartbeatEvery (milliseconds) is needed when the lease is interval text');
    every = (lease === undefined ? DEFAULT_LEASE_MS : lease) / 3;
  }
  if (typeof every !== 'number' || !(every >= 0) || !Number.isFinite(every))
    throw new TypeError('heartbeatEvery must be a non-negative number of milliseconds (0: no heartbeat)');

  const effect = await beginEffect(db, { consumer, key, request, lease }, opts);
  if (effect.action === 'replay') return { action: 'replay', result: effect.result, effect };
  if (effect.action !== 'execute') return { action: effect.action, effect };

  const { fence } = effect;
  const controller = new AbortController();
  const fencedError = () => new FencedOffError(`effect "${key}" (consumer "${consumer}") was fenced off while ` +
    `its call ran: fence ${fence} is no longer the current lease; its result is not recorded`,
  { consumer, key, fence });
  const heartbeat = startHeartbeat(db,
    { consumer, key, fence, extend: lease === undefined ? DEFAULT_LEASE_MS : lease },
    every, () => controller.abort(fencedError()), opts);
  let result;
  try {
    result = await call({ providerKey: effect.providerKey, fence, attempt: effect.attempt,
      outcomeUnknown: effect.outcomeUnknown, signal: controller.signal });
  } catch (err) {
    await heartbeat.stop();
    if (heartbeat.state.fenced) throw fencedError();
    if (unknownOutcome && unknownOutcome(err))
      return { action: 'unknown', error: err, effect };
    const message = err instanceof Error ? err.message : String(err);
    const action = await failEffect(db, { consumer, key, fence, error: message || String(err),
      retryable: !!retryable(err) }, opts);
    return { action, error: err, effect };
  } finally {
    await heartbeat.stop();
  }
  if (heartbeat.state.fenced) throw fencedError();
  await transaction(db, async (client) => {
    await completeEffect(client, { consumer, key, fence, result }, opts);
    if (apply) await apply(client, result, effect);
  }, opts);
  return { action: 'execute', result, effect };
}

module.exports = {
  beginEffect,
  completeEffect,
  failEffect,
  heartbeatEffect,
  enqueueEffect,
  claimEffects,
  withEffect,
  FencedOffError,
};
