--
-- Owners of consumers: two teams, an operator of one of them, a monitoring
-- role.  Every function that acts on a consumer is refused to a role that
-- is not a member of its owner, the views hide such consumers, and the
-- counters stay readable.
--
CREATE FUNCTION own_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    state text;
    message text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    RETURN state || ' ' || regexp_replace(message, 'entry \d+', 'entry N');
END
$f$;

CREATE ROLE own_team_a;
CREATE ROLE own_team_b;
CREATE ROLE own_oncall_a IN ROLE own_team_a;
CREATE ROLE own_monitor IN ROLE pg_monitor;
CREATE TABLE own_orders (id int PRIMARY KEY, paid int NOT NULL DEFAULT 0);
INSERT INTO own_orders VALUES (1), (2);
GRANT SELECT, UPDATE ON own_orders TO own_team_a, own_team_b;

-- both teams get every function, so that only ownership stands between them
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO own_team_a, own_team_b', f);
    END LOOP;
END
$$;
GRANT SELECT ON idem_processed_keys, idem_dead_letters, idem_retention TO own_team_a, own_team_b;

-- counters are kept per consumer name across databases: start from zero
SELECT idem_stats_reset('own-a');
-- a consumer first used by a role is owned by it
SET ROLE own_team_a;
SELECT idem_apply('a-1', 'own-a', 'update own_orders set paid = paid + 1 where id = 1');
SELECT idem_try_apply('a-2', 'own-a', 'select 1/0');
RESET ROLE;
SELECT consumer, owner FROM idem_consumers WHERE consumer LIKE 'own-%' ORDER BY consumer;

-- the other team is refused everything on it, with 42501, and nothing is
-- recorded or counted
SELECT applied AS a_applied_before, failed AS a_failed_before FROM idem_stats WHERE consumer = 'own-a' \gset
SET ROLE own_team_b;
SELECT own_error($$SELECT idem_apply('b-1', 'own-a', 'update own_orders set paid = paid + 100 where id = 1')$$);
SELECT own_error($$SELECT idem_try_apply('b-2', 'own-a', 'select 1')$$);
SELECT own_error($$SELECT idem_record_batch('own-a', ARRAY['b-3'])$$);
SELECT own_error($$SELECT idem_is_processed('a-1', 'own-a')$$);
SELECT own_error($$SELECT idem_forget('a-1', 'own-a')$$);
SELECT own_error($$SELECT idem_purge('own-a')$$);
SELECT own_error($$SELECT idem_purge()$$);
SELECT own_error($$SELECT idem_set_retention('own-a', '1 day')$$);
SELECT own_error($$SELECT idem_reset_retention('own-a')$$);
SELECT own_error($$SELECT idem_stats_reset('own-a')$$);
SELECT own_error($$SELECT idem_stats_reset()$$);
SELECT own_error($$SELECT * FROM idem_dlq_replay('own-a')$$);
SELECT own_error($$SELECT idem_consumer_set_owner('own-a', 'own_team_b')$$);
SELECT own_error($$SELECT idem_consumer_create('own-a')$$);
-- the views hide the other team's keys and dead letters
SELECT count(*) AS keys_seen FROM idem_processed_keys WHERE consumer = 'own-a';
SELECT count(*) AS dead_letters_seen FROM idem_dead_letters WHERE consumer = 'own-a';
RESET ROLE;
SELECT id AS dl_a FROM idem_dead_letters WHERE consumer = 'own-a' \gset
SET ROLE own_team_b;
SELECT own_error('SELECT idem_dlq_replay(' || :dl_a || ')');
SELECT own_error('SELECT idem_dlq_discard(' || :dl_a || ', ''not yours'')');
RESET ROLE;
SELECT paid FROM own_orders WHERE id = 1;
SELECT count(*) AS keys_of_b FROM idem_processed_keys WHERE consumer = 'own-a' AND key LIKE 'b-%';
SELECT applied = :a_applied_before AS applied_unchanged,
       failed = :a_failed_before AS failed_unchanged
  FROM idem_stats WHERE consumer = 'own-a';

