--
-- idem_position_passed() (src/position_check.c): whether a consumer's
-- position on a partition has passed an offset, answered from the
-- session's cache of positions when it can.  Proves: the answer below, at
-- and above the position, and without one; bad input refused with its
-- SQLSTATE; another team's consumer refused with 42501, also right after
-- its owner filled the session's cache (SET ROLE), with one refusal
-- whatever the position, before a leaky function or EXPLAIN ANALYZE sees
-- an answer, through a statement its owner prepared, to a role that left
-- the owner and to the owner that gave the consumer away; the view and
-- the lag of idem_metrics() likewise show a role only its own positions,
-- also through statements another team prepared; a name nobody has is a
-- consumer without positions; a position the session's own transaction
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
                          idem_position_rewind(text, text, integer, bigint, text),
                          idem_positions(text, text, integer), idem_metrics()
   TO pc_team_a, pc_team_b, pc_member;
GRANT SELECT ON idem_positions TO pc_team_a, pc_team_b, pc_member;
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

-- As a hostile tenant.  Team B is refused team A's consumer, right after
-- team A's role filled this session's cache, and the refusal tells
-- neither the position nor the owner: it is the same for an offset below
-- the position, at it and above it, and for a partition or a topic
-- without one.
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
SET ROLE pc_team_b;
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 50)$$);
SELECT count(DISTINCT pc_error(format('SELECT idem_position_passed(%L, %L, %s, %s)',
                                      'pc-a', k.topic, k.part, o))) AS refusals,
       count(*) AS calls
  FROM (VALUES ('orders', 0), ('orders', 3), ('no-such-topic', 0)) AS k (topic, part),
       unnest(ARRAY[0, 50, 100, 101, 500]) AS o;
-- A name nobody has is a consumer without positions.  That team A's name
-- is taken is no secret: consumers share one namespace, and a role that
-- may create consumers is told that a name is taken (42710), not by whom
-- (docs/privileges.md).
SELECT pc_passed('pc-nobody', 'orders', 0);
RESET ROLE;
BEGIN;
GRANT EXECUTE ON FUNCTION idem_consumer_create(text, regrole) TO pc_team_b;
SET LOCAL ROLE pc_team_b;
SELECT pc_error($$SELECT idem_consumer_create('pc-a', 'pc_team_b')$$);
ROLLBACK;
SET ROLE pc_team_b;
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
-- nor EXPLAIN ANALYZE of a query that filters rows by the answers: the
-- first call fails the query, before any row is counted
SELECT pc_error($$EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
                   SELECT o FROM generate_series(0, 200) AS o
                    WHERE idem_position_passed('pc-a', 'orders', 0, o)$$);
-- its own consumer it may check
SELECT idem_position_advance('pc-b', 'payments', 0, 7, 10);
SELECT pc_passed('pc-b', 'payments', 0);
-- a member of team A that does not inherit its privileges must SET ROLE
SET ROLE pc_member;
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 50)$$);

-- Statements prepared by team A and executed by team B and by the member
-- that does not inherit team A's privileges: each answer is the current
-- role's, never one a plan kept (idem_position_passed is VOLATILE, the
-- view and idem_metrics() test the role as they run), for the check, the
-- view and the lag alike.
SET ROLE pc_team_a;
SELECT idem_position_advance('pc-a', 'orders', 0, 101, 130);
PREPARE pc_check AS SELECT idem_position_passed('pc-a', 'orders', 0, 50);
PREPARE pc_view AS SELECT consumer, topic, partition, position, lag FROM idem_positions ORDER BY 1, 2, 3;
PREPARE pc_lags AS SELECT l FROM regexp_split_to_table(idem_metrics(), E'\n') AS l
                    WHERE l LIKE 'idem_position_lag{%' ORDER BY l;
EXECUTE pc_check;
EXECUTE pc_view;
EXECUTE pc_lags;
SET ROLE pc_team_b;
SELECT pc_error('EXECUTE pc_check');
EXECUTE pc_view;
EXECUTE pc_lags;
SET ROLE pc_member;
SELECT pc_error('EXECUTE pc_check');
EXECUTE pc_view;
EXECUTE pc_lags;
DEALLOCATE pc_check;
DEALLOCATE pc_view;
DEALLOCATE pc_lags;

-- A position team A advanced in a transaction that then sets team B's
-- role: refused.
BEGIN;
SET LOCAL ROLE pc_team_a;
SELECT idem_position_advance('pc-a', 'orders', 0, 300);
SET LOCAL ROLE pc_team_b;
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 250)$$);
ROLLBACK;
-- A role that leaves team A is refused at once, though this session
-- cached the consumer and its position while it was a member.
RESET ROLE;
CREATE ROLE pc_former IN ROLE pc_team_a;
GRANT EXECUTE ON FUNCTION idem_position_passed(text, text, integer, bigint) TO pc_former;
SET ROLE pc_former;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
RESET ROLE;
REVOKE pc_team_a FROM pc_former;
SET ROLE pc_former;
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 50)$$);
-- So is team A once it gave the consumer to team B, which then reads the
-- position.
RESET ROLE;
SELECT idem_consumer_set_owner('pc-a', 'pc_team_b');
SET ROLE pc_team_a;
SELECT pc_error($$SELECT idem_position_passed('pc-a', 'orders', 0, 50)$$);
SET ROLE pc_team_b;
SELECT idem_position_passed('pc-a', 'orders', 0, 50);
RESET ROLE;
SELECT idem_consumer_set_owner('pc-a', 'pc_team_a');
SET ROLE pc_team_a;

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
DROP ROLE pc_former;
DROP ROLE pc_team_a;
DROP ROLE pc_team_b;
