--
-- Who reads which counters: a role reads the rows of idem_stats (and the
-- samples of idem_metrics()) of the consumers whose owner's privileges it
-- has; pg_read_all_stats (pg_monitor) and superusers read every
-- consumer's.  The SRF filters, so EXPLAIN ANALYZE and a leaky function
-- in the WHERE clause never see a hidden row.  EXECUTE on
-- idem_stats_reset is the right to reset every consumer's counters.
--
CREATE ROLE sr_team_a;
CREATE ROLE sr_team_b;
CREATE ROLE sr_oncall_a IN ROLE sr_team_a;
CREATE ROLE sr_monitor IN ROLE pg_monitor;
CREATE ROLE sr_ops;
GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_metrics()
    TO sr_team_a, sr_team_b;
SELECT idem_consumer_create('sr-a', 'sr_team_a');
SELECT idem_consumer_create('sr-a2', 'sr_team_a');
SELECT idem_consumer_create('sr-b', 'sr_team_b');
SET ROLE sr_team_a;
SELECT idem_apply('a-' || g, 'sr-a', 'select 1') FROM generate_series(1, 3) g;
SELECT idem_apply('a-1', 'sr-a2', 'select 1');
RESET ROLE;
SET ROLE sr_team_b;
SELECT idem_apply('b-' || g, 'sr-b', 'select 1') FROM generate_series(1, 2) g;
SELECT idem_try_apply('b-dead', 'sr-b', 'select 1/0');
RESET ROLE;

-- each team reads its own consumers only, a member of the owner too
SET ROLE sr_team_a;
SELECT consumer, applied FROM idem_stats WHERE consumer LIKE 'sr-%' ORDER BY consumer;
RESET ROLE;
SET ROLE sr_oncall_a;
SELECT consumer, applied FROM idem_stats WHERE consumer LIKE 'sr-%' ORDER BY consumer;
RESET ROLE;
SET ROLE sr_team_b;
SELECT consumer, applied, dead_lettered FROM idem_stats WHERE consumer LIKE 'sr-%' ORDER BY consumer;
RESET ROLE;
-- a role that owns nothing reads nothing
SET ROLE sr_ops;
SELECT count(*) AS rows_seen FROM idem_stats WHERE consumer LIKE 'sr-%';
RESET ROLE;
-- pg_monitor reads every consumer
SET ROLE sr_monitor;
SELECT consumer, applied FROM idem_stats WHERE consumer LIKE 'sr-%' ORDER BY consumer;
RESET ROLE;

-- the rows are filtered inside the function: no plan node, no leaky
-- function in the WHERE clause, sees another team's row
CREATE FUNCTION sr_leak(consumer text, applied bigint) RETURNS boolean
    LANGUAGE plpgsql COST 0.0000001 AS $$
BEGIN
    RAISE NOTICE 'sr_leak: % applied %', consumer, applied;
    RETURN true;
END $$;
SET ROLE sr_team_b;
SELECT consumer FROM idem_stats WHERE consumer LIKE 'sr-%' AND sr_leak(consumer, applied);
CREATE TEMP TABLE sr_plan (line text);
DO $$
DECLARE
    l text;
BEGIN
    FOR l IN EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT * FROM idem_stats
    LOOP
        INSERT INTO sr_plan VALUES (l);
    END LOOP;
END $$;
SELECT (SELECT count(*) FROM idem_stats) AS rows_read,
       substring(line from 'actual rows=(\d+)') AS rows_in_plan
  FROM sr_plan WHERE line LIKE '%Function Scan%';
RESET ROLE;

-- idem_metrics() follows the same rule, dead-letter gauges included
CREATE FUNCTION sr_samples() RETURNS SETOF text LANGUAGE sql AS $$
    SELECT line FROM regexp_split_to_table(idem_metrics(), E'\n') AS line
     WHERE line ~ '^idem_(applied_total|dlq_pending)\{.*consumer="sr-' ORDER BY line
$$;
SET ROLE sr_team_a;
SELECT * FROM sr_samples();
RESET ROLE;
SET ROLE sr_team_b;
SELECT * FROM sr_samples();
RESET ROLE;
SET ROLE sr_monitor;
SELECT * FROM sr_samples();
RESET ROLE;

-- resetting: refused without EXECUTE, whoever owns the consumer ...
SET ROLE sr_team_a;
SELECT idem_stats_reset('sr-a');
RESET ROLE;
-- ... and with it, any consumer of the database, as the README's grant reads
GRANT EXECUTE ON FUNCTION idem_stats_reset(text) TO sr_ops;
SET ROLE sr_ops;
SELECT idem_stats_reset('sr-b');
RESET ROLE;
SELECT consumer, applied FROM idem_stats WHERE consumer LIKE 'sr-%' ORDER BY consumer;
SET ROLE sr_ops;
SELECT idem_stats_reset();
RESET ROLE;
SELECT consumer, applied FROM idem_stats WHERE consumer LIKE 'sr-%' ORDER BY consumer;

-- a consumer created under 1.0 has no owner: open to every role, as its
-- other functions are
INSERT INTO idem_consumer.consumers (name) VALUES ('sr-legacy');
SELECT idem_apply('l-1', 'sr-legacy', 'select 1');
SELECT idem_apply('l-1', 'sr-legacy', 'select 1');
SET ROLE sr_ops;
SELECT consumer, applied, duplicates FROM idem_stats WHERE consumer LIKE 'sr-%';
RESET ROLE;

DROP FUNCTION sr_leak(text, bigint);
DROP FUNCTION sr_samples();
DROP OWNED BY sr_team_a, sr_team_b, sr_oncall_a, sr_monitor, sr_ops;
DROP ROLE sr_team_a, sr_team_b, sr_oncall_a, sr_monitor, sr_ops;
