--
-- Routed dead letters (src/dead_letter.c, src/routed.c):
-- idem_try_apply with a route parks a message that fails permanently in
-- idem_consumer.routed_dead_letters, under its route beside its key;
-- idem_dlq_replay and idem_dlq_discard by key, consumer and route resolve
-- it; the view
-- idem_routed_dead_letters shows the entries of the consumers the current
-- role may act on.  Without routed keys the route is not needed and they
-- are idem_try_apply and the entry of the key in idem_dead_letters.  On
-- one server without Citus, as in routed_keys.  In a database of its own.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_routed_dlq;
\c idem_routed_dlq
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;

CREATE TABLE pay (order_id bigint, amount int CHECK (amount > 0), paid_by name DEFAULT current_user);
\set pay 'insert into pay (order_id, amount) values ($1::bigint, $2::int)'
CREATE FUNCTION state_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- without routed keys: idem_try_apply, and the entry of the key by its id
SELECT idem_try_apply('u-1', 'shop', :'pay', ARRAY['7', '-1'], route => 7::bigint) AS first,
       idem_try_apply('u-1', 'shop', :'pay', ARRAY['7', '-1'], route => 7::bigint) AS again;
SELECT consumer, key, status, sqlstate FROM idem_dead_letters;
SELECT state_of($$SELECT idem_dlq_replay('u-2', 'shop', 7::bigint)$$);
SELECT state_of($$SELECT idem_dlq_replay('u-1', 'nobody', 7::bigint)$$);
SELECT idem_dlq_discard('u-1', 'shop', 'refunded by hand', 7::bigint);
SELECT key, status, discard_reason FROM idem_dead_letters;
SELECT state_of($$SELECT idem_dlq_replay('u-1', 'shop', 7::bigint)$$);
DELETE FROM idem_consumer.dead_letters;
SELECT idem_forget('u-1', 'shop');

-- routed keys and dead letters, route bigint
SELECT idem_consumer.routed_storage_create('bigint');

-- a permanent failure parks the message under its route, beside its key;
-- a redelivery finds it parked and runs nothing
SELECT idem_try_apply('r-1', 'shop', :'pay', ARRAY['7', '-5'], route => 7::bigint,
                             event_time => '2026-01-01 00:00+00') AS first,
       idem_try_apply('r-1', 'shop', :'pay', ARRAY['7', '-5'], route => 7::bigint) AS again,
       idem_try_apply('r-2', 'shop', :'pay', ARRAY['8', '10'], route => 8::bigint) AS applied,
       idem_try_apply('r-2', 'shop', :'pay', ARRAY['8', '10'], route => 8::bigint) AS duplicate;
SELECT route, consumer, key, status, sqlstate, attempts, event_time, sql, params,
       dead_lettered_by = current_user AS by_me, resolved_at IS NULL AS unresolved
  FROM idem_routed_dead_letters;
SELECT route, key FROM idem_consumer.routed_keys ORDER BY route, key;
SELECT count(*) AS local_entries FROM idem_consumer.dead_letters;
SELECT order_id, amount FROM pay ORDER BY order_id;
SELECT consumer, applied, duplicates, dead_lettered FROM idem_stats;

-- the same key under another route is another message
SELECT idem_try_apply('r-1', 'shop', :'pay', ARRAY['9', '3'], route => 9::bigint) AS other_route;
-- the same key and route for another message: parked as key reuse, once
SELECT idem_try_apply('r-2', 'shop', :'pay', ARRAY['8', '11'], route => 8::bigint) AS reused,
       idem_try_apply('r-2', 'shop', :'pay', ARRAY['8', '11'], route => 8::bigint) AS reused_again;
SELECT route, key, status, sqlstate FROM idem_routed_dead_letters ORDER BY route;

-- a pending entry's key cannot be forgotten
SELECT state_of($$SELECT idem_forget('r-1', 'shop', 7::bigint)$$);

