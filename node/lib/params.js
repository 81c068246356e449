// Owns: turning JavaScript values into the text forms PostgreSQL's input
// functions read, the way node-postgres sends query parameters, so that a
// message's values can travel in idem_apply's text[] params.
'use strict';

// What cannot be sent: raised before anything reaches the server.
class ParamError extends TypeError {
  constructor(message, position) {
    super(message);
    this.name = 'ParamError';
    this.position = position;
  }
}

const pad = (n, width = 2) => String(n).padStart(width, '0');

// Local time with its UTC offset, as node-postgres sends a Date, so that a
// timestamptz gets the same instant and a timestamp the same wall time.
function dateText(d, where) {
  const ms = d.getTime();
  if (Number.isNaN(ms))
    throw new ParamError(`${where} is an invalid Date`, undefined);
  let year = d.getFullYear();
  const bc = year < 1;
  if (bc) year = 1 - year;
  const offset = -d.getTimezoneOffset();
  const sign = offset < 0 ? '-' : '+';
  const abs = Math.abs(offset);
  return `${pad(year, 4)}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}` +
    `T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}` +
    `.${pad(d.getMilliseconds(), 3)}${sign}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}` +
    (bc ? ' BC' : '');
}

// An array element of a PostgreSQL array literal: quoted, with backslashes
// and quotes escaped; NULL unquoted.
function arrayElement(value, where, seen) {
  if (value === null || value === undefined) return 'NULL';
  if (Array.isArray(value)) return arrayText(value, where, seen);
  const text = toText(value, where, seen);
  return '"' + text.replace(/\\/g, '\\\\').replace(/"/g, '\\"') + '"';
}

// A JavaScript array as a PostgreSQL array literal ('{1,2}'), nested arrays
// as more dimensions.
function arrayText(values, where, seen) {
  if (seen.includes(values))
    throw new ParamError(`${where} contains itself`, undefined);
  seen.push(values);
  const text = '{' + values.map((v, i) => arrayElement(v, `${where}[${i}]`, seen)).join(',') + '}';
  seen.pop();
  return text;
}

// Convert one value to text, or null for SQL NULL; `where` names it in errors.
function toText(value, where = 'value', seen = []) {
  if (value === null || value === undefined) return null;
  switch (typeof value) {
    case 'string':
      return value;
    case 'number':
      if (!Number.isFinite(value))
        throw new ParamError(`${where} is ${value}, which is almost always a bug; ` +
          `pass the string '${value}' to send it on purpose`, undefined);
      return String(value);
    case 'bigint':
    case 'boolean':
      return String(value);
    case 'object':
      break;
    default:
      throw new ParamError(`${where} is a ${typeof value}, which cannot be sent to PostgreSQL`, undefined);
  }
  if (value instanceof Date) return dateText(value, where);
  if (ArrayBuffer.isView(value))
    return '\\x' + Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString('hex');
  if (value instanceof ArrayBuffer) return '\\x' + Buffer.from(value).toString('hex');
  if (Array.isArray(value)) return arrayText(value, where, seen);
  if (typeof value.toPostgres === 'function') {
    if (seen.includes(value))
      throw new ParamError(`${where} refers to itself through toPostgres()`, undefined);
    seen.push(value);
    const text = toText(value.toPostgres(), where, seen);
    seen.pop();
    return text;
  }
  try {
    return JSON.stringify(value);
  } catch (err) {
    throw new ParamError(`${where} cannot be sent as JSON: ${err.message}`, undefined);
  }
}

// Convert a message's params to the flat text array idem_apply binds as
// $1 ... $n; an error names the parameter by its position.
function paramsText(params) {
  if (params === null || params === undefined) return null;
  if (!Array.isArray(params))
    throw new ParamError(`params must be an array, not ${typeof params}`, undefined);
  return params.map((value, i) => {
    try {
      return toText(value, `parameter $${i + 1}`);
    } catch (err) {
      if (err instanceof ParamError) err.position = i + 1;
      throw err;
    }
  });
}

module.exports = { ParamError, toText, paramsText };
