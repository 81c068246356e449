--
-- Routed keys (src/routed.c): idem_apply, idem_is_processed, idem_forget
-- and idem_record_batch with route, their last argument.  Without routed
-- keys the route is not needed and ignored; once
-- idem_consumer.routed_keys exists, keys go there with their route, and
-- every call that would record, look up or forget a key without one
-- (route NULL, the default) is refused before it records anything.  A
-- route is a value of the routes' type, or an untyped literal read by
-- that type's input function.
-- idem_citus_distribute() makes that table on a Citus coordinator
-- (test/citus); here, on one server without Citus, the same tables are
-- made, not distributed, so that the routed statements run as on a node of
-- a cluster.
-- In a database of its own.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_routed;
\c idem_routed
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;

CREATE TABLE pay (order_id bigint, msg text);
\set pay 'insert into pay values ($1::bigint, $2)'
CREATE FUNCTION state_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- without routed keys: the route is not needed, the key store decides
SELECT idem_apply('m-1', 'shop', :'pay', ARRAY['7', 'm-1'], route => 7::bigint) AS first,
       idem_apply('m-1', 'shop', :'pay', ARRAY['7', 'm-1'], route => 7::bigint) AS again,
       idem_apply('m-1', 'shop', :'pay', ARRAY['7', 'm-1']) AS without_route;
SELECT consumer, key FROM idem_processed_keys;
SELECT idem_is_processed('m-1', 'shop', 7), idem_forget('m-1', 'shop', 7),
       idem_is_processed('m-1', 'shop');
SELECT state_of($$SELECT idem_apply('m-2', 'shop', 'select 1', NULL, route => NULL::int)$$);
SELECT * FROM idem_record_batch('shop', ARRAY['m-3', 'm-3'], NULL, ARRAY[1, 2]);
SELECT idem_is_processed('m-3', 'shop') AS in_the_key_store;
SELECT state_of($$SELECT * FROM idem_record_batch('shop', ARRAY['m-4'], NULL, ARRAY[1, 2])$$);
SELECT state_of($$SELECT idem_citus_distribute('pay')$$);
SELECT state_of($$SELECT * FROM idem_citus_stats()$$);

-- routed keys: the tables idem_citus_distribute() makes, route bigint,
-- not distributed
SELECT idem_consumer.routed_storage_create('bigint');
SELECT c.relname, pg_get_userbyid(c.relowner) = pg_get_userbyid(k.relowner) AS storage_owner,
       c.relacl IS NOT NULL AS revoked
  FROM pg_class AS c, pg_class AS k
 WHERE c.relname IN ('routed_keys', 'routed_dead_letters', 'idem_routed_dead_letters')
   AND k.oid = 'idem_consumer.consumers'::regclass
 ORDER BY c.relname;

SELECT idem_apply('r-1', 'shop', :'pay', ARRAY['7', 'r-1'], route => 7::bigint) AS first,
       idem_apply('r-1', 'shop', :'pay', ARRAY['7', 'r-1'], route => 7::bigint) AS again,
       idem_apply('r-1', 'shop', :'pay', ARRAY['8', 'r-1'], route => 8) AS other_route;
SELECT route, consumer, key, fingerprint IS NOT NULL AS has_fingerprint,
       processed_at > 0 AS has_time FROM idem_consumer.routed_keys ORDER BY route;
SELECT * FROM pay ORDER BY order_id, msg;
-- the same key for another message: refused as key reuse
SELECT state_of($$SELECT idem_apply('r-1', 'shop', 'insert into pay values ($1::bigint, ''changed'')',
                                         ARRAY['7'], route => 7::bigint)$$);
SELECT idem_is_processed('r-1', 'shop', 7::bigint) AS on_7,
       idem_is_processed('r-1', 'shop', 9::bigint) AS on_9,
       idem_is_processed('r-1', 'nobody', 7::bigint) AS unknown_consumer;
