--
-- Retention by whole generations (src/keygen_retire.c): a sealed
-- generation is dropped, its tables truncated, once every consumer that
-- recorded keys there has expired them by the rule of retention (its
-- window counted back from its latest activity); a window of forever
-- keeps it, while the keys of an idle consumer or of a pending dead
-- letter are carried into the current generation.  Time is moved by
-- writing the times back, consistently: the keys' processed_at, the
-- consumers' registrations and the generations' openings.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_generation_retention;
\c idem_generation_retention
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;

CREATE TABLE log (key text);
CREATE FUNCTION deliver(consumer text, prefix text, n int) RETURNS int LANGUAGE sql AS $$
    SELECT count(*) FILTER (WHERE idem_apply(prefix || g, consumer, 'insert into log values ($1)',
                                             ARRAY[prefix || g]))::int
      FROM generate_series(1, n) AS g
$$;
-- moves every time of the generations open so far, and of their keys,
-- days back
CREATE FUNCTION age_all(days int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR g IN 1..16 LOOP
        EXECUTE format('UPDATE idem_consumer.processed_keys_%s SET processed_at = processed_at - $1 * 86400', g) USING days;
        EXECUTE format('UPDATE idem_consumer.key_collisions_%s SET processed_at = processed_at - $1 * 86400', g) USING days;
    END LOOP;
    UPDATE idem_consumer.generation_consumers SET first_at = first_at - days * 86400;
    UPDATE idem_consumer.key_generations SET opened_at = opened_at - make_interval(days => days),
        settled_at = settled_at - make_interval(days => days);
END
$$;
-- a new message for each of the consumers that stay active
CREATE FUNCTION activity(tag text) RETURNS int LANGUAGE sql AS $$
    SELECT deliver('short', tag || '-s', 1) + deliver('weekly', tag || '-w', 1)
           + deliver('forever', tag || '-f', 1)
$$;
CREATE VIEW generations AS
    SELECT string_agg(generation || ':' || state, ' ' ORDER BY epoch) AS open FROM idem_key_generations;

SELECT idem_consumer_create(c) FROM unnest(ARRAY['short', 'weekly', 'forever', 'idle']) AS c;
SELECT idem_set_retention('short', '1 day');
SELECT idem_set_retention('forever', NULL);

-- generation 1: keys of 'short' and of the default window (7 days)
SELECT deliver('short', 's1-', 100) AS short, deliver('weekly', 'w1-', 100) AS weekly;
SELECT idem_key_generation_switch() AS opened;
-- generation 2: the same consumers, ten days later
SELECT age_all(10);
SELECT deliver('short', 's2-', 100) AS short, deliver('weekly', 'w2-', 100) AS weekly;
SELECT idem_key_generation_switch() AS opened;
SELECT * FROM generations;
-- the filters of both sealed generations, and of all of them together
SELECT idem_key_generation_build_filters() AS built;
CREATE VIEW filter_of_all AS
    SELECT (SELECT array_agg(epoch ORDER BY epoch) FROM idem_consumer_local.key_filter_all AS f,
                   unnest(f.epochs) AS epoch) AS holds,
           (SELECT array_agg(epoch ORDER BY epoch) FROM idem_key_generations
             WHERE state = 'sealed') AS sealed,
           pg_relation_size('idem_consumer_local.key_filter_all_1')
           + pg_relation_size('idem_consumer_local.key_filter_all_2') > 0 AS has_pages;
SELECT * FROM filter_of_all;

-- generation 1 was sealed ten days before their latest keys: dropped, and
-- its tables emptied by the next call, once the drop has committed;
-- generation 2 was sealed just now: kept
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;
SELECT pg_relation_size('idem_consumer.processed_keys_1') > 0 AS not_yet_emptied;
SELECT idem_key_generation_retire() AS dropped;
SELECT pg_relation_size('idem_consumer.processed_keys_1') AS keys_1_bytes,
       (SELECT count(*) FROM idem_consumer.processed_keys_2) AS keys_2,
       (SELECT count(*) FROM idem_consumer.generation_consumers WHERE epoch = 1) AS registered_1;
-- the next build leaves the dropped generation out of the filter of all
-- sealed generations
SELECT idem_key_generation_build_filters() AS built;
SELECT * FROM filter_of_all;
-- nothing was deleted key by key
SELECT sum(n_tup_del) AS deleted_keys FROM pg_stat_xact_user_tables
 WHERE relname LIKE 'processed_keys%' OR relname LIKE 'key_collisions%';
-- the expired keys are new messages again; the others still duplicates
SELECT deliver('short', 's1-', 100) AS short_1, deliver('weekly', 'w1-', 100) AS weekly_1,
       deliver('short', 's2-', 100) AS short_2, deliver('weekly', 'w2-', 100) AS weekly_2;

-- a consumer whose window is forever keeps its generation, and every key
-- in it
SELECT deliver('forever', 'f-', 10) AS forever;
SELECT idem_key_generation_switch() AS opened;
SELECT age_all(400);
SELECT activity('t4') AS active;
SELECT * FROM generations;
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;
-- without it the same generation would go
SELECT idem_set_retention('forever', '30 days');
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;

-- an idle consumer stops its clock: its keys are kept however old, but
-- not its generation: they are carried into the current one, which
-- registers the consumer at its latest activity, and the generation goes
-- with the other consumers' expired keys
SELECT idem_key_generation_switch() AS opened;
SELECT deliver('idle', 'i-', 10) AS idle, deliver('short', 's5-', 10) AS short;
SELECT idem_key_generation_switch() AS opened;
SELECT age_all(20);
SELECT activity('t6') AS active;
SELECT max(first_at) AS idle_latest FROM idem_consumer.generation_consumers
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'idle') \gset
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;
-- the view shows each once, though the dropped generation's tables are
-- not emptied until the next call
SELECT count(*) AS idle_keys_shown, count(DISTINCT key) AS distinct_keys,
       pg_relation_size('idem_consumer.processed_keys_5') > 0 AS dropped_not_yet_emptied
  FROM idem_processed_keys WHERE consumer = 'idle';
