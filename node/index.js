// idem-consumer: idem_consumer's calls from node-postgres.  The package
// requires nothing itself: it works on the caller's pg Client, PoolClient
// or Pool (pg is a peer dependency).
'use strict';

const { apply, tryApply, recordBatch, batchParams } = require('./lib/apply');
const { stats } = require('./lib/stats');
const { transaction, isRetryable } = require('./lib/retry');
const { toText, paramsText, ParamError } = require('./lib/params');
const {
  beginEffect, completeEffect, failEffect, heartbeatEffect, enqueueEffect, claimEffects, withEffect,
  FencedOffError,
} = require('./lib/effects');

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
  beginEffect,
  completeEffect,
  failEffect,
  heartbeatEffect,
  enqueueEffect,
  claimEffects,
  withEffect,
  FencedOffError,
  stats,
};
