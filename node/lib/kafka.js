// Owns: consuming Kafka topics into PostgreSQL with a @platformatic/kafka
// Consumer, each batch applied through idem_record_batch and the caller's
// batch statement, with the consumer's positions (idem_position_advance)
// moved in the same transaction.  The positions in the database are the
// truth: on assignment each partition is read from its stored position,
// a message below it is skipped here without a query, and the broker's
// own offset commit is optional.
'use strict';


// Resolves at the stream's next 'readable', 'end' or 'close', leaving no
// listener behind.
function readable(stream) {
  return new Promise((resolve) => {
    const done = () => {
      for (const e of ['readable', 'end', 'close']) stream.removeListener(e, done);
      resolve();
    };
    for (const e of ['readable', 'end', 'close']) stream.on(e, done);
  });
}
const { transaction } = require('./retry');
const { batchParams } = require('./apply');

// A position would move backwards: another member of the group applied
// further while this one held stale messages.
const BACKWARDS = 'IP001';

// One statement moves every partition of a batch, in the order of the
// arrays, which are sorted by topic and partition so that two members
// lock the rows of the partitions they share in the same order.
const ADVANCE = `SELECT idem_position_advance($1, u.topic, u.partition, u.position, u.log_end) AS before
  FROM unnest($2::text[], $3::integer[], $4::bigint[], $5::bigint[]) WITH ORDINALITY
       AS u (topic, partition, position, log_end, n)
 ORDER BY u.n`;
const POSITIONS = 'SELECT topic, "partition", "position" FROM idem_positions($1)';

const DEFAULTS = { maxBatch: 500, commitOffsets: false, logEndIntervalMs: 1000, maxBackwardsRetries: 10,
  maxStreamRestarts: 10, streamRestartDelayMs: 1000 };

const partitionKey = (topic, partition) => `${topic}:${partition}`;

function checkOptions(o) {
  if (!o || typeof o !== 'object') throw new TypeError('the options must be an object');
  if (!o.kafka || typeof o.kafka.consume !== 'function')
    throw new TypeError('kafka must be a @platformatic/kafka Consumer');
  if (!o.db || typeof o.db.query !== 'function') throw new TypeError('db must be a pg Pool or Client');
  if (typeof o.consumer !== 'string' || o.consumer === '') throw new TypeError('consumer must be a non-empty string');
  if (!Array.isArray(o.topics) || o.topics.length === 0 || o.topics.some((t) => typeof t !== 'string'))
    throw new TypeError('topics must be a non-empty array of strings');
  if (typeof o.key !== 'function') throw new TypeError('key must be a function of a message');
  if (typeof o.sql !== 'string') throw new TypeError('sql must be a string');
  if (!Number.isInteger(o.maxBatch) || o.maxBatch < 1) throw new TypeError('maxBatch must be a positive integer');
}

