--
-- The record of keys cannot be changed from inside business SQL, nor a
-- key forgotten by the transaction that recorded it:
-- - idem_forget of a key recorded by the current transaction raises 55006
--   (object_in_use), whoever calls it and when, a deferred constraint
--   trigger at commit included, on the fast path and the SQL path alike;
-- - while business SQL runs, the functions that change the key store
--   (idem_forget, idem_purge, idem_dlq_replay, idem_dlq_discard,
--   idem_set_fingerprint, idem_consumer_set_owner, idem_set_retention,
--   idem_reset_retention) raise 55006, from triggers the business SQL
--   fires too, SECURITY DEFINER ones of other roles included, and so do
--   the calls that record keys, of any key (sql/trigger_guard.sql has
--   the triggers that fire after the business SQL returned).
-- Before, a deferred trigger that forgot the key just recorded ran after
-- every check, and the redelivery applied the message again; a trigger on
-- another table could forget, replay or purge whatever it liked.
--
\set VERBOSITY default
\set SHOW_CONTEXT never
-- an error as SQLSTATE and message
CREATE FUNCTION ksg_error(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ' ' || regexp_replace(msg, 'entry \d+', 'entry N');
END $$;
GRANT EXECUTE ON FUNCTION ksg_error(text) TO PUBLIC;

CREATE TABLE ksg_orders (id int PRIMARY KEY, paid int NOT NULL DEFAULT 0, k text);
INSERT INTO ksg_orders VALUES (1);
-- the deferred trigger forgets the key that the row's last update applied
CREATE FUNCTION ksg_forget_applied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_forget(NEW.k, 'ksg');
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER ksg_forget_at_commit AFTER UPDATE ON ksg_orders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ksg_forget_applied();

-- the trigger fires at commit, after idem_apply returned: it is refused, as
-- every trigger's change of keys after business SQL (sql/trigger_guard.sql),
-- the commit fails, and with it the delivery, which nothing applied
SELECT idem_apply('p1', 'ksg', 'update ksg_orders set paid = paid + 1, k = $1 where id = 1', ARRAY['p1']);
SELECT paid FROM ksg_orders;
SELECT idem_is_processed('p1', 'ksg') AS p1_recorded;
-- the same on the SQL path
SET idem_consumer.fast_path = off;
SELECT idem_apply('p1', 'ksg', 'update ksg_orders set paid = paid + 1, k = $1 where id = 1', ARRAY['p1']);
RESET idem_consumer.fast_path;
SELECT paid FROM ksg_orders;
-- in a transaction without business SQL the key store refuses it itself
BEGIN;
SELECT k FROM idem_record_batch('ksg', ARRAY['p0']) AS k;
UPDATE ksg_orders SET k = 'p0' WHERE id = 1;
COMMIT;
SELECT idem_is_processed('p0', 'ksg') AS p0_recorded;
DROP TRIGGER ksg_forget_at_commit ON ksg_orders;
-- without the trigger the message applies once
SELECT idem_apply('p1', 'ksg', 'update ksg_orders set paid = paid + 1, k = $1 where id = 1', ARRAY['p1']);
SELECT idem_apply('p1', 'ksg', 'update ksg_orders set paid = paid + 1, k = $1 where id = 1', ARRAY['p1']);
SELECT paid FROM ksg_orders;

-- in the transaction that recorded it, a key cannot be forgotten by anyone:
-- recorded by idem_apply, idem_try_apply, a batch, under a savepoint
-- released, on either path
BEGIN;
SELECT idem_apply('p2', 'ksg', 'select 1');
SELECT ksg_error($$select idem_forget('p2', 'ksg')$$);
SET LOCAL idem_consumer.fast_path = off;
SELECT ksg_error($$select idem_forget('p2', 'ksg')$$);
ROLLBACK;
BEGIN;
SET LOCAL idem_consumer.fast_path = off;
SELECT idem_try_apply('p3', 'ksg', 'select 1');
SELECT ksg_error($$select idem_forget('p3', 'ksg')$$);
RESET idem_consumer.fast_path;
SELECT ksg_error($$select idem_forget('p3', 'ksg')$$);
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT idem_record_batch('ksg', ARRAY['p4', 'p5']) ORDER BY 1;
RELEASE SAVEPOINT s;
SELECT ksg_error($$select idem_forget('p5', 'ksg')$$);
ROLLBACK;
-- a key recorded as a hash collision, which only the SQL path sees
CREATE TEMP TABLE ksg_colliding AS
    WITH c AS (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'ksg'),
         k AS (SELECT 'evt-' || g AS key, idem_consumer.key_hash64((SELECT consumer_id FROM c), 'evt-' || g) AS h
                 FROM generate_series(1, 400000) g),
         pair AS (SELECT h FROM k GROUP BY h HAVING count(*) >= 2 ORDER BY h LIMIT 1)
    SELECT row_number() OVER (ORDER BY key) AS n, key FROM k WHERE h = (SELECT h FROM pair);
SELECT key AS k1 FROM ksg_colliding WHERE n = 1 \gset
SELECT key AS k2 FROM ksg_colliding WHERE n = 2 \gset
SELECT idem_apply(:'k1', 'ksg', 'select 1') AS k1_applied;
BEGIN;
SELECT idem_apply(:'k2', 'ksg', 'select 1') AS k2_applied;
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'ksg');
SELECT replace(ksg_error(format('select idem_forget(%L, %L)', :'k2', 'ksg')), :'k2', 'K2');
ROLLBACK;
-- a key recorded by an earlier transaction is forgotten as before
SELECT idem_forget(:'k1', 'ksg') AS k1_forgotten;
SELECT idem_apply('p6', 'ksg', 'select 1');
SET idem_consumer.fast_path = off;
SELECT idem_forget('p6', 'ksg') AS p6_forgotten_sql_path;
RESET idem_consumer.fast_path;
SELECT idem_apply('p6', 'ksg', 'select 1');
SELECT idem_forget('p6', 'ksg') AS p6_forgotten_fast_path;

