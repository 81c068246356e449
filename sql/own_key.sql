--
-- Business SQL cannot undo or redo the key of the message it applies:
-- idem_forget of that key, recording it again, and idem_purge are refused
-- with 55006 (object_in_use) while the idem_apply, idem_try_apply or
-- replay that holds the key runs its SQL.  Before, the first statement
-- below succeeded and left 'f1' unrecorded, so that the next redelivery
-- applied the message again.
--
CREATE TABLE own (n int NOT NULL);
INSERT INTO own VALUES (0);
\set VERBOSITY sqlstate
SELECT idem_apply('f1', 'own', 'select idem_forget(''f1'', ''own'')');
\set VERBOSITY default
SELECT idem_apply('f1', 'own', 'select idem_forget(''f1'', ''own'')');
SELECT idem_is_processed('f1', 'own') AS f1_recorded;
-- recording it again, alone or in a batch
SELECT idem_apply('f2', 'own', 'select idem_apply(''f2'', ''own'', ''select 1'')');
SELECT idem_apply('f2', 'own', 'select idem_record_batch(''own'', ARRAY[''x'', ''f2''])');
-- purging
SELECT idem_apply('f3', 'own', 'select idem_purge()');
-- a caught refusal leaves the key recorded, and the business SQL's own
-- effects go on
CREATE FUNCTION own_try_forget(k text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_forget(k, 'own');
    RETURN 'forgotten';
EXCEPTION WHEN object_in_use THEN
    RETURN 'refused';
END $$;
SELECT idem_apply('f4', 'own', 'update own set n = n + 1 where own_try_forget(''f4'') = ''refused''');
SELECT n FROM own;
SELECT idem_is_processed('f4', 'own') AS f4_recorded;
-- idem_try_apply: the refusal is a permanent failure of the message, which
-- is parked with its key recorded
SELECT idem_try_apply('f5', 'own', 'select idem_forget(''f5'', ''own'')');
SELECT sqlstate, message FROM idem_dead_letters WHERE consumer = 'own' AND key = 'f5';
SELECT idem_is_processed('f5', 'own') AS f5_recorded;
-- a replay holds its key as well
UPDATE idem_consumer.dead_letters SET sql = 'select idem_forget(''f5'', ''own'')'
 WHERE key = 'f5';
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'own' AND key = 'f5';
SELECT status, sqlstate, attempts FROM idem_dead_letters WHERE consumer = 'own' AND key = 'f5';
-- other keys cannot be forgotten from business SQL either
-- (sql/key_store_guard.sql); once the call's transaction is over, its key
-- can be
SELECT idem_apply('f6', 'own', 'select idem_forget(''f4'', ''own'')');
SELECT idem_is_processed('f4', 'own') AS f4_recorded;
SELECT idem_apply('f6', 'own', 'select 1');
SELECT idem_forget('f6', 'own') AS f6_forgotten;
DROP FUNCTION own_try_forget(text);
DROP TABLE own;