-- a failed business statement records nothing
SELECT state_of($$SELECT idem_apply('r-2', 'shop', 'select 1 / 0', NULL, route => 7::bigint)$$);
SELECT idem_is_processed('r-2', 'shop', 7::bigint) AS recorded_after_failure;
-- bad routes
SELECT state_of($$SELECT idem_apply('r-3', 'shop', 'select 1', NULL, route => 'seven'::text)$$);
SELECT state_of($$SELECT idem_apply('r-3', 'shop', 'select 1', NULL, route => NULL::bigint)$$);
SELECT state_of($$SELECT idem_apply('r-3', 'shop', 'select 1', NULL, route => now())$$);
-- an untyped route is read as a value of the routes' type
SELECT idem_apply('r-3', 'shop', 'select 1', route => '7') AS untyped,
       idem_is_processed('r-3', 'shop', '7') AS found;
SELECT state_of($$SELECT idem_apply('r-3', 'shop', 'select 1', route => 'seven')$$);
-- an untyped parameter cannot be "any": a driver casts it
PREPARE untyped_route AS SELECT idem_apply($1, 'shop', 'select 1', route => $2);
PREPARE cast_route AS SELECT idem_apply($1, 'shop', 'select 1', route => $2::bigint);
EXECUTE cast_route('r-3', 7);
EXECUTE cast_route('r-3b', '7');
DEALLOCATE cast_route;

-- without a route, every call on keys is refused, and records nothing
SELECT state_of($$SELECT idem_apply('r-4', 'shop', 'select 1')$$);
SELECT state_of($$SELECT idem_apply('r-4', 'shop', 'select 1', route => NULL::bigint)$$);
SELECT state_of($$SELECT idem_try_apply('r-4', 'shop', 'select 1')$$);
SELECT state_of($$SELECT * FROM idem_record_batch('shop', ARRAY['r-4', 'r-5'])$$);
SELECT state_of($$SELECT idem_is_processed('r-1', 'shop')$$);
SELECT state_of($$SELECT idem_forget('r-1', 'shop')$$);
SELECT count(*) AS recorded_without_route FROM idem_processed_keys WHERE key LIKE 'r-%';
SELECT count(*) AS routed FROM idem_consumer.routed_keys;

-- batches: each key under the route at its position, the new ones
-- returned once with their routes; a key is new under another route
SELECT * FROM idem_record_batch('batch', ARRAY['b-1', 'b-2', 'b-1', 'b-3', 'b-3'], NULL,
                                       ARRAY[7, 8, 7, 7, 8]) ORDER BY 1, 2;
SELECT * FROM idem_record_batch('batch', ARRAY['b-1', 'b-4', 'b-2'], NULL,
                                       ARRAY[7, 7, 9]::bigint[]) ORDER BY 1, 2;
SELECT route, key FROM idem_consumer.routed_keys WHERE consumer = 'batch' ORDER BY route, key;
-- untyped routes are read as an array of the routes' type; with the
-- fingerprints of the messages, a key recorded under its route for another
-- message is returned as reused, and not recorded again
SELECT * FROM idem_record_batch('batch-fp', ARRAY['f-1', 'f-2'], ARRAY['a', 'b'], '{7,8}') ORDER BY 1;
SELECT * FROM idem_record_batch('batch-fp', ARRAY['f-1', 'f-2', 'f-1'], ARRAY['a', 'c', 'z'], '{7,8,9}')
 ORDER BY 1, 3;
SELECT route, key, fingerprint IS NOT NULL AS has_fingerprint FROM idem_consumer.routed_keys
 WHERE consumer = 'batch-fp' ORDER BY route, key;
SELECT applied, duplicates FROM idem_stats WHERE consumer = 'batch';
-- a batch applied by one statement, joined with its new keys and routes
INSERT INTO pay
SELECT m.order_id, m.key
  FROM (VALUES (7, 'b-5'), (8, 'b-6'), (7, 'b-1'), (9, 'b-1')) AS m (order_id, key)
  JOIN idem_record_batch('batch', ARRAY['b-5', 'b-6', 'b-1', 'b-1'], NULL, ARRAY[7, 8, 7, 9]) AS k
    ON k.key = m.key AND k.route = m.order_id::text;
