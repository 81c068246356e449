--
-- Key reuse: a key recorded for one message and delivered with another is
-- refused (IK001) by idem_apply, parked by idem_try_apply, reported by the
-- fingerprinted batch, and never applied; a true redelivery is a
-- duplicate as always.
--
CREATE FUNCTION reuse_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    state text;
    message text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    RETURN state || ' ' || message;
END
$f$;
CREATE TABLE reuse_orders (id int PRIMARY KEY, paid numeric NOT NULL DEFAULT 0);
INSERT INTO reuse_orders VALUES (1), (2);
\set pay 'update reuse_orders set paid = paid + $1 where id = $2'
-- counters are kept per consumer name across databases: start from zero
SELECT idem_stats_reset('reuse');
SELECT idem_stats_reset('reuse-batch');

-- a redelivery of the same message is a duplicate
SELECT idem_apply('r-1', 'reuse', :'pay', ARRAY['10', '1']);
SELECT idem_apply('r-1', 'reuse', :'pay', ARRAY['10', '1']);
-- another message under the key: other parameters, other SQL, a NULL
-- instead of a value; each is refused and runs nothing
SELECT reuse_error($$SELECT idem_apply('r-1', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2', ARRAY['99', '1'])$$);
SELECT reuse_error($$SELECT idem_apply('r-1', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2', ARRAY['10', '2'])$$);
SELECT reuse_error($$SELECT idem_apply('r-1', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2 and true', ARRAY['10', '1'])$$);
SELECT reuse_error($$SELECT idem_apply('r-1', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2', ARRAY['10', NULL])$$);
SELECT id, paid FROM reuse_orders ORDER BY id;
-- the detail says when the key was recorded (masked here) and the two
-- fingerprints; the hint says what to do
DO $$
DECLARE
    detail text;
    hint text;
BEGIN
    PERFORM idem_apply('r-1', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2', ARRAY['99', '1']);
EXCEPTION WHEN SQLSTATE 'IK001' THEN
    GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RAISE NOTICE 'detail: %', regexp_replace(detail, 'recorded at [^w]* with', 'recorded at T with');
    RAISE NOTICE 'hint: %', hint;
END
$$;

-- an explicit fingerprint stands for the message: parameters that vary
-- between deliveries of one message do not matter, another fingerprint does
SELECT idem_apply('r-2', 'reuse', :'pay', ARRAY['5', '2'], NULL, 'order-paid:2:v1');
SELECT idem_apply('r-2', 'reuse', :'pay', ARRAY['5.00', '2'], NULL, 'order-paid:2:v1');
SELECT reuse_error($$SELECT idem_apply('r-2', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2', ARRAY['5', '2'], NULL, 'order-paid:2:v2')$$);
SELECT reuse_error($$SELECT idem_apply('r-2', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2', ARRAY['5', '2'])$$);
SELECT reuse_error($$SELECT idem_apply('r-2', 'reuse', 'select 1', NULL, NULL, '')$$);
SELECT id, paid FROM reuse_orders ORDER BY id;

-- idem_try_apply parks another message under a recorded key as a
-- permanent failure; its own redelivery finds the entry
SELECT idem_try_apply('r-1', 'reuse', :'pay', ARRAY['10', '1']);
SELECT idem_try_apply('r-1', 'reuse', :'pay', ARRAY['77', '1']);
SELECT idem_try_apply('r-1', 'reuse', :'pay', ARRAY['77', '1']);
SELECT key, status, sqlstate, message, params FROM idem_dead_letters WHERE consumer = 'reuse';
SELECT id, paid FROM reuse_orders ORDER BY id;
-- the entry's error is built, not raised and caught: called from
-- PL/pgSQL, it carries the error's detail and hint but no context of the
-- caller's code, which no error ran through
DO $$
BEGIN
    PERFORM idem_try_apply('p-1', 'reuse-plpgsql', 'select 1');
    PERFORM idem_try_apply('p-1', 'reuse-plpgsql', 'select 2');
END
$$;
SELECT key, sqlstate, message,
       detail LIKE 'The key was recorded at % with message fingerprint %; this message''s fingerprint is %.' AS detail_given,
       hint, context
  FROM idem_dead_letters WHERE consumer = 'reuse-plpgsql';

-- the fingerprinted batch: new keys once, reused keys reported and not
-- recorded again; a key repeated in the batch with another fingerprint is
-- reused too; a NULL fingerprint is never compared
SELECT key, reused
  FROM idem_record_batch('reuse-batch', ARRAY['b-1', 'b-2', 'b-3'], ARRAY['m1', 'm2', 'm3'])
 ORDER BY key;
SELECT key, reused
  FROM idem_record_batch('reuse-batch', ARRAY['b-1', 'b-2', 'b-4', 'b-4', 'b-5', 'b-5', 'b-3'],
                         ARRAY['m1', 'other', 'm4', 'm4', 'm5', 'not-m5', NULL])
 ORDER BY key, reused;
SELECT key, fingerprint IS NOT NULL AS has_fingerprint
  FROM idem_consumer.processed_keys_1 AS k JOIN idem_consumer.consumers AS c USING (consumer_id)
 WHERE c.name = 'reuse-batch' ORDER BY key;
SELECT reuse_error($$SELECT * FROM idem_record_batch('reuse-batch', ARRAY['b-1', 'b-2'], ARRAY['m1'])$$);
SELECT reuse_error($$SELECT * FROM idem_record_batch('reuse-batch', ARRAY['b-1'], ARRAY[['m1']])$$);
SELECT key, reused FROM idem_record_batch('reuse-batch', ARRAY['b-6'], NULL);
-- the batch without fingerprints records none and compares nothing
SELECT k FROM idem_record_batch('reuse-batch', ARRAY['b-1', 'b-7']) AS k;

-- with the check off a reused key is a duplicate, and keys recorded
-- meanwhile keep no fingerprint, so they are never compared, as keys
-- recorded under 1.0
SELECT idem_set_fingerprint('reuse', false);
SELECT idem_apply('r-1', 'reuse', :'pay', ARRAY['99', '1']);
SELECT idem_apply('r-3', 'reuse', :'pay', ARRAY['1', '1']);
SELECT idem_set_fingerprint('reuse', true);
SELECT idem_apply('r-3', 'reuse', :'pay', ARRAY['1000', '1']);
SELECT reuse_error($$SELECT idem_apply('r-1', 'reuse', 'update reuse_orders set paid = paid + $1 where id = $2', ARRAY['99', '1'])$$);
SELECT id, paid FROM reuse_orders ORDER BY id;

-- every refused, parked or reported reuse is counted, whether its
-- transaction committed or not; the batch's reused keys are no duplicates
SELECT consumer, applied, duplicates, dead_lettered, key_reuse
  FROM idem_stats WHERE consumer IN ('reuse', 'reuse-batch') ORDER BY consumer;
SELECT pg_catalog.regexp_replace(idem_metrics(), '.*(idem_key_reuse_total\{database="contrib_regression",consumer="reuse"\} [0-9]+).*', '\1') AS metric;

-- bad arguments
SELECT reuse_error($$SELECT idem_set_fingerprint(NULL, true)$$);
SELECT reuse_error($$SELECT idem_set_fingerprint('reuse', NULL)$$);
SELECT reuse_error($$SELECT idem_set_fingerprint('no-such-consumer', true)$$);

DROP TABLE reuse_orders;
DROP FUNCTION reuse_error(text);
