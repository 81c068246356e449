--
-- Positions of Kafka consumers (src/positions.c): moved forward only,
-- inside the caller's transaction; moved back only by a rewind, which is
-- recorded; read by idem_positions() and its view, which show a role only
-- the consumers it may act on; the lag in idem_metrics().  As a hostile
-- tenant: another team's positions are invisible, to EXPLAIN ANALYZE too,
-- and every call on another team's consumer is refused.
--
-- A database of its own, so that every position is this test's.
\set regress_db :DBNAME
CREATE DATABASE positions_test;
\c positions_test
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
RESET client_min_messages;
CREATE ROLE pos_team_a;
CREATE ROLE pos_team_b;
GRANT EXECUTE ON FUNCTION idem_position_advance(text, text, integer, bigint, bigint, bigint),
                          idem_position_rewind(text, text, integer, bigint, text),
                          idem_positions(text, text, integer)
   TO pos_team_a, pos_team_b;
GRANT SELECT ON idem_positions TO pos_team_a, pos_team_b;
SELECT idem_consumer_create('pos-a', 'pos_team_a');
SELECT idem_consumer_create('pos-b', 'pos_team_b');

-- the SQLSTATE, message and detail of a statement's error
CREATE FUNCTION pos_error(q text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    state text; msg text; detail text;
BEGIN
    EXECUTE q;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, detail = PG_EXCEPTION_DETAIL;
    RETURN state || ': ' || msg || COALESCE(' / ' || NULLIF(detail, ''), '');
END
$$;
GRANT EXECUTE ON FUNCTION pos_error(text) TO PUBLIC;

SET ROLE pos_team_a;
-- the first advance of a partition returns NULL, later ones the position before
SELECT idem_position_advance('pos-a', 'orders', 0, 5);
SELECT idem_position_advance('pos-a', 'orders', 0, 9);
SELECT idem_position_advance('pos-a', 'orders', 1, 100, 120);
-- the same position moves nothing and reports the log-end offset
SELECT idem_position_advance('pos-a', 'orders', 0, 9, 15);
-- backwards is refused, with both offsets
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, 8)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, 0, 20)$$);
-- from_position: a stored position (9) above the first message applied
-- is refused, whatever the position given; one at or below it (a gap)
-- advances as without it
BEGIN;
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, 12, NULL, 8)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, 12, NULL, 13)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, 12, NULL, -1)$$);
SELECT idem_position_advance('pos-a', 'orders', 0, 10, NULL, 9);
SELECT idem_position_advance('pos-a', 'orders', 0, 12, 15, 11);
ROLLBACK;
-- an advance is part of the caller's transaction
BEGIN;
SELECT idem_position_advance('pos-a', 'orders', 0, 12);
ROLLBACK;
BEGIN;
SELECT idem_position_advance('pos-a', 'orders', 0, 13);
SELECT idem_position_advance('pos-a', 'orders', 0, 11);
COMMIT;
SELECT consumer, topic, partition, position, log_end_offset, lag, rewinds
  FROM idem_positions('pos-a');
-- a consumer is created by its first advance, as by idem_apply, for a
-- role that may create consumers
SELECT pos_error($$SELECT idem_position_advance('pos-a2', 'orders', 0, 1)$$);
RESET ROLE;
SELECT idem_position_advance('pos-new', 'orders', 0, 1);
SELECT name FROM idem_consumer.consumers WHERE name LIKE 'pos-%' ORDER BY 1;
SET ROLE pos_team_a;

-- bad input
SELECT pos_error($$SELECT idem_position_advance(NULL, 'orders', 0, 1)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', NULL, 0, 1)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', '', 0, 1)$$);
SELECT pos_error(format('SELECT idem_position_advance(%L, %L, 0, 1)', 'pos-a', repeat('t', 250)));
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', NULL, 1)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', -1, 1)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, NULL)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, -1)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, 9, -1)$$);
SELECT pos_error($$SELECT idem_position_rewind('pos-a', 'orders', 0, 3, NULL)$$);
SELECT pos_error($$SELECT idem_position_rewind('pos-a', 'orders', 0, 3, '')$$);
SELECT pos_error($$SELECT idem_position_rewind('nobody', 'orders', 0, 3, 'why')$$);
-- a rewind does not move forwards
SELECT pos_error($$SELECT idem_position_rewind('pos-a', 'orders', 0, 14, 'skip')$$);
SELECT position FROM idem_positions('pos-a') WHERE partition = 0;

-- a rewind moves back and is recorded; then advancing goes on from there
SELECT idem_position_rewind('pos-a', 'orders', 0, 3, 'replay after the ledger restore');
SELECT idem_position_advance('pos-a', 'orders', 0, 4);
SELECT idem_position_rewind('pos-a', 'returns', 0, 0, 'first position set by hand');
SELECT consumer, topic, partition, position, rewinds, last_rewound_by, last_rewind_reason,
       last_rewound_at IS NOT NULL AS rewound
  FROM idem_positions ORDER BY consumer, topic, partition;
