--
-- idem_record_batch: records a batch of keys in one call and returns the
-- keys that were new, each once, in the caller's transaction.
--
CREATE TABLE batch_orders (
    id bigint PRIMARY KEY,
    paid_amount numeric NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'NEW'
);
INSERT INTO batch_orders (id) SELECT g FROM generate_series(1, 5) g;

-- new keys are returned; a key repeated in the batch is returned once
SELECT k FROM idem_record_batch('batch', ARRAY['e1', 'e2', 'e1', 'e3']) AS k ORDER BY k;
-- recorded keys are not returned again
SELECT k FROM idem_record_batch('batch', ARRAY['e3', 'e4', 'e2', 'e5', 'e5']) AS k ORDER BY k;
SELECT count(*) AS nothing_new FROM idem_record_batch('batch', ARRAY['e1', 'e2', 'e3', 'e4', 'e5']);
-- an empty batch records nothing, whatever its bounds
SELECT count(*) FROM idem_record_batch('batch', '{}');
SELECT k FROM idem_record_batch('batch', '[0:1]={e6,e1}') AS k;
SELECT key FROM idem_processed_keys WHERE consumer = 'batch' ORDER BY key;

-- keys recorded one by one and by batch are the same keys
SELECT idem_apply('e7', 'batch', 'select 1') AS applied;
SELECT k FROM idem_record_batch('batch', ARRAY['e7', 'e8']) AS k;
SELECT idem_apply('e8', 'batch', 'select 1') AS applied_again,
       idem_is_processed('e8', 'batch') AS processed;
-- and idem_forget makes a key new again
SELECT idem_forget('e8', 'batch');
SELECT k FROM idem_record_batch('batch', ARRAY['e7', 'e8']) AS k;
-- the same key for another consumer is another message
SELECT k FROM idem_record_batch('batch-other', ARRAY['e1', 'e2']) AS k ORDER BY k;

-- a duplicate costs no transaction id (and so writes nothing), one by one
-- or in a batch
BEGIN;
SELECT idem_apply('e1', 'batch', 'select 1') AS applied,
       idem_is_processed('e2', 'batch') AS processed;
SELECT count(*) AS nothing_new FROM idem_record_batch('batch', ARRAY['e2', 'e3', 'e2']);
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_xid;
COMMIT;

-- A batch whose first key in the index's order is new is taken for a batch
-- of new messages: the keys after it are inserted without a probe until
-- one finds its place taken, and from there on probed.  A batch whose first
-- key is recorded probes every key.  Either way each key is new once; the
-- heap insertions of the transaction show which way was taken (a recorded
-- key inserted without a probe costs one insertion, given up at once;
-- pending statistics stay in the backend until the transaction ends).
-- The twenty keys recorded first are those of the second to the
-- twenty-first lowest hash among 200, so that one new key comes before
-- them in the index's order and the other new keys after them.
SELECT idem_consumer_create('batch-mode');
CREATE TEMP TABLE batch_mode AS
    SELECT key, rank() OVER (ORDER BY h) BETWEEN 2 AND 21 AS recorded, h
      FROM (SELECT 'm' || g AS key,
                   idem_consumer.key_hash64((SELECT consumer_id FROM idem_consumer.consumers
                                             WHERE name = 'batch-mode'), 'm' || g) AS h
              FROM generate_series(1, 200) g) AS k;
SELECT count(*) AS recorded
  FROM idem_record_batch('batch-mode', ARRAY(SELECT key FROM batch_mode WHERE recorded));
SELECT key AS first_new FROM batch_mode WHERE NOT recorded ORDER BY h LIMIT 1 \gset
SELECT (SELECT h FROM batch_mode WHERE key = :'first_new') < min(h) AS first_new_is_first
  FROM batch_mode WHERE recorded;
-- five recorded keys, the new key first in the index's order, two more new keys
BEGIN;
SELECT n_tup_ins AS ins0, n_tup_del AS del0
  FROM pg_stat_xact_all_tables WHERE relid = 'idem_consumer.processed_keys_1'::regclass \gset
