// Test helpers: connections to the database named by the usual PGHOST /
// PGPORT / PGUSER / PGDATABASE variables, with the extension created once
// even when several test files start at the same moment.
'use strict';

const { Client } = require('pg');

async function connect() {
  const client = new Client();
  await client.connect();
  await client.query('SELECT pg_advisory_lock(727001)');
  try {
    await client.query('CREATE EXTENSION IF NOT EXISTS idem_consumer');
  } finally {
    await client.query('SELECT pg_advisory_unlock(727001)');
  }
  return client;
}

// Resolve once the backend with this pid waits for a lock.
async function waitForLockWait(admin, pid, timeoutMs = 10000) {
  const end = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await admin.query(
      "SELECT wait_event_type = 'Lock' AS waiting FROM pg_stat_activity WHERE pid = $1", [pid]);
    if (rows[0] && rows[0].waiting) return;
    if (Date.now() > end) throw new Error(`backend ${pid} did not wait for a lock`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

// Consumer names unique to this run, so that a second run on the same
// database starts from no recorded keys.
const RUN = `${process.pid}-${Date.now().toString(36)}`;
const consumerName = (name) => `${name}-${RUN}`;

module.exports = { connect, waitForLockWait, consumerName };
