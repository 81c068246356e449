--
-- Routed external effects (src/effects_api.c, src/effects_store.c):
-- idem_effect_begin, _complete, _fail, _heartbeat, _enqueue and _claim
-- with a route keep an effect under it in idem_consumer.routed_effects,
-- beside the business rows of the route; a dead one is parked in
-- routed_dead_letters (kind effect) and re-armed by idem_dlq_replay by
-- key and route.  Without routed keys the route is not needed and
-- ignored.  On one
-- server without Citus, as in routed_keys.  In a database of its own.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_routed_fx;
\c idem_routed_fx
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;

CREATE TABLE charges (order_id bigint, charge text, charged_by name DEFAULT current_user);
\set charge 'insert into charges (order_id, charge) values ($1::bigint, $2)'
CREATE FUNCTION state_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- without routed keys: the effects of 1.1, the route not needed
SELECT action, fence FROM idem_effect_begin('shop', 'u-1', route => 7::bigint);
SELECT idem_effect_complete('shop', 'u-1', 1, '{"id": "ch_u1"}', route => 7::bigint);
SELECT action, result FROM idem_effect_begin('shop', 'u-1');
SELECT idem_effect_enqueue('shop', 'u-2', '{"to": "a"}', route => 7::bigint);
SELECT key, route, fence FROM idem_effect_claim('shop', route => 7::bigint);
SELECT key, route, fence FROM idem_effect_claim('shop', route => NULL::bigint);
SELECT consumer, key, state FROM idem_effects ORDER BY key;
DELETE FROM idem_consumer.effects;

-- routed keys, and with them routed effects, route bigint
SELECT idem_consumer.routed_storage_create('bigint');

-- the effect functions without a route are refused before they write
SELECT idem_effect_begin('shop', 'r-0');
SELECT idem_effect_complete('shop', 'u-1', 1, '{}');
SELECT idem_effect_fail('shop', 'u-1', 1, 'x');
SELECT idem_effect_heartbeat('shop', 'u-1', 1, '1 minute');
SELECT idem_effect_enqueue('shop', 'r-0', '{}');
SELECT * FROM idem_effect_claim('shop');
SELECT count(*) AS unrouted_effects FROM idem_consumer.effects;

-- the inline cycle under a route: begin leases it, a second begin finds it
-- busy, complete stores the result and runs the business SQL, a later
-- begin replays the result
SELECT action, fence, attempt, outcome_unknown
  FROM idem_effect_begin('shop', 'r-1', route => 7::bigint, request => '{"amount": 5}');
SELECT action, fence, retry_at IS NOT NULL AS has_retry_at
  FROM idem_effect_begin('shop', 'r-1', route => 7::bigint, request => '{"amount": 5}');
SELECT idem_effect_complete('shop', 'r-1', 1, '{"id": "ch_1"}', route => 7::bigint,
                                   sql => :'charge', params => ARRAY['7', 'ch_1']);
SELECT action, fence, result
  FROM idem_effect_begin('shop', 'r-1', route => 7::bigint, request => '{"amount": 5}');
SELECT order_id, charge FROM charges;
-- a different request under the same key and route
SELECT action FROM idem_effect_begin('shop', 'r-1', route => 7::bigint, request => '{"amount": 6}');
-- the same key under another route is another effect
SELECT action, fence FROM idem_effect_begin('shop', 'r-1', route => 8::bigint, request => '{"amount": 6}');
-- a route of a type assignable to the routes' is taken; others are refused
SELECT action FROM idem_effect_begin('shop', 'r-2', route => 9);
SELECT idem_effect_begin('shop', 'r-3', route => 'x'::text);
SELECT idem_effect_begin('shop', 'r-3', route => NULL::bigint);
SELECT route, consumer, key, state, fence, attempts, result, request
  FROM idem_routed_effects ORDER BY route, key;
SELECT count(*) AS unrouted_effects FROM idem_consumer.effects;

-- a lease that expired: the next begin takes the effect over with
-- outcome_unknown, and the first holder is fenced off
SELECT action, fence FROM idem_effect_begin('shop', 'r-4', route => 7::bigint, lease => '1 millisecond');
SELECT pg_sleep(0.01);
SELECT action, fence, attempt, outcome_unknown
  FROM idem_effect_begin('shop', 'r-4', route => 7::bigint);
SELECT idem_effect_heartbeat('shop', 'r-4', 1, '1 minute', route => 7::bigint) AS old_holder,
       idem_effect_heartbeat('shop', 'r-4', 2, '1 minute', route => 7::bigint) AS new_holder;
SELECT idem_effect_complete('shop', 'r-4', 1, '{}', route => 7::bigint,
                                   sql => :'charge', params => ARRAY['7', 'fenced off']);
