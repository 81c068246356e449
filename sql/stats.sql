--
-- Counters: outcomes count when their transaction commits; calls that
-- raised or whose transaction rolled back count as failed.  Needs
-- idem_consumer in shared_preload_libraries.
--
SELECT idem_stats_reset();
CREATE TABLE st (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
INSERT INTO st VALUES (1);
\set upd 'update st set n = n + 1 where id = 1'

-- 3 applied, then 2 duplicates
SELECT count(*) FILTER (WHERE idem_apply('s-' || g, 'stats-a', :'upd')) FROM generate_series(1, 3) g;
SELECT count(*) FILTER (WHERE idem_apply('s-' || g, 'stats-a', :'upd')) FROM generate_series(1, 2) g;
-- a transaction that rolls back: its applied call and its duplicate fail
BEGIN;
SELECT idem_apply('s-4', 'stats-a', :'upd'), idem_apply('s-1', 'stats-a', :'upd');
ROLLBACK;
-- a call that raises fails
SELECT idem_apply('s-5', 'stats-a', 'update st set n = n / 0');
-- a call undone by ROLLBACK TO SAVEPOINT fails, its neighbour commits
BEGIN;
SAVEPOINT sp;
SELECT idem_apply('s-6', 'stats-a', :'upd');
ROLLBACK TO SAVEPOINT sp;
SAVEPOINT sp2;
SELECT idem_apply('s-7', 'stats-a', :'upd');
RELEASE SAVEPOINT sp2;
COMMIT;
-- nothing is counted before the transaction ends
BEGIN;
SELECT idem_apply('s-8', 'stats-a', :'upd', event_time => now() - interval '2 seconds');
SELECT applied FROM idem_stats WHERE consumer = 'stats-a';
COMMIT;
SELECT n FROM st;

SELECT consumer, applied, duplicates, failed, dead_lettered,
       round(duplicate_ratio::numeric, 4) AS duplicate_ratio,
       latency_p50_ms > 0 AS p50_positive,
       latency_p50_ms <= latency_p95_ms AND latency_p95_ms <= latency_p99_ms
           AND latency_p99_ms <= latency_max_ms AS quantiles_ordered,
       lag_last_ms BETWEEN 2000 AND 60000 AS lag_last_from_event_time,
       last_applied_at BETWEEN now() - interval '1 minute' AND clock_timestamp() AS last_applied,
       last_duplicate_at IS NOT NULL AS last_duplicate
  FROM idem_stats WHERE consumer = 'stats-a';

-- quantiles are within 5% of the truth: 100 messages whose event times
-- are 10 ms apart commit together, so their lags are i * 10 ms plus the
-- few milliseconds until the commit
SELECT count(*) FILTER (WHERE idem_apply('lag-' || i, 'stats-lag', 'select 1',
                                         event_time => now() - i * interval '10 ms'))
  FROM generate_series(1, 100) i;
SELECT applied,
       abs(lag_p95_ms / 950 - 1) < 0.06 AS lag_p95_within_5_percent,
       abs(lag_last_ms - 1000) < 1000 AS lag_last
  FROM idem_stats WHERE consumer = 'stats-lag';

-- idem_consumer.track = off skips counting
SET idem_consumer.track = off;
SELECT idem_apply('s-untracked', 'stats-a', :'upd');
RESET idem_consumer.track;
SELECT applied FROM idem_stats WHERE consumer = 'stats-a';

-- reset of one consumer leaves the others
SELECT idem_apply('b-1', 'stats-b', 'select 1');
SELECT idem_stats_reset('stats-a');
SELECT consumer, applied, duplicates, failed, latency_p50_ms IS NULL AS no_latency,
       lag_last_ms IS NULL AS no_lag, last_applied_at IS NULL AS never_applied
  FROM idem_stats WHERE consumer IN ('stats-a', 'stats-b') ORDER BY consumer;

-- only superusers and roles granted it may reset; a role reads the
-- counters of the consumers whose owner's privileges it has, pg_monitor
-- (pg_read_all_stats) every consumer's
CREATE ROLE stats_reader;
SET ROLE stats_reader;
SELECT count(*) AS rows_of_stats_b FROM idem_stats WHERE consumer = 'stats-b';
SELECT idem_stats_reset();
SELECT idem_metrics();
RESET ROLE;
GRANT pg_monitor TO stats_reader;
SET ROLE stats_reader;
SELECT applied FROM idem_stats WHERE consumer = 'stats-b';
SELECT idem_metrics() LIKE '%idem_applied_total{database="contrib_regression",consumer="stats-b"} 1%' AS monitor_reads_metrics;
RESET ROLE;
DROP ROLE stats_reader;

-- the Prometheus exposition, line by line; a name with a newline is
-- refused to a new consumer, but one stored before that rule is served
INSERT INTO idem_consumer.consumers (name, owner) VALUES (E'we"ird\\na\nme', current_user::regrole);
SELECT idem_apply('e-1', E'we"ird\\na\nme', 'select 1', event_time => now());
SELECT idem_apply('e-1', E'we"ird\\na\nme', 'select 1');
CREATE TEMP TABLE expo AS
    SELECT n, line
      FROM regexp_split_to_table(rtrim(idem_metrics(), E'\n'), E'\n') WITH ORDINALITY AS t(line, n);
-- every line is a HELP, a TYPE or a sample of the grammar
SELECT count(*) AS malformed_lines FROM expo
 WHERE line !~ '^# (HELP|TYPE) idem_[a-z_]+ .+$'
   AND line !~ '^idem_[a-z_]+\{database="([^"\\]|\\[\\"n])*",consumer="([^"\\]|\\[\\"n])*"(,le="([0-9.e+-]+|\+Inf)")?\} [0-9][0-9.e+-]*$'
   AND line !~ '^idem_(keys_stored|key_store_bytes|key_filter_bytes)\{database="([^"\\]|\\[\\"n])*"\} [0-9]+$'
   AND line !~ '^idem_key_generation(_interval_seconds|_current_age_seconds|s_sealed|_settling_age_seconds)\{database="([^"\\]|\\[\\"n])*"\} [0-9]+\.[0-9]{3}$';
-- every family has HELP and TYPE, in that order, before its samples
SELECT substring(line from '^# TYPE (\S+)') AS family, substring(line from '(\S+)$') AS type
  FROM expo WHERE line LIKE '# TYPE %' ORDER BY n;
SELECT count(*) AS families_without_help FROM expo t
 WHERE t.line LIKE '# TYPE %'
   AND NOT EXISTS (SELECT FROM expo h WHERE h.n = t.n - 1
                   AND h.line LIKE '# HELP ' || substring(t.line from '^# TYPE (\S+)') || ' %');
-- the label escapes quote, backslash and newline
SELECT line FROM expo WHERE line LIKE 'idem_applied_total{database="contrib_regression",consumer="we%';
-- cumulative buckets never decrease and end with +Inf = _count = applied
CREATE TEMP TABLE buckets AS
    SELECT n, substring(line from '^(idem_[a-z_]+)_bucket') AS family,
           substring(line from 'consumer="((?:[^"\\]|\\.)*)"') AS consumer,
           substring(line from 'le="([^"]+)"') AS le,
           substring(line from ' (\S+)$')::numeric AS value
      FROM expo WHERE line ~ '_bucket\{database="contrib_regression",';
SELECT count(*) AS decreasing_buckets FROM (
    SELECT value < lag(value) OVER (PARTITION BY family, consumer ORDER BY n) AS decreasing FROM buckets) d
 WHERE decreasing;
SELECT count(*) AS le_not_increasing FROM (
    SELECT le <> '+Inf' AND lag(le) OVER w <> '+Inf' AND le::float8 <= (lag(le) OVER w)::float8 AS bad
      FROM buckets WINDOW w AS (PARTITION BY family, consumer ORDER BY n)) d
 WHERE bad;
SELECT s.consumer, s.applied,
       (SELECT value FROM buckets b WHERE b.family = 'idem_processing_latency_seconds'
           AND b.consumer = replace(replace(replace(s.consumer, E'\\', E'\\\\'), '"', E'\\"'), E'\n', E'\\n')
           AND b.le = '+Inf') AS inf_bucket,
       (SELECT substring(line from ' (\S+)$')::numeric FROM expo
         WHERE starts_with(line, 'idem_processing_latency_seconds_count{database="contrib_regression",consumer="'
                         || replace(replace(replace(s.consumer, E'\\', E'\\\\'), '"', E'\\"'), E'\n', E'\\n') || '"}')) AS count
  FROM idem_stats s WHERE s.consumer IN ('stats-b', 'stats-lag', E'we"ird\\na\nme')
 ORDER BY s.consumer;
-- keys stored: one gauge for all consumers, the live rows of the tables'
-- cumulative statistics (a scrape reads no key), which equals the keys in
-- the tables once this session's statistics are flushed (an autovacuum
-- ANALYZE meanwhile may replace it with its estimate, hence the 1%)
SELECT count(*) AS keys_stored_samples FROM expo WHERE line ~ '^idem_keys_stored\{database="contrib_regression"\} \d+$';
SELECT pg_stat_force_next_flush();
SELECT abs(substring(idem_metrics() from E'\nidem_keys_stored\\{database="contrib_regression"\\} (\\d+)\n')::bigint - k.n) <= k.n / 100
       AS keys_stored_close
  FROM (SELECT count(*) AS n FROM idem_processed_keys) AS k;
