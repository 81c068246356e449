--
-- Every call shape of the functions of 1.0 and 1.1 resolves, after
-- ALTER EXTENSION UPDATE to 1.2, to the function of 1.2 that replaced
-- them: positional and named, and with untyped parameters, as
-- node-postgres sends every $n (PREPARE without types).
-- parameter_types shows what each statement resolved to; the calls then
-- run.  A shape that became ambiguous ("not unique") or lost its function
-- fails its PREPARE here.
-- In a database of its own, made at 1.0 and updated.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_call_shapes;
\c idem_call_shapes
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer VERSION '1.0';
ALTER EXTENSION idem_consumer UPDATE;
SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer';
CREATE TABLE shapes (n int GENERATED ALWAYS AS IDENTITY, note text);
\set ins 'insert into shapes (note) values ($1)'

-- 1.0: idem_apply, idem_try_apply, idem_is_processed, idem_forget,
-- idem_record_batch, the dead-letter queue, counters and retention
PREPARE apply3 AS SELECT idem_apply($1, $2, $3);
PREPARE apply4 AS SELECT idem_apply($1, $2, $3, $4);
PREPARE apply5 AS SELECT idem_apply($1, $2, $3, $4, $5);
PREPARE apply_named AS SELECT idem_apply(key => $1, consumer => $2, sql => $3, params => $4, event_time => $5);
PREPARE apply_unknown(unknown, unknown, unknown, unknown, unknown) AS SELECT idem_apply($1, $2, $3, $4, $5);
PREPARE try3 AS SELECT idem_try_apply($1, $2, $3);
PREPARE try4 AS SELECT idem_try_apply($1, $2, $3, $4);
PREPARE try5 AS SELECT idem_try_apply($1, $2, $3, $4, $5);
PREPARE try_named AS SELECT idem_try_apply(key => $1, consumer => $2, sql => $3, event_time => $4);
PREPARE processed AS SELECT idem_is_processed($1, $2);
PREPARE processed_named AS SELECT idem_is_processed(consumer => $1, key => $2);
PREPARE forget AS SELECT idem_forget($1, $2);
PREPARE batch2 AS SELECT * FROM idem_record_batch($1, $2);
PREPARE replay_id AS SELECT idem_dlq_replay($1::bigint);
PREPARE replay_id_named AS SELECT idem_dlq_replay(id => $1);
PREPARE replay_consumer AS SELECT * FROM idem_dlq_replay($1);
PREPARE replay_consumer2 AS SELECT * FROM idem_dlq_replay($1, $2);
PREPARE replay_consumer_named AS SELECT * FROM idem_dlq_replay(consumer => $1, max_count => $2);
PREPARE discard AS SELECT idem_dlq_discard($1, $2);
PREPARE discard_named AS SELECT idem_dlq_discard(id => $1, reason => $2);
PREPARE stats_reset AS SELECT idem_stats_reset($1);
PREPARE set_retention AS SELECT idem_set_retention($1, $2);
PREPARE reset_retention AS SELECT idem_reset_retention($1);
PREPARE purge AS SELECT idem_purge($1, $2);
-- 1.1: the caller's fingerprint, batches with fingerprints, owners and
-- external effects
PREPARE apply6 AS SELECT idem_apply($1, $2, $3, $4, $5, $6);
PREPARE apply_fp_named AS SELECT idem_apply(key => $1, consumer => $2, sql => $3, fingerprint => $4);
PREPARE try6 AS SELECT idem_try_apply($1, $2, $3, $4, $5, $6);
PREPARE batch3 AS SELECT * FROM idem_record_batch($1, $2, $3);
PREPARE create1 AS SELECT idem_consumer_create($1);
PREPARE create2 AS SELECT idem_consumer_create($1, $2);
PREPARE set_owner AS SELECT idem_consumer_set_owner($1, $2);
PREPARE set_fingerprint AS SELECT idem_set_fingerprint($1, $2);
PREPARE begin2 AS SELECT action, fence FROM idem_effect_begin($1, $2);
PREPARE begin3 AS SELECT action, fence FROM idem_effect_begin($1, $2, $3);
PREPARE begin4 AS SELECT action, fence FROM idem_effect_begin($1, $2, $3, $4);
PREPARE begin_named AS SELECT action, fence FROM idem_effect_begin(consumer => $1, key => $2, lease => $3);
PREPARE complete4 AS SELECT idem_effect_complete($1, $2, $3, $4);
PREPARE complete5 AS SELECT idem_effect_complete($1, $2, $3, $4, $5);
PREPARE complete6 AS SELECT idem_effect_complete($1, $2, $3, $4, $5, $6);
PREPARE fail4 AS SELECT idem_effect_fail($1, $2, $3, $4);
PREPARE fail5 AS SELECT idem_effect_fail($1, $2, $3, $4, $5);
PREPARE heartbeat AS SELECT idem_effect_heartbeat($1, $2, $3, $4);
PREPARE enqueue AS SELECT idem_effect_enqueue($1, $2, $3);
PREPARE claim1 AS SELECT key, fence, route FROM idem_effect_claim($1);
PREPARE claim2 AS SELECT key, fence, route FROM idem_effect_claim($1, $2);
PREPARE claim3 AS SELECT key, fence, route FROM idem_effect_claim($1, $2, $3);
PREPARE claim_named AS SELECT key, fence, route FROM idem_effect_claim(consumer => $1, lease => $2);
PREPARE policy AS SELECT idem_set_effect_policy($1, $2, $3, $4);
SELECT name, parameter_types FROM pg_prepared_statements ORDER BY name;

