/* extension/idem_consumer--1.2.sql */

-- complain if script is sourced in psql, rather than via CREATE EXTENSION
\echo Use "CREATE EXTENSION idem_consumer" to load this file. \quit

--
-- Version 1.2, installed afresh.  CREATE EXTENSION runs this script alone;
-- a database at 1.0 or 1.1 gets 1.2 through idem_consumer--1.0--1.1.sql
-- and idem_consumer--1.1--1.2.sql instead.  Both ways give the same
-- objects, but for what an updated database keeps of its keys recorded
-- before 1.2 (docs/upgrading.md): the tables processed_keys and
-- key_collisions, their indexes on the 32-bit key_hash(integer, text), and
-- that function.  A database created here never had such keys, so it has
-- none of them: its keys are in the ring of generations from the first
-- one on.  test/t/020_upgrade.pl compares the catalogs of both ways
-- object by object and names those differences; it fails on any other.
--
-- Sections: storage of consumers; the key store (hash seed, the ring of
-- generations, their filters and operation); the API that records keys;
-- the dead-letter queue; counters and metrics; retention; owners and the
-- key-reuse check; external effects; the views that show keys, messages
-- and effects, and idem_consumers; Citus; positions of Kafka consumers.
--

--
-- Storage.  The tables live in their own schema, whatever schema the
-- functions are installed in, so that the C code can name them fully
-- qualified.  Callers never touch them directly: idem_apply() and friends
-- read and write them as the owner of the tables.  pg_dump dumps their
-- rows (pg_extension_config_dump): they are data, not part of the
-- extension's definition, so that a restored database still knows every
-- processed key.
--
CREATE SCHEMA idem_consumer;
COMMENT ON SCHEMA idem_consumer IS 'storage of the idem_consumer extension';

-- One row per consumer name; processed keys refer to it by a small id so
-- that the name is not repeated in every key row.  Sessions cache the
-- name-to-id mapping, so consumers are never renamed or deleted.
--
-- Every consumer has an owner role (src/consumers.c): only roles with its
-- privileges (and superusers) act on the consumer: record or forget its
-- keys, replay or discard its dead letters, purge it, change its settings,
-- reset its counters.  A consumer is created, by its first use or by
-- idem_consumer_create(), only for a role with EXECUTE on
-- idem_consumer_create(text, regrole), and owned by that role by default.
-- The owner is a regrole so that pg_dump writes it by name and a restore
-- into another cluster finds the same role.  NULL is left for consumers
-- created under 1.0 and carried over by an update, which have no owner.
--
-- check_fingerprint: whether the keys of the consumer keep a 32-bit
-- fingerprint of their message (src/fingerprint.c), a hash of the
-- business SQL and its parameters or of the caller's own fingerprint
-- text.  A redelivery with the same key and another fingerprint is not a
-- duplicate but a producer's bug, and is refused (SQLSTATE IK001) instead
-- of being silently skipped.
CREATE TABLE idem_consumer.consumers (
    consumer_id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name text COLLATE "C" NOT NULL UNIQUE
        CHECK (octet_length(name) BETWEEN 1 AND 128),
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    owner regrole,
    check_fingerprint boolean NOT NULL DEFAULT true
);
COMMENT ON COLUMN idem_consumer.consumers.owner IS
    'role whose privileges a role must have to act on the consumer; NULL for consumers created under 1.0, open to every role with EXECUTE';
COMMENT ON COLUMN idem_consumer.consumers.check_fingerprint IS
    'whether keys of the consumer keep the fingerprint of their message and redeliveries are compared with it';
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.consumers', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.consumers_consumer_id_seq', '');

--
-- The key store (src/keystore.c, src/keygen.c, docs/storage.md).
--
-- A key is recorded in a generation: a pair of tables, processed_keys_N
-- and key_collisions_N.  processed_keys_N is unique on
-- key_hash64(consumer_id, key), SipHash-2-4 of the pair keyed by this
-- database's secret seed; indexing the hash instead of the key keeps the
-- index small, and two different keys of a consumer that hash alike are
-- told apart through key_collisions_N.  With 64 bits a consumer needs
-- about 4 billion live keys before two of them are expected to share a
-- hash, and without the seed nobody can compute a key that takes another
-- key's place and makes its deliveries wait on the other's transaction.
--
-- The seed is made here, from pg_strong_random(), and is the database's
-- own: a dump does not carry it (a restore hashes the keys again with the
-- new database's seed as it loads them), nor does logical replication (a
-- subscriber hashes with its own).  It lives in a schema of its own, so
-- that a publication FOR TABLES IN SCHEMA idem_consumer, which a
-- subscriber of the storage uses (docs/replication.md), leaves it out: a
-- subscriber's initial copy of it would collide with the subscriber's own
-- seed.  Only the table's owner reads it.  Changing it turns the unique
-- index of every generation into garbage.
-- hash_bits keeps that many low bits of the hash: 64 always, but in the
-- test suites, which narrow it before the first key so that collisions
-- happen among the keys a test can make (none would in 64 bits).
--
CREATE SCHEMA idem_consumer_local;
COMMENT ON SCHEMA idem_consumer_local IS
    'what belongs to this database alone and is never published: the seed of the key hash';
CREATE TABLE idem_consumer_local.key_seed (
    k0 bigint NOT NULL,
    k1 bigint NOT NULL,
    hash_bits integer NOT NULL DEFAULT 64 CHECK (hash_bits BETWEEN 16 AND 64),
    single boolean PRIMARY KEY DEFAULT true CHECK (single)
);
REVOKE ALL ON idem_consumer_local.key_seed FROM PUBLIC;

CREATE FUNCTION idem_consumer.new_key_seed(OUT k0 bigint, OUT k1 bigint)
AS 'MODULE_PATHNAME', 'idem_new_key_seed'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION idem_consumer.new_key_seed() FROM PUBLIC;
INSERT INTO idem_consumer_local.key_seed (k0, k1)
SELECT k0, k1 FROM idem_consumer.new_key_seed();

-- Reads the seed through its cache in each session: IMMUTABLE holds for
-- as long as the seed does.  Not for PUBLIC: whoever could run it could
-- search for keys that share a hash.
CREATE FUNCTION idem_consumer.key_hash64(consumer_id integer, key text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_key_hash64_sql'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
REVOKE ALL ON FUNCTION idem_consumer.key_hash64(integer, text) FROM PUBLIC;

--
-- The generations: a ring of 16 pairs of tables of their own (a table
-- that inherits could not be distributed by Citus, nor partitioned by a
-- DBA).  key_generations says which pair is the current generation, which
-- takes new keys, and which are sealed: read only, probed for duplicates
-- until they expire (docs/storage.md).  They are made here once, so that
-- what pg_dump, a publication or Citus sees never changes as generations
-- come and go; an unused pair is empty.
--
-- One row per processed key: processed_at is whole seconds since
-- 2000-01-01 00:00 UTC in an integer (it lasts until 2068), so that the
-- row stays small.  fingerprint is that of the message, NULL while the
-- consumer's check is off (such keys are never compared).  A key is
-- recorded when it is the key of the row of its hash in processed_keys_N,
-- or a row of key_collisions_N; a key is in key_collisions_N only while
-- processed_keys_N holds a row of the same hash with a different key (the
-- "occupant"): whoever deletes an occupant moves one of its collisions in
-- its place.
--
-- Logical replication (docs/replication.md): a published table needs a
-- replica identity for its deletes and updates (idem_forget, the purge,
-- the no-op update that claims a key's hash).  The one unique index of
-- processed_keys_N is on an expression, which cannot be a replica
-- identity, so its identity is the full row: a few dozen bytes, which
-- cost the publisher nothing but the old row in the WAL of a delete or
-- update while wal_level is logical.  A second unique index on
-- (consumer_id, key) would turn off the fast path of idem_apply and
-- almost double the storage per key; a subscriber creates that index for
-- itself and makes it its own replica identity, as docs/replication.md
-- says.
--
DO $generations$
BEGIN
    FOR g IN 1..16 LOOP
        EXECUTE pg_catalog.format(
            'CREATE TABLE idem_consumer.%I (
                 consumer_id integer NOT NULL,
                 processed_at integer NOT NULL,
                 key text COLLATE "C" NOT NULL,
                 fingerprint integer)',
            'processed_keys_' || g);
        EXECUTE pg_catalog.format(
            'COMMENT ON COLUMN idem_consumer.%I.processed_at IS %L',
            'processed_keys_' || g,
            'seconds since 2000-01-01 00:00:00 UTC at the start of the recording transaction');
        EXECUTE pg_catalog.format(
            'CREATE UNIQUE INDEX %I ON idem_consumer.%I (idem_consumer.key_hash64(consumer_id, key))',
            'processed_keys_' || g || '_hash', 'processed_keys_' || g);
        EXECUTE pg_catalog.format(
            'ALTER TABLE idem_consumer.%I REPLICA IDENTITY FULL', 'processed_keys_' || g);
        EXECUTE pg_catalog.format(
            'CREATE TABLE idem_consumer.%I (
                 consumer_id integer NOT NULL,
                 processed_at integer NOT NULL,
                 key text COLLATE "C" NOT NULL,
                 fingerprint integer,
                 PRIMARY KEY (consumer_id, key))',
            'key_collisions_' || g);
        EXECUTE pg_catalog.format(
            'CREATE INDEX %I ON idem_consumer.%I (idem_consumer.key_hash64(consumer_id, key))',
            'key_collisions_' || g || '_hash', 'key_collisions_' || g);
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('idem_consumer.%I', 'processed_keys_' || g)::pg_catalog.regclass, '');
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('idem_consumer.%I', 'key_collisions_' || g)::pg_catalog.regclass, '');
    END LOOP;
