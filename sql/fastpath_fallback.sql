--
-- The fast path (keystore.c) writes the key table of the current
-- generation, idem_consumer.processed_keys_1, in C, so
-- it must step aside for any table it does not exactly recognise and leave
-- the work to the SQL statements.  Each case below shows a behaviour only
-- the SQL statements have.  Every change to the storage is rolled back.
--
\set SHOW_CONTEXT never
CREATE TABLE fp (n int NOT NULL);
INSERT INTO fp VALUES (0);
SELECT idem_apply('warm', 'fp', 'update fp set n = n + 1');

--
-- A column the owner added: its default is filled in, for single keys and
-- batches (the fast path formed three-column tuples: a NULL pointer
-- dereference for a text column, a wrong value for a timestamptz one).
--
BEGIN;
ALTER TABLE idem_consumer.processed_keys_1 ADD COLUMN note text DEFAULT 'by sql';
SELECT idem_apply('col-1', 'fp', 'update fp set n = n + 1') AS applied;
SELECT idem_apply('col-1', 'fp', 'update fp set n = n + 1') AS applied_again;
SELECT k FROM idem_record_batch('fp', ARRAY['col-2', 'col-1']) AS k;
SELECT key, note FROM idem_consumer.processed_keys_1
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'fp')
 ORDER BY key;
ROLLBACK;

BEGIN;
ALTER TABLE idem_consumer.processed_keys_1
  ADD COLUMN seen_at timestamptz NOT NULL DEFAULT '2026-01-01 00:00:00+00';
SELECT idem_apply('col-3', 'fp', 'update fp set n = n + 1') AS applied;
SELECT key, seen_at = '2026-01-01 00:00:00+00' AS default_kept
  FROM idem_consumer.processed_keys_1 WHERE key = 'col-3';
ROLLBACK;

-- a dropped column still takes a slot in the table's rows
BEGIN;
ALTER TABLE idem_consumer.processed_keys_1 ADD COLUMN note text;
ALTER TABLE idem_consumer.processed_keys_1 DROP COLUMN note;
SELECT idem_apply('col-4', 'fp', 'update fp set n = n + 1') AS applied,
       idem_is_processed('col-4', 'fp') AS processed;
ROLLBACK;

--
-- A trigger on the storage runs for every key (the fast path would skip it).
--
CREATE FUNCTION fp_trigger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'trigger sees key %', NEW.key;
    RETURN NEW;
END $$;
BEGIN;
CREATE TRIGGER fp_seen BEFORE INSERT ON idem_consumer.processed_keys_1
    FOR EACH ROW EXECUTE FUNCTION fp_trigger();
SELECT idem_apply('trg-1', 'fp', 'update fp set n = n + 1') AS applied;
SELECT k FROM idem_record_batch('fp', ARRAY['trg-2']) AS k;
ROLLBACK;
DROP FUNCTION fp_trigger();

--
-- Row security on the storage is enforced (the fast path would bypass
-- it).  It binds only a table owner that is not a superuser, so the
-- storage is handed to such a role for the test.
--
CREATE ROLE idem_fp_owner;
BEGIN;
GRANT USAGE ON SCHEMA idem_consumer TO idem_fp_owner;
GRANT EXECUTE ON FUNCTION idem_consumer.key_hash64(integer, text) TO idem_fp_owner;
ALTER TABLE idem_consumer.processed_keys OWNER TO idem_fp_owner;
ALTER TABLE idem_consumer.key_collisions OWNER TO idem_fp_owner;
ALTER TABLE idem_consumer.processed_keys_1 OWNER TO idem_fp_owner;
ALTER TABLE idem_consumer.key_collisions_1 OWNER TO idem_fp_owner;
ALTER TABLE idem_consumer.consumers OWNER TO idem_fp_owner;
ALTER TABLE idem_consumer.processed_keys_1 ENABLE ROW LEVEL SECURITY;
ALTER TABLE idem_consumer.processed_keys_1 FORCE ROW LEVEL SECURITY;
CREATE POLICY fp_no_blocked ON idem_consumer.processed_keys_1
    USING (true) WITH CHECK (key NOT LIKE 'blocked%');
