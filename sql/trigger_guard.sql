--
-- Once business SQL has run in a transaction, no trigger may change the
-- record of keys for the rest of it, and while business SQL runs nothing
-- may, whatever key and consumer it names: every such call raises 55006
-- (object_in_use), the calls of the transaction's own statements excepted.
-- Before, team B's triggers on a table that team A's business SQL writes
-- acted with team A's rights after the business SQL returned: a deferred
-- constraint trigger forgot an older key of team A at commit (its
-- redelivery applied again), and an AFTER trigger recorded a key team A
-- had yet to receive (its real delivery changed nothing: a lost message).
--
\set VERBOSITY default
\set SHOW_CONTEXT never
CREATE ROLE tg_a;
CREATE ROLE tg_b;
GRANT USAGE, CREATE ON SCHEMA public TO tg_b;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO tg_a;
GRANT SELECT ON idem_dead_letters TO tg_a;
SELECT idem_consumer_create('tg', 'tg_a');
SELECT idem_consumer_create('tg_other', 'tg_a');
SET ROLE tg_a;
SELECT idem_apply('old', 'tg', 'select 1') AS old_applied;
SELECT idem_apply('old', 'tg_other', 'select 1') AS old_other_applied;
SELECT idem_try_apply('parked', 'tg', 'select 1/0') AS parked;
RESET ROLE;

