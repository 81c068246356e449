// Owns: reading the counters of idem_stats as JavaScript values, the same
// whatever type parsers the caller's pg has: counts as numbers, ratios and
// milliseconds as numbers, times as Dates, column names in camelCase.
'use strict';

const { statement } = require('./retry');

// The timestamptz columns, read as milliseconds since the epoch so that
// no date text has to be parsed (its form follows the session's DateStyle).
const TIME_COLUMNS = ['last_applied_at', 'last_duplicate_at', 'stats_reset'];
const MS_SUFFIX = ' ms';

// Every column as the server's text: the caller's type parsers do not
// change what this file decodes.
const RAW_TEXT = { getTypeParser: () => (value) => value };

// PostgreSQL type OIDs of the view's columns.
const INT8 = 20;
const NUMBERS = new Set([21, 23, 700, 701, 1700]);

const camel = (name) => name.replace(/_([a-z0-9])/g, (_, c) => c.toUpperCase());

// A bigint counter as a number.  A count above 2^53 - 1 cannot be held
// exactly by a number; rather than round it, say so.
function count(text, column) {
  const n = Number(text);
  if (!Number.isSafeInteger(n))
    throw new RangeError(`${column} is ${text}, more than a number holds exactly`);
  return n;
}

function decodeRow(row, fields) {
  const out = {};
  for (const { name, dataTypeID } of fields) {
    if (name.endsWith(MS_SUFFIX)) continue;
    const text = row[name];
    let value;
    if (TIME_COLUMNS.includes(name)) {
      const ms = row[name + MS_SUFFIX];
      value = ms === null || ms === undefined ? null : new Date(Math.floor(Number(ms)));
    } else if (text === null) {
      value = null;
    } else if (dataTypeID === INT8) {
      value = count(text, name);
    } else if (NUMBERS.has(dataTypeID)) {
      value = Number(text);
    } else {
      value = text;
    }
    out[camel(name)] = value;
  }
  return out;
}

// The counters of every consumer of the database connected to, ordered by
// name; given a consumer, its counters alone, or null if it has none.
async function stats(db, consumer, opts) {
  if (consumer !== undefined && typeof consumer !== 'string')
    throw new TypeError(`consumer must be a string, not ${consumer === null ? 'null' : typeof consumer}`);
  const times = TIME_COLUMNS.map((c) =>
    `(extract(epoch FROM s.${c}) * 1000)::text AS "${c}${MS_SUFFIX}"`).join(', ');
  const one = typeof consumer === 'string';
  const res = await statement(db, {
    text: `SELECT s.*, ${times} FROM idem_stats AS s${one ? ' WHERE s.consumer = $1' : ''} ORDER BY s.consumer`,
    values: one ? [consumer] : [],
    types: RAW_TEXT,
  }, opts);
  const all = res.rows.map((row) => decodeRow(row, res.fields));
  return one ? (all[0] || null) : all;
}

module.exports = { stats };
