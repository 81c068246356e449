// Owns: consuming Kafka topics into PostgreSQL with a @platformatic/kafka
// Consumer, each batch applied through idem_record_batch and the caller's
// batch statement, with the consumer's positions (idem_position_advance)
// moved in the same transaction.  The positions in the database are the
// truth: on assignment each partition is read from its stored position,
// a message below it is skipped here without a query, and the broker's
// own offset commit is optional.
'use strict';

const { pipelinedTransaction } = require('./retry');
const { columnParams } = require('./apply');

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

// Up to max messages of a messages stream that are there now; waits for
// one if none, unless stopped() or the stream ended.
async function readBatch(stream, max, stopped) {
  for (;;) {
    const batch = [];
    let m;
    while (batch.length < max && (m = stream.read()) !== null) batch.push(m);
    if (batch.length > 0 || stopped()) return batch;
    if (stream.readableEnded || stream.destroyed) return batch;
    await readable(stream);
  }
}

// A position would move backwards: another member of the group applied
// further while this one held stale messages.
const BACKWARDS = 'IP001';

// One statement moves every partition of a batch, in the order of the
// arrays, which are sorted by topic and partition so that two members
// lock the rows of the partitions they share in the same order.  Each
// partition moves from the first offset of the batch (from_position): a
// position stored past it, by another member meanwhile, refuses the whole
// (IP001), so that the batch statement, sent in the same round trip, needs
// no answer of the advance first.
const ADVANCE = `SELECT idem_position_advance($1, u.topic, u.partition, u.position, u.log_end, u.from_position)
  FROM unnest($2::text[], $3::integer[], $4::bigint[], $5::bigint[], $6::bigint[]) WITH ORDINALITY
       AS u (topic, partition, position, log_end, from_position, n)
 ORDER BY u.n`;
