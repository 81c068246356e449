--
-- Retention: a key expires when it is older than its consumer's window
-- counted back from that consumer's latest activity (its newest key), not
-- from the wall clock.  idem_purge() removes expired keys.
--
-- keys purged one by one (by whole generations, the default: key_generation_retention)
SET idem_consumer.key_generation_interval = 0;
-- store_key() writes a key straight into the storage, as if it had been
-- recorded "age" ago; keys_of() lists what a consumer has left.
CREATE FUNCTION store_key(consumer text, key text, age interval) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO idem_consumer.consumers (name) VALUES (consumer) ON CONFLICT DO NOTHING;
    INSERT INTO idem_consumer.processed_keys_1 (consumer_id, processed_at, key)
    SELECT consumer_id,
           floor(extract(epoch FROM now() - age - timestamptz '2000-01-01 00:00:00+00'))::int, key
      FROM idem_consumer.consumers WHERE name = consumer;
$$;
CREATE FUNCTION keys_of(consumer text) RETURNS text
LANGUAGE sql AS $$
    SELECT coalesce(string_agg(key, ' ' ORDER BY processed_at, key), '(none)')
      FROM idem_processed_keys k WHERE k.consumer = keys_of.consumer;
$$;
-- retention_error runs a statement and shows its SQLSTATE and message.
CREATE FUNCTION retention_error(stmt text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    state text;
    message text;
    detail text;
    hint text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN state || ' ' || message
        || coalesce(E'\nDETAIL: ' || nullif(detail, ''), '')
        || coalesce(E'\nHINT: ' || nullif(hint, ''), '');
END
$$;

SHOW idem_consumer.retention;

-- The latest-activity rule.  "idle" stopped 18 days ago; its keys are all
-- older than 7 days by the wall clock, which the usual
-- "processed_at < now() - retention" rule would delete:
SELECT store_key('idle', 'd30', '30 days'), store_key('idle', 'd20', '20 days'),
       store_key('idle', 'd18', '18 days');
SELECT count(*) AS wall_clock_rule_would_delete
  FROM idem_processed_keys WHERE consumer = 'idle' AND processed_at < now() - interval '7 days';
-- but its window counts back from its newest key (18 days ago): only d30 is
-- more than 7 days older than d18
SELECT idem_purge('idle') AS purged, keys_of('idle');
-- however long it stays idle, it keeps the rest
SELECT idem_purge('idle') AS purged, keys_of('idle');
-- when it applies messages again, its clock moves and the old keys expire
SELECT idem_apply('back', 'idle', 'select 1');
SELECT idem_purge('idle') AS purged, keys_of('idle');
-- the window is exact to the second: a key 7 days older than the newest
-- stays, one a second older goes (one statement: one now())
SELECT idem_apply('edge', 'idle', 'select 1'),
       store_key('idle', 'inside', '7 days'), store_key('idle', 'outside', '7 days 1 second');
SELECT idem_purge('idle') AS purged, keys_of('idle');

-- Per-consumer windows override idem_consumer.retention.
SELECT store_key('short', 'd2', '2 days'), store_key('short', 'd0', '0');
SELECT store_key('long', 'd20', '20 days'), store_key('long', 'd0', '0');
SELECT store_key('monthly', 'd40', '40 days'), store_key('monthly', 'd25', '25 days'),
       store_key('monthly', 'd0', '0');
SELECT idem_set_retention('short', '1 day'),
       idem_set_retention('long', '30 days'),
       idem_set_retention('monthly', '1 month');
SELECT * FROM idem_retention WHERE consumer IN ('idle', 'short', 'long', 'monthly') ORDER BY consumer;
SELECT idem_purge('short') AS short, idem_purge('long') AS long, idem_purge('monthly') AS monthly;
SELECT keys_of('short') AS short, keys_of('long') AS long, keys_of('monthly') AS monthly;
-- setting it again replaces it
SELECT idem_set_retention('long', '10 days');
SELECT idem_purge('long') AS purged, keys_of('long');

-- NULL keeps a consumer's keys forever.
SELECT store_key('forever', 'y10', '10 years'), store_key('forever', 'd0', '0');
SELECT idem_set_retention('forever', NULL);
SELECT * FROM idem_retention WHERE consumer = 'forever';
SELECT idem_purge('forever') AS purged, keys_of('forever');
-- back to the default
SELECT idem_reset_retention('forever');
SELECT * FROM idem_retention WHERE consumer = 'forever';
SELECT idem_purge('forever') AS purged, keys_of('forever');

-- The default comes from idem_consumer.retention; -1 keeps keys forever.
SELECT store_key('default', 'h3', '3 hours'), store_key('default', 'h0', '0');
SET idem_consumer.retention = -1;
SELECT * FROM idem_retention WHERE consumer = 'default';
SELECT idem_purge('default') AS purged, keys_of('default');
SET idem_consumer.retention = '1h';
SELECT * FROM idem_retention WHERE consumer = 'default';
SELECT idem_purge('default') AS purged, keys_of('default');
RESET idem_consumer.retention;
SELECT retention_error($$SET idem_consumer.retention = 0$$);

-- At most batch_size keys per consumer per call; call until 0.
SELECT store_key('purge-batch', 'old' || g, '30 days') FROM generate_series(1, 5) g;
SELECT store_key('purge-batch', 'new', '0');
SELECT idem_purge('purge-batch', 2) AS first, idem_purge('purge-batch', 2) AS second,
       idem_purge('purge-batch', 2) AS third, idem_purge('purge-batch', 2) AS fourth;
SELECT keys_of('purge-batch');

-- Without a consumer, every consumer is purged, each by its own window.
SELECT store_key('all-a', 'old', '30 days'), store_key('all-a', 'new', '0'),
       store_key('all-b', 'old', '30 days'), store_key('all-b', 'new', '0');
SELECT idem_set_retention('all-b', NULL);
SELECT idem_purge() AS purged, keys_of('all-a') AS a, keys_of('all-b') AS b;

-- A purge in a transaction that rolls back removes nothing, and the next
-- one starts over.
SELECT store_key('rollback', 'old', '30 days'), store_key('rollback', 'new', '0');
BEGIN;
SELECT idem_purge('rollback') AS purged, keys_of('rollback');
ROLLBACK;
SELECT keys_of('rollback');
SELECT idem_purge('rollback') AS purged, keys_of('rollback');

-- Hash collisions: removing an occupant moves its collision into its place,
-- and old collisions expire like any key.
SELECT idem_apply('seed', 'hashing-r', 'select 1');
CREATE TEMP TABLE colliding AS
    WITH c AS (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'hashing-r'),
         k AS (SELECT 'evt-' || g AS key, idem_consumer.key_hash64((SELECT consumer_id FROM c), 'evt-' || g) AS h
                 FROM generate_series(1, 400000) g),
         pairs AS (SELECT h FROM k GROUP BY h HAVING count(*) >= 2 ORDER BY h LIMIT 3)
    SELECT dense_rank() OVER (ORDER BY h) AS pair, row_number() OVER (PARTITION BY h ORDER BY key) AS n, key
      FROM k WHERE h IN (SELECT h FROM pairs);
SELECT count(DISTINCT pair) = 3 AS found_three_pairs FROM colliding;
SELECT key AS a1 FROM colliding WHERE pair = 1 AND n = 1 \gset
SELECT key AS a2 FROM colliding WHERE pair = 1 AND n = 2 \gset
SELECT key AS b1 FROM colliding WHERE pair = 2 AND n = 1 \gset
SELECT key AS b2 FROM colliding WHERE pair = 2 AND n = 2 \gset
SELECT key AS c1 FROM colliding WHERE pair = 3 AND n = 1 \gset
SELECT key AS c2 FROM colliding WHERE pair = 3 AND n = 2 \gset
-- a: old occupant, new collision; b: both old; c: old collision, new occupant
SELECT store_key('hashing-r', :'a1', '30 days');
SELECT idem_apply(:'a2', 'hashing-r', 'select 1') AS a2_recorded;
SELECT store_key('hashing-r', :'b1', '30 days');
INSERT INTO idem_consumer.key_collisions_1 (consumer_id, processed_at, key)
SELECT consumer_id, processed_at - 10, :'b2' FROM idem_consumer.processed_keys_1 WHERE key = :'b1';
SELECT idem_apply(:'c1', 'hashing-r', 'select 1') AS c1_recorded;
INSERT INTO idem_consumer.key_collisions_1 (consumer_id, processed_at, key)
SELECT consumer_id, processed_at - 30 * 86400, :'c2' FROM idem_consumer.processed_keys_1 WHERE key = :'c1';
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'hashing-r');
SELECT idem_purge('hashing-r') AS purged;
-- a2 took a1's place; b1, b2 and c2 are gone; c1 stays
SELECT k.key = :'a2' AS is_a2, k.key = :'c1' AS is_c1, k.key = 'seed' AS is_seed
  FROM idem_consumer.processed_keys_1 k JOIN idem_consumer.consumers c USING (consumer_id)
 WHERE c.name = 'hashing-r' ORDER BY k.key = 'seed', k.key = :'c1';
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'hashing-r');
-- a2 inside the window is still a duplicate; the expired keys apply again
SELECT idem_apply(:'a2', 'hashing-r', 'select 1') AS a2_again,
       idem_apply(:'c1', 'hashing-r', 'select 1') AS c1_again,
       idem_apply(:'a1', 'hashing-r', 'select 1') AS a1_expired,
       idem_apply(:'b1', 'hashing-r', 'select 1') AS b1_expired,
       idem_apply(:'b2', 'hashing-r', 'select 1') AS b2_expired,
       idem_apply(:'c2', 'hashing-r', 'select 1') AS c2_expired;

