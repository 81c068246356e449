// A database of a test file's own for routed keys: its routed tables are
// made, not distributed, by the function idem_citus_distribute() makes
// them with on Citus, after the file's setup statements, so that routed
// keys do not change the other tests' database; dropped after the file's
// tests.  onConnect receives the connection to it.
//
// Connects with the usual PGHOST / PGPORT / PGUSER / PGDATABASE variables.
'use strict';

const test = require('node:test');
const { Client } = require('pg');

function routedDatabase(name, setup, onConnect) {
  let admin;
  let db;

  test.before(async () => {
    admin = new Client();
    await admin.connect();
    await admin.query(`drop database if exists ${name}`);
    await admin.query(`create database ${name}`);
    db = new Client({ database: name });
    await db.connect();
    await db.query('create extension idem_consumer');
    for (const sql of setup) {
      await db.query(sql);
    }
    await db.query("select idem_consumer.routed_storage_create('bigint')");
    onConnect(db);
  });

  test.after(async () => {
    await db.end();
    await admin.query(`drop database ${name}`);
    await admin.end();
  });
}

module.exports = { routedDatabase };
