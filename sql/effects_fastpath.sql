--
-- The fast paths of idem_effect_begin and _complete (src/effects_fastpath.c):
-- a completion that does not fit on its row's page (not a HOT update) gets
-- its index entries, every row stays reachable through the primary key
-- (amcheck), a new lease's row is the one the SQL statement inserts, and a
-- table changed by hand (here: a trigger, a check constraint, a default) is
-- left to the SQL statements.
-- The cases the statements decide (a row of the key, a superseded fence, a
-- completed effect, a concurrent writer) are in effects.sql and the
-- isolation specs effects_begin and effects_takeover.
--
CREATE EXTENSION IF NOT EXISTS amcheck;
SET enable_seqscan = off;

-- 40 leases, each completed with a result of 1,500 bytes that does not
-- compress: pages with room for one or two of them must move the others
SELECT count(*) FROM generate_series(1, 40) g,
    LATERAL idem_effect_begin('fp-wide', 'wide:' || g) e WHERE e.action = 'execute';
BEGIN;
SELECT count(*) FROM generate_series(1, 40) g,
    LATERAL idem_effect_complete('fp-wide', 'wide:' || g, 1,
        jsonb_build_object('blob', (SELECT string_agg(md5(g::text || i::text), '') FROM generate_series(1, 47) i)));
SELECT pg_stat_get_xact_tuples_updated('idem_consumer.effects'::regclass) AS updated,
       pg_stat_get_xact_tuples_updated('idem_consumer.effects'::regclass)
         - pg_stat_get_xact_tuples_hot_updated('idem_consumer.effects'::regclass) > 0 AS some_not_hot;
COMMIT;

-- every version the heap holds has its entries in both indexes
SELECT bt_index_check('idem_consumer.effects_pkey', true);
SELECT bt_index_check('idem_consumer.effects_outbox', true);
-- each completion is found through the primary key, as stored
SELECT count(*) AS completed, min(length(result->>'blob')) AS result_length,
       bool_and(lease_until IS NULL AND completed_at = updated_at) AS columns_set
  FROM idem_consumer.effects e JOIN idem_consumer.consumers c USING (consumer_id)
 WHERE c.name = 'fp-wide' AND e.key = ANY (SELECT 'wide:' || g FROM generate_series(1, 40) g)
   AND e.state = 'completed';
SELECT action, fence, length(result->>'blob') FROM idem_effect_begin('fp-wide', 'wide:7');
-- a completed lease cannot complete again, in the same transaction either
SELECT fence FROM idem_effect_begin('fp-wide', 'twice') \gset
BEGIN;
SELECT idem_effect_complete('fp-wide', 'twice', :fence, '{"n": 1}');
SELECT idem_effect_complete('fp-wide', 'twice', :fence, '{"n": 2}');
ROLLBACK;
SELECT state, result FROM idem_consumer.effects WHERE key = 'twice';

-- what a new lease's row holds, inserted by the fast path ('fast') and,
-- below, by the statement ('watched'): the same
CREATE VIEW new_lease AS
SELECT key, request, deferred, state, fence, attempts,
       provider_key ~ '^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$' AS random_uuid,
       outcome_unknown, lease_until - created_at AS lease, created_at = updated_at AS same_times,
       retry_at, last_error, result, dead_letter_id, completed_at
  FROM idem_consumer.effects;
SELECT action, fence, attempt, outcome_unknown FROM idem_effect_begin('fp-wide', 'fast', '{"amount": 5}', '45 seconds');
SELECT * FROM new_lease WHERE key = 'fast';
SELECT count(*) AS one_lease FROM idem_consumer.effects WHERE key = 'fast';

-- a trigger on the table: the SQL statements run it
CREATE FUNCTION effects_seen() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE NOTICE 'statement % % as %', lower(TG_OP), NEW.key, NEW.state;
    RETURN NEW;
END $f$;
CREATE TRIGGER seen BEFORE INSERT OR UPDATE ON idem_consumer.effects
    FOR EACH ROW EXECUTE FUNCTION effects_seen();
SELECT fence FROM idem_effect_begin('fp-wide', 'watched', '{"amount": 5}', '45 seconds') \gset
SELECT * FROM new_lease WHERE key = 'watched';
SELECT idem_effect_complete('fp-wide', 'watched', :fence, '{"ok": true}');
DROP TRIGGER seen ON idem_consumer.effects;
DROP FUNCTION effects_seen();
SELECT state, result FROM idem_consumer.effects WHERE key = 'watched';

-- a check constraint on the table: the SQL statements enforce it, on a new
-- lease and on a completion
ALTER TABLE idem_consumer.effects ADD CONSTRAINT fp_no_refused
    CHECK (key NOT LIKE 'refused%' AND NOT coalesce(result ? 'refused', false)) NOT VALID;
\set VERBOSITY terse
SELECT action FROM idem_effect_begin('fp-wide', 'refused-1');
SELECT fence FROM idem_effect_begin('fp-wide', 'checked') \gset
SELECT idem_effect_complete('fp-wide', 'checked', :fence, '{"refused": true}');
\set VERBOSITY default
ALTER TABLE idem_consumer.effects DROP CONSTRAINT fp_no_refused;
SELECT key, state FROM idem_consumer.effects WHERE key IN ('checked', 'refused-1');

-- a default the 1.1 script does not give, or another than it gives: a new
-- lease takes the statement, which fills them in
ALTER TABLE idem_consumer.effects ALTER COLUMN last_error SET DEFAULT 'by default';
SELECT action FROM idem_effect_begin('fp-wide', 'defaulted', '{"amount": 5}', '45 seconds');
ALTER TABLE idem_consumer.effects ALTER COLUMN last_error DROP DEFAULT;
SELECT * FROM new_lease WHERE key = 'defaulted';
ALTER TABLE idem_consumer.effects ALTER COLUMN provider_key SET DEFAULT 'fixed';
SELECT action, provider_key FROM idem_effect_begin('fp-wide', 'fixed', '{"amount": 5}', '45 seconds');
ALTER TABLE idem_consumer.effects ALTER COLUMN provider_key
    SET DEFAULT pg_catalog.gen_random_uuid()::text;
-- and the script's default again: the fast path
SELECT action, provider_key <> 'fixed' AS random FROM idem_effect_begin('fp-wide', 'random');
DROP VIEW new_lease;
RESET enable_seqscan;
