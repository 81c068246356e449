--
-- Generations of keys (src/keygen.c): idem_key_generation_switch seals the
-- current generation and opens the next one of the ring; every delivery
-- is probed in the sealed generations before its key goes into the
-- current one, so a key is recorded once whatever the switches between
-- its deliveries, through the fast path and the SQL statements, alone and
-- in batches, with its fingerprint and its collisions.  In a database of
-- its own, whose hash is narrowed to 16 bits so that keys collide in every
-- generation.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_generations;
\c idem_generations
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
UPDATE idem_consumer_local.key_seed SET k0 = 3, k1 = 4, hash_bits = 16;
\c
SET client_min_messages = warning;

-- before the first switch: the first generation, opened with the extension
SELECT generation, epoch, state, opened_at, sealed_at FROM idem_key_generations;

CREATE TABLE gen_log (key text);
\set log 'insert into gen_log values ($1)'
CREATE FUNCTION deliver(prefix text, n int) RETURNS int LANGUAGE sql AS $$
    SELECT count(*) FILTER (WHERE idem_apply(prefix || g, 'gen', 'insert into gen_log values ($1)',
                                             ARRAY[prefix || g]))::int
      FROM generate_series(1, n) AS g
$$;
-- where each key is: generation, and whether as a collision
CREATE VIEW gen_keys AS
    SELECT 1 AS generation, key, false AS collision FROM idem_consumer.processed_keys_1
    UNION ALL SELECT 1, key, true FROM idem_consumer.key_collisions_1
    UNION ALL SELECT 2, key, false FROM idem_consumer.processed_keys_2
    UNION ALL SELECT 2, key, true FROM idem_consumer.key_collisions_2
    UNION ALL SELECT 3, key, false FROM idem_consumer.processed_keys_3
    UNION ALL SELECT 3, key, true FROM idem_consumer.key_collisions_3;

SELECT deliver('a-', 1000) AS applied;
SELECT idem_key_generation_switch() AS opened;
SELECT generation, epoch, state, opened_at IS NOT NULL AS has_opened_at,
       sealed_at IS NOT NULL AS has_sealed_at
  FROM idem_key_generations ORDER BY epoch;
-- a redelivery of every key of the sealed generation is a duplicate; new
-- keys go into the new one
SELECT deliver('a-', 1000) AS applied_again, deliver('b-', 1000) AS applied_new;
SELECT idem_key_generation_switch() AS opened;
SELECT deliver('a-', 1000) AS a_again, deliver('b-', 1000) AS b_again, deliver('c-', 1000) AS c_new;
-- each key once, in the generation that was current at its first
-- delivery, collisions included; each message applied once
SELECT generation, left(key, 1) AS prefix, count(*) AS keys,
       count(*) FILTER (WHERE collision) > 0 AS has_collisions
  FROM gen_keys GROUP BY 1, 2 ORDER BY 1, 2;
SELECT count(*) AS logged, count(DISTINCT key) AS distinct_logged FROM gen_log;
SELECT count(*) AS shown, count(DISTINCT key) AS distinct_shown FROM idem_processed_keys;
SELECT keys_stored FROM idem_consumers WHERE consumer = 'gen';

-- idem_is_processed and idem_forget find a key in any generation; a key
-- forgotten from a sealed generation is applied again, into the current one
SELECT idem_is_processed('a-7', 'gen') AS a7, idem_is_processed('b-7', 'gen') AS b7,
       idem_is_processed('c-7', 'gen') AS c7, idem_is_processed('d-7', 'gen') AS d7;
SELECT idem_forget('a-7', 'gen') AS forgotten, idem_is_processed('a-7', 'gen') AS still;
SELECT deliver('a-', 1000) AS a_again;
SELECT generation FROM gen_keys WHERE key = 'a-7';
-- a collision forgotten from a sealed generation is applied again, alone:
-- its occupant stays found
SELECT key AS collision FROM gen_keys WHERE generation = 1 AND collision ORDER BY key LIMIT 1 \gset
SELECT idem_forget(:'collision', 'gen') AS forgotten;
SELECT deliver('a-', 1000) AS a_again;
SELECT count(*) FILTER (WHERE key = :'collision') AS collision_logged, count(*) AS logged FROM gen_log;

