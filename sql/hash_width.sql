--
-- The key hash of 1.2: SipHash-2-4 of (consumer id, key) under a seed of
-- the database's own, 64 bits wide.  Checked in databases of their own;
-- then this database's hash is narrowed for the tests after this one,
-- which make collisions on purpose (64 bits give none among the keys a
-- test can make).
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_hash_a;
CREATE DATABASE idem_hash_b;
\c idem_hash_a
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
SELECT k0 AS a_k0, k1 AS a_k1 FROM idem_consumer_local.key_seed \gset
SELECT hash_bits, k0 <> 0 OR k1 <> 0 AS seeded FROM idem_consumer_local.key_seed;
-- the hash spans 64 bits: among 10,000 keys some use the top ones
SELECT count(*) FILTER (WHERE h < -(2::numeric ^ 62) OR h > 2::numeric ^ 62) > 0 AS uses_top_bits,
       count(DISTINCT h) AS distinct_hashes
  FROM (SELECT idem_consumer.key_hash64(1, 'evt-' || g) AS h FROM generate_series(1, 10000) g) AS k;
-- new keys go into the first generation; a new install has no tables of
-- the keys of 1.0 and 1.1, nor their 32-bit hash
SELECT idem_apply('k-1', 'c', 'select 1') AS applied, idem_apply('k-1', 'c', 'select 1') AS again;
SELECT to_regclass('idem_consumer.processed_keys') IS NULL
       AND to_regclass('idem_consumer.key_collisions') IS NULL
       AND to_regprocedure('idem_consumer.key_hash(integer, text)') IS NULL AS no_legacy_pair,
       (SELECT count(*) FROM idem_consumer.processed_keys_1) AS in_first_generation,
       (SELECT count(*) FROM idem_processed_keys) AS shown,
       (SELECT keys_stored FROM idem_consumers WHERE consumer = 'c') AS counted;
SELECT idem_consumer.key_hash64(1, 'k-1') AS hash_in_a \gset
-- nobody but the owner reads the seed or computes the hash, even with
-- the schema granted
CREATE ROLE idem_hash_tenant;
GRANT USAGE ON SCHEMA idem_consumer, idem_consumer_local TO idem_hash_tenant;
SET ROLE idem_hash_tenant;
SELECT * FROM idem_consumer_local.key_seed;
SELECT idem_consumer.key_hash64(1, 'k-1');
RESET ROLE;
REVOKE USAGE ON SCHEMA idem_consumer, idem_consumer_local FROM idem_hash_tenant;
DROP ROLE idem_hash_tenant;

\c idem_hash_b
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
-- another database, another seed and other hashes
SELECT k0 <> :a_k0 OR k1 <> :a_k1 AS other_seed FROM idem_consumer_local.key_seed;
SELECT idem_consumer.key_hash64(1, 'k-1') <> :hash_in_a AS other_hash;
-- a broken seed table is a clear error, not a silent hash
DELETE FROM idem_consumer_local.key_seed;
\c
SELECT idem_apply('k-1', 'c', 'select 1');

\c :regression_db
DROP DATABASE idem_hash_a;
DROP DATABASE idem_hash_b;

-- narrowed to 32 bits before any key is stored here, with a fixed seed so
-- that the keys that collide are the same in every run
SELECT count(*) AS keys_stored FROM idem_processed_keys;
UPDATE idem_consumer_local.key_seed SET k0 = 1, k1 = 2, hash_bits = 32;