SELECT count(*) AS new_keys, bool_or(k = :'first_new') AS first_new_is_new,
       bool_and(NOT m.recorded) AS none_recorded
  FROM idem_record_batch('batch-mode',
           ARRAY(SELECT key FROM batch_mode WHERE recorded ORDER BY key LIMIT 5)
           || :'first_new'::text
           || ARRAY(SELECT key FROM batch_mode WHERE NOT recorded ORDER BY h DESC LIMIT 2)) AS k
  JOIN batch_mode m ON m.key = k;
SELECT n_tup_ins - :ins0 AS inserted, n_tup_del - :del0 AS given_up
  FROM pg_stat_xact_all_tables WHERE relid = 'idem_consumer.processed_keys_1'::regclass;
COMMIT;
-- all twenty recorded keys and two new ones: the first key is recorded
BEGIN;
SELECT n_tup_ins AS ins0, n_tup_del AS del0
  FROM pg_stat_xact_all_tables WHERE relid = 'idem_consumer.processed_keys_1'::regclass \gset
SELECT count(*) AS new_keys
  FROM idem_record_batch('batch-mode',
           ARRAY(SELECT key FROM batch_mode WHERE recorded)
           || ARRAY(SELECT key FROM batch_mode WHERE NOT recorded ORDER BY h DESC OFFSET 2 LIMIT 2)) AS k;
SELECT n_tup_ins - :ins0 AS inserted, n_tup_del - :del0 AS given_up
  FROM pg_stat_xact_all_tables WHERE relid = 'idem_consumer.processed_keys_1'::regclass;
COMMIT;
SELECT count(*) AS stored FROM idem_processed_keys WHERE consumer = 'batch-mode';

--
-- The documented usage: one statement applies a batch of order-paid
-- events.  Each message is (key, order id, amount); a message repeated in
-- the batch is taken once, and the payments of one order are summed so that
-- the update touches each order once.
--
PREPARE pay_batch(text[], bigint[], numeric[]) AS
WITH msg AS (
    SELECT DISTINCT ON (m.key) m.key, m.order_id, m.amount
      FROM unnest($1, $2, $3) AS m(key, order_id, amount)
),
new_keys AS (
    SELECT key FROM idem_record_batch('batch-payments', $1) AS key
),
paid AS (
    SELECT msg.order_id, sum(msg.amount) AS amount
      FROM msg JOIN new_keys USING (key)
     GROUP BY msg.order_id
)
UPDATE batch_orders o
   SET paid_amount = o.paid_amount + paid.amount, status = 'PAID'
  FROM paid
 WHERE o.id = paid.order_id;

-- p1 and p2 pay order 1; p3 is delivered twice in the batch
EXECUTE pay_batch(ARRAY['p1', 'p2', 'p3', 'p3', 'p4'], ARRAY[1, 1, 2, 2, 3], ARRAY[10, 5, 7, 7, 1]);
SELECT * FROM batch_orders ORDER BY id;
-- the broker redelivers p2 and p4 with two new events: only these apply
EXECUTE pay_batch(ARRAY['p2', 'p5', 'p4', 'p6'], ARRAY[1, 4, 3, 5], ARRAY[5, 100, 1, 1000]);
SELECT * FROM batch_orders ORDER BY id;
-- a batch of redeliveries changes nothing
EXECUTE pay_batch(ARRAY['p6', 'p5', 'p4', 'p3', 'p2', 'p1'], ARRAY[5, 4, 3, 2, 1, 1], ARRAY[1000, 100, 1, 7, 5, 10]);
SELECT * FROM batch_orders ORDER BY id;

-- the keys and the business changes commit or roll back together
BEGIN;
EXECUTE pay_batch(ARRAY['p7', 'p8'], ARRAY[1, 2], ARRAY[1, 1]);
SELECT idem_is_processed('p7', 'batch-payments') AS p7_inside;
ROLLBACK;
SELECT idem_is_processed('p7', 'batch-payments') AS p7_after_rollback,
       (SELECT paid_amount FROM batch_orders WHERE id = 1) AS order_1;
BEGIN;
SAVEPOINT s;
SELECT k FROM idem_record_batch('batch-payments', ARRAY['p7', 'p8']) AS k ORDER BY k;
ROLLBACK TO SAVEPOINT s;
SELECT k FROM idem_record_batch('batch-payments', ARRAY['p8', 'p9']) AS k ORDER BY k;
-- in the transaction that recorded them they are duplicates at once
SELECT count(*) AS nothing_new FROM idem_record_batch('batch-payments', ARRAY['p8', 'p9']);
COMMIT;
SELECT key FROM idem_processed_keys WHERE consumer = 'batch-payments' ORDER BY key;

