// Owns: the calls of one message (idem_apply, idem_try_apply) and of a batch
// (idem_record_batch and the caller's batch statement), with their
// arguments checked and converted before anything reaches the server.
'use strict';

const { paramsText, toText, ParamError } = require('./params');
const { statement } = require('./retry');

// The message fields every call needs, checked for type; the server checks
// the rest (empty, too long) and answers with its SQLSTATE.
function messageArgs(msg) {
  if (!msg || typeof msg !== 'object') throw new TypeError('the message must be an object');
  const { key, consumer, sql, params, eventTime } = msg;
  for (const [name, value] of [['key', key], ['consumer', consumer], ['sql', sql]])
    if (typeof value !== 'string') throw new TypeError(`${name} must be a string, not ${value === null ? 'null' : typeof value}`);
  let time = null;
  if (eventTime !== undefined && eventTime !== null) {
    if (!(eventTime instanceof Date || typeof eventTime === 'string' || typeof eventTime === 'number'))
      throw new TypeError('eventTime must be a Date, a string or milliseconds since the epoch');
    const date = typeof eventTime === 'number' ? new Date(eventTime) : eventTime;
    time = toText(date, 'eventTime');
  }
  return [key, consumer, sql, paramsText(params), time];
}

// The message's demand for rows as the bigint's text, or undefined when
// it makes none.  The type is checked here; the server refuses a negative
// count (22023).  null is refused, as the server refuses it: a demand lost
// on its way must not pass as no demand.
function expectRowsArg(msg) {
  const { expectRows } = msg;
  if (expectRows === undefined) return undefined;
  if (typeof expectRows === 'bigint' || (typeof expectRows === 'number' && Number.isSafeInteger(expectRows)))
    return String(expectRows);
  throw new TypeError('expectRows must be an integer (a number or a bigint), not ' +
    `${expectRows === null ? 'null' : typeof expectRows}; leave it out for no demand`);
}

// The caller's fingerprint of the message, or undefined to let the server
// compute it from the SQL and parameters.
function fingerprintArg(msg) {
  const { fingerprint } = msg;
  if (fingerprint === undefined || fingerprint === null) return undefined;
  if (typeof fingerprint !== 'string') throw new TypeError(`fingerprint must be a string, not ${typeof fingerprint}`);
  return fingerprint;
}

// The function call of one message and its values: the arguments of 1.0
// (key, consumer, sql, params, event_time), then the fingerprint (1.1) and
// expect_rows (1.2) only when the message has them, so that a message
// without them runs against a database at 1.0 or 1.1 too.
function messageCall(name, msg) {
  const args = messageArgs(msg);
  const expectRows = expectRowsArg(msg);
  const fingerprint = fingerprintArg(msg);
  if (expectRows !== undefined)
    return {
      call: `${name}($1, $2, $3, $4::text[], $5::timestamptz, $6::text, $7::bigint)`,
      values: [...args, fingerprint === undefined ? null : fingerprint, expectRows],
    };
  if (fingerprint !== undefined)
    return { call: `${name}($1, $2, $3, $4::text[], $5::timestamptz, $6::text)`, values: [...args, fingerprint] };
  return { call: `${name}($1, $2, $3, $4::text[], $5::timestamptz)`, values: args };
}

// Record the message's key and run its SQL, or skip it as a duplicate:
// true if applied.  With expectRows, an SQL that affects fewer rows raises
// IK002 and records nothing.
async function apply(db, msg, opts) {
  const { call, values } = messageCall('idem_apply', msg);
  return (await statement(db, { text: `SELECT ${call} AS result`, values }, opts)).rows[0].result;
}

// Like apply, but a permanent error of the SQL parks the message in the
// dead-letter queue: 'applied', 'duplicate' or 'dead_lettered'.
async function tryApply(db, msg, opts) {
  const { call, values } = messageCall('idem_try_apply', msg);
  return (await statement(db, { text: `SELECT ${call}::text AS outcome`, values }, opts)).rows[0].outcome;
}

// The columns' arrays of a batch statement, one per column, each element
// converted as a parameter would be; an error names the parameter ($3 ...).
function columnParams(messages, columns) {
  if (!Array.isArray(columns) || columns.some((c) => typeof c !== 'function'))
    throw new TypeError('columns must be an array of functions of a message');
  return columns.map((column, c) => messages.map((m, i) => {
    const value = column(m);
    if (Array.isArray(value))
      throw new ParamError(`column ${c + 1} of message ${i} is an array; a batch column holds one value per message`, c + 3);
    try {
      return toText(value, `column ${c + 1} of message ${i}`);
    } catch (err) {
      if (err instanceof ParamError) err.position = c + 3;
      throw err;
    }
  }));
}

// Build the batch statement's arrays: the keys, then one array per column.
function batchParams(messages, key, columns = []) {
  if (!Array.isArray(messages)) throw new TypeError('messages must be an array');
  if (typeof key !== 'function') throw new TypeError('key must be a function of a message');
  if (!Array.isArray(columns) || columns.some((c) => typeof c !== 'function'))
    throw new TypeError('columns must be an array of functions of a message');
  const keys = messages.map((m, i) => {
    const k = key(m);
    if (typeof k !== 'string') throw new TypeError(`the key of message ${i} must be a string, not ${typeof k}`);
    return k;
  });
  return [keys, ...columnParams(messages, columns)];
}

const RECORD_ONLY = 'SELECT k AS key FROM idem_record_batch($1, $2::text[]) AS k';

// Record a batch's keys and run the caller's batch statement on the new
// ones, in one statement: $1 is the consumer, $2 the keys (text[]), $3 ...
// the columns' arrays.  Without sql, return the keys not recorded before.
async function recordBatch(db, batch, opts) {
  if (!batch || typeof batch !== 'object') throw new TypeError('the batch must be an object');
  const { consumer, messages, key, columns, sql } = batch;
  if (typeof consumer !== 'string') throw new TypeError('consumer must be a string');
  if (sql !== undefined && typeof sql !== 'string') throw new TypeError('sql must be a string');
  const values = [consumer, ...batchParams(messages, key, columns)];
  return statement(db, { text: sql === undefined ? RECORD_ONLY : sql, values }, opts);
}

module.exports = { apply, tryApply, recordBatch, batchParams, columnParams };