-- batches: the keys of sealed generations are found, repeats collapse
SELECT k FROM idem_record_batch('gen', ARRAY['a-1', 'b-2', 'c-3', 'd-1', 'd-1', 'd-2']) AS k ORDER BY k;
SELECT k FROM idem_record_batch('gen', ARRAY['a-1', 'd-1', 'd-3']) AS k ORDER BY k;

-- the statements without the fast path decide the same
SET idem_consumer.fast_path = off;
SELECT deliver('a-', 1000) AS a_again, deliver('b-', 1000) AS b_again, deliver('e-', 50) AS e_new;
SELECT k FROM idem_record_batch('gen', ARRAY['b-9', 'e-9', 'f-1']) AS k ORDER BY k;
RESET idem_consumer.fast_path;
SELECT count(*) AS logged, count(DISTINCT key) AS distinct_logged FROM gen_log;

-- a key reused for another message in a sealed generation is refused
SELECT idem_set_fingerprint('gen', true);
SELECT idem_apply('fp-1', 'gen', :'log', ARRAY['fp-1']) AS applied;
SELECT idem_key_generation_switch() AS opened;
SELECT idem_apply('fp-1', 'gen', :'log', ARRAY['fp-1']) AS duplicate;
SET client_min_messages = notice;
DO $$
BEGIN
    PERFORM idem_apply('fp-1', 'gen', 'insert into gen_log values ($1 || ''!'')', ARRAY['fp-1']);
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'reuse: %', SQLSTATE;
END
$$;
SET client_min_messages = warning;

-- purged one by one (key_generation_interval = 0), retention removes
-- expired keys from sealed generations too
UPDATE idem_consumer.processed_keys_1 SET processed_at = processed_at - 30 * 86400;
UPDATE idem_consumer.key_collisions_1 SET processed_at = processed_at - 30 * 86400;
SELECT idem_set_retention('gen', '7 days');
SET idem_consumer.key_generation_interval = 0;
SELECT idem_purge('gen') > 0 AS purged;
RESET idem_consumer.key_generation_interval;
SELECT generation, count(*) AS keys FROM gen_keys GROUP BY 1 ORDER BY 1;
SELECT deliver('a-', 1000) AS a_again;

-- filters: built for the sealed generations, collisions included, they
-- find every key (none applied again) and spare new keys the probe of the
-- generations' indexes but for about 1% of them
SELECT idem_key_generation_build_filters() AS built;
SELECT generation, state, filtered FROM idem_key_generations ORDER BY epoch;
-- idem_metrics() gives their bytes: the pages of each sealed generation's
-- filter and of the filter of all of them
SELECT substring(idem_metrics() from E'\nidem_key_filter_bytes\\{database="idem_generations"\\} (\\d+)\n')::bigint
       = 8192 * ((SELECT sum(filter_chunks) FROM idem_consumer.key_generations)
                 + (SELECT chunks FROM idem_consumer_local.key_filter_all)) AS filter_bytes_exact,
       (SELECT sum(filter_chunks) FROM idem_consumer.key_generations) > 0 AS has_chunks;
SELECT count(*) FILTER (WHERE k.collision) > 0 AS has_collisions
  FROM gen_keys AS k WHERE k.generation = 2;
SELECT deliver('a-', 1000) AS a_again, deliver('b-', 1000) AS b_again, deliver('c-', 1000) AS c_again;
CREATE FUNCTION sealed_index_scans() RETURNS bigint LANGUAGE sql AS $$
    SELECT sum(pg_stat_get_xact_numscans(format('idem_consumer.processed_keys_%s_hash', g)::regclass))
      FROM generate_series(1, 3) AS g
$$;
BEGIN;
SELECT sealed_index_scans() AS scans_before \gset
SELECT deliver('n-', 1000) AS new_keys;
SELECT sealed_index_scans() - :scans_before < 90 AS few_probes;
ROLLBACK;
-- and the filter of all sealed generations, built with theirs, holds
-- every one of them: a new key reads one page of it, and the
-- generations' own filters only for the few keys it may hold
SELECT f.epochs @> ARRAY(SELECT epoch FROM idem_key_generations WHERE state = 'sealed')
       AS holds_every_sealed
  FROM idem_consumer_local.key_filter_all AS f;