-- Bad input
\t on
SELECT retention_error($$SELECT idem_set_retention('no-such-consumer', '1 day')$$);
SELECT retention_error($$SELECT idem_reset_retention('no-such-consumer')$$);
SELECT retention_error($$SELECT idem_purge('no-such-consumer')$$);
SELECT retention_error($$SELECT idem_set_retention(NULL, '1 day')$$);
SELECT retention_error($$SELECT idem_set_retention('', '1 day')$$);
SELECT retention_error($$SELECT idem_set_retention('short', '0')$$);
SELECT retention_error($$SELECT idem_set_retention('short', '-1 day')$$);
SELECT retention_error($$SELECT idem_set_retention('short', '1 day -1 hour')$$);
SELECT retention_error($$SELECT idem_set_retention('short', '101 years')$$);
SELECT retention_error($$SELECT idem_purge('short', 0)$$);
SELECT retention_error($$SELECT idem_purge('short', NULL)$$);
SELECT retention_error($$SELECT idem_purge(repeat('c', 129))$$);
\t off
SELECT idem_set_retention('short', '100 years'), idem_set_retention('short', '1 second');

-- Purging and setting windows are for operators: they run as the owner of
-- the storage, which the operator cannot read.
CREATE ROLE idem_retention_ops;
SET ROLE idem_retention_ops;
SELECT retention_error($$SELECT idem_purge()$$);
SELECT retention_error($$SELECT idem_set_retention('short', '1 day')$$);
SELECT retention_error($$SELECT * FROM idem_retention$$);
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_purge(text, integer), idem_set_retention(text, interval) TO idem_retention_ops;
SELECT store_key('ops', 'old', '30 days'), store_key('ops', 'new', '0');
SET ROLE idem_retention_ops;
SELECT idem_set_retention('ops', '1 day');
SELECT idem_purge('ops') AS purged;
SELECT retention_error($$SELECT count(*) FROM idem_consumer.processed_keys$$);
RESET ROLE;
SELECT keys_of('ops');
DROP OWNED BY idem_retention_ops;
DROP ROLE idem_retention_ops;

