--
-- Rows the business SQL must affect: idem_apply and idem_try_apply with
-- expect_rows raise IK002 when it affects fewer, so that a message
-- delivered before the row it changes is not recorded as applied.  NULL,
-- the default, demands nothing.  (The call shapes of 1.0 and 1.1 are
-- call_shapes' test.)
--
-- rows_error runs a statement and shows the SQLSTATE, message and detail
-- of its error, caught in a subtransaction like a consumer that handles
-- the error and carries on.
CREATE FUNCTION rows_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
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

CREATE TABLE rows_orders (
    id bigint PRIMARY KEY,
    amount_due numeric NOT NULL,
    paid_amount numeric NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'NEW'
);
\set pay 'update rows_orders set paid_amount = paid_amount + $1, status = ''PAID'' where id = $2'
-- consumers that exist count the calls whose transactions roll back
SELECT idem_consumer_create('rows-pay');
SELECT idem_consumer_create('rows-try');
SELECT idem_stats_reset('rows-pay');
SELECT idem_stats_reset('rows-try');

--
-- The default is no demand: 0 rows apply
--
SELECT idem_apply('p-0', 'rows-pay', :'pay', ARRAY['10', '1']);
SELECT idem_is_processed('p-0', 'rows-pay');

--
-- An order-paid event before its order: 0 rows, IK002, nothing recorded
--
SELECT idem_apply('p-1', 'rows-pay', :'pay', ARRAY['10', '1'], expect_rows => 1);
SELECT rows_error(format('select idem_apply(%L, %L, %L, %L, expect_rows => 1)',
                         'p-1', 'rows-pay', :'pay', ARRAY['10', '1']));
SELECT idem_is_processed('p-1', 'rows-pay');
-- the order arrives; the redelivery applies, and the next is a duplicate
INSERT INTO rows_orders (id, amount_due) VALUES (1, 10);
SELECT idem_apply('p-1', 'rows-pay', :'pay', ARRAY['10', '1'], expect_rows => 1);
SELECT idem_apply('p-1', 'rows-pay', :'pay', ARRAY['10', '1'], expect_rows => 1);
SELECT id, paid_amount, status FROM rows_orders;
-- positional: the seventh argument is expect_rows
SELECT idem_apply('p-2', 'rows-pay', :'pay', ARRAY['1', '2'], NULL, NULL, 1);
SELECT idem_is_processed('p-2', 'rows-pay');
-- a demand above what is affected; at least is enough
INSERT INTO rows_orders (id, amount_due) VALUES (2, 5), (3, 5);
SELECT idem_apply('p-3', 'rows-pay', 'update rows_orders set status = status where id >= 2',
                  expect_rows => 3);
SELECT idem_apply('p-3', 'rows-pay', 'update rows_orders set status = status where id >= 2',
                       expect_rows => 2);
SELECT idem_apply('p-4', 'rows-pay', 'update rows_orders set status = status',
                       expect_rows => 1);
-- with the caller's fingerprint and an event time, by name
SELECT idem_apply(key => 'p-5', consumer => 'rows-pay', sql => :'pay',
                       params => ARRAY['0', '3'], expect_rows => 1,
                       event_time => '2024-05-01 12:00:00+00',
                       fingerprint => 'order-paid 5');
SELECT split_part(rows_error(format('select idem_apply(%L, %L, %L, %L, NULL, %L, 1)',
                                    'p-5', 'rows-pay', :'pay', ARRAY['1', '3'], 'order-paid 6')),
                  E'\n', 1) AS reused;

--
-- What "affected" means
--
-- DML with RETURNING: the rows changed, whatever it returns
SELECT idem_apply('a-1', 'rows-pay',
                       'update rows_orders set status = status where id in (1, 2) returning id',
                       expect_rows => 2);
-- SELECT: the rows it returns
SELECT idem_apply('a-2', 'rows-pay', 'select id from rows_orders where id > $1',
                       ARRAY['1'], expect_rows => 2);
SELECT rows_error($$select idem_apply('a-3', 'rows-pay', 'select id from rows_orders where id > 100', expect_rows => 1)$$);
-- a SELECT with a data-modifying WITH: the rows the SELECT returns
SELECT idem_apply('a-4', 'rows-pay',
                       'with u as (update rows_orders set status = status returning id) select count(*) from u',
                       expect_rows => 1);
-- INSERT ... ON CONFLICT DO NOTHING: a row that conflicts is not affected
SELECT rows_error($$select idem_apply('a-5', 'rows-pay', 'insert into rows_orders (id, amount_due) values (1, 1) on conflict do nothing', expect_rows => 1)$$);
SELECT idem_apply('a-6', 'rows-pay',
                       'insert into rows_orders (id, amount_due) values (9, 1) on conflict do nothing',
                       expect_rows => 1);
-- MERGE: the rows inserted, updated or deleted
SELECT idem_apply('a-7', 'rows-pay',
                       'merge into rows_orders o using (values (9::bigint), (10)) v(id) on o.id = v.id
                        when matched then update set status = ''MERGED''
                        when not matched then insert (id, amount_due) values (v.id, 0)',
                       expect_rows => 2);
-- DELETE
SELECT idem_apply('a-8', 'rows-pay', 'delete from rows_orders where id in (9, 10)',
                       expect_rows => 2);
-- a CALL affects no rows it can report: a demand is refused before anything is recorded
CREATE PROCEDURE rows_proc() LANGUAGE sql AS 'update rows_orders set status = status';
SELECT rows_error($$select idem_apply('a-9', 'rows-pay', 'call rows_proc()', expect_rows => 1)$$);
SELECT rows_error($$select idem_try_apply('a-9', 'rows-pay', 'call rows_proc()', expect_rows => 1)$$);
SELECT idem_is_processed('a-9', 'rows-pay');
SELECT idem_apply('a-9', 'rows-pay', 'call rows_proc()');

--
-- Bad demands: refused before anything is recorded
--
SELECT rows_error($$select idem_apply('v-1', 'rows-pay', 'select 1', expect_rows => -1)$$);
SELECT rows_error($$select idem_try_apply('v-1', 'rows-pay', 'select 1', expect_rows => -5)$$);
SELECT idem_is_processed('v-1', 'rows-pay');
-- NULL demands nothing
SELECT idem_apply('v-0', 'rows-pay', 'select 1 where false', expect_rows => NULL);
SELECT idem_try_apply('v-00', 'rows-pay', 'select 1 where false', expect_rows => NULL);

--
-- idem_try_apply: too few rows is transient by default (the setting
-- lists IK002): the error is raised, the caller's transaction fails,
-- nothing is recorded or parked, and the broker redelivers
--
SHOW idem_consumer.transient_sqlstates;
SELECT idem_try_apply('t-1', 'rows-try', :'pay', ARRAY['7', '20'], expect_rows => 1);
SELECT idem_is_processed('t-1', 'rows-try');
SELECT count(*) AS entries FROM idem_dead_letters WHERE consumer = 'rows-try';
-- the order arrives; the redelivery applies
INSERT INTO rows_orders (id, amount_due) VALUES (20, 7);
SELECT idem_try_apply('t-1', 'rows-try', :'pay', ARRAY['7', '20'], expect_rows => 1);
SELECT idem_try_apply('t-1', 'rows-try', :'pay', ARRAY['7', '20'], expect_rows => 1);
-- without a demand, 0 rows is applied
SELECT idem_try_apply('t-2', 'rows-try', :'pay', ARRAY['7', '21']);
-- other errors keep their rules: a permanent one parks the message
SELECT idem_try_apply('t-3', 'rows-try', 'update rows_orders set amount_due = 1 / 0',
                                  expect_rows => 1);

--
-- A setting without IK002 makes it permanent: the message is parked with
-- its demand, and a replay demands the rows again
--
SET idem_consumer.transient_sqlstates = '23503';
SELECT idem_try_apply('t-4', 'rows-try', :'pay', ARRAY['3', '22'], expect_rows => 1);
SELECT idem_is_processed('t-4', 'rows-try');
SELECT key, status, sqlstate, message, detail, params, expect_rows, attempts
  FROM idem_dead_letters WHERE consumer = 'rows-try' ORDER BY id;
-- a redelivery of the parked message runs nothing
SELECT idem_try_apply('t-4', 'rows-try', :'pay', ARRAY['3', '22'], expect_rows => 1);
-- a replay while the row is still missing: parked again (IK002 is permanent here)
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 't-4';
-- with the default setting the same replay raises IK002 and changes nothing
RESET idem_consumer.transient_sqlstates;
SELECT rows_error(format('select idem_dlq_replay(%s)', id))
  FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 't-4';
SELECT key, status, sqlstate, attempts FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 't-4';
-- the order arrives: the replay applies the payment
INSERT INTO rows_orders (id, amount_due) VALUES (22, 3);
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 't-4';
SELECT key, status, attempts FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 't-4';
SELECT id, paid_amount, status FROM rows_orders WHERE id IN (20, 21, 22) ORDER BY id;
-- a message parked without a demand keeps none
SET idem_consumer.transient_sqlstates = '';
SELECT idem_try_apply('t-5', 'rows-try', 'select 1 / 0');
SELECT key, expect_rows FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 't-5';
RESET idem_consumer.transient_sqlstates;

--
-- Counters: a message refused for its rows counts as failed, as any error
-- of the business SQL does; parked, as dead-lettered
--
SELECT consumer, applied, duplicates, failed, dead_lettered
  FROM idem_stats WHERE consumer IN ('rows-pay', 'rows-try') ORDER BY consumer;

--
-- Typed values go into params through their output functions
--
\set pay 'update rows_orders set paid_amount = paid_amount + $1, status = ''PAID'' where id = $2'
SELECT rows_error($$SELECT idem_apply('v-1', 'rows-pay', 'update rows_orders set paid_amount = paid_amount + $1 where id = $2', ARRAY[4.50::text, 30::text], expect_rows => 1)$$);
SELECT idem_is_processed('v-1', 'rows-pay');
INSERT INTO rows_orders (id, amount_due) VALUES (30, 4.5);
SELECT idem_apply('v-1', 'rows-pay', :'pay', ARRAY[4.50::text, 30::text], expect_rows => 1);
-- a redelivery written another way is a duplicate
SELECT idem_apply('v-1', 'rows-pay', :'pay', ARRAY[4.5::numeric::text, 30::bigint::text], expect_rows => 1);
SELECT split_part(rows_error($$SELECT idem_apply('v-1', 'rows-pay', 'update rows_orders set paid_amount = paid_amount + $1 where id = $2', ARRAY[4.51::text, 30::text], expect_rows => 1)$$), E'\n', 1);
SELECT id, paid_amount, status FROM rows_orders WHERE id = 30;
-- idem_try_apply: transient IK002 re-raised; parked when permanent, and
-- its replay demands the rows again
SELECT rows_error($$SELECT idem_try_apply('tv-1', 'rows-try', 'update rows_orders set paid_amount = paid_amount + $1 where id = $2', ARRAY[2.25::text, 31::text], expect_rows => 1)$$);
SET idem_consumer.transient_sqlstates = '';
SELECT idem_try_apply('tv-1', 'rows-try', :'pay', ARRAY[2.25::text, 31::text], expect_rows => 1);
SELECT key, params, expect_rows, status FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 'tv-1';
RESET idem_consumer.transient_sqlstates;
SELECT rows_error(format('select idem_dlq_replay(%s)', (SELECT id FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 'tv-1')));
INSERT INTO rows_orders (id, amount_due) VALUES (31, 2.25);
SELECT * FROM idem_dlq_replay((SELECT id FROM idem_dead_letters WHERE consumer = 'rows-try' AND key = 'tv-1'));
SELECT idem_try_apply('tv-1', 'rows-try', :'pay', ARRAY[2.250::text, 31::text], expect_rows => 1);
SELECT idem_try_apply('tv-2', 'rows-try', 'select 1', expect_rows => 0);
SELECT id, paid_amount, status FROM rows_orders WHERE id = 31;