CREATE FUNCTION filter_pages(OUT own bigint, OUT all_sealed bigint) LANGUAGE sql AS $$
    SELECT (SELECT sum(pg_stat_get_xact_blocks_fetched(format('idem_consumer_local.key_filter_%s', g)::regclass))
              FROM generate_series(1, 16) AS g),
           (SELECT sum(pg_stat_get_xact_blocks_fetched(format('idem_consumer_local.key_filter_all_%s', p)::regclass))
              FROM generate_series(1, 2) AS p)
$$;
BEGIN;
SELECT own AS own_before, all_sealed AS all_before FROM filter_pages() \gset
SELECT deliver('m-', 1000) AS new_keys;
SELECT all_sealed - :all_before AS pages_of_all, own - :own_before < 90 AS few_own_pages
  FROM filter_pages();
ROLLBACK;
-- the statements without the fast path use them too
SET idem_consumer.fast_path = off;
SELECT deliver('b-', 1000) AS b_again, deliver('n2-', 100) AS new_keys;
RESET idem_consumer.fast_path;
-- built once: nothing left to build
SELECT idem_key_generation_build_filters() AS built;

-- who may switch: not PUBLIC, which reads no generation either
CREATE ROLE gen_tenant;
SET ROLE gen_tenant;
SELECT idem_key_generation_switch();
SELECT idem_key_generation_build_filters();
SELECT * FROM idem_key_generations;
RESET ROLE;
-- nor the filters, even with their schema granted: it can neither read
-- nor change any table there, so it learns nothing of other tenants' keys
-- from them and cannot make a filter hide a key
CREATE FUNCTION gen_leak(int) RETURNS boolean LANGUAGE plpgsql COST 0.0001 AS $$
BEGIN RAISE NOTICE 'leaked %', $1; RETURN true; END $$;
GRANT USAGE ON SCHEMA idem_consumer_local TO gen_tenant;
SET ROLE gen_tenant;
SELECT * FROM idem_consumer_local.key_filter_all;
SELECT chunk FROM idem_consumer_local.key_filter_all_1 WHERE gen_leak(chunk);
DELETE FROM idem_consumer_local.key_filter_all;
TRUNCATE idem_consumer_local.key_filter_all_2;
RESET ROLE;
SELECT count(*) AS tables_open_to_tenant
  FROM pg_class AS c
 WHERE c.relnamespace = 'idem_consumer_local'::regnamespace AND c.relkind = 'r'
   AND has_table_privilege('gen_tenant', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, TRIGGER');
REVOKE USAGE ON SCHEMA idem_consumer_local FROM gen_tenant;
DROP FUNCTION gen_leak(int);
-- a monitoring role reads them
GRANT pg_monitor TO gen_tenant;
SET ROLE gen_tenant;
SELECT count(*) AS generations FROM idem_key_generations;
RESET ROLE;
DROP ROLE gen_tenant;

-- bad calls
SELECT idem_key_generation_switch(wait => '-1 second');
SELECT idem_key_generation_switch(wait => '2 days');
SELECT idem_key_generation_switch(wait => NULL) AS no_wait_no_switch;
BEGIN;
SELECT idem_apply('in-xact', 'gen', :'log', ARRAY['in-xact']);
SELECT idem_key_generation_switch();
ROLLBACK;

-- the ring is full when the next generation still holds keys
SELECT count(*) AS live FROM idem_key_generations;
SELECT format('SELECT idem_key_generation_switch()') FROM generate_series(1, 12) \gexec
SELECT count(*) AS live, max(generation) FILTER (WHERE state = 'current') AS current
  FROM idem_key_generations;
SELECT idem_key_generation_switch();
SELECT deliver('a-', 1000) AS a_again, deliver('b-', 1000) AS b_again, deliver('c-', 1000) AS c_again;
-- retirement carries the live keys of the generation the switch opens
-- next into the current one and drops it, so that the ring goes on; its
-- tables are emptied at the next call, once the drop has committed
SELECT idem_key_generation_retire() AS dropped;
SELECT idem_key_generation_retire() AS dropped;
SELECT idem_key_generation_switch() > 0 AS switched;
SELECT count(*) AS live FROM idem_key_generations;
SELECT deliver('a-', 1000) AS a_again, deliver('b-', 1000) AS b_again, deliver('c-', 1000) AS c_again;

\c :regression_db
DROP DATABASE idem_generations;
