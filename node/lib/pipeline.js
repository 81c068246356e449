// Owns: sending several statements to PostgreSQL in one round trip on a
// node-postgres Client: for each its Parse, Bind, Describe and Execute,
// then one Sync.  The server runs them in order and, after an error,
// skips the rest up to the Sync; a transaction opened by the first is left
// for the caller to end, as after any failed statement.
'use strict';

const { toText } = require('./params');

// One Submittable (the interface of node-postgres's own Query, which
// pg-cursor uses too) for the statements.  Their rows are parsed by a
// Query of the client's own each, with the client's type parsers.
class Pipelined {
  constructor(Query, types, statements, callback) {
    this.statements = statements.map((s) => ({
      text: s.text,
      // values as text or null, as node-postgres sends them
      values: (s.values || []).map((v, i) => toText(v, `parameter $${i + 1}`)),
    }));
    this.queries = statements.map((s) => {
      const q = new Query({ text: s.text });
      if (types && q._result && !q._result._types) q._result._types = types;
      return q;
    });
    this.at = 0;
    this.callback = callback;
  }

  submit(connection) {
    const stream = connection.stream;
    if (stream && stream.cork) stream.cork();
    try {
      for (const s of this.statements) {
        connection.parse({ text: s.text, name: '', types: [] });
        connection.bind({ portal: '', statement: '', values: s.values, binary: false });
        connection.describe({ type: 'P', name: '' });
        connection.execute({ portal: '', rows: 0 });
      }
      connection.sync();
    } finally {
      if (stream && stream.uncork) stream.uncork();
    }
    return null;
  }

  handleRowDescription(msg) { this.queries[this.at].handleRowDescription(msg); }
  handleDataRow(msg) { this.queries[this.at].handleDataRow(msg); }
  handleCommandComplete(msg) { this.queries[this.at++]._result.addCommandComplete(msg); }
  handleEmptyQuery() { this.at++; }
  handlePortalSuspended() {}
  handleCopyInResponse(connection) { connection.sendCopyFail('COPY is not supported in a pipeline'); }
  handleCopyData() {}

  // the client forgets this Submittable at an error: the server skips the
  // rest and its ReadyForQuery reaches no one
  handleError(err) {
    const done = this.callback;
    this.callback = null;
    if (done) done(err);
  }

  handleReadyForQuery() {
    const done = this.callback;
    this.callback = null;
    if (done) done(null, this.queries.map((q) => q._result));
  }
}

// Runs statements ({ text, values }) on client in one round trip; resolves
// to their results, in order, or rejects with the first error.  A client
// without node-postgres's protocol connection (pg-native) runs them one
// after the other, with the same outcome.
async function pipeline(client, statements) {
  const Query = client.constructor && client.constructor.Query;
  const connection = client.connection;
  // a client in node-postgres's pipeline mode pipelines queries itself,
  // and refuses a Submittable of another kind than its Query
  if (typeof Query !== 'function' || !connection || typeof connection.parse !== 'function' ||
      typeof connection.sync !== 'function' || client.pipeline === true) {
    const results = [];
    for (const s of statements) results.push(await client.query(s));
    return results;
  }
  return new Promise((resolve, reject) => {
    client.query(new Pipelined(Query, client._types, statements, (err, results) => (err ? reject(err) : resolve(results))));
  });
}

module.exports = { pipeline };
