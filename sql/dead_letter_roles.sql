--
-- A dead-letter replay runs the stored SQL as the role that parked it,
-- with the schemas its search_path resolved to then, and only for a
-- member of that role (src/replay_role.c).
--
-- an error as SQLSTATE, message, detail and hint, entry ids left out
CREATE FUNCTION dlr_error(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text; hnt text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT;
    RETURN regexp_replace(st || ' ' || msg || E'\nDETAIL: ' || det || E'\nHINT: ' || hnt,
                          'entry \d+', 'entry N', 'g');
END $$;
GRANT EXECUTE ON FUNCTION dlr_error(text) TO PUBLIC;
CREATE ROLE idem_dlr_app;
CREATE ROLE idem_dlr_ops;
CREATE ROLE idem_dlr_other;
CREATE SCHEMA idem_dlr_app AUTHORIZATION idem_dlr_app;
GRANT USAGE, CREATE ON SCHEMA public TO idem_dlr_app;
CREATE TABLE dlr_ledger (id int PRIMARY KEY, n int NOT NULL);
INSERT INTO dlr_ledger VALUES (1, 0);
GRANT EXECUTE ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO idem_dlr_app;
GRANT EXECUTE ON FUNCTION idem_dlq_replay(bigint), idem_dlq_replay(text, integer)
    TO idem_dlr_ops, idem_dlr_other;
GRANT SELECT ON idem_dead_letters TO idem_dlr_ops, idem_dlr_other;
GRANT idem_dlr_app TO idem_dlr_ops;
-- the consumer belongs to a team that all of them are members of, so that
-- only the parking role's membership decides who replays
CREATE ROLE idem_dlr_team;
GRANT idem_dlr_team TO idem_dlr_app, idem_dlr_ops, idem_dlr_other;
SELECT idem_consumer_create('dlr', 'idem_dlr_team');

-- the consumer role may not touch the ledger: its message fails with
-- 42501, a permanent error, and is parked
SET ROLE idem_dlr_app;
SELECT idem_try_apply('r-1', 'dlr', 'update dlr_ledger set n = n + 1 where id = 1');
SELECT idem_try_apply('r-2', 'dlr', 'update dlr_ledger set n = n + 10 where id = 1');
RESET ROLE;
SELECT id AS r1 FROM idem_dead_letters WHERE consumer = 'dlr' AND key = 'r-1' \gset
SELECT id AS r2 FROM idem_dead_letters WHERE consumer = 'dlr' AND key = 'r-2' \gset
SELECT v.key, v.sqlstate, v.dead_lettered_by, d.dead_lettered_role
  FROM idem_dead_letters AS v JOIN idem_consumer.dead_letters AS d ON d.dead_letter_id = v.id
 WHERE consumer = 'dlr' ORDER BY key;
-- "$user" was resolved when the message was parked: the role's own schema
SELECT settings[1:1] FROM idem_dead_letters WHERE id = :r1;

-- a superuser's replay does not lend the SQL its rights: it fails again
SELECT idem_dlq_replay(:r1);
SELECT status, sqlstate, attempts FROM idem_dead_letters WHERE id = :r1;
SELECT n FROM dlr_ledger;

-- a role that is not a member of the parking role may not replay at all,
-- one entry or a consumer's batch
SET ROLE idem_dlr_other;
SELECT dlr_error('SELECT idem_dlq_replay(' || :r1 || ')');
SELECT dlr_error($$SELECT * FROM idem_dlq_replay('dlr')$$);
RESET ROLE;
SELECT status, attempts FROM idem_dead_letters WHERE id = :r1;

-- once the consumer role has the privileges, a member replays
GRANT SELECT, UPDATE ON dlr_ledger TO idem_dlr_app;
SET ROLE idem_dlr_ops;
SELECT idem_dlq_replay(:r1);
SELECT id = :r2 AS is_r2, outcome FROM idem_dlq_replay('dlr');
RESET ROLE;
SELECT n FROM dlr_ledger;
SELECT key, status, resolved_by FROM idem_dead_letters WHERE consumer = 'dlr' ORDER BY key;

-- the stored SQL cannot change the replaying session's settings: what it
-- sets is undone, as for maintenance commands
SET ROLE idem_dlr_app;
SELECT idem_try_apply('r-3', 'dlr',
    'select set_config(''search_path'', ''idem_dlr_app'', false), set_config(''work_mem'', ''77kB'', false), 1 / 0');
RESET ROLE;
SELECT id AS r3 FROM idem_dead_letters WHERE consumer = 'dlr' AND key = 'r-3' \gset
UPDATE idem_consumer.dead_letters SET sql = 'select set_config(''search_path'', ''idem_dlr_app'', false), set_config(''work_mem'', ''77kB'', false)'
 WHERE dead_letter_id = :r3;
SHOW search_path;
SHOW work_mem;
SELECT idem_dlq_replay(:r3);
SHOW search_path;
SHOW work_mem;

-- nor leave a temporary object behind: the replay is a security-restricted
-- operation, so the attempt fails like any permanent error
CREATE PROCEDURE idem_dlr_app.make_temp() LANGUAGE sql AS 'create temp table dlr_trap (x int)';
ALTER PROCEDURE idem_dlr_app.make_temp() OWNER TO idem_dlr_app;
SET ROLE idem_dlr_app;
SELECT idem_try_apply('r-4', 'dlr', 'select 1 / 0');
RESET ROLE;
SELECT id AS r4 FROM idem_dead_letters WHERE consumer = 'dlr' AND key = 'r-4' \gset
UPDATE idem_consumer.dead_letters SET sql = 'call make_temp()' WHERE dead_letter_id = :r4;
SELECT idem_dlq_replay(:r4);
SELECT status, sqlstate, message FROM idem_dead_letters WHERE id = :r4;
SELECT count(*) AS temp_tables FROM pg_class WHERE relname = 'dlr_trap';

-- an entry whose role was dropped is not replayed by anyone
CREATE ROLE idem_dlr_gone IN ROLE idem_dlr_team;
GRANT EXECUTE ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO idem_dlr_gone;
SET ROLE idem_dlr_gone;
SELECT idem_try_apply('r-5', 'dlr', 'select 1 / 0');
RESET ROLE;
SELECT id AS r5 FROM idem_dead_letters WHERE consumer = 'dlr' AND key = 'r-5' \gset
DROP OWNED BY idem_dlr_gone;
DROP ROLE idem_dlr_gone;
SELECT dlr_error('SELECT idem_dlq_replay(' || :r5 || ')');
SELECT idem_dlq_discard(:r5, 'its role is gone');

DROP TABLE dlr_ledger;
DROP PROCEDURE idem_dlr_app.make_temp();
DROP SCHEMA idem_dlr_app;
DROP OWNED BY idem_dlr_app;
DROP OWNED BY idem_dlr_ops;
DROP OWNED BY idem_dlr_other;
DROP ROLE idem_dlr_app, idem_dlr_ops, idem_dlr_other, idem_dlr_team;
DROP FUNCTION dlr_error(text);

--
-- A database whose SQL objects are still version 1.0: parking and
-- discarding work, a replay is refused until the update, which gives older
-- entries the role their dead_lettered_by names.
--
SELECT current_database() AS regress_db \gset
CREATE DATABASE idem_dlr_v10;
\c idem_dlr_v10
CREATE EXTENSION idem_consumer VERSION '1.0';
CREATE TABLE v10 (n int NOT NULL CHECK (n >= 0));
INSERT INTO v10 VALUES (0);
SELECT idem_try_apply('v-1', 'v10', 'update v10 set n = n - 1');
\set VERBOSITY sqlstate
SELECT idem_dlq_replay(1);
\set VERBOSITY default
SELECT idem_dlq_replay(1);
UPDATE v10 SET n = 5;
ALTER EXTENSION idem_consumer UPDATE;
SELECT dead_lettered_by, dead_lettered_role FROM idem_consumer.dead_letters;
SELECT idem_dlq_replay(1);
SELECT n FROM v10;
\c :regress_db
DROP DATABASE idem_dlr_v10;