-- one topic, one partition
SELECT topic, partition, position FROM idem_positions('pos-a', 'orders');
SELECT topic, partition, position FROM idem_positions('pos-a', 'orders', 1);
SELECT count(*) FROM idem_positions('pos-a', 'nobody-topic', 1);
SELECT pos_error($$SELECT * FROM idem_positions(NULL, 'orders')$$);
SELECT pos_error($$SELECT * FROM idem_positions('pos-a', NULL, 1)$$);
-- a consumer's positions read through the table's index are the view's rows
SELECT array_agg(p::text ORDER BY p.topic, p.partition)
       = (SELECT array_agg(v::text ORDER BY v.topic, v.partition) FROM idem_positions AS v WHERE v.consumer = 'pos-a')
       AS same_rows, count(*)
  FROM idem_positions('pos-a') AS p;
RESET ROLE;
SELECT c.name, w.topic, w.partition, w.from_position, w.to_position, w.reason,
       w.rewound_by, w.session_role, w.rewound_at <= now() AS at
  FROM idem_consumer.position_rewinds AS w
  JOIN idem_consumer.consumers AS c USING (consumer_id)
 ORDER BY w.rewind_id;
-- the lag, in Prometheus: log-end offset minus position
SELECT l FROM regexp_split_to_table(idem_metrics(), E'\n') AS l WHERE l LIKE '%position_lag%';

-- team B's own position
SET ROLE pos_team_b;
SELECT idem_position_advance('pos-b', 'payments', 0, 7, 10);

-- team B sees its own positions only: through the view, the function
-- without a consumer, or with its own consumer
SELECT consumer, topic, partition, position, lag FROM idem_positions;
SELECT consumer, topic FROM idem_positions();
SELECT consumer, topic FROM idem_positions('pos-b');
-- every call on team A's consumer is refused, before anything is read or moved
SELECT pos_error($$SELECT * FROM idem_positions('pos-a')$$);
SELECT pos_error($$SELECT * FROM idem_positions('pos-a', 'orders', 0)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'orders', 0, 1000)$$);
SELECT pos_error($$SELECT idem_position_advance('pos-a', 'nobody-topic', 0, 1)$$);
SELECT pos_error($$SELECT idem_position_rewind('pos-a', 'orders', 0, 0, 'hostile')$$);
-- a function that prints what it is given sees team B's rows only
CREATE FUNCTION pg_temp.pos_leak(text) RETURNS boolean
LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN
    RAISE NOTICE 'seen: %', $1;
    RETURN true;
END
$$;
SELECT count(*) FROM idem_positions WHERE pg_temp.pos_leak(topic);
-- EXPLAIN ANALYZE of a query for team A's topic and of one for a topic
-- nobody has: the same plan, the same counts, the same estimates
CREATE FUNCTION pg_temp.pos_plan(q text, options text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    line text;
    plan text := '';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (' || options || ') ' || q LOOP
        plan := plan || regexp_replace(regexp_replace(line, '''[^'']*''', '''?''', 'g'),
                                       '(actual rows=\d+)\.\d+', '\1', 'g') || E'\n';
    END LOOP;
    RETURN plan;
END
$$;
SELECT pg_temp.pos_plan($$SELECT * FROM idem_positions WHERE topic = 'orders'$$,
                        'ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF');
SELECT pg_temp.pos_plan($$SELECT * FROM idem_positions WHERE topic = 'orders'$$,
                        'ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF')
     = pg_temp.pos_plan($$SELECT * FROM idem_positions WHERE topic = 'nobody-topic'$$,
                        'ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, BUFFERS OFF') AS same_counts,
       pg_temp.pos_plan($$SELECT * FROM idem_positions WHERE topic = 'orders'$$, 'COSTS ON')
     = pg_temp.pos_plan($$SELECT * FROM idem_positions WHERE topic = 'nobody-topic'$$, 'COSTS ON') AS same_estimates;
-- the storage is not team B's to read
SELECT pos_error($$SELECT * FROM idem_consumer.positions$$);
SELECT pos_error($$SELECT * FROM idem_consumer.position_rewinds$$);
RESET ROLE;
-- nothing team B tried moved team A's positions or recorded a rewind
SELECT consumer, topic, partition, position FROM idem_positions ORDER BY 1, 2, 3;
SELECT count(*) AS rewinds FROM idem_consumer.position_rewinds;

\c :regress_db
DROP DATABASE positions_test;
DROP ROLE pos_team_a;
DROP ROLE pos_team_b;
