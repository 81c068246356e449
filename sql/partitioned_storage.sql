--
-- The fast paths (keystore_fastpath.c, effects_fastpath.c) write the
-- storage tables without the executor, which alone routes rows among
-- partitions and checks partition constraints.  They step aside for a
-- table a DBA partitioned and for a table a DBA attached as a partition of
-- another, and the SQL statements give the answers, with the fast path on.
-- In a database of its own, whose storage is changed for good.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_partitioned;
\c idem_partitioned
SET client_min_messages = warning;
-- the rows in errors hold times and random provider keys
\set VERBOSITY terse
CREATE EXTENSION idem_consumer;
CREATE TABLE log (key text NOT NULL);
SELECT idem_consumer_create(name) FROM unnest(ARRAY['p1', 'p2']) AS name;
SELECT consumer_id AS p1_id FROM idem_consumer.consumers WHERE name = 'p1' \gset

--
-- processed_keys_1, the key table of the current generation, attached as
-- the partition of consumer p1: a key of p2
-- breaks the partition constraint, as the INSERT statement finds (the
-- fast path inserted it).
--
CREATE TABLE keys_by_consumer (LIKE idem_consumer.processed_keys_1)
    PARTITION BY LIST (consumer_id);
ALTER TABLE keys_by_consumer ATTACH PARTITION idem_consumer.processed_keys_1
    FOR VALUES IN (:p1_id);
\c
SHOW idem_consumer.fast_path;
SELECT idem_apply('a-1', 'p1', 'insert into log values ($1)', ARRAY['a-1']) AS applied;
SELECT idem_apply('a-1', 'p1', 'insert into log values ($1)', ARRAY['a-1']) AS applied_again;
SELECT idem_is_processed('a-1', 'p1') AS processed;
SELECT k FROM idem_record_batch('p1', ARRAY['a-2', 'a-1']) AS k;
SELECT idem_apply('a-3', 'p2', 'insert into log values ($1)', ARRAY['a-3']) AS applied;
\echo :SQLSTATE
SELECT k FROM idem_record_batch('p2', ARRAY['a-4']) AS k;
\echo :SQLSTATE
SELECT idem_try_apply('a-5', 'p2', 'insert into log values ($1)', ARRAY['a-5']) AS outcome;
\echo :SQLSTATE
SELECT consumer_id = :p1_id AS of_p1, key FROM keys_by_consumer ORDER BY key;
SELECT key FROM log ORDER BY key;
ALTER TABLE keys_by_consumer DETACH PARTITION idem_consumer.processed_keys_1;
DROP TABLE keys_by_consumer;

--
-- effects attached as the partition of consumer p1: a new effect of p2
-- breaks the partition constraint (the fast path inserted it); p1's
-- effects are leased and completed as usual.
--
CREATE TABLE effects_by_consumer (LIKE idem_consumer.effects)
    PARTITION BY LIST (consumer_id);
ALTER TABLE effects_by_consumer ATTACH PARTITION idem_consumer.effects
    FOR VALUES IN (:p1_id);
\c
SELECT action, fence FROM idem_effect_begin('p1', 'charge-1', '{"amount": 1}', '1 minute');
SELECT idem_effect_complete('p1', 'charge-1', 1, '{"ok": true}');
SELECT action, result FROM idem_effect_begin('p1', 'charge-1', '{"amount": 1}', '1 minute');
SELECT action FROM idem_effect_begin('p2', 'charge-2', '{"amount": 2}', '1 minute');
\echo :SQLSTATE
SELECT consumer, key, state FROM idem_effects ORDER BY consumer, key;
ALTER TABLE effects_by_consumer DETACH PARTITION idem_consumer.effects;
DROP TABLE effects_by_consumer;

--
-- processed_keys_1 and effects made partitioned tables by consumer, each
-- partition with the unique index the extension's table has.  The
-- old tables stay, renamed, for the views that read them.
--
TRUNCATE log;
ALTER EXTENSION idem_consumer DROP TABLE idem_consumer.processed_keys_1;
ALTER TABLE idem_consumer.processed_keys_1 RENAME TO processed_keys_1_unpartitioned;
ALTER INDEX idem_consumer.processed_keys_1_hash RENAME TO processed_keys_1_unpartitioned_hash;
CREATE TABLE idem_consumer.processed_keys_1 (LIKE idem_consumer.processed_keys_1_unpartitioned)
    PARTITION BY LIST (consumer_id);