-- the owner's members may do all of it
SET ROLE own_oncall_a;
SELECT count(*) AS keys_seen FROM idem_processed_keys WHERE consumer = 'own-a';
SELECT idem_is_processed('a-1', 'own-a');
SELECT idem_set_retention('own-a', '30 days');
SELECT idem_dlq_discard(:dl_a, 'division by zero is not a payment');
SELECT idem_purge('own-a');
RESET ROLE;

-- the monitoring role reads the counters of every consumer, not the keys
SET ROLE own_monitor;
SELECT consumer, applied FROM idem_stats WHERE consumer = 'own-a';
SELECT consumer, owner FROM idem_consumers WHERE consumer = 'own-a';
SELECT own_error('SELECT count(*) FROM idem_processed_keys');
RESET ROLE;

-- creating consumers: for oneself or a role one is a member of; a name
-- another team owns is taken
SET ROLE own_team_b;
SELECT idem_consumer_create('own-b');
SELECT own_error($$SELECT idem_consumer_create('own-b2', 'own_team_a')$$);
SELECT own_error($$SELECT idem_consumer_create('own-b')$$);
SELECT own_error($$SELECT idem_consumer_create('own-b3', NULL)$$);
RESET ROLE;
SELECT idem_consumer_create('own-a2', 'own_team_a');
SELECT consumer, owner FROM idem_consumers WHERE consumer LIKE 'own-%' ORDER BY consumer;

-- giving a consumer away: to a role the giver is a member of
SET ROLE own_oncall_a;
SELECT own_error($$SELECT idem_consumer_set_owner('own-a2', 'own_team_b')$$);
SELECT idem_consumer_set_owner('own-a2', 'own_oncall_a');
SELECT own_error($$SELECT idem_consumer_set_owner('own-a2', NULL)$$);
RESET ROLE;
SELECT idem_consumer_set_owner('own-a2', 'own_team_b');
SET ROLE own_oncall_a;
SELECT own_error($$SELECT idem_apply('x', 'own-a2', 'select 1')$$);
RESET ROLE;
SELECT own_error($$SELECT idem_consumer_set_owner('no-such-consumer', 'own_team_b')$$);

-- idem_consumer.create_consumers keeps a role from creating consumers;
-- only superusers set it
SET idem_consumer.create_consumers = off;
SET ROLE own_team_b;
SELECT own_error($$SELECT idem_apply('c-1', 'own-new', 'select 1')$$);
SELECT own_error($$SELECT idem_consumer_create('own-new')$$);
SELECT own_error($$SET idem_consumer.create_consumers = on$$);
-- an existing consumer of its own keeps working
SELECT idem_apply('b-own-1', 'own-b', 'select 1');
RESET ROLE;
RESET idem_consumer.create_consumers;
SELECT count(*) AS created FROM idem_consumers WHERE consumer = 'own-new';

-- a consumer created under 1.0 has no owner: open to every role with
-- EXECUTE, as in 1.0, until a superuser gives it one
INSERT INTO idem_consumer.consumers (name) VALUES ('own-legacy');
SET ROLE own_team_b;
SELECT idem_apply('l-1', 'own-legacy', 'select 1');
SELECT count(*) AS keys_seen FROM idem_processed_keys WHERE consumer = 'own-legacy';
SELECT own_error($$SELECT idem_consumer_set_owner('own-legacy', 'own_team_b')$$);
SELECT own_error($$SELECT idem_purge()$$);
RESET ROLE;
SELECT idem_consumer_set_owner('own-legacy', 'own_team_a');
SET ROLE own_team_b;
SELECT own_error($$SELECT idem_apply('l-2', 'own-legacy', 'select 1')$$);
RESET ROLE;

-- bad arguments
SELECT own_error($$SELECT idem_consumer_create(NULL)$$);
SELECT own_error($$SELECT idem_consumer_create('')$$);
SELECT own_error($$SELECT idem_consumer_create('x', 'no_such_role')$$);

DROP TABLE own_orders;
DROP OWNED BY own_team_a, own_team_b, own_oncall_a, own_monitor;
DROP ROLE own_team_a, own_team_b, own_oncall_a, own_monitor;
DROP FUNCTION own_error(text);
