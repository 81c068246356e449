--
-- A purge run reads the whole table once, for each consumer's latest
-- activity and, per chunk of 2048 blocks (16 MB), each consumer's oldest
-- key; then it reads again only the chunks that hold a key old enough to
-- go.  In a database of its own, so that keys lie in the order they were
-- stored.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_retention_chunks;
\c idem_retention_chunks
SET client_min_messages = warning;
-- keys purged one by one (by whole generations, the default: key_generation_retention)
SET idem_consumer.key_generation_interval = 0;
CREATE EXTENSION idem_consumer;
INSERT INTO idem_consumer.consumers (name) VALUES ('chunks'), ('other');
-- store_keys(consumer, prefix, n, age): n keys recorded age ago (but for
-- those whose hash another key of the consumer has taken)
CREATE FUNCTION store_keys(consumer text, prefix text, n int, age interval) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO idem_consumer.processed_keys_1 (consumer_id, processed_at, key)
    SELECT c.consumer_id,
           floor(extract(epoch FROM now() - age - timestamptz '2000-01-01 00:00:00+00'))::int,
           prefix || g
      FROM idem_consumer.consumers c, generate_series(1, n) g
     WHERE c.name = consumer
    ON CONFLICT DO NOTHING;
$$;
-- blocks of processed_keys this transaction has read so far
CREATE FUNCTION blocks_read() RETURNS bigint
LANGUAGE sql AS $$
    SELECT pg_stat_get_xact_blocks_fetched('idem_consumer.processed_keys_1'::regclass)
$$;

-- In chunk 0: expired keys of "other", then fresh keys of "chunks" that
-- fill it; after them, five expired keys of "chunks", and a fresh key of
-- "other" (the default window is 7 days).
SELECT store_keys('other', 'expired-', 1000, '30 days');
SELECT store_keys('chunks', 'fresh-', 400000, '0');
SELECT store_keys('chunks', 'expired-', 5, '30 days');
SELECT store_keys('other', 'fresh-', 1, '0');
SELECT pg_relation_size('idem_consumer.processed_keys_1') / 8192 AS blocks \gset
SELECT :blocks > 2048 + 100 AS beyond_chunk_0,
       (SELECT min(k.ctid) >= '(2048,0)' FROM idem_consumer.processed_keys_1 k
         JOIN idem_consumer.consumers c USING (consumer_id)
         WHERE c.name = 'chunks' AND k.key LIKE 'expired-%') AS expired_of_chunks_beyond_chunk_0,
       (SELECT max(k.ctid) < '(2048,0)' FROM idem_consumer.processed_keys_1 k
         JOIN idem_consumer.consumers c USING (consumer_id)
         WHERE c.name = 'other' AND k.key LIKE 'expired-%') AS expired_of_other_in_chunk_0;

-- Purging "chunks" reads every block once, then only the blocks after
-- chunk 0 (where "other" has expired keys, but this purge is not for
-- "other"), and the five expired rows again to remove them; reading chunk
-- 0 again would add 2048 blocks.
BEGIN;
SELECT blocks_read() AS before \gset
SELECT idem_purge('chunks', 100000) AS purged;
SELECT blocks_read() - :before AS read \gset
SELECT :read >= :blocks AS read_every_block,
       :read <= :blocks + (:blocks - 2048) + 100 AS chunk_0_read_once;
COMMIT;
-- Purging everyone reads chunk 0 again, for the expired keys of "other".
SELECT idem_purge(NULL, 100000) AS purged;
SELECT c.name, count(*) FILTER (WHERE k.key LIKE 'expired-%') AS expired_left,
       count(*) FILTER (WHERE k.key LIKE 'fresh-%') > 0 AS fresh_kept
  FROM idem_consumer.processed_keys_1 k JOIN idem_consumer.consumers c USING (consumer_id)
 GROUP BY 1 ORDER BY 1;

\c :regression_db
DROP DATABASE idem_retention_chunks;
