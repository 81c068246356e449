// idem-consumer: idem_consumer's calls from node-postgres.  The package
// requires nothing itself: it works on the caller's pg Client, PoolClient
// or Pool (pg is a peer dependency).
'use strict';

const { apply, tryApply, recordBatch, batchParams } = require('./lib/apply');
const { transaction, isRetryable } = require('./lib/retry');
const { toText, paramsText, ParamError } = require('./lib/params');

// The effect calls (idem_effect_begin, heartbeat, complete, fail) will be
// exported from here, from lib/effects.js, once the extension has them.

module.exports = {
  apply,
  tryApply,
  recordBatch,
  batchParams,
  transaction,
  isRetryable,
  toText,
  paramsText,
  ParamError,
};
