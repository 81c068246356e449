// idem-consumer: idem_consumer's calls from node-postgres.  The package
// requires nothing itself: it works on the caller's pg Client, PoolClient
// or Pool (pg is a peer dependency), and consumeKafka on the caller's
// @platformatic/kafka Consumer (an optional peer dependency).
'use strict';

const { apply, tryApply, recordBatch, batchParams } = require('./lib/apply');
const { stats } = require('./lib/stats');
const { traced } = require('./lib/trace');
const { transaction, isRetryable } = require('./lib/retry');
const { toText, paramsText, ParamError } = require('./lib/params');
const {
  beginEffect, completeEffect, failEffect, heartbeatEffect, enqueueEffect, claimEffects, withEffect,
  FencedOffError,
} = require('./lib/effects');
const { consumeKafka } = require('./lib/kafka');

// the outcome a span records, from what each call resolves to
const applied = (result) => (result ? 'applied' : 'duplicate');
const action = (result) => (result && typeof result === 'object' ? result.action : result);

module.exports = {
  apply: traced('idem_apply', apply, applied),
  tryApply: traced('idem_try_apply', tryApply, (outcome) => outcome),
  recordBatch: traced('idem_record_batch', recordBatch),
  batchParams,
  transaction,
  isRetryable,
  toText,
  paramsText,
  ParamError,
  beginEffect: traced('idem_effect_begin', beginEffect, action),
  completeEffect: traced('idem_effect_complete', completeEffect),
  failEffect: traced('idem_effect_fail', failEffect, action),
  heartbeatEffect,
  enqueueEffect: traced('idem_effect_enqueue', enqueueEffect, (enqueued) => (enqueued ? 'enqueued' : 'duplicate')),
  claimEffects,
  withEffect: traced('idem_effect', withEffect, action),
  FencedOffError,
  stats,
  consumeKafka,
};
