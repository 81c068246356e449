--
-- idem_apply: records the key and runs the business SQL once per
-- (consumer, key), in the caller's transaction.
--
CREATE TABLE orders (
    id bigint PRIMARY KEY,
    amount_due numeric NOT NULL,
    paid_amount numeric NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'NEW',
    note text
);
INSERT INTO orders (id, amount_due) SELECT g, 100 FROM generate_series(1, 5) g;

-- first delivery applies, redelivery does not
SELECT idem_apply('order-paid:e1', 'payments',
                  'update orders set paid_amount = paid_amount + $1, status = ''PAID'' where id = $2',
                  ARRAY['10.50', '1']);
SELECT idem_apply('order-paid:e1', 'payments',
                  'update orders set paid_amount = paid_amount + $1, status = ''PAID'' where id = $2',
                  ARRAY['10.50', '1']);
SELECT id, paid_amount, status FROM orders WHERE id = 1;

-- the key reused by another message (other SQL or parameters) is refused
-- and runs nothing (key_reuse.sql shows the whole error)
\set VERBOSITY terse
SELECT idem_apply('order-paid:e1', 'payments',
                  'update orders set paid_amount = paid_amount + $1 where id = $2',
                  ARRAY['1000', '1']);
\set VERBOSITY default
SELECT paid_amount FROM orders WHERE id = 1;
-- with the consumer's check off it is a duplicate like any other, and runs
-- nothing either
SELECT idem_set_fingerprint('payments', false);
SELECT idem_apply('order-paid:e1', 'payments',
                  'update orders set paid_amount = paid_amount + $1 where id = $2',
                  ARRAY['1000', '1']);
SELECT idem_set_fingerprint('payments', true);
SELECT paid_amount FROM orders WHERE id = 1;

-- the same key for another consumer is independent
SELECT idem_apply('order-paid:e1', 'shipping',
                  'update orders set note = $1 where id = $2', ARRAY['shipped', '1']);
SELECT note FROM orders WHERE id = 1;

-- named arguments, no params, event_time
SELECT idem_apply(key => 'k-noparams', consumer => 'payments',
                  sql => 'update orders set status = ''CHECKED'' where id = 5',
                  event_time => now() - interval '2 seconds');
SELECT status FROM orders WHERE id = 5;

-- parameter types are inferred from their context: numeric, bigint, text,
-- and a NULL element is an SQL NULL
SELECT idem_apply('k-types', 'payments',
                  'update orders set paid_amount = paid_amount + $1, note = $3 where id = $2',
                  ARRAY['0.25', '2', NULL]);
SELECT paid_amount, note IS NULL AS note_is_null FROM orders WHERE id = 2;
SELECT idem_apply('k-insert', 'payments',
                  'insert into orders (id, amount_due, note) values ($1, $2, $3)',
                  ARRAY['6', '42', 'it''s "quoted"; drop table orders; --']);
SELECT id, amount_due, note FROM orders WHERE id = 6;

-- SELECT, data-modifying WITH, MERGE and CALL are accepted
SELECT idem_apply('k-select', 'payments', 'select $1::int + 1', ARRAY['1']);
SELECT idem_apply('k-with', 'payments',
                  'with u as (update orders set note = $1 where id = $2 returning id) select count(*) from u',
                  ARRAY['via cte', '3']);
SELECT note FROM orders WHERE id = 3;
SELECT idem_apply('k-merge', 'payments',
                  'merge into orders o using (select $1::bigint as id) s on o.id = s.id
                   when matched then update set note = ''merged''
                   when not matched then insert (id, amount_due, note) values (s.id, 0, ''merged'')',
                  ARRAY['7']);
SELECT id, note FROM orders WHERE id = 7;
CREATE PROCEDURE pay(p_id bigint, p_amount numeric) LANGUAGE sql
    AS $$ update orders set paid_amount = paid_amount + p_amount where id = p_id $$;
SELECT idem_apply('k-call', 'payments', 'call pay($1, $2)', ARRAY['4', '7']);
SELECT paid_amount FROM orders WHERE id = 4;

