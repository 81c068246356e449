--
-- A dead-letter replay runs another role's SQL in the operator's session:
-- the session-level advisory locks that SQL takes are released when the
-- replay ends, and those the operator held before are held again, however
-- the SQL ends (src/replay_locks.c).  Transaction-level ones end with the
-- operator's transaction, as every lock of it does.
--
CREATE ROLE rl_team;
GRANT EXECUTE ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO rl_team;
SELECT idem_consumer_create('rl', 'rl_team');
-- a transient error, raised by the business SQL
CREATE FUNCTION rl_transient() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'try again' USING ERRCODE = 'serialization_failure';
END $$;
GRANT EXECUTE ON FUNCTION rl_transient() TO rl_team;
-- the advisory locks of the test this session holds, one row per mode
CREATE FUNCTION rl_held() RETURNS TABLE (objid oid, mode text) LANGUAGE sql AS $$
    SELECT objid, mode FROM pg_locks
     WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objid BETWEEN 7000 AND 7999
     ORDER BY objid, mode
$$;

-- park messages as the team, then give each entry the SQL to replay
SET ROLE rl_team;
SELECT idem_try_apply('k-' || g, 'rl', 'select 1/0') FROM generate_series(1, 7) g;
RESET ROLE;
CREATE FUNCTION rl_entry(k text, stmt text) RETURNS bigint LANGUAGE sql AS $$
    UPDATE idem_consumer.dead_letters SET sql = stmt
     WHERE dead_letter_id = (SELECT id FROM idem_dead_letters WHERE consumer = 'rl' AND key = k)
    RETURNING dead_letter_id
$$;

-- the SQL's session lock is released when the replay ends
SELECT idem_dlq_replay(rl_entry('k-1', 'select pg_advisory_lock(7001), pg_advisory_lock_shared(7011)'));
SELECT * FROM rl_held();

-- the operator's own session locks are kept, counted: taken twice before,
-- once more by the SQL, they unlock twice
SELECT pg_advisory_lock(7002), pg_advisory_lock(7002);
SELECT idem_dlq_replay(rl_entry('k-2', 'select pg_advisory_lock(7002)'));
SELECT * FROM rl_held();
SELECT pg_advisory_unlock(7002) AS first, pg_advisory_unlock(7002) AS second;
SELECT pg_advisory_unlock(7002) AS third;

-- what the SQL unlocks of the operator's is locked again
SELECT pg_advisory_lock(7003);
SELECT idem_dlq_replay(rl_entry('k-3', 'select pg_advisory_unlock_all()'));
SELECT * FROM rl_held();
SELECT pg_advisory_unlock(7003);

-- a replay that fails again: its session lock goes too
SELECT idem_dlq_replay(rl_entry('k-4', 'select pg_advisory_lock(7004), 1/0'));
SELECT * FROM rl_held();

-- a transient error reaches the operator: the lock is released all the same
SELECT idem_dlq_replay(rl_entry('k-5', 'select pg_advisory_lock(7005), rl_transient()'));
SELECT * FROM rl_held();

-- a batch replay, each entry's locks released after it
SELECT rl_entry('k-6', 'select pg_advisory_lock(7006)') AS id6,
       rl_entry('k-7', 'select pg_advisory_lock(7007)') AS id7 \gset
SELECT count(*) AS replayed FROM idem_dlq_replay('rl', 10) WHERE outcome = 'applied';
SELECT * FROM rl_held();

-- a transaction-level lock ends with the operator's transaction
SELECT idem_try_apply('k-8', 'rl', 'select 1/0');
BEGIN;
SELECT idem_dlq_replay(rl_entry('k-8', 'select pg_advisory_xact_lock(7008)'));
SELECT * FROM rl_held();
COMMIT;
SELECT * FROM rl_held();

-- the rest of the session's state is refused to the SQL outright: as
-- business SQL's own statement, and run by a function it calls, since a
-- replay is a security-restricted operation; each fails again
CREATE FUNCTION rl_run(stmt text) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 1;
END $$;
GRANT EXECUTE ON FUNCTION rl_run(text) TO rl_team;
SET ROLE rl_team;
SELECT idem_try_apply('k-' || g, 'rl', 'select 1/0') FROM generate_series(9, 12) g;
RESET ROLE;
SELECT idem_dlq_replay(rl_entry('k-9', 'listen rl_channel'));
SELECT idem_dlq_replay(rl_entry('k-10', $$select rl_run('listen rl_channel')$$));
SELECT idem_dlq_replay(rl_entry('k-11', $$select rl_run('prepare rl_prepared as select 1')$$));
SELECT idem_dlq_replay(rl_entry('k-12', $$select rl_run('create temp table rl_temp (i int)')$$));
SELECT key, sqlstate, message FROM idem_dead_letters
 WHERE consumer = 'rl' AND key IN ('k-9', 'k-10', 'k-11', 'k-12') ORDER BY key;
SELECT (SELECT count(*) FROM pg_listening_channels()) AS channels,
       (SELECT count(*) FROM pg_prepared_statements) AS prepared,
       (SELECT count(*) FROM pg_class WHERE relname = 'rl_temp') AS temp_tables;

DROP FUNCTION rl_run(text);
DROP FUNCTION rl_entry(text, text);
DROP FUNCTION rl_held();
DROP FUNCTION rl_transient();
DROP OWNED BY rl_team;
DROP ROLE rl_team;
