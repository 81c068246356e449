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