--
-- Hash collisions: two keys of one hash are two messages, whether they
-- come in one batch, in two, or one by idem_apply.
--
SELECT count(*) FROM idem_record_batch('batch-hashing', ARRAY['seed']);
CREATE TEMP TABLE batch_colliding AS
    WITH c AS (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'batch-hashing'),
         k AS (SELECT 'evt-' || g AS key, idem_consumer.key_hash64((SELECT consumer_id FROM c), 'evt-' || g) AS h
                 FROM generate_series(1, 400000) g),
         pairs AS (SELECT h FROM k GROUP BY h HAVING count(*) >= 2 ORDER BY h LIMIT 2)
    SELECT dense_rank() OVER (ORDER BY h) AS pair, row_number() OVER (PARTITION BY h ORDER BY key) AS n, key
      FROM k WHERE h IN (SELECT h FROM pairs);
SELECT count(DISTINCT pair) = 2 AND min(n) = 1 AND max(n) >= 2 AS found_two_pairs FROM batch_colliding;
SELECT key AS a1 FROM batch_colliding WHERE pair = 1 AND n = 1 \gset
SELECT key AS a2 FROM batch_colliding WHERE pair = 1 AND n = 2 \gset
SELECT key AS b1 FROM batch_colliding WHERE pair = 2 AND n = 1 \gset
SELECT key AS b2 FROM batch_colliding WHERE pair = 2 AND n = 2 \gset
-- both keys of a pair in one batch (with a redelivery of each)
SELECT k = :'a1' AS is_a1, k = :'a2' AS is_a2
  FROM idem_record_batch('batch-hashing', ARRAY[:'a2', :'a1', 'x1', :'a2', :'a1']) AS k
 WHERE k <> 'x1' ORDER BY k = :'a2';
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'batch-hashing');
SELECT count(*) AS nothing_new FROM idem_record_batch('batch-hashing', ARRAY[:'a1', :'a2', 'x1']);
-- one key of a pair by idem_apply, the other by a batch, then both again
SELECT idem_apply(:'b1', 'batch-hashing', 'select 1') AS b1_applied;
SELECT k = :'b2' AS is_b2 FROM idem_record_batch('batch-hashing', ARRAY[:'b1', :'b2']) AS k;
SELECT count(*) AS nothing_new FROM idem_record_batch('batch-hashing', ARRAY[:'b2', :'b1']);
SELECT idem_apply(:'b2', 'batch-hashing', 'select 1') AS b2_applied_again;
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'batch-hashing');
-- forgetting an occupant keeps its collision recorded
SELECT idem_forget(:'a1', 'batch-hashing');
SELECT k = :'a1' AS is_a1 FROM idem_record_batch('batch-hashing', ARRAY[:'a2', :'a1']) AS k;
SELECT count(*) AS stored FROM idem_processed_keys WHERE consumer = 'batch-hashing';

--
-- Bad input: each call fails with its own SQLSTATE and records nothing.
--
CREATE FUNCTION batch_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    state text;
    message text;
    detail text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL;
    RETURN state || ' ' || message || coalesce(E'\nDETAIL: ' || nullif(detail, ''), '');
END
$f$;
\t on
SELECT batch_error($$SELECT idem_record_batch(NULL, ARRAY['bad-1'])$$);
SELECT batch_error($$SELECT idem_record_batch('', ARRAY['bad-1'])$$);
SELECT batch_error($$SELECT idem_record_batch(repeat('c', 129), ARRAY['bad-1'])$$);
SELECT batch_error($$SELECT idem_record_batch('bad-batch', NULL)$$);
SELECT batch_error($$SELECT idem_record_batch('bad-batch', ARRAY[ARRAY['bad-1', 'bad-2']])$$);
SELECT batch_error($$SELECT idem_record_batch('bad-batch', ARRAY['bad-1', NULL])$$);
SELECT batch_error($$SELECT idem_record_batch('bad-batch', ARRAY['bad-1', ''])$$);
SELECT batch_error($$SELECT idem_record_batch('bad-batch', '[5:6]={bad-1,""}')$$);
SELECT batch_error($$SELECT idem_record_batch('bad-batch', ARRAY['bad-1', repeat('k', 1025)])$$);
SELECT batch_error($$SELECT idem_record_batch('bad-batch', ARRAY['bad-1', 'bad-2']::text[] || NULL::text)$$);
\t off
SELECT count(*) AS longest_key_accepted FROM idem_record_batch('bad-batch', ARRAY[repeat('k', 1024)]);
SELECT count(*) AS recorded FROM idem_processed_keys WHERE consumer = 'bad-batch' AND key LIKE 'bad-%';

