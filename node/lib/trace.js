// Owns: the OpenTelemetry spans of the package's calls, and the trace
// context each statement carries to the server as an SQL comment.
//
// @opentelemetry/api is an optional peer dependency, looked up once: when
// the application does not have it, every call goes straight to the
// function it wraps.  With it, each call of a message, a batch or an
// effect is a span of kind CONSUMER named as OpenTelemetry's messaging
// conventions name a processing span, with the consumer as the consumer
// group, the message's destination, partition and id when it names them,
// the idempotency key, and the outcome (applied, duplicate,
// dead_lettered, reused, or the effect's action); never the parameters or
// the SQL.  Every statement sent inside a span (or any active trace
// context) ends with the context in the sqlcommenter format,
// /*traceparent='00-...'*/, so that pg_stat_activity and the server log
// show which trace a statement belongs to.
'use strict';

let api = null;
try {
  api = require('@opentelemetry/api');
} catch (err) {
  if (err.code !== 'MODULE_NOT_FOUND') throw err;
}

const { version } = require('../package.json');
const tracer = api && api.trace.getTracer('idem-consumer', version);
const KEY_REUSED = 'IK001';

// The attributes of one message or effect: what tells it apart, never
// what it carries.
function messageAttributes(operation, msg) {
  const attributes = {
    'messaging.operation.type': 'process',
    'messaging.operation.name': operation,
  };
  if (!msg || typeof msg !== 'object') return attributes;
  const put = (name, value) => {
    if (typeof value === 'string' || typeof value === 'number') attributes[name] = value;
  };
  put('messaging.system', msg.system);
  put('messaging.consumer.group.name', msg.consumer);
  put('messaging.destination.name', msg.destination);
  if (msg.partition !== undefined && msg.partition !== null)
    put('messaging.destination.partition.id', String(msg.partition));
  put('messaging.message.id', msg.messageId);
  put('idem_consumer.key', msg.key);
  if (Array.isArray(msg.messages)) attributes['messaging.batch.message_count'] = msg.messages.length;
  return attributes;
}

// traced(operation, fn, outcomeOf): fn(db, msg, ...rest) in a span when
// the application has the OpenTelemetry API; outcomeOf(result) names the
// outcome recorded on the span (undefined: none).
function traced(operation, fn, outcomeOf) {
  if (!tracer) return fn;
  const wrapped = function (db, msg, ...rest) {
    const name = msg && typeof msg.destination === 'string' ? `process ${msg.destination}` : `process ${operation}`;
    return tracer.startActiveSpan(name, { kind: api.SpanKind.CONSUMER, attributes: messageAttributes(operation, msg) },
      async (span) => {
        try {
          const result = await fn(db, msg, ...rest);
          const outcome = outcomeOf ? outcomeOf(result) : undefined;
          if (outcome !== undefined) span.setAttribute('idem_consumer.outcome', outcome);
          return result;
        } catch (err) {
          if (err && err.code === KEY_REUSED) span.setAttribute('idem_consumer.outcome', 'reused');
          span.recordException(err);
          span.setStatus({ code: api.SpanStatusCode.ERROR, message: err && err.message });
          throw err;
        } finally {
          span.end();
        }
      });
  };
  Object.defineProperty(wrapped, 'name', { value: fn.name });
  return wrapped;
}

// The sqlcommenter comment of the active trace context ('' when there is
// none): its W3C fields, URL-encoded and sorted, as key='value' pairs.
function traceComment() {
  if (!api) return '';
  const carrier = {};
  api.propagation.inject(api.context.active(), carrier);
  const keys = Object.keys(carrier).sort();
  if (keys.length === 0) return '';
  return ' /*' + keys.map((k) => `${encodeURIComponent(k)}='${encodeURIComponent(carrier[k])}'`).join(',') + '*/';
}

// The query with the trace context appended to its text.
function withTraceComment(query) {
  const comment = traceComment();
  return comment === '' ? query : { ...query, text: query.text + comment };
}

module.exports = { traced, withTraceComment, tracing: tracer !== null };