-- they run: messages, a parked message replayed by id and by consumer
EXECUTE apply3('a-3', 'shapes', 'insert into shapes (note) values (''three'')');
EXECUTE apply4('a-4', 'shapes', :'ins', '{four}');
EXECUTE apply5('a-5', 'shapes', :'ins', '{five}', '2026-01-01 00:00:00+00');
EXECUTE apply_named('a-n', 'shapes', :'ins', '{named}', NULL);
EXECUTE apply_unknown('a-u', 'shapes', :'ins', '{unknown}', NULL);
EXECUTE apply6('a-6', 'shapes', :'ins', '{six}', NULL, 'fp-6');
EXECUTE apply_fp_named('a-f', 'shapes', 'select 1', 'fp-f');
EXECUTE apply4('a-4', 'shapes', :'ins', '{four}');
EXECUTE try3('t-3', 'shapes', 'select 1');
EXECUTE try4('t-4', 'shapes', 'select 1 / $1::int', '{0}');
EXECUTE try5('t-5', 'shapes', 'select 1', NULL, NULL);
EXECUTE try6('t-6', 'shapes', 'select 1', NULL, NULL, 'fp-t6');
EXECUTE try_named('t-n', 'shapes', 'select 1', NULL);
EXECUTE processed('a-4', 'shapes');
EXECUTE processed_named('shapes', 'a-5');
EXECUTE forget('a-3', 'shapes');
EXECUTE batch2('shapes', '{b-1,b-2,a-4}');
EXECUTE batch3('shapes', '{b-3,b-1}', '{x,y}');
SELECT note FROM shapes ORDER BY n;
SELECT id AS parked_id FROM idem_dead_letters WHERE key = 't-4' \gset
EXECUTE replay_id(:parked_id);
EXECUTE replay_id_named(:parked_id);
EXECUTE replay_consumer('shapes');
EXECUTE replay_consumer2('shapes', 10);
EXECUTE replay_consumer_named('shapes', 10);
EXECUTE discard(:parked_id, 'gone');
SELECT idem_try_apply('t-5', 'shapes', 'select 1 / 0');
SELECT id AS parked_id FROM idem_dead_letters WHERE key = 't-5' \gset
EXECUTE discard_named(:parked_id, 'gone too');
SELECT key, status, discard_reason FROM idem_dead_letters ORDER BY key;
EXECUTE stats_reset('shapes');
EXECUTE set_retention('shapes', '1 day');
EXECUTE reset_retention('shapes');
EXECUTE purge('shapes', 100);
EXECUTE create1('shapes-2');
EXECUTE create2('shapes-3', 'pg_database_owner');
EXECUTE set_owner('shapes-3', 'pg_database_owner');
EXECUTE set_fingerprint('shapes', 'true');
-- effects: begin, heartbeat, fail, begin again, complete; the outbox
SELECT action, fence FROM idem_effect_begin('shapes', 'e-1');
EXECUTE heartbeat('shapes', 'e-1', 1, '10 seconds');
EXECUTE fail4('shapes', 'e-1', 1, 'timeout');
UPDATE idem_consumer.effects SET retry_at = now();
SELECT action, fence, attempt FROM idem_effect_begin('shapes', 'e-1', NULL, '5 seconds');
EXECUTE begin2('shapes', 'e-2');
EXECUTE begin3('shapes', 'e-3', '{}');
EXECUTE begin_named('shapes', 'e-4', '1 minute');
EXECUTE complete4('shapes', 'e-2', 1, '{}');
EXECUTE complete5('shapes', 'e-3', 1, '{}', 'select 1');
EXECUTE fail5('shapes', 'e-4', 1, 'declined', false);
EXECUTE complete6('shapes', 'e-1', 2, '{"ok": true}', :'ins', '{effect}');
EXECUTE enqueue('shapes', 'o-1', '{"to": "x"}');
SELECT key, request, fence, attempt, route FROM idem_effect_claim('shapes', 5, '10 seconds');
EXECUTE enqueue('shapes', 'o-2', '{"to": "y"}');
EXECUTE claim1('shapes');
EXECUTE claim2('shapes', 5);
EXECUTE claim_named('shapes', '1 minute');
EXECUTE policy('shapes', 3, '1 second', '1 minute');
SELECT note FROM shapes WHERE note = 'effect';
DEALLOCATE ALL;

-- what such statements would meet with two functions of one name whose
-- defaults cover the same leading arguments: the reason 1.2 has one of
-- each
BEGIN;
CREATE FUNCTION idem_apply(key text, consumer text, sql text, params text[] DEFAULT NULL,
                           expect_rows bigint DEFAULT NULL)
RETURNS bigint LANGUAGE sql AS 'select 0::bigint';
PREPARE apply3 AS SELECT idem_apply($1, $2, $3);
ROLLBACK;

\c :regression_db
DROP DATABASE idem_call_shapes;
