// One delivery from node-postgres in a process of its own, so that the
// caller can choose its TZ: node-postgres writes a Date in the process's
// local time zone.  argv[2] is JSON {sql, params}; a param {date: ms}, also inside
// an array, is a Date.  Prints JSON: the first column of the first row, or the error's
// SQLSTATE, and the text node-postgres sent for each Date.
'use strict';

const { Client } = require('pg');
const { prepareValue } = require('pg/lib/utils');

(async () => {
  const { sql, params } = JSON.parse(process.argv[2]);
  const sent = [];
  const revive = (p) => {
    if (Array.isArray(p))
      return p.map(revive);
    if (p && typeof p === 'object' && 'date' in p) {
      const date = new Date(p.date);
      sent.push(prepareValue(date));
      return date;
    }
    return p;
  };
  const values = params.map(revive);
  const client = new Client({ statement_timeout: 20000 });
  await client.connect();
  try {
    const { rows } = await client.query({ text: sql, values, rowMode: 'array' });
    console.log(JSON.stringify({ value: rows[0][0], sent }));
  } catch (err) {
    console.log(JSON.stringify({ code: err.code, message: err.message, sent }));
  } finally {
    await client.end();
  }
})().catch((err) => { console.error(err); process.exit(1); });
