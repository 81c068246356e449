--
-- No internal statement depends on the caller's search_path: a superuser
-- whose search_path puts a schema that others can write before pg_catalog
-- (public, pg_catalog) runs the key store, the dead letters, the purge,
-- the generations' switch and retire, effects and the views, and none of
-- the look-alikes there runs: a public.timestamptz domain whose check
-- raises, and public functions and operators of the same names and
-- argument types as pg_catalog's, each of which raises.  Before, the
-- retire cast a literal to timestamptz without its schema (KR_SEALED),
-- and the tenant's domain check ran as the superuser.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_hostile_path;
\c idem_hostile_path
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
\set VERBOSITY terse

-- what a tenant with CREATE on public leaves there
CREATE FUNCTION public.hostile(what text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'hostile % ran', what;
END $$;
CREATE DOMAIN public.timestamptz AS pg_catalog.timestamptz CHECK (public.hostile('domain timestamptz'));
CREATE DOMAIN public.int4 AS pg_catalog.int4 CHECK (public.hostile('domain int4'));
CREATE DOMAIN public.int8 AS pg_catalog.int8 CHECK (public.hostile('domain int8'));
CREATE DOMAIN public.text AS pg_catalog.text CHECK (public.hostile('domain text'));
CREATE DOMAIN public.interval AS pg_catalog.interval CHECK (public.hostile('domain interval'));
CREATE DOMAIN public.jsonb AS pg_catalog.jsonb CHECK (public.hostile('domain jsonb'));
CREATE DOMAIN public.regclass AS pg_catalog.regclass CHECK (public.hostile('domain regclass'));
CREATE FUNCTION public.now() RETURNS pg_catalog.timestamptz LANGUAGE sql
    AS $$ SELECT CASE WHEN public.hostile('now()') THEN pg_catalog.now() END $$;
CREATE FUNCTION public.floor(double precision) RETURNS double precision LANGUAGE sql
    AS $$ SELECT CASE WHEN public.hostile('floor()') THEN $1 END $$;
CREATE FUNCTION public.date_part(pg_catalog.text, pg_catalog.interval) RETURNS double precision LANGUAGE sql
    AS $$ SELECT CASE WHEN public.hostile('date_part()') THEN 0::double precision END $$;
CREATE FUNCTION public.unnest(anyarray) RETURNS SETOF anyelement LANGUAGE sql
    AS $$ SELECT CASE WHEN public.hostile('unnest()') THEN $1[1] END $$;
CREATE FUNCTION public.count(anyelement) RETURNS bigint LANGUAGE sql
    AS $$ SELECT CASE WHEN public.hostile('count()') THEN 0::bigint END $$;
CREATE FUNCTION public.max(anyelement) RETURNS anyelement LANGUAGE sql
    AS $$ SELECT CASE WHEN public.hostile('max()') THEN $1 END $$;
-- an operator of each name and built-in argument types the statements use
DO $$
DECLARE
    o record;
BEGIN
    FOR o IN SELECT op, l, r, row_number() OVER () AS n
               FROM unnest(ARRAY['=', '<>', '<', '<=', '>', '>=']) AS op,
                    unnest(ARRAY['int2', 'int4', 'int8', 'text', 'oid', 'timestamptz', 'interval',
                                 'bool', 'name', 'tid', 'xid', 'regclass']) AS l,
                    LATERAL (SELECT l AS r) AS rr
             UNION ALL
             SELECT op, l, r, 1000 + row_number() OVER ()
               FROM (VALUES ('+', 'int4', 'int4'), ('+', 'int8', 'int8'), ('-', 'int4', 'int4'),
                            ('-', 'int8', 'int8'), ('-', 'timestamptz', 'timestamptz'),
                            ('-', 'timestamptz', 'interval'), ('+', 'timestamptz', 'interval'),
                            ('*', 'interval', 'float8'), ('*', 'int8', 'int8'),
                            ('||', 'text', 'text'), ('=', 'int4', 'int8'), ('=', 'int8', 'int4'),
                            ('<@', 'int8', 'int8range'), ('@>', 'anyarray', 'anyarray'),
                            ('&&', 'anyarray', 'anyarray')) AS v(op, l, r)
    LOOP
        EXECUTE format('CREATE FUNCTION public.hostile_op_%s(pg_catalog.%s, pg_catalog.%s) RETURNS boolean '
                       'LANGUAGE sql AS $f$ SELECT public.hostile(%L) $f$',
                       o.n, o.l, o.r, format('operator %s(%s, %s)', o.op, o.l, o.r));
        EXECUTE format('CREATE OPERATOR public.%s (LEFTARG = pg_catalog.%s, RIGHTARG = pg_catalog.%s, '
                       'FUNCTION = public.hostile_op_%s)', o.op, o.l, o.r, o.n);
    END LOOP;
END $$;

-- keys, a dead letter, an effect, and a generation to retire, made with
-- the default search_path
SELECT idem_consumer_create(c) FROM unnest(ARRAY['hp', 'hp_other']) AS c;
SELECT idem_set_retention('hp_other', '1 second');
SELECT idem_apply('k' || g, 'hp', 'select 1') FROM generate_series(1, 3) AS g;
SELECT idem_apply('old', 'hp_other', 'select 1');
SELECT idem_key_generation_switch() AS switched;
-- thirty days on: every key of the first generation has expired
UPDATE idem_consumer.processed_keys_1 SET processed_at = processed_at - 30 * 86400;
UPDATE idem_consumer.generation_consumers SET first_at = first_at - 30 * 86400;
UPDATE idem_consumer.key_generations SET opened_at = opened_at - interval '30 days',
    settled_at = settled_at - interval '30 days';

-- a fresh session, so that no statement was planned before
\c idem_hostile_path
\set VERBOSITY terse
SET search_path = public, pg_catalog;
SHOW search_path;
-- the look-alikes are what an unqualified name finds
SELECT 1 = 1;
SELECT timestamptz '2000-01-01 00:00:00+00';
SELECT now();
SELECT idem_apply('k4', 'hp', 'select 1') AS applied, idem_apply('k1', 'hp', 'select 1') AS duplicate,
       idem_apply('new', 'hp_other', 'select 1') AS other_applied;
SELECT idem_try_apply('parked', 'hp', 'select 1/0');
SELECT idem_try_apply('parked2', 'hp', 'select 1/0');
SELECT k FROM idem_record_batch('hp', ARRAY['b1', 'k2', 'b1']) AS k;
SELECT idem_is_processed('k1', 'hp') AS k1, idem_forget('k2', 'hp') AS k2_forgotten;
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE key OPERATOR(pg_catalog.=) 'parked';
-- discarded, neither keeps the first generation
SELECT key, idem_dlq_discard(id, 'reason') FROM idem_dead_letters
 WHERE status OPERATOR(pg_catalog.=) 'pending' ORDER BY key;
SELECT action FROM idem_effect_begin('hp', 'e1', '{"n": 1}');
SELECT idem_effect_complete('hp', 'e1', 1, '{"ok": true}');
SELECT idem_effect_enqueue('hp', 'e2', '{"n": 2}');
SELECT key FROM idem_effect_claim('hp');
SET idem_consumer.key_generation_interval = 0;   -- the purge key by key
SELECT idem_purge('hp_other') AS purged;
RESET idem_consumer.key_generation_interval;
-- by generations, the purge of every consumer drops the expired
-- generation as retire does; retire then finds nothing left to drop
SELECT idem_purge() AS purged_by_generation;
SELECT idem_key_generation_retire() AS retired;
-- the next call truncates what the first one dropped
SELECT idem_key_generation_retire() AS retired_again;
SELECT count(*) AS generations_left FROM idem_key_generations;
SELECT count(*) > 0 AS keys FROM idem_processed_keys;
SELECT consumer, key, status FROM idem_dead_letters ORDER BY key;
SELECT consumer, key, state FROM idem_effects ORDER BY key;
SELECT consumer, retention FROM idem_retention ORDER BY consumer;
SELECT consumer, applied > 0 AS applied FROM idem_stats ORDER BY consumer;
SELECT count(*) AS info FROM idem_stats_info;
SELECT count(*) > 0 AS consumers FROM idem_consumers;
RESET search_path;

\c :regression_db
DROP DATABASE idem_hostile_path;