END
$generations$;

-- The filters of the sealed generations (src/keygen_filter.c): a blocked
-- Bloom filter of each generation's keys under this database's hash seed,
-- one chunk of bits per page, chunk n in block n.  They belong to this
-- database alone, like the seed: never dumped (a restore builds them again
-- with its own seed), never published.
DO $filters$
BEGIN
    FOR g IN 1..16 LOOP
        EXECUTE pg_catalog.format(
            'CREATE TABLE idem_consumer_local.%I (chunk integer NOT NULL, bits bytea NOT NULL)',
            'key_filter_' || g);
        EXECUTE pg_catalog.format(
            'ALTER TABLE idem_consumer_local.%I ALTER COLUMN bits SET STORAGE PLAIN',
            'key_filter_' || g);
        EXECUTE pg_catalog.format(
            'REVOKE ALL ON idem_consumer_local.%I FROM PUBLIC', 'key_filter_' || g);
    END LOOP;
END
$filters$;

-- The generations opened, one row each, numbered by epoch in the order
-- they were opened; the largest epoch is the current generation, the
-- others are sealed, and a pair of tables without a row is free.  Until
-- the first switch the table is empty and processed_keys_1 is the current
-- generation, so that a restore, which loads the rows a dump holds, finds
-- none made by CREATE EXTENSION in the way.  A generation was sealed when
-- the next one was opened, and settled once no transaction that recorded
-- keys there before was left (settled_at, set by a transaction whose xmin
-- src/keygen.c relies on).
CREATE TABLE idem_consumer.key_generations (
    epoch bigint PRIMARY KEY CHECK (epoch > 0),
    generation integer NOT NULL UNIQUE CHECK (generation BETWEEN 1 AND 16),
    opened_at timestamptz,
    filter_chunks integer CHECK (filter_chunks > 0),
    settled_at timestamptz
);
COMMENT ON COLUMN idem_consumer.key_generations.filter_chunks IS
    'chunks of the generation''s filter once built: until this database''s own filter has as many, the keys are probed without it';
COMMENT ON COLUMN idem_consumer.key_generations.opened_at IS
    'NULL for the first generation, opened with the extension';
COMMENT ON COLUMN idem_consumer.key_generations.settled_at IS
    'once sealed, when no transaction that recorded keys in the generation was left: no key there is newer; NULL until then';
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.key_generations', '');

-- The consumers that recorded keys in each generation opened: a row per
-- consumer and session at its first new key there, in the transaction
-- that records it, with that key's processed_at.  A sealed generation is
-- dropped when every consumer here has expired its keys (src/keygen_retire.c);
-- its newest first_at is a lower bound of the consumer's latest activity.
-- No unique key, so that registering never waits for another session.
CREATE TABLE idem_consumer.generation_consumers (
    epoch bigint NOT NULL,
    consumer_id integer NOT NULL,
    first_at integer NOT NULL
);
CREATE INDEX generation_consumers_epoch
    ON idem_consumer.generation_consumers (epoch, consumer_id);
CREATE INDEX generation_consumers_consumer
    ON idem_consumer.generation_consumers (consumer_id, first_at);
ALTER TABLE idem_consumer.generation_consumers REPLICA IDENTITY FULL;
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.generation_consumers', '');

-- A storage table whose rows sessions cache (key_generations, the filter
-- of all sealed generations, consumers) tells every session to read it
-- again at every change, a switch's, a setter's, the storage owner's by
-- hand, a restore's or a logical subscriber's (src/storage.c).  Row
-- triggers, as logical replication fires no statement trigger but for
-- TRUNCATE; enabled ALWAYS, so that the subscriber's apply fires them.
CREATE FUNCTION idem_consumer.storage_changed() RETURNS trigger
AS 'MODULE_PATHNAME', 'idem_storage_changed'
LANGUAGE C;
REVOKE ALL ON FUNCTION idem_consumer.storage_changed() FROM PUBLIC;
-- key_generations: which generation is current (src/keygen.c)
CREATE TRIGGER key_generations_changed
    AFTER INSERT OR UPDATE OR DELETE ON idem_consumer.key_generations
    FOR EACH ROW EXECUTE FUNCTION idem_consumer.storage_changed();
CREATE TRIGGER key_generations_truncated
    AFTER TRUNCATE ON idem_consumer.key_generations
    FOR EACH STATEMENT EXECUTE FUNCTION idem_consumer.storage_changed();
ALTER TABLE idem_consumer.key_generations ENABLE ALWAYS TRIGGER key_generations_changed;
ALTER TABLE idem_consumer.key_generations ENABLE ALWAYS TRIGGER key_generations_truncated;

-- consumers: their owners and settings (src/consumers.c); a new row
-- changes nothing cached: no trigger for INSERT
CREATE TRIGGER consumers_changed
    AFTER UPDATE OR DELETE ON idem_consumer.consumers
    FOR EACH ROW EXECUTE FUNCTION idem_consumer.storage_changed();
CREATE TRIGGER consumers_truncated
    AFTER TRUNCATE ON idem_consumer.consumers
    FOR EACH STATEMENT EXECUTE FUNCTION idem_consumer.storage_changed();
ALTER TABLE idem_consumer.consumers ENABLE ALWAYS TRIGGER consumers_changed;
ALTER TABLE idem_consumer.consumers ENABLE ALWAYS TRIGGER consumers_truncated;

-- The filter of all sealed generations at once (src/keygen_filter.c): one
-- blocked Bloom filter of the keys of every generation whose epoch its row
-- in key_filter_all lists, so that a new key reads one page of filter
-- whatever the number of sealed generations, and the generations' own
-- filters only for the 1% of keys it may hold.  Two tables: sessions read
-- the one the row names while the other is built.  This database's own,
-- like the other filters: never dumped, never published.
DO $filter_all$
BEGIN
    FOR place IN 1..2 LOOP
        EXECUTE pg_catalog.format(
            'CREATE TABLE idem_consumer_local.%I (chunk integer NOT NULL, bits bytea NOT NULL)',
            'key_filter_all_' || place);
        EXECUTE pg_catalog.format(
            'ALTER TABLE idem_consumer_local.%I ALTER COLUMN bits SET STORAGE PLAIN',
            'key_filter_all_' || place);
        EXECUTE pg_catalog.format(
            'REVOKE ALL ON idem_consumer_local.%I FROM PUBLIC', 'key_filter_all_' || place);
    END LOOP;
END
$filter_all$;
CREATE TABLE idem_consumer_local.key_filter_all (
    place integer PRIMARY KEY CHECK (place IN (1, 2)),
    epochs bigint[] NOT NULL,
    chunks integer NOT NULL CHECK (chunks > 0)
);
COMMENT ON TABLE idem_consumer_local.key_filter_all IS
    'the filter of all sealed generations: which table holds it, the epochs of the generations whose keys it holds, and its chunks';
REVOKE ALL ON idem_consumer_local.key_filter_all FROM PUBLIC;
CREATE TRIGGER key_filter_all_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON idem_consumer_local.key_filter_all
    FOR EACH STATEMENT EXECUTE FUNCTION idem_consumer.storage_changed();

-- Seals the current generation and opens the next one of the ring
-- (src/keygen.c); waits at most "wait" for the gate, which a delivery
-- holds only while it records a key.  Run it in a transaction of its own.
CREATE FUNCTION idem_key_generation_switch(wait interval DEFAULT '10s')
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_key_generation_switch'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION idem_key_generation_switch(interval) FROM PUBLIC;

-- Drops the sealed generations whose keys have all expired and empties
-- their tables (src/keygen_retire.c); returns how many it dropped.
CREATE FUNCTION idem_key_generation_retire()
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_key_generation_retire'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION idem_key_generation_retire() FROM PUBLIC;

-- Builds the filters of the sealed generations that lack one, and the
-- filter of all sealed generations if it lacks one of them
-- (src/keygen_filter.c); returns how many filters it built.
CREATE FUNCTION idem_key_generation_build_filters()
RETURNS integer
AS 'MODULE_PATHNAME', 'idem_key_generation_build_filters'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION idem_key_generation_build_filters() FROM PUBLIC;

