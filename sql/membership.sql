--
-- Acting on a consumer takes the privileges of its owner, as PostgreSQL's
-- own ownership checks do (has_privs_of_role): a member that does not
-- inherit them (NOINHERIT) must SET ROLE to the owner first.  Making a
-- role the owner of a consumer takes being able to SET ROLE to it, as
-- ALTER ... OWNER TO does.
--
CREATE FUNCTION mb_error(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ' ' || regexp_replace(msg, 'entry \d+', 'entry N');
END $$;

CREATE ROLE mb_owner;
CREATE ROLE mb_inherit IN ROLE mb_owner;
CREATE ROLE mb_noinherit NOINHERIT IN ROLE mb_owner;
CREATE ROLE mb_other;
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO mb_owner, mb_inherit, mb_noinherit, mb_other', f);
    END LOOP;
END
$$;
GRANT SELECT ON idem_processed_keys, idem_dead_letters TO mb_owner, mb_inherit, mb_noinherit;

SELECT idem_consumer_create('mb', 'mb_owner');
SET ROLE mb_owner;
SELECT idem_apply('k-1', 'mb', 'select 1');
SELECT idem_try_apply('k-2', 'mb', 'select 1 / 0');
SELECT idem_try_apply('k-3', 'mb', 'select 1 / 0');
RESET ROLE;
SELECT id AS k2 FROM idem_dead_letters WHERE consumer = 'mb' AND key = 'k-2' \gset

-- the member without the owner's privileges is refused every owner action
SET ROLE mb_noinherit;
SELECT mb_error($$SELECT idem_apply('n-1', 'mb', 'select 1')$$);
SELECT mb_error($$SELECT idem_try_apply('n-2', 'mb', 'select 1')$$);
SELECT mb_error($$SELECT idem_record_batch('mb', ARRAY['n-3'])$$);
SELECT mb_error($$SELECT idem_is_processed('k-1', 'mb')$$);
SELECT mb_error($$SELECT idem_forget('k-1', 'mb')$$);
SELECT mb_error($$SELECT idem_purge('mb')$$);
SELECT mb_error($$SELECT idem_purge()$$);
SELECT mb_error($$SELECT idem_set_retention('mb', '1 day')$$);
SELECT mb_error($$SELECT idem_set_fingerprint('mb', false)$$);
SELECT mb_error($$SELECT idem_stats_reset('mb')$$);
SELECT mb_error($$SELECT idem_stats_reset()$$);
SELECT mb_error('SELECT idem_dlq_replay(' || :k2 || ')');
SELECT mb_error('SELECT idem_dlq_discard(' || :k2 || ', ''no'')');
SELECT mb_error($$SELECT * FROM idem_dlq_replay('mb')$$);
SELECT mb_error($$SELECT idem_consumer_set_owner('mb', 'mb_noinherit')$$);
SELECT mb_error($$SELECT idem_effect_enqueue('mb', 'e-1', '{}')$$);
-- and sees nothing of it, as the views already showed
SELECT count(*) AS keys_seen FROM idem_processed_keys WHERE consumer = 'mb';
SELECT count(*) AS dead_letters_seen FROM idem_dead_letters WHERE consumer = 'mb';
RESET ROLE;
-- it may still become the owner, and then act
SET SESSION AUTHORIZATION mb_noinherit;
SET ROLE mb_owner;
SELECT idem_is_processed('k-1', 'mb');
RESET SESSION AUTHORIZATION;
-- it may make the owner (a role it can SET ROLE to) the owner of a new
-- consumer, as ALTER ... OWNER TO allows
SET ROLE mb_noinherit;
SELECT idem_consumer_create('mb-2', 'mb_owner');
SELECT mb_error($$SELECT idem_consumer_create('mb-3', 'mb_other')$$);
RESET ROLE;
SELECT consumer, owner FROM idem_consumers WHERE consumer LIKE 'mb%' ORDER BY consumer;

-- the member that inherits the privileges acts on the consumer
SET ROLE mb_inherit;
SELECT idem_is_processed('k-1', 'mb');
SELECT idem_dlq_discard(:k2, 'not a payment');
SELECT count(*) AS keys_seen FROM idem_processed_keys WHERE consumer = 'mb';
RESET ROLE;

-- a role outside is refused as before
SET ROLE mb_other;
SELECT mb_error($$SELECT idem_is_processed('k-1', 'mb')$$);
RESET ROLE;

DROP OWNED BY mb_owner, mb_inherit, mb_noinherit, mb_other;
DROP ROLE mb_owner, mb_inherit, mb_noinherit, mb_other;
DROP FUNCTION mb_error(text);