SELECT count(*) AS idle_keys_in_current,
       count(*) FILTER (WHERE processed_at <= :idle_latest) AS with_their_times
  FROM idem_consumer.processed_keys_6
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'idle');
SELECT g.epoch = (SELECT max(epoch) FROM idem_consumer.key_generations) AS in_current,
       g.first_at = :idle_latest AS at_its_latest_activity
  FROM idem_consumer.generation_consumers AS g
 WHERE g.consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'idle');
SELECT deliver('idle', 'i-', 10) AS idle_again, deliver('short', 's5-', 10) AS short_expired;
-- its next new message moves its clock; nothing is left to drop
SELECT deliver('idle', 'i2-', 1) AS idle_new;
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;

-- a pending dead letter's key is carried into the current generation, as
-- an idle consumer's keys are, and its generation goes; once the entry is
-- resolved, it goes with the generation its key is in now
SELECT idem_key_generation_switch() AS opened;
SELECT idem_try_apply('bad-1', 'short', 'select 1 / 0') AS parked;
SELECT deliver('short', 's7-', 10) AS short;
SELECT idem_key_generation_switch() AS opened;
SELECT age_all(5);
SELECT activity('t8') AS active, deliver('idle', 'i8-', 1) AS idle;
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;
SELECT idem_dlq_discard(id, 'not ours')
  FROM idem_dead_letters WHERE key = 'bad-1';
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;
SELECT count(*) AS entries_left FROM idem_dead_letters WHERE key = 'bad-1';

-- by default (and with key_generation_interval set) keys expire by
-- generation: the purge of a consumer deletes no key of the ring one by
-- one; with key_generation_interval = 0 it does
SELECT age_all(30);
SELECT idem_purge('weekly') AS purged_by_generation;
SET idem_consumer.key_generation_interval = 0;
SELECT idem_purge() > 0 AS purged_key_by_key;
RESET idem_consumer.key_generation_interval;

-- once every sealed generation is dropped, the next build empties the
-- filter of all of them: no page of dropped keys stays behind
SELECT idem_key_generation_build_filters() > 0 AS built;
SELECT holds IS NOT NULL AND has_pages AS has_filter_of_all FROM filter_of_all;
SELECT idem_set_retention(c, '1 day') FROM unnest(ARRAY['weekly', 'forever', 'idle']) AS c;
SELECT idem_key_generation_switch() AS opened;
SELECT age_all(400);
SELECT activity('t9') AS active, deliver('idle', 'i9-', 1) AS idle;
SELECT idem_key_generation_retire() > 0 AS dropped;
SELECT idem_key_generation_retire() AS dropped;
SELECT * FROM generations;
SELECT count(*) AS entries_left FROM idem_dead_letters WHERE key = 'bad-1';
SELECT idem_key_generation_build_filters() AS built;
SELECT * FROM filter_of_all;
SELECT count(*) AS filter_of_all_rows FROM idem_consumer_local.key_filter_all;
-- and keys delivered again after all that are still decided right
SELECT deliver('short', 't9-s', 1) AS short_again, deliver('weekly', 'w2-', 100) AS weekly_expired;