SELECT consumer, keys_stored FROM idem_consumers WHERE consumer IN ('stats-a', 'stats-lag') ORDER BY consumer;
-- the bytes of the key store: every generation's key and collision
-- tables (and 1.1's, in a database updated from it) with their indexes; of the filters: none before a
-- generation is sealed and its filter built
SELECT substring(line from ' (\d+)$')::bigint =
       (SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c
         WHERE c.relnamespace = 'idem_consumer'::regnamespace AND c.relkind = 'r'
           AND c.relname ~ '^(processed_keys|key_collisions)(_\d+)?$') AS key_store_bytes_exact,
       (SELECT count(*) FROM pg_class c
         WHERE c.relnamespace = 'idem_consumer'::regnamespace AND c.relkind = 'r'
           AND c.relname ~ '^(processed_keys|key_collisions)(_\d+)?$') AS key_tables
  FROM expo WHERE line ~ '^idem_key_store_bytes\{database="contrib_regression"\} \d+$';
SELECT line FROM expo WHERE line LIKE 'idem_key_filter_bytes{%';

-- the other counters: every consumer that made a counted call is tracked
SELECT consumers = (SELECT count(*) FROM idem_stats) AS consumers_listed,
       max_consumers, untracked_calls FROM idem_stats_info;

-- idem_try_apply: a committed dead-lettering counts once, its redeliveries
-- count as duplicates, a rolled-back one as failed
SELECT idem_try_apply('d-1', 'stats-dlq', 'update st set n = n / 0');
SELECT idem_try_apply('d-1', 'stats-dlq', 'update st set n = n / 0');
SELECT idem_try_apply('d-2', 'stats-dlq', 'update st set n = n + 1 where id = 1');
BEGIN;
SELECT idem_try_apply('d-3', 'stats-dlq', 'update st set n = n / 0');
ROLLBACK;
SELECT applied, duplicates, failed, dead_lettered FROM idem_stats WHERE consumer = 'stats-dlq';
SELECT line FROM regexp_split_to_table(idem_metrics(), E'\n') AS line
 WHERE line LIKE 'idem_dlq_enqueue_total{database="contrib_regression",consumer="stats-dlq"}%';
SELECT consumer, keys_stored, dead_letters_pending, oldest_pending_age < interval '1 minute' AS recent
  FROM idem_consumers WHERE consumer = 'stats-dlq';

-- idem_record_batch: each element is a delivery; new keys are applied,
-- the others (recorded before, or repeated in the batch) duplicates
SELECT count(*) FROM idem_record_batch('stats-batch', ARRAY['b1', 'b2', 'b3']);
SELECT count(*) FROM idem_record_batch('stats-batch', ARRAY['b3', 'b4', 'b4']);
SELECT applied, duplicates, failed FROM idem_stats WHERE consumer = 'stats-batch';

-- a call of the same consumer inside a savepoint after one outside it
-- is counted at its own level: the rollback to the savepoint fails it
-- alone, and a released one commits with the transaction (the consumer
-- exists before: the counts of one whose creation rolled back are not kept)
SELECT idem_apply('n-0', 'stats-nest', 'select 1');
BEGIN;
SELECT idem_apply('n-1', 'stats-nest', 'select 1');
SAVEPOINT inner_call;
SELECT idem_apply('n-2', 'stats-nest', 'select 1');
ROLLBACK TO SAVEPOINT inner_call;
SAVEPOINT released_call;
SELECT idem_apply('n-3', 'stats-nest', 'select 1'), idem_apply('n-1', 'stats-nest', 'select 1');
RELEASE SAVEPOINT released_call;
SELECT idem_apply('n-4', 'stats-nest', 'select 1');
COMMIT;
SELECT applied, duplicates, failed FROM idem_stats WHERE consumer = 'stats-nest';
SELECT line FROM regexp_split_to_table(idem_metrics(), E'\n') AS line
 WHERE line LIKE 'idem_processing_latency_seconds_count{database="contrib_regression",consumer="stats-batch"}%';