-- a replay that fails again counts an attempt; once the cause is fixed it
-- applies, and only once
SELECT idem_dlq_replay('r-1', 'shop', 7::bigint) AS still_failing;
SELECT attempts, status FROM idem_routed_dead_letters WHERE route = 7;
ALTER TABLE pay DROP CONSTRAINT pay_amount_check;
SELECT idem_dlq_replay('r-1', 'shop', 7::bigint) AS fixed;
SELECT state_of($$SELECT idem_dlq_replay('r-1', 'shop', 7::bigint)$$);
SELECT idem_try_apply('r-1', 'shop', :'pay', ARRAY['7', '-5'], route => 7::bigint) AS redelivered;
SELECT order_id, amount FROM pay WHERE order_id = 7;
SELECT status, attempts, resolved_by = current_user AS by_me FROM idem_routed_dead_letters WHERE route = 7;

-- a discarded entry keeps its key's redeliveries parked
SELECT idem_dlq_discard('r-2', 'shop', 'the order was cancelled', 8::bigint);
SELECT idem_try_apply('r-2', 'shop', :'pay', ARRAY['8', '11'], route => 8::bigint) AS after_discard;
SELECT state_of($$SELECT idem_dlq_discard('r-2', 'shop', 'again', 8::bigint)$$);
SELECT route, status, discard_reason FROM idem_routed_dead_letters ORDER BY route;

-- bad calls
SELECT state_of($$SELECT idem_dlq_replay('r-9', 'shop', 7::bigint)$$);
SELECT state_of($$SELECT idem_dlq_replay('r-1', 'shop', NULL::bigint)$$);
SELECT state_of($$SELECT idem_dlq_replay('r-1', 'shop', 'seven'::text)$$);
SELECT state_of($$SELECT idem_dlq_discard('r-1', 'shop', NULL, 7::bigint)$$);
SELECT state_of($$SELECT idem_try_apply('r-9', 'shop', 'select 1', NULL, route => NULL::bigint)$$);
SELECT state_of($$SELECT idem_try_apply('r-9', 'shop', 'select 1')$$);
SELECT state_of($$SELECT idem_dlq_replay('shop')$$);
-- SQL text that cannot be a message is the caller's error, not parked
SELECT state_of($$SELECT idem_try_apply('r-9', 'shop', 'select 1; select 2', NULL, route => 7::bigint)$$);
SELECT count(*) AS parked FROM idem_consumer.routed_dead_letters WHERE key = 'r-9';

-- business SQL may not replay or discard
SELECT idem_try_apply('r-3', 'shop', 'select 1 / 0', NULL, route => 3::bigint) AS parked;
SELECT state_of($$SELECT idem_apply('r-4', 'shop',
    'select idem_dlq_replay(''r-3'', ''shop'', 3::bigint)', NULL, route => 3::bigint)$$);
SELECT state_of($$SELECT idem_try_apply('r-4', 'shop',
    'select idem_dlq_discard(''r-3'', ''shop'', ''x'', 3::bigint)', NULL, route => 3::bigint)$$);
SELECT key, status, sqlstate FROM idem_routed_dead_letters WHERE route = 3 ORDER BY key;

-- retention: a pending entry keeps its key; a resolved one expires with it
SELECT idem_set_retention('shop', '1 day');
UPDATE idem_consumer.routed_keys SET processed_at = processed_at - 2 * 86400 WHERE route IN (3, 7, 8);
SELECT idem_try_apply('r-5', 'shop', 'select 1', NULL, route => 5::bigint) AS latest;
SELECT idem_purge('shop') AS purged;
SELECT route, key FROM idem_consumer.routed_keys ORDER BY route, key;
SELECT route, key, status FROM idem_consumer.routed_dead_letters ORDER BY route, key;

-- tenants: a replay runs the SQL as the role that parked it, for its
-- members only; the view shows a role its own consumers' entries
CREATE ROLE routed_pay;
CREATE ROLE routed_other;
CREATE ROLE routed_pay_operator IN ROLE routed_pay;
GRANT INSERT ON pay TO routed_pay;
GRANT SELECT ON idem_routed_dead_letters TO routed_pay, routed_other;
GRANT EXECUTE ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_dlq_replay(text, text, "any"),
                          idem_dlq_discard(text, text, text, "any")
    TO routed_pay, routed_other;
