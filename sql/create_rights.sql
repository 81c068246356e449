--
-- Creating consumers is a privilege of the current role, granted by the
-- DBA as EXECUTE on idem_consumer_create(text, regrole): it holds through
-- SET ROLE and a pooler's SET LOCAL ROLE, which a per-role setting of
-- idem_consumer.create_consumers does not.  The setting stays an
-- additional off-switch.  A database still at 1.1 keeps the rule of 1.1.
--
CREATE FUNCTION cr_error(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            det = PG_EXCEPTION_DETAIL;
    RETURN st || ' ' || msg || coalesce(E'\nDETAIL: ' || nullif(det, ''), '');
END $$;

-- a pooler logs in once and takes a team's role per transaction; it acts
-- only through those roles (NOINHERIT)
CREATE ROLE cr_pooler NOINHERIT;
CREATE ROLE cr_team;
CREATE ROLE cr_creator;
CREATE ROLE cr_creator_member IN ROLE cr_creator;
GRANT cr_team, cr_creator TO cr_pooler;
GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_record_batch(text, text[]),
                          idem_effect_enqueue(text, text, jsonb, "any")
    TO cr_pooler, cr_team, cr_creator;
GRANT EXECUTE ON FUNCTION idem_consumer_create(text, regrole) TO cr_creator;
-- the per-role switch of 1.1: it follows the login, not SET ROLE
ALTER ROLE cr_team SET idem_consumer.create_consumers = off;

-- a role without the grant creates no consumer, however it uses one
SET ROLE cr_team;
SELECT cr_error($$SELECT idem_apply('k', 'cr-new-1', 'select 1')$$);
SELECT cr_error($$SELECT idem_try_apply('k', 'cr-new-1', 'select 1')$$);
SELECT cr_error($$SELECT idem_record_batch('cr-new-1', ARRAY['k'])$$);
SELECT cr_error($$SELECT idem_effect_enqueue('cr-new-1', 'k', '{}')$$);
SELECT cr_error($$SELECT idem_consumer_create('cr-new-1')$$);
RESET ROLE;

-- nor through a pooler's SET LOCAL ROLE
SET SESSION AUTHORIZATION cr_pooler;
BEGIN;
SET LOCAL ROLE cr_team;
SELECT current_user, cr_error($$SELECT idem_apply('k', 'cr-new-2', 'select 1')$$);
COMMIT;
-- the pooler's own login role has no privilege of the roles it may become
SELECT current_user, cr_error($$SELECT idem_apply('k', 'cr-new-3', 'select 1')$$);

-- the role with the grant creates, implicitly or explicitly, the consumer
-- owned by itself
BEGIN;
SET LOCAL ROLE cr_creator;
SELECT idem_apply('k', 'cr-by-creator', 'select 1');
SELECT idem_consumer_create('cr-by-creator-2');
COMMIT;
RESET SESSION AUTHORIZATION;
-- and so does a member that inherits it
SET ROLE cr_creator_member;
SELECT idem_apply('k', 'cr-by-member', 'select 1');
RESET ROLE;
SELECT consumer, owner FROM idem_consumers WHERE consumer LIKE 'cr-%' ORDER BY consumer;

-- a consumer the DBA created for the team works for it without the grant
SELECT idem_consumer_create('cr-team', 'cr_team');
SET ROLE cr_team;
SELECT idem_apply('k', 'cr-team', 'select 1');
RESET ROLE;

-- idem_consumer.create_consumers = off still stops a role with the grant
SET idem_consumer.create_consumers = off;
SET ROLE cr_creator;
SELECT cr_error($$SELECT idem_apply('k', 'cr-new-4', 'select 1')$$);
SELECT cr_error($$SELECT idem_consumer_create('cr-new-4')$$);
RESET ROLE;
RESET idem_consumer.create_consumers;
SELECT count(*) AS refused_created FROM idem_consumers WHERE consumer LIKE 'cr-new-%';

-- a database still at 1.1 keeps the rule of 1.1: any role with EXECUTE on
-- the API creates consumers, unless the setting is off in its session;
-- the update to 1.2 brings the privilege
SELECT current_database() AS regress_db \gset
CREATE DATABASE idem_cr_v11;
\c idem_cr_v11
CREATE EXTENSION idem_consumer VERSION '1.1';
GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz) TO cr_team;
SET ROLE cr_team;
SELECT idem_apply('k', 'cr-v11', 'select 1');
RESET ROLE;
ALTER EXTENSION idem_consumer UPDATE TO '1.2';
SET ROLE cr_team;
SELECT idem_apply('k', 'cr-v12', 'select 1');
SELECT idem_apply('k2', 'cr-v11', 'select 1');
RESET ROLE;
\c :regress_db
DROP DATABASE idem_cr_v11;

DROP OWNED BY cr_pooler, cr_team, cr_creator, cr_creator_member;
DROP ROLE cr_pooler, cr_team, cr_creator, cr_creator_member;
DROP FUNCTION cr_error(text);