-- idem_is_processed and idem_forget
SELECT idem_is_processed('order-paid:e1', 'payments') AS processed,
       idem_is_processed('order-paid:e2', 'payments') AS unknown_key,
       idem_is_processed('order-paid:e1', 'no-such-consumer') AS unknown_consumer;
SELECT idem_forget('order-paid:e1', 'payments') AS forgotten,
       idem_forget('order-paid:e1', 'payments') AS forgotten_again,
       idem_forget('order-paid:e1', 'no-such-consumer') AS unknown_consumer;
SELECT idem_is_processed('order-paid:e1', 'payments');
-- after forget, a redelivery applies again
SELECT idem_apply('order-paid:e1', 'payments',
                  'update orders set paid_amount = paid_amount + $1 where id = $2',
                  ARRAY['10.50', '1']);
SELECT paid_amount FROM orders WHERE id = 1;
SELECT idem_is_processed('order-paid:e1', 'shipping');

-- an error in the business SQL propagates unchanged, and the rollback
-- leaves the key unrecorded so the redelivery is processed
\set VERBOSITY default
SELECT idem_apply('k-fails', 'payments', 'update orders set paid_amount = 1 / $1 where id = 1', ARRAY['0']);
SELECT idem_apply('k-fails', 'payments', 'insert into orders (id, amount_due) values ($1, 1)', ARRAY['1']);
SELECT idem_is_processed('k-fails', 'payments');
SELECT idem_apply('k-fails', 'payments', 'update orders set note = $1 where id = 1', ARRAY['retried']);
SELECT note FROM orders WHERE id = 1;

-- everything happens in the caller's transaction
BEGIN;
SELECT idem_apply('k-rollback', 'payments', 'update orders set note = $1 where id = 2', ARRAY['rolled back']);
SELECT idem_is_processed('k-rollback', 'payments');
ROLLBACK;
SELECT idem_is_processed('k-rollback', 'payments'), note IS NULL AS note_is_null FROM orders WHERE id = 2;

-- in a transaction that applied it, the key is a duplicate at once
BEGIN;
SELECT idem_apply('k-twice', 'payments', 'update orders set paid_amount = paid_amount + 1 where id = 3');
SELECT idem_apply('k-twice', 'payments', 'update orders set paid_amount = paid_amount + 1 where id = 3');
COMMIT;
SELECT paid_amount FROM orders WHERE id = 3;

-- a savepoint rolled back takes the key with it
BEGIN;
SAVEPOINT s1;
SELECT idem_apply('k-savepoint', 'payments', 'update orders set note = $1 where id = 4', ARRAY['undone']);
ROLLBACK TO SAVEPOINT s1;
SELECT idem_is_processed('k-savepoint', 'payments');
SELECT idem_apply('k-savepoint', 'payments', 'update orders set note = $1 where id = 4', ARRAY['kept']);
COMMIT;
SELECT note FROM orders WHERE id = 4;

-- a failure caught by PL/pgSQL leaves nothing half-recorded
DO $$
BEGIN
    PERFORM idem_apply('k-caught', 'payments', 'update orders set paid_amount = 1 / 0 where id = 1');
EXCEPTION WHEN division_by_zero THEN
    RAISE NOTICE 'caught %', SQLSTATE;
END $$;
SELECT idem_is_processed('k-caught', 'payments');

-- business SQL may not call idem_apply itself, for another consumer either:
-- the inner call is refused (55006), and the outer message fails whole
SELECT idem_apply('k-outer', 'payments',
                  'select idem_apply($1, ''inner'', ''update orders set note = $1 where id = 5'', array[''nested''])',
                  ARRAY['k-inner']);
SELECT note FROM orders WHERE id = 5;
SELECT idem_is_processed('k-inner', 'inner');

-- the readable view
SELECT consumer, key FROM idem_processed_keys ORDER BY consumer, key;
SELECT count(*) FROM idem_processed_keys
 WHERE processed_at BETWEEN now() - interval '1 minute' AND now() + interval '1 second';