SELECT idem_consumer_create('pay-team', 'routed_pay');
ALTER TABLE pay ADD CONSTRAINT pay_amount_check CHECK (amount > 0) NOT VALID;
SET ROLE routed_pay;
SELECT idem_try_apply('t-1', 'pay-team', :'pay', ARRAY['11', '-1'], route => 11::bigint) AS tenant_parked;
SELECT route, consumer, key, dead_lettered_by FROM idem_routed_dead_letters ORDER BY route;
SELECT state_of($$SELECT count(*) FROM idem_consumer.routed_dead_letters$$);
RESET ROLE;
-- a leaky function in WHERE sees no other team's row
CREATE FUNCTION leak(text) RETURNS boolean LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN RAISE NOTICE 'seen: %', $1; RETURN true; END $$;
SET client_min_messages = notice;
SET ROLE routed_other;
SELECT count(*) AS visible FROM idem_routed_dead_letters WHERE leak(key);
SELECT state_of($$SELECT idem_dlq_replay('t-1', 'pay-team', 11::bigint)$$);
SELECT state_of($$SELECT idem_dlq_discard('t-1', 'pay-team', 'x', 11::bigint)$$);
RESET ROLE;
SET client_min_messages = warning;
ALTER TABLE pay DROP CONSTRAINT pay_amount_check;
SET ROLE routed_pay_operator;
SELECT idem_dlq_replay('t-1', 'pay-team', 11::bigint) AS replayed_by_member;
RESET ROLE;
SELECT order_id, paid_by FROM pay WHERE order_id = 11;
-- the superuser is a member of every role; a role that is gone is refused
SELECT idem_try_apply('t-2', 'shop', 'insert into pay (order_id, amount) values (12, 1 / 0)', NULL,
                             route => 12::bigint) AS parked;
UPDATE idem_consumer.routed_dead_letters SET dead_lettered_by = 'no_such_role' WHERE key = 't-2';
SELECT state_of($$SELECT idem_dlq_replay('t-2', 'shop', 12::bigint)$$);

-- row demands under a route: idem_apply with expect_rows raises IK002
-- and records nothing when the SQL affects too few rows; an entry parked
-- by idem_try_apply keeps its demand, and a replay demands the rows again
CREATE TABLE orders_due (order_id bigint PRIMARY KEY, due int NOT NULL);
INSERT INTO orders_due VALUES (21, 10);
\set settle 'update orders_due set due = due - $2::int where order_id = $1::bigint'
SELECT idem_apply('rows-1', 'shop', :'settle', ARRAY['21', '4'], route => 21::bigint,
                              expect_rows => 1) AS settled,
       idem_apply('rows-1', 'shop', :'settle', ARRAY['21', '4'], route => 21::bigint,
                              expect_rows => 1) AS duplicate;
SELECT state_of($$SELECT idem_apply('rows-2', 'shop', 'update orders_due set due = 0 where order_id = 22',
                                                NULL, route => 22::bigint, expect_rows => 1)$$);
SELECT idem_is_processed('rows-2', 'shop', 22::bigint) AS recorded;
SELECT state_of($$SELECT idem_apply('rows-3', 'shop', 'select 1', NULL, route => 22::bigint,
                                                expect_rows => 0 - 1)$$);
-- too few rows is transient by default: raised, nothing parked
SELECT state_of($$SELECT idem_try_apply('rows-4', 'shop', 'update orders_due set due = 0 where order_id = 24',
                                                    NULL, route => 24::bigint, expect_rows => 1)$$);
SET idem_consumer.transient_sqlstates = '40001';
SELECT idem_try_apply('rows-4', 'shop', 'update orders_due set due = 0 where order_id = 24',
                                         NULL, route => 24::bigint, expect_rows => 1);
SELECT idem_try_apply('rows-5', 'shop', :'settle', ARRAY['21', '1'], route => 21::bigint,
                                         expect_rows => 1);
SELECT route, key, status, sqlstate, expect_rows FROM idem_routed_dead_letters WHERE key LIKE 'rows-%';
-- replayed while the row is still missing: parked again; once it exists, applied
SELECT idem_dlq_replay('rows-4', 'shop', 24::bigint) AS row_missing;
INSERT INTO orders_due VALUES (24, 5);
SELECT idem_dlq_replay('rows-4', 'shop', 24::bigint) AS row_there;
RESET idem_consumer.transient_sqlstates;
SELECT order_id, due FROM orders_due ORDER BY order_id;
SELECT route, key, status, attempts, expect_rows FROM idem_routed_dead_letters WHERE key LIKE 'rows-%';

\c :regression_db
DROP DATABASE idem_routed_dlq;
DROP ROLE routed_pay_operator;
DROP ROLE routed_pay;
DROP ROLE routed_other;