-- a carry copies only the keys still inside their consumer's window: an
-- idle consumer's keys older than that, counted from its latest
-- activity, stay behind and go with their generation, and so do the
-- resolved dead-letter entries of those keys
SELECT idem_consumer_create('daily');
SELECT idem_set_retention('daily', '1 day');
SELECT idem_key_generation_switch() AS opened;
SELECT deliver('daily', 'd-old-', 5) AS daily_old,
       idem_try_apply('d-old-bad', 'daily', 'select 1 / 0') AS old_parked;
SELECT idem_dlq_discard(id, 'not ours') FROM idem_dead_letters WHERE key = 'd-old-bad';
SELECT age_all(2);
-- its registration is moved to its latest activity, as a carry would
UPDATE idem_consumer.generation_consumers SET first_at = first_at + 2 * 86400
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'daily');
SELECT deliver('daily', 'd-new-', 5) AS daily_new,
       idem_try_apply('d-new-bad', 'daily', 'select 1 / 0') AS new_parked;
SELECT idem_dlq_discard(id, 'not ours') FROM idem_dead_letters WHERE key = 'd-new-bad';
SELECT idem_key_generation_switch() AS opened;
SELECT age_all(3);
SELECT activity('t10') AS active;
SELECT idem_key_generation_retire() AS dropped;
SELECT count(*) FILTER (WHERE key LIKE 'd-new-%') AS live_carried,
       count(*) FILTER (WHERE key LIKE 'd-old-%') AS expired_carried
  FROM idem_processed_keys WHERE consumer = 'daily';
SELECT key, status FROM idem_dead_letters WHERE consumer = 'daily' ORDER BY key;
SELECT deliver('daily', 'd-new-', 5) AS daily_new_again,
       deliver('daily', 'd-old-', 5) AS daily_old_expired;

-- the purge of every consumer drops the expired generations too, as
-- idem_key_generation_retire() does, so that idem_purge() alone, on a
-- schedule, keeps the key store bounded; still nothing key by key
SELECT idem_key_generation_switch() AS opened;
SELECT age_all(400);
SELECT activity('t11') AS active;
SELECT count(*) AS sealed_before FROM idem_key_generations WHERE state = 'sealed';
SELECT count(*) AS short_keys_before FROM idem_consumer.processed_keys_11
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'short');
SELECT idem_purge() AS purged_key_by_key;
SELECT count(*) AS sealed_after FROM idem_key_generations WHERE state = 'sealed';
-- emptied whole, at the next call, not key by key
SELECT count(*) AS short_keys_after FROM idem_consumer.processed_keys_11
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'short');
SELECT idem_purge() AS purged_again;
SELECT pg_relation_size('idem_consumer.processed_keys_11') AS keys_11_bytes;

-- the interval the worker switches at, by default derived from the
-- windows: a fourteenth of the longest finite one (here the default 7
-- days), at least a minute, at most a day
CREATE FUNCTION switch_interval() RETURNS numeric LANGUAGE sql AS $$
    SELECT (regexp_match(idem_metrics(),
            'idem_key_generation_interval_seconds\{[^}]*\} ([0-9.]+)'))[1]::numeric
$$;
SELECT switch_interval() AS derived;
SELECT idem_set_retention('weekly', '60 days');
SELECT switch_interval() AS at_most_a_day;
SET idem_consumer.retention = -1;
SELECT idem_set_retention(c, '10 minutes')
  FROM unnest(ARRAY['short', 'weekly', 'idle', 'daily', 'forever']) AS c;
SELECT switch_interval() AS at_least_a_minute;
SELECT idem_set_retention('forever', '28 minutes');
SELECT switch_interval() AS fourteenth;
SELECT idem_set_retention(c, NULL)
  FROM unnest(ARRAY['short', 'weekly', 'idle', 'daily', 'forever']) AS c;
SELECT switch_interval() AS every_key_forever;
RESET idem_consumer.retention;
SET idem_consumer.key_generation_interval = '2h';
SELECT switch_interval() AS set;
RESET idem_consumer.key_generation_interval;

-- who may drop: not PUBLIC
CREATE ROLE retire_tenant;
SET ROLE retire_tenant;
SELECT idem_key_generation_retire();
RESET ROLE;
DROP ROLE retire_tenant;

\c :regression_db
DROP DATABASE idem_generation_retention;
