--
-- The fast path of idem_position_advance (src/positions_fastpath.c): the
-- row locked by the advance is updated without the executor, to the same
-- row the statement writes, with the index entries an update that is not
-- HOT needs; a table that is not as created, a row inserted by this
-- transaction and idem_consumer.fast_path = off take the statement.
--
-- A database of its own, so that every position is this test's.
\set regress_db :DBNAME
CREATE DATABASE positions_fastpath_test;
\c positions_fastpath_test
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
CREATE EXTENSION amcheck;
RESET client_min_messages;
-- 120 partitions, committed: their rows fill the table's first page
SELECT count(*) FROM generate_series(0, 119) AS p,
     LATERAL idem_position_advance('fp', 'orders', p, 10) AS a WHERE a IS NULL;

-- The same advance by the fast path (partition 0) and by the statement
-- (partition 1), in one transaction: the same row but for the partition.
-- The fast path reads the index once an advance (the lock), the statement
-- twice (the lock and the UPDATE's own scan).
BEGIN;
SELECT idx_scan AS before FROM pg_stat_xact_user_tables
 WHERE relid = 'idem_consumer.positions'::regclass \gset
SELECT idem_position_advance('fp', 'orders', 0, 15, 40, 10);
SELECT idx_scan - :before AS fast_index_scans FROM pg_stat_xact_user_tables
 WHERE relid = 'idem_consumer.positions'::regclass;
SET LOCAL idem_consumer.fast_path = off;
SELECT idx_scan AS before FROM pg_stat_xact_user_tables
 WHERE relid = 'idem_consumer.positions'::regclass \gset
SELECT idem_position_advance('fp', 'orders', 1, 15, 40, 10);
SELECT idx_scan - :before AS statement_index_scans FROM pg_stat_xact_user_tables
 WHERE relid = 'idem_consumer.positions'::regclass;
SELECT p.partition, p.position, p.log_end_offset, p.advanced_at = now() AS advanced_now,
       p.log_end_at = now() AS log_end_now, p.rewinds, p.last_rewound_at
  FROM idem_consumer.positions AS p WHERE p.partition IN (0, 1) ORDER BY p.partition;
-- no log-end offset given keeps the last one, as COALESCE does
RESET idem_consumer.fast_path;
COMMIT;
SELECT idem_position_advance('fp', 'orders', 0, 16);
SELECT p.position, p.log_end_offset FROM idem_consumer.positions AS p WHERE p.partition = 0;

-- Every partition advanced once, by the fast path, on a full page: the
-- updates that find no room there (most) are not HOT, and the new versions get
-- their index entries, which amcheck finds with every row of the table.
BEGIN;
SELECT count(*) FROM generate_series(2, 119) AS p,
     LATERAL idem_position_advance('fp', 'orders', p, 20) AS a WHERE a = 10;
SELECT n_tup_upd - n_tup_hot_upd > 100 AS mostly_not_hot FROM pg_stat_xact_user_tables
 WHERE relid = 'idem_consumer.positions'::regclass;
COMMIT;
SELECT bt_index_check('idem_consumer.positions_pkey', true);
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT count(*) AS rows, min(position), max(position) FROM idem_positions('fp', 'orders')
 WHERE partition >= 2;
SELECT count(*) AS found FROM generate_series(2, 119) AS p
  JOIN idem_consumer.positions AS x ON x.consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'fp')
   AND x.topic = 'orders' AND x.partition = p AND x.position = 20;
RESET enable_seqscan;
RESET enable_bitmapscan;

-- A trigger the table's owner adds: the advance takes the statement,
-- which fires it
CREATE FUNCTION pg_temp.seen() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE NOTICE 'trigger saw % -> %', OLD.position, NEW.position; RETURN NEW; END $$;
CREATE TRIGGER seen BEFORE UPDATE ON idem_consumer.positions
    FOR EACH ROW EXECUTE FUNCTION pg_temp.seen();
SELECT idem_position_advance('fp', 'orders', 0, 17);
DROP TRIGGER seen ON idem_consumer.positions;
-- and a check constraint added: the statement, which enforces it
ALTER TABLE idem_consumer.positions ADD CONSTRAINT below_100 CHECK (position < 100);
\set VERBOSITY terse
SELECT idem_position_advance('fp', 'orders', 0, 100);
\set VERBOSITY default
ALTER TABLE idem_consumer.positions DROP CONSTRAINT below_100;
-- as well in place of one of the script's: the checks are known by name
BEGIN;
ALTER TABLE idem_consumer.positions DROP CONSTRAINT positions_position_check;
ALTER TABLE idem_consumer.positions ADD CONSTRAINT below_100 CHECK (position < 100);
\set VERBOSITY terse
SELECT idem_position_advance('fp', 'orders', 0, 100);
\set VERBOSITY default
ROLLBACK;
SELECT idem_position_advance('fp', 'orders', 0, 100);
-- and row security, which binds none of the superusers here: the
-- statement all the same, which reads the index twice
BEGIN;
ALTER TABLE idem_consumer.positions ENABLE ROW LEVEL SECURITY;
SELECT idx_scan AS before FROM pg_stat_xact_user_tables
 WHERE relid = 'idem_consumer.positions'::regclass \gset
SELECT idem_position_advance('fp', 'orders', 0, 101);
SELECT idx_scan - :before AS statement_index_scans FROM pg_stat_xact_user_tables
 WHERE relid = 'idem_consumer.positions'::regclass;
ROLLBACK;

-- A row inserted by this transaction: the statement, whose foreign key
-- check the insert's would not make
BEGIN;
SELECT idem_position_advance('fp', 'orders', 200, 1);
SELECT idem_position_advance('fp', 'orders', 200, 2);
SELECT position FROM idem_positions('fp', 'orders', 200);
COMMIT;

\c :regress_db
DROP DATABASE positions_fastpath_test;
