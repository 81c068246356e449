--
-- The views that show each team only its own consumers' rows are security
-- barriers: a caller's condition never runs on another team's rows, whether
-- it leaks them through a cheap function that prints its argument or
-- through an error message that quotes the value it failed on.  They show a
-- consumer to the roles with its owner's privileges, as PostgreSQL's own
-- ownership checks do: a NOINHERIT member of the owner sees nothing.
--
-- A database of its own, so that every row the views hold is this test's.
\set regress_db :DBNAME
CREATE DATABASE view_barriers;
\c view_barriers
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
RESET client_min_messages;
CREATE ROLE vb_team_a;
CREATE ROLE vb_team_b;
CREATE ROLE vb_noinherit NOINHERIT IN ROLE vb_team_a;
CREATE TABLE vb_orders (id int PRIMARY KEY, paid int NOT NULL DEFAULT 0);
INSERT INTO vb_orders VALUES (1);
GRANT SELECT, UPDATE ON vb_orders TO vb_team_a, vb_team_b;
GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_effect_begin(text, text, jsonb, interval, "any")
   TO vb_team_a, vb_team_b;
GRANT SELECT ON idem_processed_keys, idem_dead_letters, idem_effects
   TO vb_team_a, vb_team_b, vb_noinherit;
SELECT idem_consumer_create('vb-a', 'vb_team_a');
SELECT idem_consumer_create('vb-b', 'vb_team_b');

-- team A's secrets: a key, a parked message with its SQL and parameters,
-- an effect with its request
SET ROLE vb_team_a;
SELECT idem_apply('secret-key-a1', 'vb-a', 'update vb_orders set paid = paid + 1 where id = 1');
SELECT idem_try_apply('secret-key-a2', 'vb-a',
                      'update vb_orders set paid = paid + $1::int / 0 where id = 1',
                      ARRAY['secret-param-a']);
SELECT action FROM idem_effect_begin('vb-a', 'secret-key-a3', '{"card": "secret-card-a"}');
RESET ROLE;
-- team B's own rows
SET ROLE vb_team_b;
SELECT idem_apply('key-b1', 'vb-b', 'update vb_orders set paid = paid + 1 where id = 1');
RESET ROLE;

-- a function that prints whatever it is given, and costs so little that the
-- planner would run it before any other condition
CREATE FUNCTION vb_leak(text) RETURNS boolean
LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN
    RAISE NOTICE 'leaked: %', $1;
    RETURN true;
END
$$;

SET ROLE vb_team_b;
-- the leaky function sees team B's rows only
SELECT consumer, key FROM idem_processed_keys WHERE vb_leak(key);
SELECT consumer, key FROM idem_dead_letters WHERE vb_leak(sql || params::text);
SELECT consumer, key FROM idem_effects WHERE vb_leak(key || request::text);
-- a cast that fails on the first row it meets fails on team B's own row,
-- never on one of team A's
SELECT count(*) FROM idem_processed_keys WHERE (key || 'x')::int > 0;
SELECT count(*) FROM idem_dead_letters WHERE (sql || params::text)::int > 0;
SELECT count(*) FROM idem_effects WHERE (key || request::text)::int > 0;
RESET ROLE;

-- the owner's team sees its own
SET ROLE vb_team_a;
SELECT consumer, key FROM idem_processed_keys ORDER BY key;
SELECT consumer, key, params FROM idem_dead_letters;
SELECT consumer, key, request FROM idem_effects;
RESET ROLE;

-- a member that does not inherit the owner's privileges sees nothing
SET ROLE vb_noinherit;
SELECT count(*) FROM idem_processed_keys;
SELECT count(*) FROM idem_dead_letters;
SELECT count(*) FROM idem_effects;
RESET ROLE;

-- the views are declared as barriers
SELECT c.relname, c.reloptions
  FROM pg_class c JOIN pg_depend d ON d.objid = c.oid AND d.classid = 'pg_class'::regclass
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem_consumer')
   AND c.relkind = 'v'
 ORDER BY 1;

\c :regress_db
DROP DATABASE view_barriers;
DROP ROLE vb_team_a, vb_team_b, vb_noinherit;