-- team B's tables, which team A's business SQL writes, and its triggers,
-- which run with team A's rights: each row names a statement that the
-- trigger runs, and the log keeps its outcome
SET ROLE tg_b;
CREATE FUNCTION tg_outcome(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ' ' || msg;
END $$;
CREATE TABLE tg_log (at text NOT NULL, stmt text NOT NULL, outcome text NOT NULL);
CREATE FUNCTION tg_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tg_log VALUES (TG_ARGV[0], NEW.stmt, tg_outcome(NEW.stmt));
    RETURN NULL;
END $$;
CREATE TABLE tg_now (stmt text NOT NULL);
CREATE TRIGGER tg_now_run AFTER INSERT ON tg_now
    FOR EACH ROW EXECUTE FUNCTION tg_run('after row');
CREATE TABLE tg_later (stmt text NOT NULL);
CREATE CONSTRAINT TRIGGER tg_later_run AFTER INSERT ON tg_later
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tg_run('deferred');
GRANT INSERT, SELECT ON tg_now, tg_later TO tg_a;
GRANT INSERT, SELECT, DELETE ON tg_log TO tg_a;
RESET ROLE;

-- the two attacks: a deferred trigger forgets an older key at commit, an
-- AFTER trigger records a key of a later delivery; neither lets its error
-- out, so the business SQL and the commit go through
SET ROLE tg_a;
SELECT idem_apply('a1', 'tg', 'insert into tg_later values ($1)',
                  ARRAY['select idem_forget(''old'', ''tg'')']) AS a1_applied;
SELECT idem_apply('a2', 'tg', 'insert into tg_now values ($1)',
                  ARRAY['select idem_record_batch(''tg'', ARRAY[''future''])']) AS a2_applied;
SELECT at, stmt, outcome FROM tg_log;
-- the redelivery of old is a duplicate, the first delivery of future applies
SELECT idem_apply('old', 'tg', 'select 1') AS old_applied_again;
SELECT idem_apply('future', 'tg', 'select 1') AS future_applied;
RESET ROLE;
DELETE FROM tg_log;

-- a trigger fired by business SQL changes no key of any consumer, by any
-- function that changes what is recorded
CREATE TABLE tg_stmts (n int, stmt text);
INSERT INTO tg_stmts VALUES
    (1, 'select idem_forget(''old'', ''tg_other'')'),
    (2, 'select idem_apply(''b1'', ''tg_other'', ''select 1'')'),
    (3, 'select idem_apply(''b1'', ''tg'', ''select 1'', variadic ARRAY[]::text[])'),
    (4, 'select idem_try_apply(''b1'', ''tg'', ''select 1'')'),
    (5, 'select idem_record_batch(''tg_other'', ARRAY[''b1''])'),
    (6, 'select idem_effect_enqueue(''tg'', ''b1'', ''{}'')'),
    (7, 'select idem_dlq_replay(id) from idem_dead_letters where key = ''parked'''),
    (8, 'select idem_dlq_discard(id, ''x'') from idem_dead_letters where key = ''parked'''),
    (9, 'select idem_purge(''tg_other'')'),
    (10, 'select idem_set_retention(''tg_other'', ''1 second'')');
GRANT SELECT ON tg_stmts TO tg_a;
SET ROLE tg_a;
SELECT count(*) FILTER (WHERE idem_apply('c' || n, 'tg', 'insert into tg_now values ($1)', ARRAY[stmt])) AS applied
  FROM tg_stmts;
SELECT stmt, outcome FROM tg_log ORDER BY stmt;
DELETE FROM tg_log;
-- and at commit, each from a trigger of its own
SELECT count(*) FILTER (WHERE idem_apply('d' || n, 'tg', 'insert into tg_later values ($1)', ARRAY[stmt])) AS applied
  FROM tg_stmts;
SELECT stmt, outcome FROM tg_log ORDER BY stmt;
DELETE FROM tg_log;
SELECT idem_is_processed('old', 'tg_other') AS old_recorded,
       idem_is_processed('b1', 'tg_other') AS b1_recorded,
       idem_is_processed('b1', 'tg') AS b1_recorded_tg;
SELECT status FROM idem_dead_letters WHERE key = 'parked';

-- SET CONSTRAINTS ... IMMEDIATE fires the deferred trigger early: refused
-- the same; the transaction's own statements change keys as before
BEGIN;
SELECT idem_apply('e1', 'tg', 'insert into tg_later values ($1)',
                  ARRAY['select idem_forget(''old'', ''tg'')']) AS e1_applied;
SET CONSTRAINTS ALL IMMEDIATE;
SELECT at, outcome FROM tg_log;
SELECT idem_forget('old', 'tg_other') AS own_forget;
SELECT k FROM idem_record_batch('tg_other', ARRAY['e2']) AS k;
COMMIT;
DELETE FROM tg_log;

-- a trigger before any business SQL of its transaction changes keys; once
-- one has run, the next is refused, and the next transaction starts afresh
BEGIN;
INSERT INTO tg_now VALUES ('select idem_apply(''f1'', ''tg'', ''select 1'')'),
                          ('select idem_apply(''f2'', ''tg'', ''select 1'')');
COMMIT;
INSERT INTO tg_now VALUES ('select idem_apply(''f3'', ''tg'', ''select 1'')');
INSERT INTO tg_later VALUES ('select idem_forget(''f3'', ''tg'')');
SELECT at, stmt, outcome FROM tg_log;
RESET ROLE;

-- a trigger that lets the refusal out fails the business SQL, or at commit
-- the commit, and with it the delivery: nothing applied, nothing recorded;
-- idem_effect_begin, refused in a subtransaction, is refused the same in
-- the caller's own transaction
SET ROLE tg_b;
CREATE FUNCTION tg_run_strict() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE NEW.stmt;
    RETURN NULL;
END $$;
CREATE TABLE tg_strict_now (stmt text NOT NULL);
CREATE TRIGGER tg_strict_now_run AFTER INSERT ON tg_strict_now
    FOR EACH ROW EXECUTE FUNCTION tg_run_strict();
CREATE TABLE tg_strict_later (stmt text NOT NULL);
CREATE CONSTRAINT TRIGGER tg_strict_later_run AFTER INSERT ON tg_strict_later
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION tg_run_strict();
GRANT INSERT, SELECT ON tg_strict_now, tg_strict_later TO tg_a;
RESET ROLE;
SET ROLE tg_a;
SELECT idem_apply('g1', 'tg', 'insert into tg_strict_later values ($1)',
                  ARRAY['select idem_forget(''old'', ''tg'')']);
SELECT idem_apply('g2', 'tg', 'insert into tg_strict_now values ($1)',
                  ARRAY['select idem_effect_begin(''tg'', ''g-effect'')']);
SELECT idem_apply('g3', 'tg', 'insert into tg_strict_later values ($1)',
                  ARRAY['select idem_effect_begin(''tg'', ''g-effect'')']);
SELECT idem_try_apply('g4', 'tg', 'insert into tg_strict_now values ($1)',
                      ARRAY['select idem_apply(''g-later'', ''tg'', ''select 1'')']);
SELECT sqlstate, message FROM idem_dead_letters WHERE key = 'g4';
SELECT (SELECT count(*) FROM tg_strict_now) + (SELECT count(*) FROM tg_strict_later) AS strict_rows;
SELECT idem_is_processed('g1', 'tg') AS g1, idem_is_processed('g2', 'tg') AS g2,
       idem_is_processed('g3', 'tg') AS g3, idem_is_processed('g-later', 'tg') AS g_later,
       idem_is_processed('old', 'tg') AS old;
SELECT action FROM idem_effect_begin('tg', 'g-effect');
RESET ROLE;

DROP TABLE tg_stmts;
DROP OWNED BY tg_a, tg_b;
SELECT idem_consumer_set_owner(c, 'postgres') FROM unnest(ARRAY['tg', 'tg_other']) c;
DROP ROLE tg_a;
DROP ROLE tg_b;
