--
-- No node of a reader's plan over the views that filter by owner ever sees
-- a row of a consumer the reader may not act on (src/visible_rows.c).
-- Each view reads a set-returning function that returns only the permitted
-- rows, so that EXPLAIN ANALYZE, whose row counts ("actual rows", "Rows
-- Removed by Filter") cover every node of the plan, and the planner's
-- estimates ("rows=") are the same whether another team's key, SQL,
-- parameter or provider key exists or not: a query for another team's
-- value and one for a value nobody has give the same plan and counts,
-- and another team's new rows change no estimate.  As an on-call role with
-- SELECT on the views (as in the README), and as a role with CONNECT
-- only.  The routed views show an entry of a consumer this node does not
-- know only to the roles with the privileges of the storage's owner.
--
-- A database of its own, so that every row the views hold is this test's.
\set regress_db :DBNAME
CREATE DATABASE view_leaks;
\c view_leaks
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
RESET client_min_messages;
CREATE ROLE vl_team_a;
CREATE ROLE vl_team_b;
CREATE ROLE vl_oncall_b IN ROLE vl_team_b;
CREATE ROLE vl_connect;
CREATE TABLE vl_orders (id int PRIMARY KEY, paid int NOT NULL DEFAULT 0);
INSERT INTO vl_orders VALUES (1);
GRANT SELECT ON idem_processed_keys, idem_dead_letters, idem_effects TO vl_oncall_b, vl_team_a;
SELECT idem_consumer_create('vl-a', 'vl_team_a');
SELECT idem_consumer_create('vl-b', 'vl_team_b');

-- team B's own rows, one of each
SELECT idem_apply('key-b1', 'vl-b', 'update vl_orders set paid = paid + 1 where id = 1');
SELECT idem_try_apply('key-b2', 'vl-b', 'update vl_orders set paid = $1::int / 0 where id = 1',
                      ARRAY['param-b']);
SELECT action FROM idem_effect_begin('vl-b', 'key-b3', '{"card": "card-b"}');

-- EXPLAIN of a query as text, with every quoted value replaced by '?', so
-- that the plans of two queries that differ in a value compare equal when
-- the plans do
CREATE FUNCTION vl_explain(q text, options text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    line text;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (' || options || ') ' || q LOOP
        -- from PostgreSQL 18 on, actual rows have two decimals
        RETURN NEXT regexp_replace(regexp_replace(line, '''[^'']*''', '''?''', 'g'),
                                   '(actual rows=\d+)\.\d+', '\1', 'g');
    END LOOP;
END
$$;
-- the row counts of every node, run
CREATE FUNCTION vl_counts(q text) RETURNS text
LANGUAGE sql AS $$
    SELECT string_agg(l, E'\n')
      FROM vl_explain(q, 'ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF') AS l
$$;
-- the planner's estimated rows of every node
CREATE FUNCTION vl_estimates(q text) RETURNS text
LANGUAGE sql AS $$
    SELECT string_agg(m[1], ' ')
      FROM vl_explain(q, 'COSTS ON') AS l, regexp_matches(l, 'rows=(\d+)', 'g') AS m
$$;
-- a query for another team's value against one for a value nobody has:
-- the plan and counts of the first, and whether the second's are the same
CREATE FUNCTION vl_compare(secret text, missing text)
RETURNS TABLE (plan text, same_counts boolean, same_estimates boolean)
LANGUAGE sql AS $$
    SELECT vl_counts(secret), vl_counts(secret) = vl_counts(missing),
           vl_estimates(secret) = vl_estimates(missing)
$$;
-- a function that prints whatever it is given, cheap enough to run first
CREATE FUNCTION vl_leak(text) RETURNS boolean
LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN
    RAISE NOTICE 'leaked: %', $1;
    RETURN true;
END
$$;

-- the estimates of the views before team A has any row
SET ROLE vl_oncall_b;
SELECT vl_estimates('SELECT * FROM idem_processed_keys WHERE key >= ''secret-'' AND key < ''secret.''')
       AS keys_before,
       vl_estimates('SELECT * FROM idem_dead_letters WHERE sql >= ''update'' AND params[1] = ''secret-param-a''')
       AS dead_letters_before,
       vl_estimates('SELECT * FROM idem_effects WHERE key >= ''secret-''') AS effects_before
\gset
RESET ROLE;

-- team A's secrets: 200 keys, a parked message with its S''L and parameter,
-- an effect and its provider key
SELECT count(*) FILTER (WHERE idem_apply('secret-' || i, 'vl-a',
                                         'update vl_orders set paid = paid + 1 where id = 1'))
  FROM generate_series(1, 200) AS i;
SELECT idem_try_apply('secret-dl', 'vl-a', 'update vl_orders set paid = $1::int / 0 where id = 1 and true',
                      ARRAY['secret-param-a']);
SELECT action FROM idem_effect_begin('vl-a', 'secret-fx', '{"card": "secret-card-a"}');
SELECT provider_key AS secret_provider_key FROM idem_consumer.effects WHERE key = 'secret-fx' \gset

-- routed entries and effects, written here by hand (without Citus the
-- routed tables are local tables): team B's, then the estimates of the
-- routed views, then team A's and those of a consumer this node does not
-- know
SELECT idem_consumer.routed_storage_create('bigint');
GRANT SELECT ON idem_routed_dead_letters, idem_routed_effects TO vl_oncall_b, vl_team_a;
INSERT INTO idem_consumer.routed_dead_letters
       (route, consumer, key, sql, params, settings, sqlstate, message, dead_lettered_by)
VALUES (2, 'vl-b', 'routed-b1', 'update b', ARRAY['param-b'], '{}', '22012', 'division by zero',
        'vl_team_b');
INSERT INTO idem_consumer.routed_effects (route, consumer, key, deferred, state)
VALUES (2, 'vl-b', 'routed-b2', false, 'pending');
SET ROLE vl_oncall_b;
SELECT vl_estimates('SELECT * FROM idem_routed_dead_letters WHERE key >= ''secret-''')
       AS routed_dead_letters_before,
       vl_estimates('SELECT * FROM idem_routed_effects WHERE key >= ''secret-''')
       AS routed_effects_before
\gset
RESET ROLE;
INSERT INTO idem_consumer.routed_dead_letters
       (route, consumer, key, sql, params, settings, sqlstate, message, dead_lettered_by)
VALUES (1, 'vl-a', 'secret-routed', 'update secret', ARRAY['secret-param-a'], '{}', '22012',
        'division by zero', 'vl_team_a'),
       (3, 'vl-unknown', 'unknown-routed', 'update unknown', ARRAY['unknown-param'], '{}', '22012',
        'division by zero', 'vl_team_a');
INSERT INTO idem_consumer.routed_effects (route, consumer, key, deferred, state)
VALUES (1, 'vl-a', 'secret-routed-fx', false, 'pending'),
       (3, 'vl-unknown', 'unknown-routed-fx', false, 'pending');
SELECT provider_key AS secret_routed_provider_key FROM idem_consumer.routed_effects
 WHERE key = 'secret-routed-fx' \gset
ANALYZE idem_consumer.processed_keys_1, idem_consumer.dead_letters, idem_consumer.effects,
        idem_consumer.routed_dead_letters, idem_consumer.routed_effects;

SET ROLE vl_oncall_b;
-- team A's rows change no estimate
SELECT vl_estimates('SELECT * FROM idem_processed_keys WHERE key >= ''secret-'' AND key < ''secret.''')
       = :'keys_before' AS keys_same,
       vl_estimates('SELECT * FROM idem_dead_letters WHERE sql >= ''update'' AND params[1] = ''secret-param-a''')
       = :'dead_letters_before' AS dead_letters_same,
       vl_estimates('SELECT * FROM idem_effects WHERE key >= ''secret-''')
       = :'effects_before' AS effects_same,
       vl_estimates('SELECT * FROM idem_routed_dead_letters WHERE key >= ''secret-''')
       = :'routed_dead_letters_before' AS routed_dead_letters_same,
       vl_estimates('SELECT * FROM idem_routed_effects WHERE key >= ''secret-''')
       = :'routed_effects_before' AS routed_effects_same;

-- another team's key, by equality and by prefix, against keys nobody has
SELECT * FROM vl_compare('SELECT 1 FROM idem_processed_keys WHERE key = ''secret-7''',
                         'SELECT 1 FROM idem_processed_keys WHERE key = ''nobody-7''');
SELECT * FROM vl_compare('SELECT 1 FROM idem_processed_keys WHERE key >= ''secret-'' AND key < ''secret.''',
                         'SELECT 1 FROM idem_processed_keys WHERE key >= ''nobody-'' AND key < ''nobody.''');
-- another team's parked SQL and parameter
SELECT * FROM vl_compare('SELECT 1 FROM idem_dead_letters WHERE params[1] = ''secret-param-a''',
                         'SELECT 1 FROM idem_dead_letters WHERE params[1] = ''nobody-param''');
SELECT * FROM vl_compare('SELECT 1 FROM idem_dead_letters WHERE sql = ''update vl_orders set paid = $1::int / 0 where id = 1 and true''',
                         'SELECT 1 FROM idem_dead_letters WHERE sql = ''update vl_orders set paid = $1::int / 0 where id = 1 and false''');
-- another team's provider key
SELECT * FROM vl_compare(format('SELECT 1 FROM idem_effects WHERE provider_key = %L', :'secret_provider_key'),
                         'SELECT 1 FROM idem_effects WHERE provider_key = ''nobody''');
-- the routed views: another team's entry, and the parameter of an entry of
-- a consumer this node does not know
SELECT * FROM vl_compare('SELECT 1 FROM idem_routed_dead_letters WHERE key = ''secret-routed''',
                         'SELECT 1 FROM idem_routed_dead_letters WHERE key = ''nobody-routed''');
SELECT * FROM vl_compare('SELECT 1 FROM idem_routed_dead_letters WHERE params[1] = ''unknown-param''',
                         'SELECT 1 FROM idem_routed_dead_letters WHERE params[1] = ''nobody-param''');
SELECT * FROM vl_compare(format('SELECT 1 FROM idem_routed_effects WHERE provider_key = %L',
                                :'secret_routed_provider_key'),
                         'SELECT 1 FROM idem_routed_effects WHERE provider_key = ''nobody''');
SELECT * FROM vl_compare('SELECT 1 FROM idem_routed_effects WHERE key = ''unknown-routed-fx''',
                         'SELECT 1 FROM idem_routed_effects WHERE key = ''nobody-routed-fx''');

-- the team's own rows are there, and only they
SELECT consumer, key FROM idem_processed_keys;
SELECT consumer, key, params FROM idem_dead_letters;
SELECT consumer, key FROM idem_effects;
SELECT route, consumer, key FROM idem_routed_dead_letters;
SELECT route, consumer, key FROM idem_routed_effects;
-- a leaky function and a failing cast on the routed views meet the team's
-- own rows only
SELECT key FROM idem_routed_dead_letters WHERE vl_leak(key || sql || params::text);
SELECT key FROM idem_routed_effects WHERE vl_leak(key || state || length(provider_key));
SELECT count(*) FROM idem_routed_dead_letters WHERE (sql || params::text)::int > 0;
SELECT count(*) FROM idem_routed_effects WHERE (key || state || length(provider_key))::int > 0;
-- the functions behind the views are not the reader's to call
SELECT * FROM idem_consumer.processed_keys_visible();
RESET ROLE;

-- with CONNECT only, every view is refused before any row is read, the
-- same for a value that exists as for one that does not
SET ROLE vl_connect;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF)
SELECT 1 FROM idem_processed_keys WHERE key = 'secret-7';
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF)
SELECT 1 FROM idem_processed_keys WHERE key = 'nobody-7';
EXPLAIN SELECT 1 FROM idem_dead_letters WHERE params[1] = 'secret-param-a';
EXPLAIN SELECT 1 FROM idem_effects WHERE key = 'secret-fx';
EXPLAIN SELECT 1 FROM idem_routed_dead_letters WHERE key = 'secret-routed';
EXPLAIN SELECT 1 FROM idem_routed_effects WHERE key = 'secret-routed-fx';
SELECT * FROM idem_consumer.dead_letters_visible();
RESET ROLE;

-- team A sees its own, and nothing of the consumer this node does not know
SET ROLE vl_team_a;
SELECT count(*) AS team_a_keys FROM idem_processed_keys;
SELECT route, consumer, key FROM idem_routed_dead_letters;
SELECT route, consumer, key FROM idem_routed_effects;
RESET ROLE;

-- the storage's owner (here the superuser that created the extension)
-- sees every entry, those of the unknown consumer too
SELECT route, consumer, key FROM idem_routed_dead_letters ORDER BY route;
SELECT route, consumer, key FROM idem_routed_effects ORDER BY route;
-- the routed views name the columns of the function, route's type with
-- them; without them it has none to return
SELECT idem_consumer.routed_dead_letters_visible();

\c :regress_db
DROP DATABASE view_leaks;
DROP ROLE vl_team_a, vl_team_b, vl_oncall_b, vl_connect;
