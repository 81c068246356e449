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
-- that the name is not repeated in every key row.  Consumers are never
-- deleted: a removed id could be reused and merge two consumers' keys.
CREATE TABLE idem_consumer.consumers (
    consumer_id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text COLLATE "C" NOT NULL UNIQUE
        CHECK (octet_length(name) BETWEEN 1 AND 128),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- The exclusion constraint's index key: consumer id in four bytes, then the
-- key's bytes.  It is injective, so two rows have equal scoped keys exactly
-- when they have the same consumer and the same key.
CREATE FUNCTION idem_consumer.scoped_key(consumer_id integer, key text)
RETURNS bytea
AS 'MODULE_PATHNAME', 'idem_scoped_key'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

-- One row per processed message.  The row is kept narrow on purpose
-- (64 bytes of heap tuple for a 30-character key): processed_at is whole
-- seconds since 2000-01-01 00:00 UTC in an integer, which lasts until 2068;
-- uniqueness is enforced by an exclusion constraint over a hash index,
-- which stores a 4-byte hash per row instead of a copy of the key, and
-- compares the real keys of rows whose hashes collide.
CREATE TABLE idem_consumer.processed_keys (
    consumer_id integer NOT NULL,
    processed_at integer NOT NULL,
    key text NOT NULL,
    CONSTRAINT processed_keys_consumer_key_excl
        EXCLUDE USING hash ((idem_consumer.scoped_key(consumer_id, key)) WITH =)
);
COMMENT ON COLUMN idem_consumer.processed_keys.processed_at IS
    'seconds since 2000-01-01 00:00:00 UTC at the start of the recording transaction';

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

-- Readable view of the processed keys, for operators.
CREATE VIEW idem_processed_keys AS
    SELECT c.name AS consumer,
           k.key,
           timestamptz '2000-01-01 00:00:00+00'
               OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => k.processed_at)
               AS processed_at
      FROM idem_consumer.processed_keys AS k
      JOIN idem_consumer.consumers AS c USING (consumer_id);

-- Recording a key for a consumer, or removing one, is a privilege: a role
-- that can record keys can make any message be skipped.
REVOKE ALL ON FUNCTION idem_apply(text, text, text, text[], timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_is_processed(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_forget(text, text) FROM PUBLIC;
REVOKE ALL ON idem_processed_keys FROM PUBLIC;
