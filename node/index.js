// idem-consumer: idem_consumer's calls from node-postgres.  The package
// requires nothing itself: it works on the caller's pg Client, PoolClient
// or Pool (pg is a peer dependency), and consumeKafka on the caller's
// @platformatic/kafka Consumer (an optional peer dependency).
'use strict';

const { apply, applyRows, tryApply, tryApplyRows, recordBatch, batchParams } = require('./lib/apply');
const { stats } = require('./lib/stats');
const { transaction, isRetryable } = require('./lib/retry');
const { toText, paramsText, ParamError } = require('./lib/params');
const {
  beginEffect, completeEffect, failEffect, heartbeatEffect, enqueueEffect, claimEffects, withEffect,
  FencedOffError,
} = require('./lib/effects');
const { consumeKafka } = require('./lib/kafka');

module.exports = {
  apply,
  applyRows,
  tryApply,
  tryApplyRows,
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
  consumeKafka,
};