SELECT idem_effect_complete('shop', 'r-4', 3, '{}', route => 7::bigint);
SELECT idem_effect_complete('shop', 'r-4', 2, '{"id": "ch_4"}', route => 8::bigint);
SELECT idem_effect_complete('shop', 'r-4', 2, '{"id": "ch_4"}', route => 7::bigint,
                                   sql => :'charge', params => ARRAY['7', 'ch_4']);
SELECT order_id, charge FROM charges ORDER BY charge;

-- failures: retried with backoff, then dead and parked under the route
SELECT idem_set_effect_policy('shop', 2, '1 hour', '1 hour');
SELECT action, fence FROM idem_effect_begin('shop', 'r-5', route => 7::bigint);
SELECT idem_effect_fail('shop', 'r-5', 1, 'timeout', route => 7::bigint) AS first_failure;
SELECT action, last_error FROM idem_effect_begin('shop', 'r-5', route => 7::bigint);
UPDATE idem_consumer.routed_effects SET retry_at = now() WHERE key = 'r-5';
SELECT action, fence, attempt FROM idem_effect_begin('shop', 'r-5', route => 7::bigint);
SELECT idem_effect_fail('shop', 'r-5', 2, 'timeout again', route => 7::bigint) AS second_failure;
SELECT action, last_error FROM idem_effect_begin('shop', 'r-5', route => 7::bigint);
SELECT route, consumer, key, kind, status, sqlstate, message, detail, sql,
       dead_lettered_by = current_user AS by_me
  FROM idem_routed_dead_letters;
SELECT consumer, effects_dead FROM idem_stats WHERE consumer = 'shop';
-- a message that fails under the key of a parked effect finds the key's
-- entry taken; an effect that dies under the key of a parked message
-- cannot be parked
SELECT action FROM idem_effect_begin('shop', 'r-6', route => 7::bigint);
SELECT idem_try_apply('r-6', 'shop', 'select 1 / 0', NULL, route => 7::bigint) AS message_parked;
SELECT idem_effect_fail('shop', 'r-6', 1, 'declined', route => 7::bigint, retryable => false);
SELECT state FROM idem_routed_effects WHERE key = 'r-6';
-- forgetting a message's key leaves an effect's entry alone
SELECT idem_dlq_discard('r-6', 'shop', 'test', 7::bigint);
SELECT idem_forget('r-6', 'shop', 7::bigint);
SELECT key, kind, status FROM idem_routed_dead_letters ORDER BY key;
-- the replay of the effect's entry re-arms it: due now, attempts from zero
SELECT idem_dlq_replay('r-5', 'shop', 7::bigint);
SELECT key, state, attempts, retry_at <= now() AS due FROM idem_routed_effects WHERE key = 'r-5';
SELECT key, kind, status FROM idem_routed_dead_letters WHERE key = 'r-5';
SELECT action, fence, attempt FROM idem_effect_begin('shop', 'r-5', route => 7::bigint);
SELECT idem_dlq_replay('r-5', 'shop', 7::bigint);
-- dead again and discarded: the effect stays dead
SELECT idem_effect_fail('shop', 'r-5', 3, 'declined', route => 7::bigint, retryable => false);
SELECT idem_dlq_discard('r-5', 'shop', 'refunded by hand', 7::bigint);
SELECT key, status, attempts, discard_reason FROM idem_routed_dead_letters WHERE key = 'r-5';
SELECT action FROM idem_effect_begin('shop', 'r-5', route => 7::bigint);
-- an entry whose effect was re-armed by hand is not replayed twice
SELECT action FROM idem_effect_begin('shop', 'r-7', route => 7::bigint);
SELECT idem_effect_fail('shop', 'r-7', 1, 'declined', route => 7::bigint, retryable => false);
UPDATE idem_consumer.routed_effects SET state = 'waiting', retry_at = now() WHERE key = 'r-7';
SELECT idem_dlq_replay('r-7', 'shop', 7::bigint);
SELECT idem_dlq_discard('r-7', 'shop', 're-armed by hand', 7::bigint);

-- the outbox: an effect enqueued in a business transaction exists if and
-- only if it commits
BEGIN;
SELECT idem_effect_enqueue('mail', 'm-1', '{"to": "a"}', route => 7::bigint);
ROLLBACK;
BEGIN;
SELECT idem_effect_enqueue('mail', 'm-1', '{"to": "a"}', route => 7::bigint) AS m1,
       idem_effect_enqueue('mail', 'm-2', '{"to": "b"}', route => 8::bigint) AS m2,
       idem_effect_enqueue('mail', 'm-3', '{"to": "c"}', route => 8::bigint) AS m3,
       idem_effect_enqueue('mail', 'm-1', '{"to": "a"}', route => 7::bigint) AS m1_again;
