--
-- What a refused role is told: that it may not act on a consumer, never
-- which role owns it; and a dead-letter entry of another team is, to it,
-- an entry that does not exist.
--
CREATE FUNCTION fm_error(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text; hnt text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    RETURN regexp_replace(st || ' ' || msg || coalesce(E'\nDETAIL: ' || nullif(det, ''), '')
                          || coalesce(E'\nHINT: ' || nullif(hnt, ''), ''),
                          'entry \d+', 'entry N', 'g');
END $$;

CREATE ROLE fm_secret_team;
CREATE ROLE fm_secret_member IN ROLE fm_secret_team;
CREATE ROLE fm_secret_noinherit NOINHERIT IN ROLE fm_secret_team;
CREATE ROLE fm_stranger;
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
               JOIN pg_depend d ON d.objid = p.oid AND d.classid = 'pg_proc'::regclass
              WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem_consumer')
                AND p.pronamespace = 'public'::regnamespace
                -- its EXECUTE is the right to reset every consumer's counters
                AND p.proname <> 'idem_stats_reset'
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO fm_secret_team, fm_secret_noinherit, fm_stranger', f);
    END LOOP;
END
$$;

SELECT idem_consumer_create('fm-secret', 'fm_secret_team');
SET ROLE fm_secret_team;
SELECT idem_try_apply('k-1', 'fm-secret', 'select 1 / 0');
RESET ROLE;
SELECT dead_letter_id AS secret_id FROM idem_consumer.dead_letters d
  JOIN idem_consumer.consumers c USING (consumer_id) WHERE c.name = 'fm-secret' \gset
SELECT max(dead_letter_id) + 1000 AS missing_id FROM idem_consumer.dead_letters \gset

SET ROLE fm_stranger;
-- a consumer of another team: refused, its owner not named
SELECT fm_error($$SELECT idem_apply('k-2', 'fm-secret', 'select 1')$$);
SELECT fm_error($$SELECT idem_forget('k-1', 'fm-secret')$$);
-- functions on every consumer: refused without naming an owner
SELECT split_part(e, E'\n', 1) AS error, e ~ 'owned by|fm_secret' AS names_an_owner
  FROM fm_error($$SELECT idem_purge()$$) AS e;
SELECT split_part(e, E'\n', 1) AS error, e ~ 'owned by|fm_secret' AS names_an_owner
  FROM fm_error($$SELECT idem_stats_reset()$$) AS e;
-- a name that is taken: said so, the owner not named
SELECT fm_error($$SELECT idem_consumer_create('fm-secret')$$);
-- another team's dead letter and one that does not exist: the same answer
SELECT fm_error('SELECT idem_dlq_replay(' || :secret_id || ')') AS foreign_entry;
SELECT fm_error('SELECT idem_dlq_replay(' || :missing_id || ')') AS missing_entry;
SELECT fm_error('SELECT idem_dlq_discard(' || :secret_id || ', ''x'')') AS foreign_entry;
SELECT fm_error('SELECT idem_dlq_discard(' || :missing_id || ', ''x'')') AS missing_entry;
RESET ROLE;

-- a member that does not inherit the owner's privileges is told to SET
-- ROLE to the owner, which it may know
SET ROLE fm_secret_noinherit;
SELECT fm_error($$SELECT idem_apply('k-2', 'fm-secret', 'select 1')$$);
RESET ROLE;

-- a member of the owner is told who owns a name that is taken
SET ROLE fm_secret_member;
SELECT fm_error($$SELECT idem_consumer_create('fm-secret', 'fm_secret_team')$$);
RESET ROLE;

-- the entry is untouched
SELECT status, attempts FROM idem_consumer.dead_letters WHERE dead_letter_id = :secret_id;

DROP OWNED BY fm_secret_team, fm_secret_member, fm_secret_noinherit, fm_stranger;
DROP ROLE fm_secret_team, fm_secret_member, fm_secret_noinherit, fm_stranger;
DROP FUNCTION fm_error(text);
