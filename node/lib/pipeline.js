// Owns: sending several statements to PostgreSQL in one round trip on a
// node-postgres Client: for each its Parse, Bind, Describe and Execute,
// then one Sync.  The server runs them in order and, after an error,
// skips the rest up to the Sync; a transaction opened by the first is left
// for the caller to end, as after any failed statement.  A statement with
// a name is parsed once a connection, as node-postgres does it for its
// named queries, and bound by its name afterwards.
'use strict';

const { toText } = require('./params');

// One Submittable (the interface of node-postgres's own Query, which
// pg-cursor uses too) for the statements.  Their rows are parsed by a
// Query of the client's own each, with the client's type parsers.
class Pipelined {
  constructor(Query, types, statements, callback) {
    this.statements = statements.map((s) => ({
      name: s.name || '',
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
    const parsed = connection.parsedStatements || {};
    // The named statements parsed here, in the order of their
    // ParseComplete, which the server sends each parse that succeeds,
    // before an error skips the rest: a name is known once its statement
    // exists on the server, whatever happens to the statements after it.
    const parsing = [];
    const other = this.statements.find((s) => s.name && parsed[s.name] !== undefined && parsed[s.name] !== s.text);
    if (other) return new Error(`the statement ${other.name} was prepared with another text`);
    if (stream && stream.cork) stream.cork();
    try {
      for (const s of this.statements) {
        if (!s.name || parsed[s.name] === undefined) {
          connection.parse({ text: s.text, name: s.name, types: [] });
          parsing.push(s.name);
        }
        connection.bind({ portal: '', statement: s.name, values: s.values, binary: false });
        connection.describe({ type: 'P', name: '' });
        connection.execute({ portal: '', rows: 0 });
      }
      connection.sync();
    } finally {
      if (stream && stream.uncork) stream.uncork();
    }
    if (parsing.some((name) => name !== '') && connection.parsedStatements) {
      const onParsed = () => {
        const name = parsing.shift();
        if (name) connection.parsedStatements[name] = this.statements.find((s) => s.name === name).text;
        if (parsing.length === 0) connection.removeListener('parseComplete', onParsed);
      };
      connection.on('parseComplete', onParsed);
      this.parsed = onParsed;
      this.connection = connection;
    }
    return null;
  }

  // stops following the ParseCompletes once the server answered
  done(err, results) {
    if (this.parsed) this.connection.removeListener('parseComplete', this.parsed);
    this.parsed = null;
    const done = this.callback;
    this.callback = null;
    if (done) done(err, results);
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
    this.done(err);
  }

  handleReadyForQuery() {
    this.done(null, this.queries.map((q) => q._result));
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