SELECT idem_apply('rls-1', 'fp', 'update fp set n = n + 1') AS applied;
SAVEPOINT blocked;
SELECT idem_apply('blocked-1', 'fp', 'update fp set n = n + 1') AS applied;
ROLLBACK TO SAVEPOINT blocked;
SELECT idem_is_processed('rls-1', 'fp') AS rls_1, idem_is_processed('blocked-1', 'fp') AS blocked_1;
ROLLBACK;
DROP ROLE idem_fp_owner;

--
-- A read-only transaction: a new key raises the usual error and records
-- nothing (the fast path would have written it).
--
BEGIN READ ONLY;
SELECT idem_is_processed('warm', 'fp') AS warm_processed;
SAVEPOINT ro;
SELECT idem_apply('ro-1', 'fp', 'select 1') AS applied;
ROLLBACK TO SAVEPOINT ro;
SELECT idem_is_processed('ro-1', 'fp') AS ro_processed;
COMMIT;

--
-- idem_consumer.fast_path = off sends everything to the SQL statements
-- (the isolation specs run both ways).  It shows in the index scans of a
-- duplicate: the fast path's one probe, against the SQL path's three: the
-- probe that no transaction in progress holds the key (which the INSERT
-- would wait for with the gate held, src/keystore.c), the INSERT ... ON
-- CONFLICT that finds the key, and its SELECT that tells a duplicate from
-- a collision.
--
CREATE FUNCTION fp_scans() RETURNS bigint LANGUAGE sql AS $$
    SELECT idx_scan FROM pg_stat_xact_all_tables
     WHERE relid = 'idem_consumer.processed_keys_1'::regclass
$$;
BEGIN;
SELECT idem_apply('warm', 'fp', 'update fp set n = n + 1') AS applied;
SELECT fp_scans() AS scans \gset
SELECT idem_apply('warm', 'fp', 'update fp set n = n + 1') AS applied;
SELECT fp_scans() - :scans AS index_scans;
SET LOCAL idem_consumer.fast_path = off;
SELECT fp_scans() AS scans \gset
SELECT idem_apply('warm', 'fp', 'update fp set n = n + 1') AS applied;
SELECT fp_scans() - :scans AS index_scans;
COMMIT;
-- A default on a column of the key table: every key gives every column,
-- but the fast path knows the table only without defaults and leaves
-- the duplicate to the SQL statements and their three scans.
BEGIN;
ALTER TABLE idem_consumer.processed_keys_1 ALTER COLUMN processed_at SET DEFAULT 0;
SELECT fp_scans() AS scans \gset
SELECT idem_apply('warm', 'fp', 'update fp set n = n + 1') AS applied;
SELECT fp_scans() - :scans AS index_scans;
ROLLBACK;
DROP FUNCTION fp_scans();

--
-- A check constraint on the storage is checked, and another index is
-- filled, here through an expression that shows each key (the fast path
-- would do neither).  The fast path found this table usable in the calls
-- above: what it found is not kept past a change to the table.
--
BEGIN;
ALTER TABLE idem_consumer.processed_keys_1
    ADD CONSTRAINT fp_no_blocked CHECK (key NOT LIKE 'blocked%') NOT VALID;
SAVEPOINT blocked;
\set VERBOSITY terse
SELECT idem_apply('blocked-2', 'fp', 'update fp set n = n + 1') AS applied;
\set VERBOSITY default
ROLLBACK TO SAVEPOINT blocked;
SELECT idem_is_processed('blocked-2', 'fp') AS blocked_2;
ROLLBACK;

CREATE FUNCTION fp_index_sees(key text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF key LIKE 'idx-%' THEN
        RAISE NOTICE 'index sees key %', key;
    END IF;
    RETURN key;
END $$;
BEGIN;
CREATE INDEX fp_seen ON idem_consumer.processed_keys_1 (public.fp_index_sees(key));
SELECT idem_apply('idx-1', 'fp', 'update fp set n = n + 1') AS applied;
ROLLBACK;
DROP FUNCTION fp_index_sees(text);

-- everything above was rolled back: only the first key is there
SELECT key FROM idem_processed_keys WHERE consumer = 'fp' ORDER BY key;
SELECT n FROM fp;
DROP TABLE fp;
