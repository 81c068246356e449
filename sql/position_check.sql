--
-- idem_position_passed() (src/position_check.c): whether a consumer's
-- position on a partition has passed an offset, answered from the
-- session's cache of positions when it can.  Proves: the answer below, at
-- and above the position, and without one; bad input refused with its
-- SQLSTATE; another team's consumer refused with 42501, also right after
-- its owner filled the session's cache (SET ROLE), and the refusal tells
-- nothing of the position; a position the session's own transaction
-- advanced counts in it but is not cached, so that a rollback takes it
-- back; every way a position goes down (a rewind, in the rewinding
-- transaction and after its commit, an UPDATE by hand, as a subscriber's
-- apply, a DELETE, a TRUNCATE, a prepared rewind) is seen by the session
-- that cached the position before.  The concurrent cases are
-- test/isolation/specs/position_check.spec.
--
-- A database of its own, so that every position is this test's.
\set regress_db :DBNAME
CREATE DATABASE position_check_test;
\c position_check_test
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
RESET client_min_messages;
CREATE ROLE pc_team_a;
CREATE ROLE pc_team_b;
CREATE ROLE pc_member NOINHERIT IN ROLE pc_team_a;
GRANT EXECUTE ON FUNCTION idem_position_passed(text, text, integer, bigint),
                          idem_position_advance(text, text, integer, bigint, bigint, bigint),
                          idem_position_rewind(text, text, integer, bigint, text)
   TO pc_team_a, pc_team_b, pc_member;
SELECT idem_consumer_create('pc-a', 'pc_team_a');
SELECT idem_consumer_create('pc-b', 'pc_team_b');

-- the SQLSTATE, message, detail and hint of a statement's error
CREATE FUNCTION pc_error(q text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    state text; msg text; detail text; hint text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN state || ': ' || msg || COALESCE(' / ' || NULLIF(detail, ''), '')
           || COALESCE(' / ' || NULLIF(hint, ''), '');
END
$$;
GRANT EXECUTE ON FUNCTION pc_error(text) TO PUBLIC;

-- the answers for offsets 0, 99, 100, 101 of a partition
CREATE FUNCTION pc_passed(consumer text, topic text, part integer) RETURNS text
LANGUAGE sql AS $$
    SELECT string_agg(o || ':' || idem_position_passed(consumer, topic, part, o), ' ' ORDER BY o)
      FROM unnest(ARRAY[0, 99, 100, 101]::bigint[]) AS o
$$;
GRANT EXECUTE ON FUNCTION pc_passed(text, text, integer) TO PUBLIC;

SET ROLE pc_team_a;
SELECT idem_position_advance('pc-a', 'orders', 0, 100);
-- the position is the offset of the next message to read: 99 is applied,
-- 100 is not; twice, the second from the cache
SELECT pc_passed('pc-a', 'orders', 0);
SELECT pc_passed('pc-a', 'orders', 0);
-- no position on that partition, in that topic, of an unknown consumer
SELECT pc_passed('pc-a', 'orders', 1);
SELECT pc_passed('pc-a', 'refunds', 0);
SELECT pc_passed('pc-nobody', 'orders', 0);
-- an advance is seen at once
SELECT idem_position_advance('pc-a', 'orders', 0, 101);
SELECT pc_passed('pc-a', 'orders', 0);

-- bad input
SELECT pc_error($$SELECT idem_position_passed(NULL, 'orders', 0, 1)$$);
SELECT pc_error($$SELECT idem_position_passed('', 'orders', 0, 1)$$);
SELECT pc_error($$SELECT idem_position_passed('pc-a', NULL, 0, 1)$$);
SELECT pc_error($$SELECT idem_position_passed('pc-a', '', 0, 1)$$);
SELECT pc_error(format('SELECT idem_position_passed(%L, %L, 0, 1)', 'pc-a', repeat('t', 250)));
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', NULL, 1)$$);
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', -1, 1)$$);
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, NULL)$$);
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, -1)$$);
-- the longest topic is a topic
SELECT idem_position_passed('pc-a', repeat('t', 249), 0, 0);