-- The generations as operators see them.
-- Whether the sessions of this database use its own filter of a
-- generation: the table has the chunks that key_generations records, and
-- was written with that row (row_xmin), not before a subscription wrote it.
CREATE FUNCTION idem_consumer.key_filter_in_use(generation integer, filter_chunks integer, row_xmin xid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_key_filter_in_use'
LANGUAGE C VOLATILE STRICT;
REVOKE ALL ON FUNCTION idem_consumer.key_filter_in_use(integer, integer, xid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_consumer.key_filter_in_use(integer, integer, xid) TO pg_monitor;

CREATE VIEW idem_key_generations AS
    SELECT g.generation,
           g.epoch,
           CASE WHEN pg_catalog.lead(g.epoch) OVER w IS NULL THEN 'current'
                WHEN g.settled_at IS NULL THEN 'settling'
                ELSE 'sealed' END AS state,
           g.opened_at,
           pg_catalog.lead(g.opened_at) OVER w AS sealed_at,
           COALESCE(idem_consumer.key_filter_in_use(g.generation, g.filter_chunks, g.xmin), false) AS filtered
      FROM (SELECT epoch, generation, opened_at, filter_chunks, settled_at, xmin FROM idem_consumer.key_generations
            UNION ALL
            SELECT 1, 1, NULL, NULL, NULL, NULL
             WHERE NOT EXISTS (SELECT FROM idem_consumer.key_generations)) AS g
    WINDOW w AS (ORDER BY g.epoch);
REVOKE ALL ON idem_key_generations FROM PUBLIC;
GRANT SELECT ON idem_key_generations TO pg_monitor;

--
-- The API that records keys.
--
-- Each function of the API is one function: what a version adds to a
-- function comes as trailing parameters with defaults, so that every call
-- of the older function, positional or named, and every driver that
-- sends its parameters untyped (node-postgres sends each $n as unknown),
-- resolves to it unchanged.  Overloads with defaults would make such calls
-- "not unique".
--
-- The parameters after event_time:
--  - fingerprint, the caller's own fingerprint of the message, for
--    messages whose parameters vary between deliveries; NULL hashes the
--    business SQL and its parameters (src/fingerprint.c).
--  - expect_rows, the least number of rows the business SQL must affect
--    (src/expect_rows.c): an UPDATE that matches no row succeeds, so a
--    message delivered before the one that creates its row (an order-paid
--    event before its order) would be recorded as applied with nothing
--    changed.  Fewer rows raise IK002; NULL, the default, demands nothing.
--    A dead letter keeps the demand, so that a replay demands the rows
--    again.
--  - route, last, where keys are routed (Citus, src/routed.c): the value
--    of the distribution column of the business row the key protects, of
--    that column's type or an untyped literal; NULL, the default, is a
--    key without a route, which a database whose keys are routed refuses.
--    Where keys are not routed a route is ignored, so that the same
--    consumer runs on one server and on Citus.  It is "any" so that it
--    takes the distribution column's own type; an untyped parameter ($n)
--    cannot be "any", and a driver casts it ($8::bigint).
--
-- Values of other types than text go into params through their types'
-- output functions: ARRAY[$4::text, $5::text] (docs/clients.md).
--
-- Recording a key for a consumer, or removing one, is a privilege: a role
-- that can record keys can make any message be skipped.  EXECUTE on every
-- function of the API is revoked from PUBLIC; the DBA grants it.
--
CREATE FUNCTION idem_apply(key text, consumer text, sql text,
                           params text[] DEFAULT NULL,
                           event_time timestamptz DEFAULT NULL,
                           fingerprint text DEFAULT NULL,
                           expect_rows bigint DEFAULT NULL,
                           route "any" DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") IS
    'record (consumer, key) and run sql with params once; false for a duplicate';
REVOKE ALL ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") FROM PUBLIC;

-- VOLATILE: it takes a new snapshot per call (under READ COMMITTED it sees
-- keys committed since the calling statement began, and keys recorded
-- earlier in that statement), and a planner that took it for STABLE could
-- evaluate it once for many rows.
CREATE FUNCTION idem_is_processed(key text, consumer text, route "any" DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_is_processed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_is_processed(text, text, "any") IS
    'whether (consumer, key) is recorded and visible to this transaction';
REVOKE ALL ON FUNCTION idem_is_processed(text, text, "any") FROM PUBLIC;

CREATE FUNCTION idem_forget(key text, consumer text, route "any" DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_forget'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_forget(text, text, "any") IS
    'remove (consumer, key) so that the message is processed again; true if it was recorded';
REVOKE ALL ON FUNCTION idem_forget(text, text, "any") FROM PUBLIC;

-- A batch of keys without their messages, as 1.0 had it.
CREATE FUNCTION idem_record_batch(consumer text, keys text[])
RETURNS SETOF text
AS 'MODULE_PATHNAME', 'idem_record_batch'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idem_record_batch(text, text[]) IS
    'record every key of a batch for consumer; returns the keys that were new, each once';
REVOKE ALL ON FUNCTION idem_record_batch(text, text[]) FROM PUBLIC;

-- A batch with the fingerprints of its messages and routes, aligned with
-- the keys: each new key once (reused = false), and each key recorded
-- before with another fingerprint (reused = true), which is not recorded
-- again; route is the route of each key as text (NULL where keys are not
-- routed): one key under two routes is two messages, and both may be new.
CREATE FUNCTION idem_record_batch(consumer text, keys text[], fingerprints text[],
                                  routes "any" DEFAULT NULL)
RETURNS TABLE (key text, reused boolean, route text)
AS 'MODULE_PATHNAME', 'idem_record_batch_fingerprinted'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idem_record_batch(text, text[], text[], "any") IS
    'record every key of a batch with the fingerprint of its message, under its route where keys are routed; returns the new keys and the reused ones';
REVOKE ALL ON FUNCTION idem_record_batch(text, text[], text[], "any") FROM PUBLIC;

--
-- Dead-letter queue (see docs/dead_letters.md).
--
-- idem_try_apply() parks a message whose business SQL fails permanently
-- here, in the caller's transaction, and returns 'dead_lettered' instead of
-- raising.  The key of the message is recorded like any other, so
-- redeliveries are not run; the entry of the key tells them apart from
-- applied messages.  Operators replay or discard entries.
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
-- each replay), not redeliveries.  A dead external effect is parked here
-- like a message; kind tells the two apart.  Its sql is a comment, which
-- no message can have (idem_try_apply refuses SQL that is only comments),
-- so nothing ever runs it: replaying the entry re-arms the effect instead.
-- Replays run the stored SQL as the role that parked it
-- (src/replay_role.c), dead_lettered_role; regrole is dumped as the
-- role's name, so a restored database maps it to the role of that name.
-- It is NULL only for entries parked under 1.0 whose role was gone at the
-- update: a replay of such an entry is refused.
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
    kind text NOT NULL DEFAULT 'message' CHECK (kind IN ('message', 'effect')),
    dead_lettered_role regrole,
    expect_rows bigint CHECK (expect_rows OPERATOR(pg_catalog.>) 0),
    UNIQUE (consumer_id, key),
    CHECK ((status = 'pending') = (resolved_at IS NULL AND resolved_by IS NULL)),
    CHECK ((status = 'discarded') = (discard_reason IS NOT NULL))
);
-- pending entries of a consumer in replay order; also serves depth and age
CREATE INDEX dead_letters_pending
    ON idem_consumer.dead_letters (consumer_id, dead_letter_id)
    WHERE status = 'pending';
COMMENT ON COLUMN idem_consumer.dead_letters.dead_lettered_role IS
    'role that ran idem_try_apply; a replay runs sql as this role, for members of it only';
COMMENT ON COLUMN idem_consumer.dead_letters.expect_rows IS
    'least number of rows the SQL must affect, NULL for no demand; a replay demands it again';
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.dead_letters_dead_letter_id_seq', '');

-- Dead-lettering is recording a key, like idem_apply.  Replaying and
-- discarding are for the operators of a consumer: EXECUTE on each is
-- revoked from PUBLIC, as on the API above.
CREATE FUNCTION idem_try_apply(key text, consumer text, sql text,
                               params text[] DEFAULT NULL,
                               event_time timestamptz DEFAULT NULL,
                               fingerprint text DEFAULT NULL,
                               expect_rows bigint DEFAULT NULL,
                               route "any" DEFAULT NULL)
RETURNS idem_outcome
AS 'MODULE_PATHNAME', 'idem_try_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any") IS
    'like idem_apply, but park the message in the dead-letter queue on a permanent error instead of raising';
REVOKE ALL ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any") FROM PUBLIC;

CREATE FUNCTION idem_dlq_replay(id bigint)
RETURNS idem_outcome
AS 'MODULE_PATHNAME', 'idem_dlq_replay'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_dlq_replay(bigint) IS
    'run a pending dead-letter entry again under its key: applied, or dead_lettered with the new error';
REVOKE ALL ON FUNCTION idem_dlq_replay(bigint) FROM PUBLIC;

CREATE FUNCTION idem_dlq_replay(consumer text, max_count integer DEFAULT 100)
RETURNS TABLE (id bigint, outcome idem_outcome)
AS 'MODULE_PATHNAME', 'idem_dlq_replay_consumer'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idem_dlq_replay(text, integer) IS
    'replay up to max_count pending entries of a consumer, oldest first, skipping entries other sessions are replaying';
REVOKE ALL ON FUNCTION idem_dlq_replay(text, integer) FROM PUBLIC;

CREATE FUNCTION idem_dlq_discard(id bigint, reason text)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_dlq_discard'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_dlq_discard(bigint, text) IS
    'resolve a pending dead-letter entry without running it; redeliveries of its key stay skipped';
REVOKE ALL ON FUNCTION idem_dlq_discard(bigint, text) FROM PUBLIC;

-- The entry of a routed message is named by its key, consumer and route:
-- its table is distributed by route, and an id would be each node's own.
-- These are overloads of their own, with no default for the route:
-- idem_dlq_replay(id bigint, route "any" DEFAULT NULL) would make an
-- untyped call of idem_dlq_replay(consumer, max_count) "not unique".
-- Where keys are not routed they find the entry of the key in
-- idem_dead_letters.
CREATE FUNCTION idem_dlq_replay(key text, consumer text, route "any")
RETURNS idem_outcome
AS 'MODULE_PATHNAME', 'idem_dlq_replay_key'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_dlq_replay(text, text, "any") IS
    'idem_dlq_replay for the pending entry of a key, named by its key, consumer and route';
REVOKE ALL ON FUNCTION idem_dlq_replay(text, text, "any") FROM PUBLIC;

CREATE FUNCTION idem_dlq_discard(key text, consumer text, reason text, route "any")
RETURNS void
AS 'MODULE_PATHNAME', 'idem_dlq_discard_key'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_dlq_discard(text, text, text, "any") IS
    'idem_dlq_discard for the pending entry of a key, named by its key, consumer and route';
REVOKE ALL ON FUNCTION idem_dlq_discard(text, text, text, "any") FROM PUBLIC;

--
-- Counters (need shared_preload_libraries) and metrics (src/stats.c,
-- src/metrics.c).
--
-- The counters in shared memory are kept per database and consumer, and
-- each database's idem_stats and idem_stats_info show its own.  The
-- functions the views read are the views' business, not the API: they are
-- in the schema idem_consumer, where only its owner may name them.
-- idem_stats_internal() is the function of the first idem_stats, without
-- the effect counters and key_reuse, kept as every database updated from
-- 1.0 has it.
--
CREATE FUNCTION idem_consumer.idem_stats_internal(
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

CREATE FUNCTION idem_consumer.idem_stats_internal_1_1(
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
    OUT stats_reset timestamptz,
    OUT effects_executed bigint,
    OUT effects_replayed bigint,
    OUT effects_busy bigint,
    OUT effects_fenced_off bigint,
    OUT effects_request_mismatches bigint,
    OUT effects_unknown_outcomes bigint,
    OUT effects_dead bigint,
    OUT key_reuse bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_internal_1_1'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW idem_stats AS SELECT * FROM idem_consumer.idem_stats_internal_1_1();
COMMENT ON VIEW idem_stats IS 'per-consumer outcomes, latency and lag of idem_apply';

CREATE FUNCTION idem_consumer.idem_stats_info_internal(
    OUT consumers bigint,
    OUT max_consumers integer,
    OUT untracked_calls bigint,
    OUT stats_reset timestamptz)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_stats_info_internal'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE VIEW idem_stats_info AS SELECT * FROM idem_consumer.idem_stats_info_internal();
COMMENT ON VIEW idem_stats_info IS 'counters of idem_consumer that are not per consumer';

-- It changes the shared counters and checks the caller's rights on the
-- consumers with a statement of its own: not a function for a parallel
-- worker.
CREATE FUNCTION idem_stats_reset(consumer text DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_stats_reset'
LANGUAGE C VOLATILE PARALLEL UNSAFE;

-- A database label on every sample; the counters of every database for a
-- role with the privileges of pg_read_all_stats, so that one scrape
-- covers the cluster.
CREATE FUNCTION idem_metrics()
RETURNS text
AS 'MODULE_PATHNAME', 'idem_metrics_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_metrics() IS 'counters in the Prometheus text exposition format 0.0.4, labelled by database and consumer';

GRANT SELECT ON idem_stats, idem_stats_info TO PUBLIC;
REVOKE ALL ON FUNCTION idem_stats_reset(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_metrics() TO pg_monitor;

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
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.retention_settings', '');

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
-- Owners of consumers and the key-reuse check (src/consumers.c,
-- src/fingerprint.c; the columns owner and check_fingerprint of
-- idem_consumer.consumers, above).
--
-- EXECUTE on idem_consumer_create(text, regrole) is the privilege to
-- create consumers, explicitly or by their first use; the DBA grants it.
--
CREATE FUNCTION idem_consumer_create(consumer text, owner regrole DEFAULT current_user::regrole)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_consumer_create'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_consumer_create(text, regrole) IS
    'create a consumer owned by owner (the current role when NULL); EXECUTE on it is the privilege to create consumers, also by their first use';

CREATE FUNCTION idem_consumer_set_owner(consumer text, owner regrole)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_consumer_set_owner'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_consumer_set_owner(text, regrole) IS
    'give a consumer to another owner; for members of the present owner and superusers';

REVOKE ALL ON FUNCTION idem_consumer_create(text, regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_consumer_set_owner(text, regrole) FROM PUBLIC;

CREATE FUNCTION idem_set_fingerprint(consumer text, enabled boolean)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_set_fingerprint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_set_fingerprint(text, boolean) IS
    'turn the key-reuse check of a consumer on or off';
REVOKE ALL ON FUNCTION idem_set_fingerprint(text, boolean) FROM PUBLIC;

--
-- External effects (src/effects.c, src/effects_store.c; README "External
-- effects").  A call to a payment provider, a mailer or a webhook cannot be
-- rolled back with the consumer's transaction.  An effect row per
-- (consumer, key) holds its state, a lease with a fencing token that rises
-- with every attempt, the provider key sent along as Idempotency-Key, and
-- the stored result, so that a redelivery replays the result instead of
-- calling again, and a worker whose lease was taken over cannot record an
-- outcome.  The same rows serve the transactional outbox: an effect
-- enqueued in the business transaction exists if and only if it commits.
-- A dead effect is parked in the dead-letter queue (its kind 'effect').
--

-- What idem_effect_begin() tells the caller to do.
CREATE TYPE idem_effect_action AS ENUM ('execute', 'replay', 'busy', 'wait', 'dead');
COMMENT ON TYPE idem_effect_action IS
    'execute: call the provider now; replay: completed before, use result; busy: another worker holds the lease; wait: retry at retry_at; dead: attempts exhausted or failed permanently';

-- The answer of idem_effect_begin().
CREATE TYPE idem_effect AS (
    action idem_effect_action,
    fence bigint,
    provider_key text,
    attempt integer,
    outcome_unknown boolean,
    result jsonb,
    retry_at timestamptz,
    last_error text
);

-- One row per effect.  state: pending (enqueued, never claimed),
-- in_flight (leased to the holder of fence until lease_until), waiting
-- (failed retryably, due at retry_at), completed (result stored), dead.
-- fence only ever grows; attempts counts the leases handed out since the
-- effect was created or last re-armed.  Only src/effects_store.c writes
-- the table, and it keeps these rules itself: CHECK constraints here would
-- be parsed again by every insert and update of the inline cycle, which
-- cost a tenth of its time.  consumer_id has no foreign key, as in the
-- tables of keys: consumers are never deleted, and the key's check would
-- lock the consumer's row at every begin (another tenth of the cycle, and
-- a multixact when two workers of a consumer begin at once).
CREATE TABLE idem_consumer.effects (
    consumer_id integer NOT NULL,
    key text COLLATE "C" NOT NULL,
    request jsonb,
    deferred boolean NOT NULL,
    state text NOT NULL,
    fence bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    provider_key text NOT NULL DEFAULT pg_catalog.gen_random_uuid()::text,
    outcome_unknown boolean NOT NULL DEFAULT false,
    lease_until timestamptz,
    retry_at timestamptz,
    last_error text,
    result jsonb,
    dead_letter_id bigint,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    completed_at timestamptz,
    PRIMARY KEY (consumer_id, key)
) WITH (fillfactor = 70);
-- The outbox's effects of a consumer, oldest first.  No index names a
-- column that a lease, a completion or a failure changes, and pages keep
-- room, so that those updates are HOT: the inline cycle updates its row
-- once or twice in two short transactions.
CREATE INDEX effects_outbox
    ON idem_consumer.effects (consumer_id, created_at)
    WHERE deferred;

-- Retry policy per consumer; a consumer without a row follows the
-- idem_consumer.effect_* settings.
CREATE TABLE idem_consumer.effect_policies (
    consumer_id integer PRIMARY KEY REFERENCES idem_consumer.consumers,
    max_attempts integer NOT NULL CHECK (max_attempts >= 1),
    base_delay interval NOT NULL CHECK (base_delay OPERATOR(pg_catalog.>) interval '0'),
    max_delay interval NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CHECK (max_delay OPERATOR(pg_catalog.>=) base_delay)
);
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.effects', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.effect_policies', '');

-- Effects are recorded like keys: consumers' roles only.  Each function
-- takes the route last, like the API above.
CREATE FUNCTION idem_effect_begin(consumer text, key text, request jsonb DEFAULT NULL,
                                  lease interval DEFAULT '30 seconds',
                                  route "any" DEFAULT NULL)
RETURNS idem_effect
AS 'MODULE_PATHNAME', 'idem_effect_begin'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_begin(text, text, jsonb, interval, "any") IS
    'claim an external effect before calling the provider; run it alone, outside a transaction block';
REVOKE ALL ON FUNCTION idem_effect_begin(text, text, jsonb, interval, "any") FROM PUBLIC;

CREATE FUNCTION idem_effect_complete(consumer text, key text, fence bigint, result jsonb,
                                     sql text DEFAULT NULL, params text[] DEFAULT NULL,
                                     route "any" DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_effect_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_complete(text, text, bigint, jsonb, text, text[], "any") IS
    'store the result of an effect (and run sql with params) in the business transaction; raises IE001 if fence is no longer current';
REVOKE ALL ON FUNCTION idem_effect_complete(text, text, bigint, jsonb, text, text[], "any") FROM PUBLIC;

CREATE FUNCTION idem_effect_fail(consumer text, key text, fence bigint, error text,
                                 retryable boolean DEFAULT true,
                                 route "any" DEFAULT NULL)
RETURNS idem_effect_action
AS 'MODULE_PATHNAME', 'idem_effect_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_fail(text, text, bigint, text, boolean, "any") IS
    'record a failed attempt: wait (retry later with backoff) or dead (dead-letter queue)';
REVOKE ALL ON FUNCTION idem_effect_fail(text, text, bigint, text, boolean, "any") FROM PUBLIC;

CREATE FUNCTION idem_effect_heartbeat(consumer text, key text, fence bigint, extend interval,
                                      route "any" DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_effect_heartbeat'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_heartbeat(text, text, bigint, interval, "any") IS
    'extend a live lease to now() + extend; false when the caller has been fenced off';
REVOKE ALL ON FUNCTION idem_effect_heartbeat(text, text, bigint, interval, "any") FROM PUBLIC;

CREATE FUNCTION idem_effect_enqueue(consumer text, key text, request jsonb,
                                    route "any" DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_effect_enqueue'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_enqueue(text, text, jsonb, "any") IS
    'add an effect to the outbox in the business transaction; false if the key was enqueued before';
REVOKE ALL ON FUNCTION idem_effect_enqueue(text, text, jsonb, "any") FROM PUBLIC;

-- A claim under one route; a NULL of the routes' type (route =>
-- NULL::bigint) claims under every route.  route in the result is each
-- effect's route as text (NULL where keys are not routed and none was
-- given).
CREATE FUNCTION idem_effect_claim(consumer text, max_count integer DEFAULT 10,
                                  lease interval DEFAULT '30 seconds',
                                  route "any" DEFAULT NULL)
RETURNS TABLE (key text, request jsonb, fence bigint, provider_key text,
               attempt integer, outcome_unknown boolean, route text)
AS 'MODULE_PATHNAME', 'idem_effect_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idem_effect_claim(text, integer, interval, "any") IS
    'lease up to max_count due outbox effects, oldest first, skipping those other dispatchers hold; of one route, or every route for a NULL of the routes'' type';
REVOKE ALL ON FUNCTION idem_effect_claim(text, integer, interval, "any") FROM PUBLIC;

CREATE FUNCTION idem_set_effect_policy(consumer text, max_attempts integer,
                                       base_delay interval, max_delay interval)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_set_effect_policy'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_set_effect_policy(text, integer, interval, interval) IS
    'set how often and how late a consumer''s failed effects are retried';
REVOKE ALL ON FUNCTION idem_set_effect_policy(text, integer, interval, interval) FROM PUBLIC;

--
-- Views that show keys, messages and effects (src/visible_rows.c).
--
-- Each shows a role only the rows of the consumers it may act on, and
-- reads them from a set-returning function that returns nothing else, the
-- way pg_stat_statements' view reads its function: the owner test runs
-- inside the function, in a statement on the storage of its own.  With
-- the test in the view's WHERE clause, even in a security barrier, the
-- planner pushes a caller's leakproof condition (key = '...') below it
-- into the scan of the storage, and EXPLAIN ANALYZE reports how many
-- rows of other teams that scan found.  The owner test is
-- pg_has_role(..., 'USAGE'), that is has_privs_of_role(), the test
-- PostgreSQL's own ownership checks use: a member of the owner role that
-- does not inherit its privileges (NOINHERIT, or from PostgreSQL 16 a
-- grant WITH INHERIT FALSE) sees nothing.  A consumer without an owner
-- is open to every role.
--
-- The functions are in the schema idem_consumer, where only its owner may
-- name them; the views keep a barrier option, harmless over a function
-- scan.  Columns keep the collation of the storage ("C" for keys and
-- consumer names).  The views show the SQL and parameters of messages,
-- requests and results: SELECT is for operator roles only, which the DBA
-- grants.
--
CREATE FUNCTION idem_consumer.processed_keys_visible(
    OUT consumer text, OUT key text, OUT processed_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_processed_keys_visible'
LANGUAGE C STABLE STRICT;
COMMENT ON FUNCTION idem_consumer.processed_keys_visible() IS
    'the rows of idem_processed_keys: the keys of every generation of the consumers the current role may act on';

CREATE VIEW idem_processed_keys WITH (security_barrier) AS
    SELECT k.consumer COLLATE "C" AS consumer,
           k.key COLLATE "C" AS key,
           k.processed_at
      FROM idem_consumer.processed_keys_visible() AS k;
REVOKE ALL ON idem_processed_keys FROM PUBLIC;

CREATE FUNCTION idem_consumer.dead_letters_visible(
    OUT id bigint, OUT consumer text, OUT key text, OUT status text,
    OUT sqlstate text, OUT message text, OUT detail text, OUT hint text,
    OUT context text, OUT attempts integer, OUT first_failed_at timestamptz,
    OUT last_failed_at timestamptz, OUT event_time timestamptz, OUT sql text,
    OUT params text[], OUT settings text[], OUT dead_lettered_by text,
    OUT resolved_at timestamptz, OUT resolved_by text, OUT discard_reason text,
    OUT kind text, OUT expect_rows bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_dead_letters_visible'
LANGUAGE C STABLE STRICT;
COMMENT ON FUNCTION idem_consumer.dead_letters_visible() IS
    'the rows of idem_dead_letters: the entries of the consumers the current role may act on';

CREATE VIEW idem_dead_letters WITH (security_barrier) AS
    SELECT d.id,
           d.consumer COLLATE "C" AS consumer,
           d.key COLLATE "C" AS key,
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
           d.discard_reason,
           d.kind,
           d.expect_rows
      FROM idem_consumer.dead_letters_visible() AS d;
REVOKE ALL ON idem_dead_letters FROM PUBLIC;

CREATE FUNCTION idem_consumer.effects_visible(
    OUT consumer text, OUT key text, OUT state text, OUT deferred boolean,
    OUT attempts integer, OUT fence bigint, OUT provider_key text,
    OUT outcome_unknown boolean, OUT lease_until timestamptz,
    OUT retry_at timestamptz, OUT last_error text, OUT result jsonb,
    OUT request jsonb, OUT dead_letter_id bigint, OUT created_at timestamptz,
    OUT updated_at timestamptz, OUT completed_at timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_effects_visible'
LANGUAGE C STABLE STRICT;
COMMENT ON FUNCTION idem_consumer.effects_visible() IS
    'the rows of idem_effects: the effects of the consumers the current role may act on';

CREATE VIEW idem_effects WITH (security_barrier) AS
    SELECT e.consumer COLLATE "C" AS consumer,
           e.key COLLATE "C" AS key,
           e.state,
           e.deferred,
           e.attempts,
           e.fence,
           e.provider_key,
           e.outcome_unknown,
           e.lease_until,
           e.retry_at,
           e.last_error,
           e.result,
           e.request,
           e.dead_letter_id,
           e.created_at,
           e.updated_at,
           e.completed_at
      FROM idem_consumer.effects_visible() AS e;
COMMENT ON VIEW idem_effects IS 'external effects: state, lease, fence, retries and stored result';
REVOKE ALL ON idem_effects FROM PUBLIC;

-- What the tables hold, per consumer, with its owner; reads every stored
-- key, of every generation.  For monitoring roles: it shows consumers,
-- not messages.
CREATE VIEW idem_consumers AS
    SELECT c.name AS consumer,
           c.created_at,
           keys.keys_stored,
           keys.oldest_processed_at,
           keys.newest_processed_at,
           dlq.dead_letters_pending,
           dlq.oldest_pending_age,
           c.owner
      FROM idem_consumer.consumers AS c
     CROSS JOIN LATERAL (
           SELECT pg_catalog.count(*) AS keys_stored,
                  timestamptz '2000-01-01 00:00:00+00'
                      OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => pg_catalog.min(k.processed_at))
                      AS oldest_processed_at,
                  timestamptz '2000-01-01 00:00:00+00'
                      OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => pg_catalog.max(k.processed_at))
                      AS newest_processed_at
             FROM (SELECT processed_at FROM idem_consumer.processed_keys_1
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_1
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_2
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_2
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_3
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_3
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_4
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_4
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_5
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_5
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_6
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_6
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_7
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_7
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_8
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_8
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_9
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_9
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_10
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_10
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_11
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_11
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_12
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_12
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_13
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_13
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_14
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_14
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_15
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_15
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.processed_keys_16
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions_16
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id) AS k) AS keys
     CROSS JOIN LATERAL (
           SELECT pg_catalog.count(*) AS dead_letters_pending,
                  pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(d.first_failed_at)
                      AS oldest_pending_age
             FROM idem_consumer.dead_letters AS d
            WHERE d.consumer_id OPERATOR(pg_catalog.=) c.consumer_id
              AND d.status OPERATOR(pg_catalog.=) 'pending') AS dlq;

REVOKE ALL ON idem_consumers FROM PUBLIC;
GRANT SELECT ON idem_consumers TO pg_monitor;

--
-- Routed keys, for Citus (src/routed.c, docs/citus.md): keys stored with a
-- route, the value of the distribution column of the business row they
-- protect, in idem_consumer.routed_keys, which idem_citus_distribute()
-- makes and distributes colocated with the business table.  Its route
-- column has the type of that table's distribution column, so the table
-- exists only once that call has run.
--
--
-- The rows of the routed views below, of the consumers the current role
-- may act on (src/visible_rows.c); an entry of a consumer this node does
-- not know only to the roles with the privileges of the storage's owner.
-- Their columns are those of the routed tables, whose route has the type
-- routed_storage_create() is given: each view names them.
--
CREATE FUNCTION idem_consumer.routed_dead_letters_visible()
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_routed_dead_letters_visible'
LANGUAGE C STABLE STRICT;
COMMENT ON FUNCTION idem_consumer.routed_dead_letters_visible() IS
    'the rows of idem_routed_dead_letters: the entries of the consumers the current role may act on';

CREATE FUNCTION idem_consumer.routed_effects_visible()
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_routed_effects_visible'
LANGUAGE C STABLE STRICT;
COMMENT ON FUNCTION idem_consumer.routed_effects_visible() IS
    'the rows of idem_routed_effects: the effects of the consumers the current role may act on';

--
-- The routed tables, made by idem_citus_distribute(), which names the
-- table to colocate them with; without one they stay local:
--  - routed_keys (route, consumer, key, fingerprint, processed_at), the
--    keys;
--  - routed_dead_letters, the dead-letter queue of routed messages, keyed
--    like the keys, so that an entry lives and moves with its key and the
--    business rows, and what idem_try_apply parks under a route, a replay applies
--    and the purge expires commits or not with them on one node.  Its
--    consumer is a name and its role a role name: ids and OIDs are each
--    node's own;
--  - the view idem_routed_dead_letters, read like idem_dead_letters, made
--    once the tables are distributed, so that Citus makes it on every node.
-- The route has the type of the business table's distribution column.
-- Owned by the owner of the storage, like every table of the key store.
--
CREATE FUNCTION idem_consumer.routed_storage_create(route_type regtype,
                                                    colocate_with regclass DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    storage_owner text := (SELECT c.relowner::pg_catalog.regrole::pg_catalog.text
                             FROM pg_catalog.pg_class AS c
                            WHERE c.oid OPERATOR(pg_catalog.=)
                                  'idem_consumer.consumers'::pg_catalog.regclass);
    ext_schema name := (SELECT n.nspname FROM pg_catalog.pg_extension AS e
                          JOIN pg_catalog.pg_namespace AS n
                            ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                         WHERE e.extname OPERATOR(pg_catalog.=) 'idem_consumer');
BEGIN
    EXECUTE pg_catalog.format(
        'CREATE TABLE idem_consumer.routed_keys (
             route %s NOT NULL,
             consumer text NOT NULL,
             key text NOT NULL,
             fingerprint integer,
             processed_at integer NOT NULL,
             PRIMARY KEY (route, consumer, key))', route_type);
    EXECUTE pg_catalog.format(
        'CREATE TABLE idem_consumer.routed_dead_letters (
             route %s NOT NULL,
             consumer text NOT NULL,
             key text NOT NULL,
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
             status text NOT NULL DEFAULT ''pending''
                 CHECK (status IN (''pending'', ''replayed'', ''discarded'')),
             resolved_at timestamptz,
             resolved_by text,
             discard_reason text,
             kind text NOT NULL DEFAULT ''message'' CHECK (kind IN (''message'', ''effect'')),
             expect_rows bigint CHECK (expect_rows > 0),
             PRIMARY KEY (route, consumer, key),
             CHECK ((status = ''pending'') = (resolved_at IS NULL AND resolved_by IS NULL)),
             CHECK ((status = ''discarded'') = (discard_reason IS NOT NULL)))', route_type);
    -- the columns and states of idem_consumer.effects (1.1), but for the
    -- entry id: a routed effect''s entry is named by its route and key
    EXECUTE pg_catalog.format(
        'CREATE TABLE idem_consumer.routed_effects (
             route %s NOT NULL,
             consumer text NOT NULL,
             key text NOT NULL,
             request jsonb,
             deferred boolean NOT NULL,
             state text NOT NULL,
             fence bigint NOT NULL DEFAULT 0,
             attempts integer NOT NULL DEFAULT 0,
             provider_key text NOT NULL DEFAULT pg_catalog.gen_random_uuid()::text,
             outcome_unknown boolean NOT NULL DEFAULT false,
             lease_until timestamptz,
             retry_at timestamptz,
             last_error text,
             result jsonb,
             created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
             updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
             completed_at timestamptz,
             PRIMARY KEY (route, consumer, key)) WITH (fillfactor = 70)', route_type);
    EXECUTE pg_catalog.format('ALTER TABLE idem_consumer.routed_keys OWNER TO %s', storage_owner);
    EXECUTE pg_catalog.format('ALTER TABLE idem_consumer.routed_dead_letters OWNER TO %s',
                              storage_owner);
    EXECUTE pg_catalog.format('ALTER TABLE idem_consumer.routed_effects OWNER TO %s',
                              storage_owner);
    REVOKE ALL ON idem_consumer.routed_keys, idem_consumer.routed_dead_letters,
                  idem_consumer.routed_effects FROM PUBLIC;
    COMMENT ON TABLE idem_consumer.routed_keys IS
        'keys recorded with their route, colocated with the business rows they protect';
    COMMENT ON TABLE idem_consumer.routed_dead_letters IS
        'dead-letter entries of routed messages and effects, colocated with their keys';
    COMMENT ON TABLE idem_consumer.routed_effects IS
        'external effects stored with their route, colocated with the business rows they complete';
    IF colocate_with IS NOT NULL THEN
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''route'', colocate_with => $2)'
            USING 'idem_consumer.routed_keys', colocate_with::pg_catalog.text;
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''route'', colocate_with => $2)'
            USING 'idem_consumer.routed_dead_letters', 'idem_consumer.routed_keys';
        EXECUTE 'SELECT pg_catalog.create_distributed_table($1, ''route'', colocate_with => $2)'
            USING 'idem_consumer.routed_effects', 'idem_consumer.routed_keys';
    END IF;

    -- each reads its function (src/visible_rows.c), as idem_dead_letters
    -- does; the route has the type of the table's, named here
    EXECUTE pg_catalog.format(
        'CREATE VIEW %I.idem_routed_dead_letters WITH (security_barrier) AS
             SELECT * FROM idem_consumer.routed_dead_letters_visible() AS d (
                    route %s, consumer text, key text, status text, sqlstate text,
                    message text, detail text, hint text, context text,
                    attempts integer, first_failed_at timestamptz,
                    last_failed_at timestamptz, event_time timestamptz, sql text,
                    params text[], settings text[], dead_lettered_by text,
                    resolved_at timestamptz, resolved_by text,
                    discard_reason text, kind text, expect_rows bigint)',
        ext_schema, route_type);
    EXECUTE pg_catalog.format('ALTER VIEW %I.idem_routed_dead_letters OWNER TO %s',
                              ext_schema, storage_owner);
    EXECUTE pg_catalog.format('REVOKE ALL ON %I.idem_routed_dead_letters FROM PUBLIC',
                              ext_schema);
    EXECUTE pg_catalog.format('COMMENT ON VIEW %I.idem_routed_dead_letters IS %L',
                              ext_schema,
                              'dead-letter entries of routed messages, of the consumers the current role may act on');

    EXECUTE pg_catalog.format(
        'CREATE VIEW %I.idem_routed_effects WITH (security_barrier) AS
             SELECT * FROM idem_consumer.routed_effects_visible() AS e (
                    route %s, consumer text, key text, state text, deferred boolean,
                    attempts integer, fence bigint, provider_key text,
                    outcome_unknown boolean, lease_until timestamptz,
                    retry_at timestamptz, last_error text, result jsonb,
                    request jsonb, created_at timestamptz, updated_at timestamptz,
                    completed_at timestamptz)',
        ext_schema, route_type);
    EXECUTE pg_catalog.format('ALTER VIEW %I.idem_routed_effects OWNER TO %s',
                              ext_schema, storage_owner);
    EXECUTE pg_catalog.format('REVOKE ALL ON %I.idem_routed_effects FROM PUBLIC',
                              ext_schema);
    EXECUTE pg_catalog.format('COMMENT ON VIEW %I.idem_routed_effects IS %L',
                              ext_schema,
                              'external effects stored with their route, of the consumers the current role may act on');
END
$$;
COMMENT ON FUNCTION idem_consumer.routed_storage_create(regtype, regclass) IS
    'make the routed tables with the route of the given type, distributed colocated with the given table, or local without one';
REVOKE ALL ON FUNCTION idem_consumer.routed_storage_create(regtype, regclass) FROM PUBLIC;

CREATE FUNCTION idem_citus_distribute(colocate_with regclass)
RETURNS regclass
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    dist_column name;
    route_type text;
    colocated boolean;
    holds_keys boolean := false;
    key_table regclass;
    routed regclass := pg_catalog.to_regclass('idem_consumer.routed_keys');
BEGIN
    IF colocate_with IS NULL THEN
        RAISE EXCEPTION 'colocate_with must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the distributed table whose rows the keys protect.';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'extension "citus" is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Routed keys are for Citus clusters; on one server, keys need no route.';
    END IF;
    -- pg_dist_partition exists only with Citus: read it dynamically
    EXECUTE 'SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
               FROM pg_catalog.pg_dist_partition AS p
               JOIN pg_catalog.pg_attribute AS a
                 ON a.attrelid OPERATOR(pg_catalog.=) p.logicalrelid
                AND a.attname OPERATOR(pg_catalog.=)
                    pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)
              WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1
                AND p.partmethod OPERATOR(pg_catalog.=) ''h'''
        INTO dist_column, route_type USING colocate_with;
    IF dist_column IS NULL THEN
        RAISE EXCEPTION 'table % is not a hash-distributed Citus table', colocate_with
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the business table whose rows the keys protect, distributed by create_distributed_table().';
    END IF;

    IF routed IS NOT NULL THEN
        -- called again: the same colocation is kept, another one refused
        EXECUTE 'SELECT pg_catalog.count(DISTINCT colocationid) OPERATOR(pg_catalog.=) 1
                   FROM pg_catalog.pg_dist_partition
                  WHERE logicalrelid OPERATOR(pg_catalog.=) ANY ($1)'
            INTO colocated USING ARRAY[routed, colocate_with];
        IF NOT colocated THEN
            RAISE EXCEPTION 'the keys of idem_consumer are distributed already, not colocated with %',
                            colocate_with
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Keys follow one group of colocated tables, the one they were distributed with.',
                      HINT = 'Colocate the business table with idem_consumer.routed_keys (create_distributed_table(..., colocate_with => ''idem_consumer.routed_keys'')).';
        END IF;
        RETURN routed;
    END IF;

    -- keys recorded without a route would not be found once keys are routed
    FOR key_table IN
        SELECT c.oid FROM pg_catalog.pg_class AS c
         WHERE c.relnamespace OPERATOR(pg_catalog.=) 'idem_consumer'::pg_catalog.regnamespace
           AND c.relkind OPERATOR(pg_catalog.=) 'r'
           AND c.relname OPERATOR(pg_catalog.~) '^(processed_keys|key_collisions)(_[0-9]+)?$'
    LOOP
        EXECUTE pg_catalog.format('SELECT EXISTS (SELECT FROM %s)', key_table) INTO holds_keys;
        EXIT WHEN holds_keys;
    END LOOP;
    IF holds_keys THEN
        RAISE EXCEPTION 'the key store of idem_consumer holds keys recorded without a route'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'Once keys are routed, a key recorded without its route is not looked up, and its message would be applied again.',
                  HINT = 'Distribute the keys before consumers start, or once the keys recorded without a route have expired.';
    END IF;

    PERFORM idem_consumer.routed_storage_create(route_type::pg_catalog.regtype, colocate_with);
    RETURN 'idem_consumer.routed_keys'::pg_catalog.regclass;
END
$$;
COMMENT ON FUNCTION idem_citus_distribute(regclass) IS
    'store keys with a route, distributed by Citus colocated with the given table';
REVOKE ALL ON FUNCTION idem_citus_distribute(regclass) FROM PUBLIC;

CREATE FUNCTION idem_citus_stats(
    OUT consumer text,
    OUT nodes integer,
    OUT applied bigint,
    OUT duplicates bigint,
    OUT failed bigint,
    OUT dead_lettered bigint,
    OUT key_reuse bigint,
    OUT latency_p95_ms_max double precision,
    OUT lag_p95_ms_max double precision,
    OUT last_applied_at timestamptz,
    OUT last_duplicate_at timestamptz,
    OUT effects_executed bigint,
    OUT effects_replayed bigint,
    OUT effects_fenced_off bigint,
    OUT effects_unknown_outcomes bigint,
    OUT effects_dead bigint,
    OUT dead_letters_pending bigint)
RETURNS SETOF record
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ext_schema name;
    node record;
    node_counters json[] := '{}';
    pending json := '[]';
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'extension "citus" is not installed in this database'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'On one server, idem_stats has every counter.';
    END IF;
    SELECT n.nspname INTO STRICT ext_schema
      FROM pg_catalog.pg_extension AS e
      JOIN pg_catalog.pg_namespace AS n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'idem_consumer';
    -- every node's idem_stats, read as the caller; a node that cannot be
    -- read makes the sum wrong, so it is an error, not a gap
    FOR node IN EXECUTE 'SELECT nodeid, success, result FROM pg_catalog.run_command_on_all_nodes($1)'
        USING pg_catalog.format(
            'SELECT COALESCE(pg_catalog.json_agg(s), ''[]'') FROM %I.idem_stats AS s',
            ext_schema)
    LOOP
        IF NOT node.success THEN
            RAISE EXCEPTION 'could not read the counters of node %', node.nodeid
                USING ERRCODE = 'connection_exception',
                      DETAIL = node.result,
                      HINT = 'Every node needs idem_consumer, in the schema it has on the coordinator.';
        END IF;
        node_counters := node_counters OPERATOR(pg_catalog.||) node.result::json;
    END LOOP;
    -- the routed queue is one distributed table: read here, it is every
    -- shard's, as the caller may see it
    IF pg_catalog.to_regclass(pg_catalog.format('%I.idem_routed_dead_letters', ext_schema)) IS NOT NULL THEN
        EXECUTE pg_catalog.format(
            'SELECT COALESCE(pg_catalog.json_agg(p), ''[]'')
               FROM (SELECT d.consumer, pg_catalog.count(*) AS pending
                       FROM %I.idem_routed_dead_letters AS d
                      WHERE d.status OPERATOR(pg_catalog.=) ''pending''
                      GROUP BY d.consumer) AS p', ext_schema)
            INTO pending;
    END IF;
    RETURN QUERY
        WITH counters AS (
            SELECT s.consumer, pg_catalog.count(*)::integer AS nodes,
                   pg_catalog.sum(s.applied)::bigint AS applied,
                   pg_catalog.sum(s.duplicates)::bigint AS duplicates,
                   pg_catalog.sum(s.failed)::bigint AS failed,
                   pg_catalog.sum(s.dead_lettered)::bigint AS dead_lettered,
                   pg_catalog.sum(s.key_reuse)::bigint AS key_reuse,
                   pg_catalog.max(s.latency_p95_ms) AS latency_p95_ms_max,
                   pg_catalog.max(s.lag_p95_ms) AS lag_p95_ms_max,
                   pg_catalog.max(s.last_applied_at) AS last_applied_at,
                   pg_catalog.max(s.last_duplicate_at) AS last_duplicate_at,
                   pg_catalog.sum(s.effects_executed)::bigint AS effects_executed,
                   pg_catalog.sum(s.effects_replayed)::bigint AS effects_replayed,
                   pg_catalog.sum(s.effects_fenced_off)::bigint AS effects_fenced_off,
                   pg_catalog.sum(s.effects_unknown_outcomes)::bigint AS effects_unknown_outcomes,
                   pg_catalog.sum(s.effects_dead)::bigint AS effects_dead
              FROM pg_catalog.unnest(node_counters) AS c (counters)
             CROSS JOIN LATERAL pg_catalog.json_to_recordset(c.counters) AS s (
                   consumer text, applied bigint, duplicates bigint, failed bigint,
                   dead_lettered bigint, key_reuse bigint, latency_p95_ms double precision,
                   lag_p95_ms double precision, last_applied_at timestamptz,
                   last_duplicate_at timestamptz, effects_executed bigint,
                   effects_replayed bigint, effects_fenced_off bigint,
                   effects_unknown_outcomes bigint, effects_dead bigint)
             GROUP BY s.consumer),
        queue AS (
            SELECT q.consumer, q.pending
              FROM pg_catalog.json_to_recordset(pending) AS q (consumer text, pending bigint))
        SELECT COALESCE(c.consumer, q.consumer), COALESCE(c.nodes, 0),
               COALESCE(c.applied, 0), COALESCE(c.duplicates, 0), COALESCE(c.failed, 0),
               COALESCE(c.dead_lettered, 0), COALESCE(c.key_reuse, 0),
               c.latency_p95_ms_max, c.lag_p95_ms_max, c.last_applied_at,
               c.last_duplicate_at, COALESCE(c.effects_executed, 0),
               COALESCE(c.effects_replayed, 0), COALESCE(c.effects_fenced_off, 0),
               COALESCE(c.effects_unknown_outcomes, 0), COALESCE(c.effects_dead, 0),
               COALESCE(q.pending, 0)
          FROM counters AS c
          FULL JOIN queue AS q ON q.consumer OPERATOR(pg_catalog.=) c.consumer
         ORDER BY 1;
END
$$;
COMMENT ON FUNCTION idem_citus_stats() IS
    'idem_stats summed over the nodes of a Citus cluster';
REVOKE ALL ON FUNCTION idem_citus_stats() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idem_citus_stats() TO pg_monitor;

--
-- Positions of Kafka consumers (src/positions.c, docs/brokers.md).
--
-- A consumer's position on a partition of a topic is the offset of the
-- next message to read, as Kafka commits it: every message below it is
-- applied.  idem_position_advance() moves it forward in the caller's
-- transaction, under the row's lock, and refuses to move it backwards
-- (IP001); idem_position_rewind() moves it back, for an operator, and
-- records who did it, when, from where to where and why in
-- position_rewinds (the last one also in the position's row, which
-- idem_positions() reads alone).  The log-end offset is what the consumer
-- last reported of the partition, for the lag.
--
CREATE TABLE idem_consumer.positions (
    consumer_id integer NOT NULL REFERENCES idem_consumer.consumers,
    topic text COLLATE "C" NOT NULL CHECK (octet_length(topic) BETWEEN 1 AND 249),
    "partition" integer NOT NULL CHECK ("partition" >= 0),
    "position" bigint NOT NULL CHECK ("position" >= 0),
    advanced_at timestamptz NOT NULL,
    log_end_offset bigint CHECK (log_end_offset >= 0),
    log_end_at timestamptz,
    rewinds bigint NOT NULL DEFAULT 0,
    last_rewound_at timestamptz,
    last_rewound_by name,
    last_rewind_reason text,
    PRIMARY KEY (consumer_id, topic, "partition")
);
COMMENT ON TABLE idem_consumer.positions IS
    'the offset of the next message to read of each consumer on each partition of a topic';

CREATE TABLE idem_consumer.position_rewinds (
    rewind_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_id integer NOT NULL REFERENCES idem_consumer.consumers,
    topic text COLLATE "C" NOT NULL,
    "partition" integer NOT NULL,
    from_position bigint,
    to_position bigint NOT NULL,
    reason text NOT NULL CHECK (reason <> ''),
    rewound_by name NOT NULL,
    session_role name NOT NULL,
    rewound_at timestamptz NOT NULL
);
CREATE INDEX ON idem_consumer.position_rewinds (consumer_id, topic, "partition", rewind_id);
COMMENT ON TABLE idem_consumer.position_rewinds IS
    'every rewind of a position: by whom (the current role, and the session''s), when, from, to and why';
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.positions', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.position_rewinds', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.position_rewinds_rewind_id_seq', '');

CREATE FUNCTION idem_position_advance(consumer text, topic text, "partition" integer,
                                      "position" bigint, log_end_offset bigint DEFAULT NULL,
                                      from_position bigint DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_position_advance'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_position_advance(text, text, integer, bigint, bigint, bigint) IS
    'moves a consumer''s position on a partition forward in this transaction, never backwards nor past from_position; returns the position before';

CREATE FUNCTION idem_position_rewind(consumer text, topic text, "partition" integer,
                                     "position" bigint, reason text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_position_rewind'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_position_rewind(text, text, integer, bigint, text) IS
    'moves a consumer''s position on a partition back, recording who, when, from, to and why; returns the position before';

CREATE FUNCTION idem_positions(of_consumer text DEFAULT NULL, of_topic text DEFAULT NULL,
    of_partition integer DEFAULT NULL,
    OUT consumer text, OUT topic text, OUT "partition" integer, OUT "position" bigint,
    OUT log_end_offset bigint, OUT lag bigint, OUT advanced_at timestamptz,
    OUT log_end_at timestamptz, OUT rewinds bigint, OUT last_rewound_at timestamptz,
    OUT last_rewound_by name, OUT last_rewind_reason text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_positions'
LANGUAGE C STABLE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_positions(text, text, integer) IS
    'the positions of a consumer (of one topic, of one partition), or of every consumer the current role may act on';

CREATE VIEW idem_positions WITH (security_barrier) AS
    SELECT p.consumer COLLATE "C" AS consumer,
           p.topic COLLATE "C" AS topic,
           p."partition",
           p."position",
           p.log_end_offset,
           p.lag,
           p.advanced_at,
           p.log_end_at,
           p.rewinds,
           p.last_rewound_at,
           p.last_rewound_by,
           p.last_rewind_reason
      FROM idem_positions() AS p;
COMMENT ON VIEW idem_positions IS
    'the positions of the consumers the current role may act on, with their lag';

REVOKE ALL ON FUNCTION idem_position_advance(text, text, integer, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_position_rewind(text, text, integer, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_positions(text, text, integer) FROM PUBLIC;
REVOKE ALL ON idem_positions FROM PUBLIC;

--
-- The check of a redelivered message against its partition's position
-- (src/position_check.c): whether the position has passed the message's
-- offset, answered by each session from a cache of the positions it read,
-- which only a position that goes down or away can make wrong.  These
-- triggers tell every session of each of those (a rewind, an UPDATE,
-- DELETE or TRUNCATE by hand or by a logical subscriber's apply) once it
-- commits; an advance fires none.  Enabled ALWAYS, so that the apply
-- fires them.
--
CREATE TRIGGER positions_lowered
    AFTER UPDATE ON idem_consumer.positions
    FOR EACH ROW
    WHEN (NEW."position" OPERATOR(pg_catalog.<) OLD."position"
          OR NEW.consumer_id OPERATOR(pg_catalog.<>) OLD.consumer_id
          OR NEW.topic OPERATOR(pg_catalog.<>) OLD.topic
          OR NEW."partition" OPERATOR(pg_catalog.<>) OLD."partition")
    EXECUTE FUNCTION idem_consumer.storage_changed();
CREATE TRIGGER positions_deleted
    AFTER DELETE ON idem_consumer.positions
    FOR EACH ROW EXECUTE FUNCTION idem_consumer.storage_changed();
CREATE TRIGGER positions_truncated
    AFTER TRUNCATE ON idem_consumer.positions
    FOR EACH STATEMENT EXECUTE FUNCTION idem_consumer.storage_changed();
ALTER TABLE idem_consumer.positions ENABLE ALWAYS TRIGGER positions_lowered;
ALTER TABLE idem_consumer.positions ENABLE ALWAYS TRIGGER positions_deleted;
ALTER TABLE idem_consumer.positions ENABLE ALWAYS TRIGGER positions_truncated;

-- VOLATILE, as idem_is_processed: it answers for the moment of each call,
-- under a snapshot of its own.
CREATE FUNCTION idem_position_passed(consumer text, topic text, "partition" integer,
                                     "offset" bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_position_passed'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_position_passed(text, text, integer, bigint) IS
    'whether a consumer''s position on a partition has passed offset: the message there is applied, its redelivery a duplicate';
REVOKE ALL ON FUNCTION idem_position_passed(text, text, integer, bigint) FROM PUBLIC;