SELECT order_id, msg FROM pay WHERE msg LIKE 'b-%' ORDER BY msg;
-- bad batches record nothing
SELECT state_of($$SELECT * FROM idem_record_batch('batch', ARRAY['b-9'], NULL, ARRAY[1, 2])$$);
SELECT state_of($$SELECT * FROM idem_record_batch('batch', ARRAY['b-9', 'b-8'], NULL, ARRAY[1, NULL])$$);
SELECT state_of($$SELECT * FROM idem_record_batch('batch', ARRAY['b-9'], NULL, NULL::bigint[])$$);
SELECT state_of($$SELECT * FROM idem_record_batch('batch', ARRAY['b-9'], NULL, ARRAY['seven'])$$);
SELECT state_of($$SELECT * FROM idem_record_batch('batch', ARRAY['b-9'], NULL, ARRAY[[1]])$$);
SELECT state_of($$SELECT * FROM idem_record_batch('batch', ARRAY['b-9'], NULL, 7::bigint)$$);
SELECT state_of($$SELECT * FROM idem_record_batch('batch', ARRAY['b-9', NULL], NULL, ARRAY[1, 2])$$);
SELECT count(*) AS empty_batch FROM idem_record_batch('batch', '{}', NULL, '{}'::bigint[]);
SELECT count(*) AS recorded FROM idem_consumer.routed_keys WHERE key IN ('b-8', 'b-9');

-- business SQL may not forget a key, routed or not
SELECT state_of($$SELECT idem_apply('r-6', 'shop',
    'select idem_forget(''r-1'', ''shop'', 7::bigint)', NULL, route => 7::bigint)$$);
SELECT idem_forget('r-1', 'shop', 7::bigint) AS forgotten,
       idem_forget('r-1', 'shop', 7::bigint) AS forgotten_again,
       idem_apply('r-1', 'shop', :'pay', ARRAY['7', 'r-1 again'], route => 7::bigint) AS applied_again;

-- retention: a routed key older than its consumer's window, counted back
-- from that consumer's latest routed key, goes at the next purge
SELECT idem_set_retention('shop', '1 day');
UPDATE idem_consumer.routed_keys SET processed_at = processed_at - 2 * 86400
 WHERE route = 8 AND key = 'r-1';
SELECT idem_purge('shop') AS purged, idem_purge('shop') AS purged_again;
SELECT route, key FROM idem_consumer.routed_keys WHERE consumer = 'shop' ORDER BY route, key;
-- a window of forever keeps every key; the default window (7 days) not
SELECT idem_apply('r-8', 'shop', 'select 1', NULL, route => 9::bigint) AS newer;
UPDATE idem_consumer.routed_keys SET processed_at = processed_at - 400 * 86400
 WHERE route = 7 AND key = 'r-1';
SELECT idem_set_retention('shop', NULL);
SELECT idem_purge() AS purged_forever;
SELECT idem_reset_retention('shop');
SELECT idem_purge() AS purged_by_default;
SELECT route, key FROM idem_consumer.routed_keys WHERE consumer = 'shop' ORDER BY route, key;

-- a tenant: the business SQL runs with its rights, the routed keys are
-- not its to read or change
CREATE ROLE routed_tenant;
GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_is_processed(text, text, "any")
    TO routed_tenant;
SELECT idem_consumer_create('tenant-shop', 'routed_tenant');
SET ROLE routed_tenant;
SELECT state_of($$SELECT idem_apply('t-1', 'tenant-shop', 'insert into pay values (1, ''t'')', NULL, route => 1::bigint)$$);
SELECT state_of($$SELECT idem_apply('t-1', 'tenant-shop', 'select 1', NULL, route => 1::bigint)$$);
SELECT state_of($$SELECT idem_apply('t-2', 'shop', 'select 1', NULL, route => 1::bigint)$$);
SELECT state_of($$SELECT count(*) FROM idem_consumer.routed_keys$$);
SELECT state_of($$SELECT idem_forget('t-1', 'tenant-shop', 1::bigint)$$);
RESET ROLE;
SELECT consumer, key FROM idem_consumer.routed_keys WHERE route = 1 ORDER BY key;

-- the routed keys are the database's, not the extension's: they keep
-- DROP EXTENSION from dropping them with it
SELECT state_of('DROP EXTENSION idem_consumer');
-- without the tables, keys are the key store's again
DROP VIEW idem_routed_dead_letters, idem_routed_effects;
DROP TABLE idem_consumer.routed_keys, idem_consumer.routed_dead_letters, idem_consumer.routed_effects;
SELECT idem_apply('r-7', 'shop', 'select 1') AS unrouted_again;

\c :regression_db
DROP DATABASE idem_routed;
DROP ROLE routed_tenant;