// Consume opts.topics with opts.kafka (a @platformatic/kafka Consumer,
// created by the caller with its groupId, brokers and deserializers) into
// opts.db.  Each batch of messages runs, in one transaction:
//   SELECT idem_position_advance(...)  for each partition of the batch
//   opts.sql with $1 = opts.consumer, $2 = the keys, $3 ... = opts.columns
// on the messages at or above the positions before.  Returns
// { done, close, counts }: done settles when the run stops (rejects on
// an error of the broker or the database), close() stops it.
function consumeKafka(options) {
  const o = { ...DEFAULTS, ...(options || {}) };
  checkOptions(o);
  const { kafka, db, consumer, topics } = o;
  const positions = new Map();        // 'topic:partition' -> bigint, as last read or written
  const logEnds = new Map();          // 'topic:partition' -> bigint, as last listed
  let owned = new Set();
  let stream = null;
  let closing = false;
  let logEndAt = 0;
  let logEndRefresh = null;
  // skipped: below the position known here, a second copy of an offset or
  // of a key in the batch, all without a query; overtaken:
  // below the position another member stored meanwhile, which the advance
  // returned; backwards: batches refused whole (IP001) and read again;
  // streamRestarts: streams opened again after one ended or failed
  const counts = { batches: 0, messages: 0, skipped: 0, overtaken: 0, applied: 0, assignments: 0, backwards: 0,
    streamRestarts: 0 };

  async function readPositions() {
    const { rows } = await db.query(POSITIONS, [consumer]);
    for (const r of rows) positions.set(partitionKey(r.topic, r.partition), BigInt(r.position));
  }

  // The log-end offsets of the topics' partitions, listed at most every
  // logEndIntervalMs, in the background: the lag is for monitoring.
  function refreshLogEnds() {
    if (logEndRefresh || Date.now() - logEndAt < o.logEndIntervalMs) return;
    logEndAt = Date.now();
    logEndRefresh = kafka.listOffsets({ topics }).then((offsets) => {
      for (const [topic, partitions] of offsets)
        partitions.forEach((end, p) => logEnds.set(partitionKey(topic, p), BigInt(end)));
    }, () => {}).finally(() => { logEndRefresh = null; });
  }

  // A partition newly assigned to this member is read from its stored
  // position.  The stream may already fetch it from an older offset:
  // reading below the position only delivers messages skipped here.
  async function onJoin({ assignments }) {
    const now = new Set();
    for (const a of assignments || []) for (const p of a.partitions) now.add(partitionKey(a.topic, p));
    const fresh = [...now].filter((k) => !owned.has(k));
    owned = now;
    counts.assignments++;
    if (fresh.length === 0 || !stream) return;
    await readPositions();
    for (const k of fresh) if (positions.has(k)) stream.offsetsToFetch.set(k, positions.get(k));
  }

  // The messages of a batch by partition, in offset order, each offset
  // once (a client may deliver one twice), none below the position known.
  function byPartition(messages) {
    const parts = new Map();
    for (const m of messages) {
      const k = partitionKey(m.topic, m.partition);
      let part = parts.get(k);
      if (!part) parts.set(k, part = { topic: m.topic, partition: m.partition, messages: [] });
      part.messages.push(m);
    }
    for (const [k, part] of parts) {
      const from = positions.get(k) ?? -1n;
      const seen = new Set();
      part.messages = part.messages
        .filter((m) => m.offset >= from && !seen.has(m.offset) && seen.add(m.offset))
        .sort((a, b) => (a.offset < b.offset ? -1 : 1));
      if (part.messages.length === 0) parts.delete(k);
    }
    return [...parts.values()].sort((a, b) =>
      (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
  }

  // One transaction: advance every partition, keep the messages at or
  // above each position before, each key once, apply them.  Resolves to
  // the messages applied and those below the positions before, or null
  // when a position was further than the batch (IP001): nothing was done.
  async function applyParts(parts) {
    const arrays = [[], [], [], []];
    for (const part of parts) {
      const next = part.messages[part.messages.length - 1].offset + 1n;
      const end = logEnds.get(partitionKey(part.topic, part.partition));
      arrays[0].push(part.topic);
      arrays[1].push(part.partition);
      arrays[2].push(next.toString());
      arrays[3].push(end === undefined ? null : (end > next ? end : next).toString());
      part.next = next;
    }
    try {
      return await transaction(db, async (client) => {
        const { rows } = await client.query(ADVANCE, [consumer, ...arrays]);
        // a key published twice can land in one batch: the batch statement
        // gets it once, so that it need not take each key once itself
        const batch = [];
        const keys = new Set();
        let overtaken = 0;
        parts.forEach((part, i) => {
          const before = rows[i].before === null ? -1n : BigInt(rows[i].before);
          for (const m of part.messages) {
            if (m.offset < before) { overtaken++; continue; }
            const k = o.key(m);
            if (!keys.has(k)) batch.push(m);
            keys.add(k);
          }
        });
        if (batch.length > 0) {
          const result = await client.query(o.sql, [consumer, ...batchParams(batch, o.key, o.columns || [])]);
          if (o.onApplied) o.onApplied(batch, result);
        }
        return { applied: batch.length, overtaken };
      }, o.retry);
    } catch (err) {
      if (err && err.code === BACKWARDS) return null;
      throw err;
    }
  }

  async function handleBatch(messages) {
    counts.batches++;
    counts.messages += messages.length;
    refreshLogEnds();
    let done = null;
    for (let attempt = 0; ; attempt++) {
      const parts = byPartition(messages);
      if (parts.length === 0) break;
      done = await applyParts(parts);
      if (done !== null) {
        for (const part of parts) positions.set(partitionKey(part.topic, part.partition), part.next);
        if (o.commitOffsets)
          await Promise.all(parts.map((part) => part.messages[part.messages.length - 1].commit()
            .catch(() => {})));     // the database holds the positions; the broker's is a copy
        break;
      }
      // another member went further: read where, and skip what it applied
      counts.backwards++;
      if (attempt >= o.maxBackwardsRetries) throw new Error('positions kept moving past this batch');
      await readPositions();
    }
    const { applied, overtaken } = done || { applied: 0, overtaken: 0 };
    const batch = { messages: messages.length, applied, skipped: messages.length - applied - overtaken, overtaken };
    counts.applied += batch.applied;
    counts.skipped += batch.skipped;
    counts.overtaken += batch.overtaken;
    if (o.onBatch) o.onBatch(batch);
  }

  // Up to maxBatch messages that are there now; waits for one if none.
  async function nextBatch() {
    for (;;) {
      const batch = [];
      let m;
      while (batch.length < o.maxBatch && (m = stream.read()) !== null) batch.push(m);
      if (batch.length > 0 || closing) return batch;
      if (stream.readableEnded || stream.destroyed) return batch;
      await readable(stream);
    }
  }

  // The stored positions of the topics, as the stream's starting offsets.
  async function startOffsets() {
    await readPositions();
    const offsets = [];
    for (const [k, position] of positions) {
      const i = k.lastIndexOf(':');
      const topic = k.slice(0, i);
      if (topics.includes(topic)) offsets.push({ topic, partition: Number(k.slice(i + 1)), offset: position });
    }
    return offsets;
  }

  // Reads batches from one stream until it ends, fails or the run closes;
  // resolves to the stream's error, if any.
  async function consumeStream() {
    stream = await kafka.consume({
      topics, autocommit: false, mode: 'manual', fallbackMode: 'earliest', offsets: await startOffsets(),
    });
    owned = new Set();
    for (const a of kafka.assignments || [])
      for (const p of a.partitions) owned.add(partitionKey(a.topic, p));
    let streamError = null;
    stream.on('error', (err) => { streamError = err; });
    // a 'readable' listener makes the stream fetch
    stream.on('readable', () => {});
    try {
      while (!closing) {
        const batch = await nextBatch();
        if (joinError) throw fatal(joinError);
        if (batch.length > 0) await handleBatch(batch).catch((err) => { throw fatal(err); });
        else if (stream.readableEnded || stream.destroyed) break;
      }
    } finally {
      if (!stream.destroyed) await stream.close().catch(() => {});
    }
    return streamError || new Error('the stream ended');
  }

  // the errors that end the run: those of a batch or of an assignment
  // (the database's, the caller's functions'), not those of a stream
  const fatalErrors = new WeakSet();
  const fatal = (err) => {
    if (err !== null && typeof err === 'object') fatalErrors.add(err);
    return err;
  };

  // assignments are handled one after the other; an error stops the run
  let joined = Promise.resolve();
  let joinError = null;
  const joinHandler = (payload) => {
    joined = joined.then(() => onJoin(payload)).catch((err) => { joinError = joinError || err; });
  };

  // A stream that ends or fails (the broker restarting, the connection
  // lost) is opened again from the stored positions, up to
  // o.maxStreamRestarts times in a row without a batch in between; an
  // error of a batch (the database's, the caller's functions') ends the run.
  async function run() {
    kafka.on('consumer:group:join', joinHandler);
    try {
      for (let failures = 0; !closing; failures++) {
        const batchesBefore = counts.batches;
        let err;
        try {
          err = await consumeStream();
        } catch (e) {
          if (fatalErrors.has(e) || typeof e !== 'object' || e === null) throw e;
          err = e;                                  // consume() itself failed: the broker
        }
        if (closing) break;
        if (counts.batches > batchesBefore) failures = 0;
        if (failures >= o.maxStreamRestarts) throw err;
        counts.streamRestarts++;
        await new Promise((r) => setTimeout(r, o.streamRestartDelayMs));
      }
    } finally {
      kafka.removeListener('consumer:group:join', joinHandler);
    }
  }

  const done = run();
  done.catch(() => {});
  return {
    done,
    counts,
    positions,
    // Stops after the batch in hand; the caller closes its Consumer.
    async close() {
      closing = true;
      if (stream) await stream.close().catch(() => {});
      await done.catch(() => {});
    },
  };
}

module.exports = { consumeKafka, BACKWARDS };