-- the transaction's own advance counts in it, and is not cached: after
-- the rollback, 150 is not passed
BEGIN;
SELECT idem_position_advance('pc-a', 'orders', 0, 200);
SELECT idem_position_passed('pc-a', 'orders', 0, 150);
ROLLBACK;
SELECT idem_position_passed('pc-a', 'orders', 0, 150);
-- likewise a partition's first position
BEGIN;
SELECT idem_position_advance('pc-a', 'orders', 5, 10);
SELECT idem_position_passed('pc-a', 'orders', 5, 0);
ROLLBACK;
SELECT idem_position_passed('pc-a', 'orders', 5, 0);

-- as a hostile tenant: team B is refused team A's consumer, right after
-- team A's role filled this session's cache, and the error tells neither
-- the position nor the owner
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
SET ROLE pc_team_b;
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 50)$$);
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 500)$$);
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'no-such-topic', 0, 0)$$);
-- nor does a function of team B's that is given each answer: no answer
-- reaches it
CREATE FUNCTION pg_temp.pc_leak(bigint, boolean) RETURNS boolean
LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN
    RAISE NOTICE 'seen: % %', $1, $2;
    RETURN true;
END
$$;
SELECT pc_error($$SELECT count(*) FROM generate_series(0, 200) AS o
                   WHERE pg_temp.pc_leak(o, idem_position_passed('pc-a', 'orders', 0, o))$$);
-- its own consumer it may check
SELECT pc_passed('pc-b', 'orders', 0);
-- a member of team A that does not inherit its privileges must SET ROLE
SET ROLE pc_member;
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 50)$$);
SET ROLE pc_team_a;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);

-- a rewind: not passed any more in the rewinding transaction, passed
-- again after its rollback, not passed after its commit
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
BEGIN;
SELECT idem_position_rewind('pc-a', 'orders', 0, 10, 'replay');
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
ROLLBACK;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
SELECT idem_position_rewind('pc-a', 'orders', 0, 10, 'replay');
SELECT pc_passed('pc-a', 'orders', 0);
SELECT idem_position_passed('pc-a', 'orders', 0, 9);
RESET ROLE;

-- by hand, as the storage's owner: an UPDATE that lowers a position
SELECT idem_position_advance('pc-a', 'orders', 0, 100);
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
UPDATE idem_consumer.positions SET "position" = 20
 WHERE topic = 'orders' AND "partition" = 0;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
-- one that moves a row to another partition
SELECT idem_position_advance('pc-a', 'orders', 0, 100);
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
UPDATE idem_consumer.positions SET "partition" = 7
 WHERE topic = 'orders' AND "partition" = 0;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
SELECT idem_position_passed('pc-a', 'orders', 7, 50);
-- as a logical subscriber's apply worker, which fires only triggers
-- enabled ALWAYS
SELECT idem_position_advance('pc-a', 'orders', 0, 100);
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
SET session_replication_role = replica;
UPDATE idem_consumer.positions SET "position" = 20
 WHERE topic = 'orders' AND "partition" = 0;
RESET session_replication_role;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
-- a DELETE
UPDATE idem_consumer.positions SET "position" = 100
 WHERE topic = 'orders' AND "partition" = 0;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
DELETE FROM idem_consumer.positions WHERE topic = 'orders' AND "partition" = 0;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
-- a TRUNCATE
SELECT idem_position_advance('pc-a', 'orders', 0, 100);
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
TRUNCATE idem_consumer.positions;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
-- a prepared rewind: passed until COMMIT PREPARED, not after
SELECT idem_position_advance('pc-a', 'orders', 0, 100);
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
BEGIN;
SELECT idem_position_rewind('pc-a', 'orders', 0, 10, 'replay');
PREPARE TRANSACTION 'position_check';
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
COMMIT PREPARED 'position_check';
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
-- an advance does not fire them: the triggers' condition
SELECT tgname, tgenabled, pg_get_triggerdef(oid) LIKE '%WHEN%' AS conditional
  FROM pg_trigger WHERE tgrelid = 'idem_consumer.positions'::regclass AND NOT tgisinternal
 ORDER BY 1;

\c :regress_db
DROP DATABASE position_check_test;
DROP ROLE pc_member;
DROP ROLE pc_team_a;
DROP ROLE pc_team_b;