CREATE TABLE idem_consumer.processed_keys_1_p1 PARTITION OF idem_consumer.processed_keys_1
    FOR VALUES IN (:p1_id);
CREATE TABLE idem_consumer.processed_keys_1_rest PARTITION OF idem_consumer.processed_keys_1
    DEFAULT;
CREATE INDEX processed_keys_1_hash ON idem_consumer.processed_keys_1
    (idem_consumer.key_hash64(consumer_id, key));
CREATE UNIQUE INDEX ON idem_consumer.processed_keys_1_p1 (idem_consumer.key_hash64(consumer_id, key));
CREATE UNIQUE INDEX ON idem_consumer.processed_keys_1_rest (idem_consumer.key_hash64(consumer_id, key));

ALTER EXTENSION idem_consumer DROP TABLE idem_consumer.effects;
ALTER TABLE idem_consumer.effects RENAME TO effects_unpartitioned;
ALTER TABLE idem_consumer.effects_unpartitioned RENAME CONSTRAINT effects_pkey TO effects_unpartitioned_pkey;
ALTER INDEX idem_consumer.effects_outbox RENAME TO effects_unpartitioned_outbox;
CREATE TABLE idem_consumer.effects
    (LIKE idem_consumer.effects_unpartitioned INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)
    PARTITION BY LIST (consumer_id);
CREATE TABLE idem_consumer.effects_p1 PARTITION OF idem_consumer.effects
    FOR VALUES IN (:p1_id);
CREATE TABLE idem_consumer.effects_rest PARTITION OF idem_consumer.effects DEFAULT;
\c
SELECT idem_apply('b-1', 'p1', 'insert into log values ($1)', ARRAY['b-1']) AS applied;
SELECT idem_apply('b-1', 'p1', 'insert into log values ($1)', ARRAY['b-1']) AS applied_again;
SELECT idem_apply('b-1', 'p1', 'insert into log values ($1)', ARRAY['another message']) AS reused;
\echo :SQLSTATE
SELECT idem_apply('b-2', 'p2', 'insert into log values ($1)', ARRAY['b-2']) AS applied;
SELECT idem_is_processed('b-1', 'p1') AS b1, idem_is_processed('b-2', 'p1') AS b2_of_p1,
       idem_is_processed('b-2', 'p2') AS b2;
SELECT k FROM idem_record_batch('p1', ARRAY['b-3', 'b-1', 'b-3']) AS k;
SELECT * FROM idem_record_batch('p2', ARRAY['b-2', 'b-4'], ARRAY['fp-2', 'fp-4']);
SELECT idem_try_apply('b-5', 'p2', 'insert into log values ($1)', ARRAY['b-5']) AS outcome;
SELECT idem_try_apply('b-5', 'p2', 'insert into log values ($1)', ARRAY['b-5']) AS outcome_again;
SELECT idem_forget('b-1', 'p1') AS forgotten, idem_is_processed('b-1', 'p1') AS b1;
SELECT tableoid::regclass AS partition, key FROM idem_consumer.processed_keys_1 ORDER BY key;
SELECT key FROM log ORDER BY key;

SELECT action, fence FROM idem_effect_begin('p1', 'charge-3', '{"amount": 3}', '1 minute');
SELECT action FROM idem_effect_begin('p1', 'charge-3', '{"amount": 3}', '1 minute');
SELECT idem_effect_complete('p1', 'charge-3', 1, '{"ok": true}');
SELECT action, result FROM idem_effect_begin('p1', 'charge-3', '{"amount": 3}', '1 minute');
SELECT action, fence FROM idem_effect_begin('p2', 'charge-4', NULL, '1 minute');
SELECT tableoid::regclass AS partition, key, state, fence
  FROM idem_consumer.effects ORDER BY key;

\c :regression_db
DROP DATABASE idem_partitioned;