-- a plain trigger on another table, which the business SQL touches, runs
-- whatever its row asks; each key-store change is refused, of any key
CREATE TABLE ksg_audit (stmt text NOT NULL, outcome text);
CREATE FUNCTION ksg_run_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.outcome := ksg_error(NEW.stmt);
    RETURN NEW;
END $$;
CREATE TRIGGER ksg_audit_run BEFORE INSERT ON ksg_audit
    FOR EACH ROW EXECUTE FUNCTION ksg_run_stmt();
SELECT idem_try_apply('parked', 'ksg', 'select 1/0');
SELECT idem_apply('old', 'ksg', 'select 1');
SELECT idem_apply('t' || n, 'ksg', 'insert into ksg_audit (stmt) values ($1)', ARRAY[stmt])
  FROM (VALUES (1, 'select idem_forget(''old'', ''ksg'')'),
               (2, 'select idem_purge(''ksg'')'),
               (3, 'select idem_dlq_replay(id) from idem_dead_letters where consumer = ''ksg'' and key = ''parked'''),
               (4, 'select idem_dlq_replay(''ksg'')'),
               (5, 'select idem_dlq_discard(id, ''x'') from idem_dead_letters where consumer = ''ksg'' and key = ''parked'''),
               (6, 'select idem_set_fingerprint(''ksg'', false)'),
               (7, 'select idem_consumer_set_owner(''ksg'', current_user::regrole)'),
               (8, 'select idem_set_retention(''ksg'', ''1 second'')'),
               (9, 'select idem_reset_retention(''ksg'')'),
               (10, 'select idem_forget(''old'', ''ksg_elsewhere'')'),
               (11, 'select idem_apply(''other'', ''ksg_elsewhere'', ''select 1'')')) AS s(n, stmt)
 ORDER BY n;
SELECT stmt, outcome FROM ksg_audit;
SELECT idem_is_processed('old', 'ksg') AS old_recorded;
SELECT status FROM idem_dead_letters WHERE consumer = 'ksg' AND key = 'parked';
-- the same from an AFTER trigger that lets the error out: the business SQL
-- fails, so idem_apply raises and idem_try_apply parks the message
CREATE TABLE ksg_touch (n int);
CREATE FUNCTION ksg_forget_old() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_forget('old', 'ksg');
    RETURN NULL;
