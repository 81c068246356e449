/* extension/idem_consumer--1.0.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idem_consumer" to load this file. \quit

--
-- Storage.  The tables live in their own schema, whatever schema the
-- functions are installed in, so that the C code can name them fully
-- qualified.  Callers never touch them directly: idem_apply() and friends
-- read and write them as the owner of the tables.
--
CREATE SCHEMA idem_consumer;
COMMENT ON SCHEMA idem_consumer IS 'storage of the idem_consumer extension';

-- One row per consumer name; processed keys refer to it by a small id so
-- that the name is not repeated in every key row.  Sessions cache the
-- name-to-id mapping, so consumers are never renamed or deleted.
CREATE TABLE idem_consumer.consumers (
    consumer_id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text COLLATE "C" NOT NULL UNIQUE
        CHECK (octet_length(name) BETWEEN 1 AND 128),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- A 32-bit hash of (consumer id, key), the unique index key of
-- processed_keys.  Indexing the hash instead of the key keeps the index at
-- one 16-byte tuple per key; two different keys of a consumer that hash
-- alike are told apart through key_collisions below.
CREATE FUNCTION idem_consumer.key_hash(consumer_id integer, key text)
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_key_hash'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- One row per processed message: 64 bytes of heap tuple for a 30-character
-- key.  processed_at is whole seconds since 2000-01-01 00:00 UTC in an
-- integer (it lasts until 2068), so that the row fits that size.
--
-- A key is recorded when it is the key of the row of its hash here, or a
-- row of key_collisions.  A key is in key_collisions only while this table
-- holds a row of the same hash with a different key (the "occupant"):
-- whoever deletes an occupant moves one of its collisions in its place.
CREATE TABLE idem_consumer.processed_keys (
    consumer_id integer NOT NULL,
    processed_at integer NOT NULL,
    key text COLLATE "C" NOT NULL
);
CREATE UNIQUE INDEX processed_keys_hash
    ON idem_consumer.processed_keys (idem_consumer.key_hash(consumer_id, key));
COMMENT ON COLUMN idem_consumer.processed_keys.processed_at IS
    'seconds since 2000-01-01 00:00:00 UTC at the start of the recording transaction';

-- Keys whose hash was taken by another key of processed_keys.  With a
-- 32-bit hash a consumer with n live keys has about n^2 / 2^33 of them:
-- some hundred for a million keys.
CREATE TABLE idem_consumer.key_collisions (
    consumer_id integer NOT NULL,
    processed_at integer NOT NULL,
    key text COLLATE "C" NOT NULL,
    PRIMARY KEY (consumer_id, key)
);
CREATE INDEX key_collisions_hash
    ON idem_consumer.key_collisions (idem_consumer.key_hash(consumer_id, key));

--
-- API
--
CREATE FUNCTION idem_apply(key text, consumer text, sql text,
                           params text[] DEFAULT NULL,
                           event_time timestamptz DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_apply(text, text, text, text[], timestamptz) IS
    'record (consumer, key) and run sql with params once; false for a duplicate';

CREATE FUNCTION idem_is_processed(key text, consumer text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_is_processed'
LANGUAGE C STABLE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_is_processed(text, text) IS
    'whether (consumer, key) is recorded and visible to this transaction';

CREATE FUNCTION idem_forget(key text, consumer text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_forget(text, text) IS
    'remove (consumer, key) so that the message is processed again; true if it was recorded';

CREATE FUNCTION idem_record_batch(consumer text, keys text[])
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'idem_record_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idem_record_batch(text, text[]) IS
    'record every key of a batch for consumer; returns the keys that were new, each once';

-- Readable view of the processed keys, for operators.
CREATE VIEW idem_processed_keys AS
    SELECT c.name AS consumer,
           k.key,
           timestamptz '2000-01-01 00:00:00+00'
               OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => k.processed_at)
               AS processed_at
      FROM (SELECT consumer_id, processed_at, key
              FROM idem_consumer.processed_keys
            UNION ALL
            SELECT consumer_id, processed_at, key
              FROM idem_consumer.key_collisions) AS k
      JOIN idem_consumer.consumers AS c USING (consumer_id);

-- Recording a key for a consumer, or removing one, is a privilege: a role
-- that can record keys can make any message be skipped.
REVOKE ALL ON FUNCTION idem_apply(text, text, text, text[], timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_is_processed(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_forget(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_record_batch(text, text[]) FROM PUBLIC;
REVOKE ALL ON idem_processed_keys FROM PUBLIC;

--
-- Dead-letter queue (see docs/dead_letters.md).
--
-- idem_try_apply() parks a message whose business SQL fails permanently
-- here, in the caller's transaction, and returns 'dead_lettered' instead of
-- raising.  The key of the message is recorded in processed_keys like any
-- other, so redeliveries are not run; the entry of the key tells them
-- apart from applied messages.  Operators replay or discard entries.
--

-- What idem_try_apply() and idem_dlq_replay() did with a message.
CREATE TYPE idem_outcome AS ENUM ('applied', 'duplicate', 'dead_lettered');
COMMENT ON TYPE idem_outcome IS
    'applied: the business SQL ran; duplicate: the key was already applied; dead_lettered: the message is parked in the dead-letter queue';

-- One row per dead-lettered (consumer, key), kept after it is resolved:
-- a discarded entry still marks its key as dead-lettered for redeliveries.
-- settings holds {name, value} pairs of the settings that change how sql
-- and params read; a replay restores them.  The error columns describe the
-- last failure; attempts counts runs of the SQL (the first delivery and
-- each replay), not redeliveries.
CREATE TABLE idem_consumer.dead_letters (
    dead_letter_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_id integer NOT NULL REFERENCES idem_consumer.consumers,
    key text COLLATE "C" NOT NULL,
    sql text NOT NULL,
    params text[],
    event_time timestamptz,
    settings text[] NOT NULL,
    sqlstate text NOT NULL CHECK (octet_length(sqlstate) = 5),
    message text NOT NULL,
    detail text,
    hint text,
    context text,
    first_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    last_failed_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    attempts integer NOT NULL DEFAULT 1 CHECK (attempts >= 1),
    dead_lettered_by text NOT NULL,
    status text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'replayed', 'discarded')),
    resolved_at timestamptz,
    resolved_by text,
    discard_reason text,
    UNIQUE (consumer_id, key),
    CHECK ((status = 'pending') = (resolved_at IS NULL AND resolved_by IS NULL)),
    CHECK ((status = 'discarded') = (discard_reason IS NOT NULL))
);
-- pending entries of a consumer in replay order; also serves depth and age
CREATE INDEX dead_letters_pending
    ON idem_consumer.dead_letters (consumer_id, dead_letter_id)
    WHERE status = 'pending';

CREATE FUNCTION idem_try_apply(key text, consumer text, sql text,
                               params text[] DEFAULT NULL,
                               event_time timestamptz DEFAULT NULL)
RETURNS idem_outcome
AS 'MODULE_PATHNAME', 'idem_try_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz) IS
    'like idem_apply, but park the message in the dead-letter queue on a permanent error instead of raising';

CREATE FUNCTION idem_dlq_replay(id bigint)
RETURNS idem_outcome
AS 'MODULE_PATHNAME', 'idem_dlq_replay'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_dlq_replay(bigint) IS
    'run a pending dead-letter entry again under its key: applied, or dead_lettered with the new error';

CREATE FUNCTION idem_dlq_replay(consumer text, max_count integer DEFAULT 100)
RETURNS TABLE (id bigint, outcome idem_outcome)
AS 'MODULE_PATHNAME', 'idem_dlq_replay_consumer'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idem_dlq_replay(text, integer) IS
    'replay up to max_count pending entries of a consumer, oldest first, skipping entries other sessions are replaying';

CREATE FUNCTION idem_dlq_discard(id bigint, reason text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_dlq_discard'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_dlq_discard(bigint, text) IS
    'resolve a pending dead-letter entry without running it; redeliveries of its key stay skipped';

-- Readable view of the dead-letter queue, pending and resolved entries.
CREATE VIEW idem_dead_letters AS
    SELECT d.dead_letter_id AS id,
           c.name AS consumer,
           d.key,
           d.status,
           d.sqlstate,
           d.message,
           d.detail,
           d.hint,
           d.context,
           d.attempts,
           d.first_failed_at,
           d.last_failed_at,
           d.event_time,
           d.sql,
           d.params,
           d.settings,
           d.dead_lettered_by,
           d.resolved_at,
           d.resolved_by,
           d.discard_reason
      FROM idem_consumer.dead_letters AS d
      JOIN idem_consumer.consumers AS c USING (consumer_id);

-- Dead-lettering is recording a key, like idem_apply.  Replaying and
-- discarding are for the operators of a consumer, and the view shows the
-- SQL and parameters of messages: grant them to operator roles only.
REVOKE ALL ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_dlq_replay(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_dlq_replay(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_dlq_discard(bigint, text) FROM PUBLIC;
REVOKE ALL ON idem_dead_letters FROM PUBLIC;

--
-- Counters (need shared_preload_libraries) and metrics
--
CREATE FUNCTION idem_stats_internal(
    OUT consumer text,
    OUT applied bigint,
    OUT duplicates bigint,
    OUT failed bigint,
    OUT dead_lettered bigint,
    OUT duplicate_ratio double precision,
    OUT latency_p50_ms double precision,
    OUT latency_p95_ms double precision,
    OUT latency_p99_ms double precision,
    OUT latency_max_ms double precision,
    OUT lag_last_ms double precision,
    OUT lag_p95_ms double precision,
    OUT last_applied_at timestamptz,
    OUT last_duplicate_at timestamptz,
    OUT stats_reset timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_internal'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW idem_stats AS SELECT * FROM idem_stats_internal();
COMMENT ON VIEW idem_stats IS 'per-consumer outcomes, latency and lag of idem_apply';

CREATE FUNCTION idem_stats_info_internal(
    OUT consumers bigint,
    OUT max_consumers integer,
    OUT untracked_calls bigint,
    OUT stats_reset timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_stats_info_internal'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW idem_stats_info AS SELECT * FROM idem_stats_info_internal();
COMMENT ON VIEW idem_stats_info IS 'counters of idem_consumer that are not per consumer';

CREATE FUNCTION idem_stats_reset(consumer text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION idem_metrics()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_metrics'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_metrics() IS 'counters in the Prometheus text exposition format 0.0.4';

-- What the tables hold, per consumer; reads every stored key.
CREATE VIEW idem_consumers AS
    SELECT c.name AS consumer,
           c.created_at,
           keys.keys_stored,
           keys.oldest_processed_at,
           keys.newest_processed_at,
           dlq.dead_letters_pending,
           dlq.oldest_pending_age
      FROM idem_consumer.consumers AS c
     CROSS JOIN LATERAL (
           SELECT pg_catalog.count(*) AS keys_stored,
                  timestamptz '2000-01-01 00:00:00+00'
                      OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => pg_catalog.min(k.processed_at))
                      AS oldest_processed_at,
                  timestamptz '2000-01-01 00:00:00+00'
                      OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => pg_catalog.max(k.processed_at))
                      AS newest_processed_at
             FROM (SELECT processed_at FROM idem_consumer.processed_keys
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id) AS k) AS keys
     CROSS JOIN LATERAL (
           SELECT pg_catalog.count(*) AS dead_letters_pending,
                  pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(d.first_failed_at)
                      AS oldest_pending_age
             FROM idem_consumer.dead_letters AS d
            WHERE d.consumer_id OPERATOR(pg_catalog.=) c.consumer_id
              AND d.status OPERATOR(pg_catalog.=) 'pending') AS dlq;

GRANT SELECT ON idem_stats, idem_stats_info TO PUBLIC;
REVOKE ALL ON FUNCTION idem_stats_reset(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_metrics() TO pg_monitor;
REVOKE ALL ON idem_consumers FROM PUBLIC;
GRANT SELECT ON idem_consumers TO pg_monitor;

--
-- Retention (src/retention.c, src/purge_worker.c, docs/retention.md)
--
-- A key expires when it is older than its consumer's retention window
-- counted back from the newest key that consumer recorded (its latest
-- activity), never from the wall clock: a consumer that stops keeps all
-- its keys until it applies messages again.  idem_purge() and the
-- background worker remove expired keys.
--

-- Per-consumer windows.  A consumer without a row follows the
-- idem_consumer.retention setting (7 days unless configured); a row with a
-- NULL retention keeps the consumer's keys forever.
CREATE TABLE idem_consumer.retention_settings (
    consumer_id integer PRIMARY KEY REFERENCES idem_consumer.consumers,
    retention interval
        CHECK (retention OPERATOR(pg_catalog.>) interval '0'
               AND retention OPERATOR(pg_catalog.<=) interval '100 years'),
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

CREATE FUNCTION idem_set_retention(consumer text, retention interval)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_set_retention'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_set_retention(text, interval) IS
    'set how long a consumer''s keys are kept after its latest activity; NULL keeps them forever';

CREATE FUNCTION idem_reset_retention(consumer text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_reset_retention'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_reset_retention(text) IS
    'make a consumer follow idem_consumer.retention again';

CREATE FUNCTION idem_purge(consumer text DEFAULT NULL, batch_size integer DEFAULT 10000)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_purge'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_purge(text, integer) IS
    'remove expired keys, at most batch_size per consumer; call until it returns 0';

-- idem_consumer.retention as an interval, NULL for -1 (forever).
CREATE FUNCTION idem_consumer.default_retention()
RETURNS interval
AS 'MODULE_PATHNAME', 'idem_default_retention'
LANGUAGE C STABLE PARALLEL SAFE;

-- Each consumer's window: its own, or the default.
CREATE VIEW idem_retention AS
    SELECT c.name AS consumer,
           CASE WHEN s.consumer_id IS NULL THEN idem_consumer.default_retention()
                ELSE s.retention END AS retention,
           s.consumer_id IS NULL AS is_default
      FROM idem_consumer.consumers AS c
      LEFT JOIN idem_consumer.retention_settings AS s
        ON s.consumer_id OPERATOR(pg_catalog.=) c.consumer_id;
COMMENT ON VIEW idem_retention IS
    'retention window of each consumer; NULL keeps its keys forever';

-- Shortening a window or purging removes keys: operators only.
REVOKE ALL ON FUNCTION idem_set_retention(text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_reset_retention(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_purge(text, integer) FROM PUBLIC;
REVOKE ALL ON idem_retention FROM PUBLIC;
GRANT SELECT ON idem_retention TO pg_monitor;

--
-- pg_dump: the storage is data, not part of the extension's definition;
-- dump it so that a restored database still knows every processed key.
--
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.consumers', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.consumers_consumer_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.processed_keys', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.key_collisions', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.dead_letters_dead_letter_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.retention_settings', '');
