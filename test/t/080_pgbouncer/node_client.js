// node-postgres through PgBouncer in transaction mode (test/t/080_pgbouncer.pl).
//
// Usage: node node_client.js HOST PORT USER PASSWORD DBNAME unnamed|named PREFIX
//
// Two clients deliver the same eight messages in turns (the second delivery
// of each is a redelivery), as parameterized queries: unnamed (node-postgres
// parses them anew each time) or with a `name` (node-postgres prepares the
// statement once per client, on the server connection of its first use).
// Prints one line per call: "LABEL t|f", or "LABEL ERROR SQLSTATE MESSAGE".
'use strict';
const { Client } = require('pg');

const APPLY = "SELECT idem_apply($1, 'payments', "
  + "'update orders set paid = paid + $1 where id = $2', ARRAY['1', '5']) AS applied";

async function main() {
  const [host, port, user, password, database, mode, prefix] = process.argv.slice(2);
  const connect = async () => {
    const client = new Client({ host, port: Number(port), user, password, database,
      connectionTimeoutMillis: 10000 });
    await client.connect();
    return client;
  };
  const clients = [await connect(), await connect()];
  for (let i = 1; i <= 8; i++) {
    for (const [n, client] of clients.entries()) {
      const query = { text: APPLY, values: [`${prefix}:${i}`] };
      if (mode === 'named') query.name = 'idem_apply';
      try {
        const res = await client.query(query);
        console.log(`c${n + 1} ${i} ${res.rows[0].applied ? 't' : 'f'}`);
      } catch (e) {
        console.log(`c${n + 1} ${i} ERROR ${e.code} ${e.message}`);
      }
    }
  }
  await Promise.all(clients.map((c) => c.end()));
}

main().catch((e) => { console.error(e); process.exit(1); });