--
-- Privileges and a hostile search_path, as for idem_apply.
--
CREATE ROLE idem_batch_app;
SET ROLE idem_batch_app;
SELECT idem_record_batch('batch', ARRAY['denied']);
RESET ROLE;
GRANT EXECUTE ON FUNCTION idem_record_batch(text, text[]) TO idem_batch_app;
SET ROLE idem_batch_app;
-- EXECUTE is not enough for a consumer another role owns
SELECT k FROM idem_record_batch('batch', ARRAY['granted', 'e1']) AS k;
RESET ROLE;
SELECT idem_consumer_set_owner('batch', 'idem_batch_app');
SET ROLE idem_batch_app;
SELECT k FROM idem_record_batch('batch', ARRAY['granted', 'e1']) AS k;
RESET ROLE;
SELECT idem_consumer_set_owner('batch', current_user::regrole);

CREATE SCHEMA batch_evil;
CREATE FUNCTION batch_evil.unnest(text[]) RETURNS SETOF text LANGUAGE sql AS $$ SELECT 'evil'::text $$;
CREATE FUNCTION batch_evil.key_hash(int, text) RETURNS int LANGUAGE sql AS 'SELECT 0';
CREATE FUNCTION batch_evil.always_true(text, text) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE FUNCTION batch_evil.always_true(int, int) RETURNS bool LANGUAGE sql AS 'SELECT true';
CREATE OPERATOR batch_evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = batch_evil.always_true);
CREATE OPERATOR batch_evil.= (LEFTARG = int, RIGHTARG = int, FUNCTION = batch_evil.always_true);
SET search_path = batch_evil, pg_catalog, public;
SELECT k FROM idem_record_batch('batch-evil', ARRAY['v1', 'v2', 'v1']) AS k ORDER BY k;
SELECT k FROM idem_record_batch('batch-evil', ARRAY['v2', 'v3']) AS k ORDER BY k;
RESET search_path;
SELECT key FROM idem_processed_keys WHERE consumer = 'batch-evil' ORDER BY key;
DROP SCHEMA batch_evil CASCADE;
DROP OWNED BY idem_batch_app;
DROP ROLE idem_batch_app;

--
-- With an index of its own on the storage (say, an operator's index for
-- retention), the fast path steps aside and the SQL statements give the
-- same answers, for batches and for single keys.
--
CREATE INDEX processed_keys_at ON idem_consumer.processed_keys_1 (processed_at);
SELECT k FROM idem_record_batch('batch-sql', ARRAY['s1', 's2', 's1']) AS k ORDER BY k;
SELECT k FROM idem_record_batch('batch-sql', ARRAY['s2', 's3']) AS k ORDER BY k;
SELECT count(*) AS nothing_new FROM idem_record_batch('batch-hashing', ARRAY[:'a2', :'a1', 'x1']);
SELECT idem_forget(:'a2', 'batch-hashing') AS forgot_occupant;
SELECT k = :'a2' AS is_a2 FROM idem_record_batch('batch-hashing', ARRAY[:'a1', :'a2']) AS k;
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'batch-hashing');
SELECT idem_apply('s3', 'batch-sql', 'select 1') AS s3_again,
       idem_apply('s4', 'batch-sql', 'select 1') AS s4,
       idem_is_processed('s4', 'batch-sql') AS s4_processed,
       idem_is_processed('s5', 'batch-sql') AS s5_processed;
DROP INDEX idem_consumer.processed_keys_at;
SELECT k FROM idem_record_batch('batch-sql', ARRAY['s4', 's5']) AS k;
SELECT key FROM idem_processed_keys WHERE consumer = 'batch-sql' ORDER BY key;