-- A hostile search_path, with objects that shadow every name the purge's
-- statements use placed before pg_catalog, changes nothing.
CREATE SCHEMA evil;
CREATE TABLE evil.processed_keys (consumer_id int, processed_at int, key text);
CREATE TABLE evil.key_collisions (consumer_id int, processed_at int, key text);
CREATE TABLE evil.retention_settings (consumer_id int, retention interval);
CREATE FUNCTION evil.yes(int, int) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION evil.yes(tid, tid) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR evil.< (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.yes);
CREATE OPERATOR evil.= (LEFTARG = int, RIGHTARG = int, FUNCTION = evil.yes);
CREATE OPERATOR evil.>= (LEFTARG = tid, RIGHTARG = tid, FUNCTION = evil.yes);
CREATE OPERATOR evil.< (LEFTARG = tid, RIGHTARG = tid, FUNCTION = evil.yes);
CREATE OPERATOR evil.= (LEFTARG = tid, RIGHTARG = tid, FUNCTION = evil.yes);
CREATE FUNCTION evil.max(int) RETURNS int LANGUAGE sql AS 'SELECT 2000000000';
CREATE FUNCTION evil.min(int) RETURNS int LANGUAGE sql AS 'SELECT 2000000000';
CREATE FUNCTION evil.unnest(int[]) RETURNS SETOF int LANGUAGE sql AS 'SELECT 1';
CREATE FUNCTION evil.pg_relation_size(regclass) RETURNS bigint LANGUAGE sql AS 'SELECT 0::bigint';
SELECT store_key('evil-purge', 'old', '30 days'), store_key('evil-purge', 'mid', '3 days'),
       store_key('evil-purge', 'new', '0');
SET search_path = evil, pg_catalog, public;
SELECT 1 < 0 AS shadowed;
SELECT idem_set_retention('evil-purge', '1 day');
SELECT idem_purge('evil-purge') AS purged;
RESET search_path;
SELECT keys_of('evil-purge');
DROP SCHEMA evil CASCADE;
