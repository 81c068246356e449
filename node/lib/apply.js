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

// Send one message's call; select is the function call's select list.
async function callMessage(db, select, msg, opts) {
  const res = await statement(db, { text: `SELECT ${select} AS result`, values: messageArgs(msg) }, opts);
  return res.rows[0].result;
}

// Record the message's key and run its SQL, or skip it as a duplicate.
function apply(db, msg, opts) {
  return callMessage(db, 'idem_apply($1, $2, $3, $4::text[], $5::timestamptz)', msg, opts);
}

// Like apply, but a permanent error of the SQL parks the message in the
// dead-letter queue: 'applied', 'duplicate' or 'dead_lettered'.
function tryApply(db, msg, opts) {
  return callMessage(db, 'idem_try_apply($1, $2, $3, $4::text[], $5::timestamptz)::text', msg, opts);
}

// Build the batch statement's arrays: the keys, then one array per column,
// each element converted as a parameter would be.
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
  const arrays = columns.map((column, c) => messages.map((m, i) => {
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
  return [keys, ...arrays];
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

module.exports = { apply, tryApply, recordBatch, batchParams };