COMMIT;
SELECT idem_effect_enqueue('mail', 'm-1', '{"to": "x"}', route => 7::bigint);
-- a claim of one route, then of every route, each effect with its route
SELECT key, route, request, fence, attempt, outcome_unknown FROM idem_effect_claim('mail', 1, route => 8::bigint);
SELECT key, route, request, fence, attempt FROM idem_effect_claim('mail', route => NULL::bigint);
SELECT key, route FROM idem_effect_claim('mail', route => NULL::bigint);
SELECT * FROM idem_effect_claim('mail', route => NULL::integer);
SELECT * FROM idem_effect_claim('nobody', route => NULL::bigint);
BEGIN;
SELECT * FROM idem_effect_claim('mail', route => 7::bigint);
ROLLBACK;
SELECT idem_effect_complete('mail', 'm-2', 1, '{"sent": true}', route => 8::bigint);
SELECT route, key, state FROM idem_routed_effects WHERE consumer = 'mail' ORDER BY key;

-- retention: completed effects older than the consumer's window, counted
-- back from its newest completion, go with the routed purge, and the
-- resolved entries of effects that are gone with them
SELECT idem_set_retention('shop', '1 day');
UPDATE idem_consumer.routed_effects SET completed_at = completed_at - interval '3 days'
 WHERE consumer = 'shop' AND key = 'r-4';
SELECT action FROM idem_effect_begin('shop', 'r-8', route => 7::bigint);
SELECT idem_effect_complete('shop', 'r-8', 1, '{}', route => 7::bigint);
SELECT idem_purge('shop') AS keys_purged;
-- r-4, completed three days before the consumer's newest completion, is gone
SELECT route, key, state FROM idem_routed_effects WHERE consumer = 'shop' ORDER BY route, key;
UPDATE idem_consumer.routed_effects SET state = 'completed', completed_at = now() - interval '3 days'
 WHERE key = 'r-7';
SELECT idem_purge('shop') AS keys_purged;
-- r-7's resolved entry goes with its effect; r-5's stays with its dead effect
SELECT route, key, state FROM idem_routed_effects WHERE consumer = 'shop' ORDER BY route, key;
SELECT key, kind, status FROM idem_routed_dead_letters ORDER BY key;
SELECT idem_reset_retention('shop');

-- a tenant: its effects only, with its own rights; the view is a barrier
CREATE ROLE routed_fx_team;
CREATE ROLE routed_fx_other;
GRANT EXECUTE ON FUNCTION idem_effect_begin(text, text, jsonb, interval, "any"),
    idem_effect_complete(text, text, bigint, jsonb, text, text[], "any")
    TO routed_fx_team, routed_fx_other;
GRANT SELECT ON idem_routed_effects TO routed_fx_team, routed_fx_other;
GRANT SELECT, INSERT ON charges TO routed_fx_team;
SELECT idem_consumer_create('fx-team', 'routed_fx_team');
-- a trigger on the business table sees the caller, without the storage's
-- rights: the business SQL of a completion runs as the tenant
CREATE FUNCTION charges_probe() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.charge := NEW.charge || ' as ' || current_user || ', storage schema usable: '
                  || has_schema_privilege('idem_consumer', 'USAGE');
    RETURN NEW;
END $$;
CREATE TRIGGER charges_probe BEFORE INSERT ON charges FOR EACH ROW EXECUTE FUNCTION charges_probe();
SET ROLE routed_fx_team;
SELECT action, fence FROM idem_effect_begin('fx-team', 't-1', route => 11::bigint, request => '{"card": "secret"}');
SELECT idem_effect_complete('fx-team', 't-1', 1, '{}', route => 11::bigint,
                                   sql => :'charge', params => ARRAY['11', 'ch_t1']);
SELECT consumer, key, state FROM idem_routed_effects ORDER BY route, key;
SELECT state_of($$SELECT count(*) FROM idem_consumer.routed_effects$$);
RESET ROLE;
SELECT order_id, charge, charged_by FROM charges WHERE order_id = 11;
DROP TRIGGER charges_probe ON charges;
CREATE FUNCTION leak(text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN RAISE NOTICE 'seen: %', $1; RETURN true; END $$;
SET client_min_messages = notice;
SET ROLE routed_fx_other;
SELECT count(*) AS visible FROM idem_routed_effects WHERE leak(key || request::text);
-- nor does an error in WHERE: the other team's row is never tested
SELECT count(*) AS visible FROM idem_routed_effects
 WHERE 1 / (CASE WHEN key = 't-1' THEN 0 ELSE 1 END) = 1;
SELECT state_of($$SELECT idem_effect_complete('fx-team', 't-1', 1, '{}', route => 11::bigint)$$);
SELECT action FROM idem_effect_begin('fx-team', 't-1', route => 11::bigint);
RESET ROLE;
SET client_min_messages = warning;

\c :regression_db
DROP DATABASE idem_routed_fx;
DROP ROLE routed_fx_team;
DROP ROLE routed_fx_other;