END $$;
CREATE TRIGGER ksg_touch_forget AFTER INSERT ON ksg_touch
    FOR EACH ROW EXECUTE FUNCTION ksg_forget_old();
SELECT idem_apply('t20', 'ksg', 'insert into ksg_touch values (1)');
SELECT idem_try_apply('t21', 'ksg', 'insert into ksg_touch values (1)');
SELECT sqlstate, message FROM idem_dead_letters WHERE consumer = 'ksg' AND key = 't21';
SELECT idem_is_processed('old', 'ksg') AS old_recorded;
DROP TRIGGER ksg_touch_forget ON ksg_touch;

-- a SECURITY DEFINER trigger function of another role, acting on its own
-- consumer with its own rights, is refused the same way
CREATE ROLE ksg_app;
CREATE ROLE ksg_other;
GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO ksg_app;
GRANT EXECUTE ON FUNCTION idem_forget(text, text, "any") TO ksg_other;
GRANT USAGE, CREATE ON SCHEMA public TO ksg_app, ksg_other;
SELECT idem_consumer_create('ksg_app_c', 'ksg_app');
SELECT idem_consumer_create('ksg_other_c', 'ksg_other');
SET ROLE ksg_other;
CREATE TABLE ksg_other_inbox (n int);
CREATE FUNCTION ksg_other_forget() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
    SET search_path = public AS $$
BEGIN
    PERFORM idem_forget('o1', 'ksg_other_c');
    RETURN NULL;
END $$;
CREATE TRIGGER ksg_other_inbox_forget AFTER INSERT ON ksg_other_inbox
    FOR EACH ROW EXECUTE FUNCTION ksg_other_forget();
GRANT INSERT ON ksg_other_inbox TO ksg_app;
RESET ROLE;
SELECT idem_apply('o1', 'ksg_other_c', 'select 1');
SET ROLE ksg_app;
SELECT idem_apply('a1', 'ksg_app_c', 'insert into ksg_other_inbox values (1)');
RESET ROLE;
SELECT idem_is_processed('o1', 'ksg_other_c') AS o1_recorded;
-- outside business SQL the other role's own forget works
SET ROLE ksg_other;
INSERT INTO ksg_other_inbox VALUES (2);
RESET ROLE;
SELECT idem_is_processed('o1', 'ksg_other_c') AS o1_recorded;


-- a purge in a transaction that records keys is refused, whoever calls it
-- and when: with a window shorter than the transaction's age it could
-- remove a key the transaction recorded, as a forget would (a deferred
-- trigger after business SQL is refused before that, as a trigger)
CREATE FUNCTION ksg_purge_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_purge('ksg');
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER ksg_purge_at_commit AFTER UPDATE ON ksg_orders
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ksg_purge_at_commit();
SELECT paid AS paid_before FROM ksg_orders;
SELECT idem_apply('pu1', 'ksg', 'update ksg_orders set paid = paid + 1 where id = 1');
SELECT paid AS paid_after FROM ksg_orders;
SELECT idem_is_processed('pu1', 'ksg') AS pu1_recorded;
DROP TRIGGER ksg_purge_at_commit ON ksg_orders;
BEGIN;
SELECT idem_record_batch('ksg', ARRAY['pu2']);
SELECT ksg_error($$SELECT idem_purge('ksg')$$);
ROLLBACK;
-- in a transaction of its own the purge runs (and removes nothing: the
-- retention of ksg was never set, so it keeps its keys forever)
SELECT idem_purge('ksg') AS purged;

DROP TABLE ksg_other_inbox;
DROP FUNCTION ksg_other_forget();
REVOKE USAGE, CREATE ON SCHEMA public FROM ksg_app, ksg_other;
REVOKE EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") FROM ksg_app;
REVOKE EXECUTE ON FUNCTION idem_forget(text, text, "any") FROM ksg_other;
SELECT idem_consumer_set_owner(c, 'postgres') FROM unnest(ARRAY['ksg_app_c', 'ksg_other_c']) c;
DROP ROLE ksg_app;
DROP ROLE ksg_other;
DROP TABLE ksg_touch, ksg_audit, ksg_orders;
DROP FUNCTION ksg_forget_old(), ksg_run_stmt(), ksg_forget_applied(), ksg_purge_at_commit(), ksg_error(text);