// parsed once a connection: its plan is kept, as the batches' advance is
// the same statement each time
const ADVANCE_NAME = 'idem_consumer_kafka_advance';
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
// opts.db.  Each batch of messages runs, in one transaction sent in one
// round trip:
//   SELECT idem_position_advance(...)  for each partition of the batch
//   opts.sql with $1 = opts.consumer, $2 = the keys, $3 ... = opts.columns
// on the messages at or above the positions known here.  Returns
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
  // of a key in the batch, all without a query; overtaken: below the
  // position another member stored meanwhile, which refused the advance;
  // backwards: batches refused (IP001), the positions read again;
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

  // The part of partition (topic, partition) in parts, found by index.
  function partOf(parts, index, topic, partition) {
    const k = partitionKey(topic, partition);
    let part = index.get(k);
    if (!part) {
      part = { topic, partition, key: k, messages: [], ordered: true };
      index.set(k, part);
      parts.push(part);
    }
    return part;
  }

  // The messages of a batch by partition, in offset order, each offset
  // once (a client may deliver one twice), none below the position known.
  // A stream delivers a partition's messages in runs, in offset order:
  // one comparison a message finds the run's part and tells that the
  // part needs no sorting; a part out of order is sorted and its second
  // copies dropped.
  function byPartition(messages) {
    const parts = [];
    const index = new Map();
    let part = null;
    let last = -1n;
    for (const m of messages) {
      if (part === null || m.partition !== part.partition || m.topic !== part.topic) {
        part = partOf(parts, index, m.topic, m.partition);
        last = part.messages.length > 0 ? part.messages[part.messages.length - 1].offset : -1n;
      }
      if (m.offset <= last) part.ordered = false;
      else last = m.offset;
      part.messages.push(m);
    }
    const kept = [];
    for (const p of parts) {
      const from = positions.get(p.key) ?? -1n;
      if (!p.ordered) {
        const seen = new Set();
        p.messages = p.messages.filter((m) => !seen.has(m.offset) && seen.add(m.offset))
          .sort((a, b) => (a.offset < b.offset ? -1 : 1));
      }
      // in offset order: those below the position are the first ones
      let skip = 0;
      while (skip < p.messages.length && p.messages[skip].offset < from) skip++;
      if (skip > 0) p.messages = p.messages.slice(skip);
      if (p.messages.length > 0) kept.push(p);
    }
    return kept.sort((a, b) =>
      (a.topic < b.topic ? -1 : a.topic > b.topic ? 1 : a.partition - b.partition));
  }

  // One transaction in one round trip: advance every partition from the
  // first message of its part, and apply each key once (a key published
  // twice can land in one batch: the batch statement gets it once, so
  // that it need not take each key once itself).  Resolves to the count
  // applied, or null when a position was past the batch's first message
  // (IP001): nothing was done.
  async function applyParts(parts) {
    const arrays = [[], [], [], [], []];
    const batch = [];
    const keys = [];
    const seen = new Set();
    for (const part of parts) {
      const next = part.messages[part.messages.length - 1].offset + 1n;
      const end = logEnds.get(part.key);
      arrays[0].push(part.topic);
      arrays[1].push(part.partition);
      arrays[2].push(next.toString());
      arrays[3].push(end === undefined ? null : (end > next ? end : next).toString());
      arrays[4].push(part.messages[0].offset.toString());
      part.next = next;
      for (const m of part.messages) {
        const k = o.key(m);
        if (typeof k !== 'string')
          throw new TypeError(`the key of message ${batch.length} must be a string, not ${typeof k}`);
        if (seen.has(k)) continue;
        seen.add(k);
        keys.push(k);
        batch.push(m);
      }
    }
    const statements = [
      { name: ADVANCE_NAME, text: ADVANCE, values: [consumer, ...arrays] },
      { text: o.sql, values: [consumer, keys, ...columnParams(batch, o.columns || [])] },
    ];
    const inside = o.onApplied ? ([, result]) => o.onApplied(batch, result) : undefined;
    try {
      await pipelinedTransaction(db, statements, o.retry, inside);
      return batch.length;
    } catch (err) {
      if (err && err.code === BACKWARDS) return null;
      throw err;
    }
  }

  // The broker's offsets, a copy of the positions for the tools that read
  // the group's: committed in the background, not awaited by the batches,
  // the latest of each partition, one commit at a time.
  const toCommit = new Map();
  let committing = null;
  function commitOffsets(parts) {
    for (const part of parts)
      toCommit.set(part.key, part.messages[part.messages.length - 1]);
    if (!committing) committing = commitLoop();
  }
  async function commitLoop() {
    while (toCommit.size > 0) {
      const last = [...toCommit.values()];
      toCommit.clear();
      await Promise.all(last.map((m) => m.commit().catch(() => {})));
    }
    committing = null;
  }

  const partsSize = (parts) => parts.reduce((n, part) => n + part.messages.length, 0);

  async function handleBatch(messages) {
    counts.batches++;
    counts.messages += messages.length;
    refreshLogEnds();
    let applied = 0;
    let overtaken = 0;
    let parts = byPartition(messages);
    for (let attempt = 0; parts.length > 0; attempt++) {
      const done = await applyParts(parts);
      if (done !== null) {
        applied = done;
        for (const part of parts) positions.set(part.key, part.next);
        if (o.commitOffsets) commitOffsets(parts);
        break;
      }
      // another member went further: read where, and skip what it applied
      counts.backwards++;
      if (attempt >= o.maxBackwardsRetries) throw new Error('positions kept moving past this batch');
      await readPositions();
      const before = partsSize(parts);
      parts = byPartition(messages);
      overtaken += before - partsSize(parts);
    }
    const batch = { messages: messages.length, applied, skipped: messages.length - applied - overtaken, overtaken };
    counts.applied += batch.applied;
    counts.skipped += batch.skipped;
    counts.overtaken += batch.overtaken;
    if (o.onBatch) o.onBatch(batch);
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
        const batch = await readBatch(stream, o.maxBatch, () => closing);
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
      await committing;
    },
  };
}

module.exports = { consumeKafka, readBatch, BACKWARDS };
