--
-- idem_metrics(): the dead-letter gauges idem_dlq_pending and
-- idem_dlq_oldest_pending_age_seconds, read from the tables at each scrape
-- through the partial index of pending entries.
--
-- seqscans off before the first scrape of this session plans the query:
-- the index check below then fails only if the query cannot use the index
SET enable_seqscan = off;
CREATE TABLE mdl (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
INSERT INTO mdl VALUES (1);

-- three messages parked for mdl-a, one of them discarded; mdl-b has none
SELECT idem_try_apply('m-' || g, 'mdl-a', 'update mdl set n = n / 0 where id = 1')
  FROM generate_series(1, 3) g;
SELECT idem_dlq_discard(id, 'test')
  FROM idem_dead_letters WHERE consumer = 'mdl-a' AND key = 'm-3';
SELECT idem_apply('m-1', 'mdl-b', 'update mdl set n = n + 1 where id = 1');

CREATE FUNCTION mdl_lines() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT line FROM regexp_split_to_table(idem_metrics(), E'\n') AS line
     WHERE line ~ '^# (HELP|TYPE) idem_dlq_(pending|oldest)'
        OR line ~ '^idem_dlq_(pending|oldest_pending_age_seconds)\{database="contrib_regression",consumer="mdl-'
$$;

-- the pending count of every consumer (0 included); an age only where
-- something is pending: the time since the first failure of the oldest
-- pending entry, here two hours (the scrape shares the transaction's now());
-- the discarded entry is older still and does not count
BEGIN;
UPDATE idem_consumer.dead_letters SET first_failed_at = now() - interval '2 hours'
 WHERE key = 'm-1';
UPDATE idem_consumer.dead_letters SET first_failed_at = now() - interval '5 hours'
 WHERE key = 'm-3';
SELECT * FROM mdl_lines();
-- the scrape read the pending entries through their partial index
SELECT pg_stat_get_xact_numscans('idem_consumer.dead_letters_pending'::regclass) > 0
       AS read_pending_index;
COMMIT;

-- a replay that succeeds leaves one pending entry, the younger one
UPDATE mdl SET n = 1;
UPDATE idem_consumer.dead_letters SET sql = 'update mdl set n = n + 1 where id = 1'
 WHERE key = 'm-1';
SELECT idem_dlq_replay(id)
  FROM idem_dead_letters WHERE consumer = 'mdl-a' AND key = 'm-1';
SELECT line ~ '^idem_dlq_oldest_pending_age_seconds\{database="contrib_regression",consumer="mdl-a"\} [0-9]+\.[0-9]{3}$'
       AS age_format,
       substring(line from ' (\S+)$')::float8 < 60 AS younger
  FROM mdl_lines() AS line WHERE line LIKE 'idem_dlq_oldest%{%';
SELECT line FROM mdl_lines() AS line WHERE line LIKE 'idem_dlq_pending{%';

-- pg_monitor reads the gauges without any privilege on the tables
CREATE ROLE mdl_monitor;
GRANT pg_monitor TO mdl_monitor;
SET ROLE mdl_monitor;
SELECT count(*) AS pending_lines FROM regexp_split_to_table(idem_metrics(), E'\n') AS line
 WHERE line ~ '^idem_dlq_pending\{database="contrib_regression",consumer="mdl-';
RESET ROLE;
DROP ROLE mdl_monitor;
DROP FUNCTION mdl_lines();
DROP TABLE mdl;
