--
-- Dead-letter queue: idem_try_apply parks a message whose business SQL
-- fails permanently and re-raises a transient failure; operators replay or
-- discard the parked entries.
--
-- dlq_error runs a statement and shows the SQLSTATE, message and detail
-- of its error, with dead-letter entry ids masked.  It catches the error
-- in a subtransaction, like a consumer that handles the error and carries
-- on.
--
-- The session's zone by its canonical name: pg_regress's PST8PDT is a zone
-- of its own in PostgreSQL's bundled time zone data and a link to
-- America/Los_Angeles in the system's, and parked settings show it.
SET TimeZone = 'America/Los_Angeles';
CREATE FUNCTION dlq_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    state text;
    message text;
    detail text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS OR query_canceled THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL;
    RETURN regexp_replace(state || ' ' || message
                          || coalesce(E'\nDETAIL: ' || nullif(detail, ''), ''),
                          'entry -?[0-9]+', 'entry N', 'g');
END
$f$;

-- fails_with raises an error with the SQLSTATE it is given.
CREATE FUNCTION fails_with(code text) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION 'failing with %', code USING ERRCODE = code;
END
$f$;

CREATE TABLE wallets (id int PRIMARY KEY, balance numeric NOT NULL CHECK (balance >= 0));
INSERT INTO wallets VALUES (1, 100), (2, 0);
CREATE TABLE wallet_log (key text NOT NULL, note text);

SELECT enum_range(NULL::idem_outcome);

--
-- Outcomes
--
SELECT idem_try_apply('t-1', 'billing',
                      'update wallets set balance = balance - $1 where id = $2',
                      ARRAY['30', '1']);
SELECT idem_try_apply('t-1', 'billing',
                      'update wallets set balance = balance - $1 where id = $2',
                      ARRAY['30', '1']);
SELECT balance FROM wallets WHERE id = 1;

-- a permanent failure: the effects of the business SQL are rolled back,
-- the key is recorded and the message is parked with its error
SELECT idem_try_apply('t-2', 'billing',
                      'with log as (insert into wallet_log values ($3, ''debit''))
                       update wallets set balance = balance - $1 where id = $2',
                      ARRAY['500', '1', 't-2'], '2024-05-01 12:00:00+00');
SELECT count(*) AS log_rows FROM wallet_log;
SELECT balance FROM wallets WHERE id = 1;
SELECT idem_is_processed('t-2', 'billing');
\x on
SELECT consumer, key, status, sqlstate, message, detail, hint, context, attempts,
       event_time, sql, params, settings, dead_lettered_by,
       first_failed_at = last_failed_at AS failed_once,
       resolved_at, resolved_by, discard_reason
  FROM idem_dead_letters WHERE key = 't-2';
\x off

-- a redelivery runs nothing and adds no entry; the attempts stay 1
SELECT idem_try_apply('t-2', 'billing',
                      'with log as (insert into wallet_log values ($3, ''debit''))
                       update wallets set balance = balance - $1 where id = $2',
                      ARRAY['500', '1', 't-2'], '2024-05-01 12:00:00+00');
SELECT count(*) AS entries, max(attempts) AS attempts FROM idem_dead_letters WHERE key = 't-2';
SELECT count(*) AS log_rows FROM wallet_log;

-- idem_apply is unchanged: it raises, records nothing, and sees a
-- dead-lettered key as processed
SELECT idem_apply('t-3', 'billing', 'update wallets set balance = -1 where id = 1');
SELECT idem_is_processed('t-3', 'billing');
SELECT idem_apply('t-2', 'billing',
                      'with log as (insert into wallet_log values ($3, ''debit''))
                       update wallets set balance = balance - $1 where id = $2',
                  ARRAY['500', '1', 't-2'], '2024-05-01 12:00:00+00');
SELECT balance FROM wallets WHERE id = 1;

--
-- Classification
--
-- permanent: real errors of data, schema and privileges, and errors raised
-- with representative SQLSTATEs; each is dead-lettered
CREATE TABLE dl_parents (id int PRIMARY KEY);
CREATE TABLE dl_children (id int PRIMARY KEY, parent_id int NOT NULL REFERENCES dl_parents);
SELECT key, idem_try_apply(key, 'classify', sql, params)
  FROM (VALUES
    ('unique', 'insert into wallets values ($1, 0)', ARRAY['1']),
    ('foreign-key', 'insert into dl_children values ($1, $2)', ARRAY['1', '42']),
    ('not-null', 'insert into wallets values ($1, $2)', ARRAY['3', NULL]),
    ('division', 'update wallets set balance = 1 / $1 where id = 1', ARRAY['0']),
    ('undefined-table', 'update no_such_table set x = 1', NULL),
    ('undefined-column', 'update wallets set no_such_column = 1', NULL),
    ('bad-value', 'update wallets set balance = $1 where id = 1', ARRAY['ten']),
    ('out-of-range', 'update wallets set balance = 1 where id = $1', ARRAY['99999999999']),
    ('param-count', 'update wallets set balance = $1 where id = 1', ARRAY['1', '2']),
    ('no-data', 'select fails_with($1)', ARRAY['P0002']),
    ('object-state', 'select fails_with($1)', ARRAY['55000'])
  ) AS m(key, sql, params)
 ORDER BY key;
SELECT key, sqlstate, message FROM idem_dead_letters WHERE consumer = 'classify' ORDER BY key;
SELECT balance FROM wallets WHERE id = 1;

-- transient: re-raised unchanged, nothing recorded; classes 58 (system
-- I/O) and XX (internal) are the server's trouble, not the message's
SELECT code, dlq_error(format($$select idem_try_apply(%L, 'classify', 'select fails_with($1)', ARRAY[%L])$$,
                              'transient-' || code, code))
  FROM unnest(ARRAY['40001', '40P01', '40002', '55P03', '57014', '57P01', '57000',
                    '53100', '53200', '53300', '08006', '08000',
                    '58000', '58030', '58P01', 'XX000', 'XX001', 'XX002']) AS code;
SELECT count(*) AS recorded FROM idem_processed_keys WHERE key LIKE 'transient-%';
SELECT count(*) AS parked FROM idem_dead_letters WHERE key LIKE 'transient-%';

-- a real cancel (statement_timeout) is re-raised as it is
SET statement_timeout = '200ms';
SELECT idem_try_apply('transient-timeout', 'classify', 'select pg_sleep(10)');
RESET statement_timeout;
SELECT idem_is_processed('transient-timeout', 'classify');

-- idem_consumer.transient_sqlstates adds SQLSTATEs and classes
SET idem_consumer.transient_sqlstates = '23505';
SELECT dlq_error($$select idem_try_apply('guc-1', 'classify', 'insert into wallets values ($1, 0)', ARRAY['1'])$$);
SELECT idem_try_apply('guc-2', 'classify', 'select fails_with($1)', ARRAY['23503']);
SET idem_consumer.transient_sqlstates = 'p0', '22012';
SHOW idem_consumer.transient_sqlstates;
SELECT dlq_error($$select idem_try_apply('guc-3', 'classify', 'select fails_with($1)', ARRAY['P0002'])$$);
SELECT dlq_error($$select idem_try_apply('guc-4', 'classify', 'select 1 / $1', ARRAY['0'])$$);
SELECT idem_try_apply('guc-5', 'classify', 'select fails_with($1)', ARRAY['22003']);
SET idem_consumer.transient_sqlstates = '2350';
SET idem_consumer.transient_sqlstates = '23505, 40-01';
RESET idem_consumer.transient_sqlstates;
SELECT key, idem_is_processed(key, 'classify') AS recorded
  FROM unnest(ARRAY['guc-1', 'guc-2', 'guc-3', 'guc-4', 'guc-5']) AS key;

--
-- Everything happens in the caller's transaction
--
BEGIN;
SELECT idem_try_apply('rb-1', 'billing', 'update wallets set balance = -1 where id = 1');
SELECT status FROM idem_dead_letters WHERE key = 'rb-1';
ROLLBACK;
SELECT count(*) AS entries FROM idem_dead_letters WHERE key = 'rb-1';
SELECT idem_is_processed('rb-1', 'billing');

BEGIN;
SAVEPOINT s;
SELECT idem_try_apply('rb-2', 'billing', 'update wallets set balance = -1 where id = 1');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) AS entries FROM idem_dead_letters WHERE key = 'rb-2';
COMMIT;

-- a dead-lettering in a transaction that fails later leaves nothing
BEGIN;
SELECT idem_try_apply('rb-3', 'billing', 'update wallets set balance = -1 where id = 1');
SELECT 1 / 0;
COMMIT;
SELECT count(*) AS entries FROM idem_dead_letters WHERE key = 'rb-3';
SELECT idem_is_processed('rb-3', 'billing');

-- business SQL may not call idem_try_apply itself: the refusal (55006) is
-- a permanent failure of the outer message, which is parked
SELECT idem_try_apply('outer-1', 'nesting',
                      'select idem_try_apply($1, ''nested'', ''update wallets set balance = -1 where id = 1'')',
                      ARRAY['inner-1']);
SELECT idem_try_apply('outer-2', 'nesting',
                      'select idem_try_apply($1, ''nested'', ''update wallets set balance = -1 where id = 1''), 1 / 0',
                      ARRAY['inner-2']);
SELECT consumer, key, sqlstate FROM idem_dead_letters
 WHERE consumer IN ('nesting', 'nested') ORDER BY consumer, key;
SELECT idem_is_processed('inner-2', 'nested');

--
-- Bad input: raised, nothing recorded, no consumer created
--
\t on
-- key, consumer, sql
SELECT dlq_error($$SELECT idem_try_apply(NULL, 'bad', 'select 1')$$);
SELECT dlq_error($$SELECT idem_try_apply('', 'bad', 'select 1')$$);
SELECT dlq_error($$SELECT idem_try_apply(repeat('k', 1025), 'bad', 'select 1')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', NULL, 'select 1')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', '', 'select 1')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', repeat('c', 129), 'select 1')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', NULL)$$);
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', '')$$);
-- SQL text that does not parse as one accepted statement is the caller's
-- bug, not the message's
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', ' ; -- nothing')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', 'updte wallets set balance = 1')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', 'select 1; select 2')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', 'commit')$$);
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', 'vacuum wallets')$$);
-- params, event_time
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', 'select $1::int', ARRAY[ARRAY['1']])$$);
SELECT dlq_error($$SELECT idem_try_apply('k', 'bad', 'select 1', NULL, 'infinity')$$);
-- replay and discard
SELECT dlq_error($$SELECT idem_dlq_replay(NULL::bigint)$$);
SELECT dlq_error($$SELECT idem_dlq_replay(-1)$$);
SELECT dlq_error($$SELECT * FROM idem_dlq_replay(NULL::text)$$);
SELECT dlq_error($$SELECT * FROM idem_dlq_replay('no-such-consumer')$$);
SELECT dlq_error($$SELECT * FROM idem_dlq_replay('billing', NULL)$$);
SELECT dlq_error($$SELECT * FROM idem_dlq_replay('billing', 0)$$);
SELECT dlq_error($$SELECT idem_dlq_discard(NULL, 'reason')$$);
SELECT dlq_error($$SELECT idem_dlq_discard(-1, 'reason')$$);
\t off
SELECT (SELECT count(*) FROM idem_consumer.consumers WHERE name = 'bad') AS consumers,
       (SELECT count(*) FROM idem_processed_keys WHERE consumer = 'bad') AS keys;

--
-- Replay
--
CREATE TABLE parcels (id int PRIMARY KEY, status text NOT NULL DEFAULT 'NEW');
CREATE TABLE deliveries (parcel_id int NOT NULL REFERENCES parcels, qty int NOT NULL);
-- a delivery of a parcel that is not registered yet: a missing row
SELECT idem_try_apply('ship-1', 'shipping', 'insert into deliveries values ($1, $2)', ARRAY['7', '3']);
SELECT id AS ship1 FROM idem_dead_letters WHERE key = 'ship-1' \gset
-- replayed before the fix: fails again, stays pending with attempts 2
SELECT idem_dlq_replay(:ship1);
SELECT status, sqlstate, attempts, resolved_at IS NULL AS unresolved FROM idem_dead_letters WHERE id = :ship1;
-- fixed, replayed: applied once, the entry is replayed, redeliveries are duplicates
INSERT INTO parcels VALUES (7);
SELECT idem_dlq_replay(:ship1);
SELECT status, attempts, resolved_by, resolved_at >= first_failed_at AS resolved_after_failure FROM idem_dead_letters WHERE id = :ship1;
SELECT * FROM deliveries;
SELECT idem_try_apply('ship-1', 'shipping', 'insert into deliveries values ($1, $2)', ARRAY['7', '3']);
SELECT idem_is_processed('ship-1', 'shipping');

-- the error of a failed replay replaces the stored one
SELECT idem_try_apply('ship-2', 'shipping', 'update parcels set priority = $1 where id = $2', ARRAY['9', '7']);
SELECT id AS ship2 FROM idem_dead_letters WHERE key = 'ship-2' \gset
SELECT sqlstate, message FROM idem_dead_letters WHERE id = :ship2;
ALTER TABLE parcels ADD COLUMN priority int CHECK (priority <= 5);
SELECT idem_dlq_replay(:ship2);
SELECT status, sqlstate, message, attempts FROM idem_dead_letters WHERE id = :ship2;
ALTER TABLE parcels DROP CONSTRAINT parcels_priority_check;
SELECT idem_dlq_replay(:ship2);
SELECT status, attempts FROM idem_dead_letters WHERE id = :ship2;
SELECT id, priority FROM parcels;

-- a replay is in the caller's transaction
SELECT idem_try_apply('ship-3', 'shipping', 'insert into deliveries values ($1, $2)', ARRAY['8', '1']);
SELECT id AS ship3 FROM idem_dead_letters WHERE key = 'ship-3' \gset
INSERT INTO parcels VALUES (8);
BEGIN;
SELECT idem_dlq_replay(:ship3);
ROLLBACK;
SELECT status, attempts FROM idem_dead_letters WHERE id = :ship3;
SELECT count(*) AS deliveries_of_8 FROM deliveries WHERE parcel_id = 8;

-- a transient error during a replay is raised and changes nothing
CREATE TABLE flaky_state (code text);
CREATE FUNCTION flaky() RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
    c text;
BEGIN
    SELECT code INTO c FROM flaky_state;
    IF c IS NOT NULL THEN
        RAISE EXCEPTION 'flaky failure %', c USING ERRCODE = c;
    END IF;
END
$f$;
INSERT INTO flaky_state VALUES ('23000');
SELECT idem_try_apply('flaky-1', 'flaky', 'select flaky()');
SELECT id AS flaky1 FROM idem_dead_letters WHERE key = 'flaky-1' \gset
UPDATE flaky_state SET code = '40001';
SELECT idem_dlq_replay(:flaky1);
SELECT status, sqlstate, attempts FROM idem_dead_letters WHERE id = :flaky1;
DELETE FROM flaky_state;
SELECT idem_dlq_replay(:flaky1);

-- a replay reads the stored text and params with the settings they were
-- sent with, whatever the replaying session's are
CREATE SCHEMA tenant_x;
CREATE TABLE tenant_x.counters (name text PRIMARY KEY, n int NOT NULL CHECK (n <= 1), at timestamptz);
INSERT INTO tenant_x.counters VALUES ('a', 1);
CREATE TABLE public.counters (name text PRIMARY KEY, n int NOT NULL, at timestamptz);
INSERT INTO public.counters VALUES ('a', 0);
SET search_path = tenant_x, public;
SET TimeZone = 'Asia/Tokyo';
SELECT idem_try_apply('tn-1', 'tenant', 'update counters set n = n + 1, at = $2 where name = $1',
                      ARRAY['a', '2024-01-01 09:00']);
RESET search_path;
SET TimeZone = 'America/Los_Angeles';
SELECT id AS tn1 FROM idem_dead_letters WHERE key = 'tn-1' \gset
SELECT settings FROM idem_dead_letters WHERE id = :tn1;
UPDATE tenant_x.counters SET n = 0;
SELECT idem_dlq_replay(:tn1);
SELECT n, at = '2024-01-01 00:00:00+00' AS tokyo_time FROM tenant_x.counters;
SELECT n, at FROM public.counters;
SHOW search_path;
SHOW TimeZone;

--
-- Replay of a consumer's pending entries, oldest first
--
UPDATE wallets SET balance = 0 WHERE id = 2;
SELECT key, idem_try_apply(key, 'batch', 'update wallets set balance = balance - $1 where id = 2', ARRAY[amount])
  FROM (VALUES ('b-1', '10'), ('b-2', '20'), ('b-3', '1000'), ('b-4', '30'), ('b-5', '5')) AS m(key, amount)
 ORDER BY key;
UPDATE wallets SET balance = 100 WHERE id = 2;
SELECT r.ord, d.key, r.outcome
  FROM idem_dlq_replay('batch', 2) WITH ORDINALITY AS r(id, outcome, ord)
  JOIN idem_dead_letters AS d USING (id) ORDER BY r.ord;
-- an entry that fails again is passed over, not retried in the same call
SELECT r.ord, d.key, r.outcome
  FROM idem_dlq_replay('batch') WITH ORDINALITY AS r(id, outcome, ord)
  JOIN idem_dead_letters AS d USING (id) ORDER BY r.ord;
SELECT key, status, attempts FROM idem_dead_letters WHERE consumer = 'batch' ORDER BY key;
SELECT balance FROM wallets WHERE id = 2;
SELECT r.ord, d.key, r.outcome
  FROM idem_dlq_replay('batch') WITH ORDINALITY AS r(id, outcome, ord)
  JOIN idem_dead_letters AS d USING (id) ORDER BY r.ord;
-- a consumer with nothing pending
SELECT * FROM idem_dlq_replay('tenant');

--
-- Discard
--
SELECT id AS b3 FROM idem_dead_letters WHERE key = 'b-3' \gset
SELECT idem_dlq_discard(:b3, 'amount exceeds any balance; refunded by hand, ticket OPS-123');
SELECT status, resolved_by, discard_reason, resolved_at >= first_failed_at AS resolved_after_failure
  FROM idem_dead_letters WHERE id = :b3;
-- the key stays recorded: a redelivery is still dead_lettered and runs nothing
SELECT idem_try_apply('b-3', 'batch', 'update wallets set balance = balance - $1 where id = 2', ARRAY['1000']);
SELECT idem_is_processed('b-3', 'batch');
SELECT balance FROM wallets WHERE id = 2;
\t on
SELECT dlq_error(format('SELECT idem_dlq_discard(%s, %L)', :b3, 'again'));
SELECT dlq_error(format('SELECT idem_dlq_replay(%s)', :b3));
SELECT dlq_error(format('SELECT idem_dlq_replay(%s)', :ship1));
SELECT dlq_error(format('SELECT idem_dlq_discard(%s, %L)', :ship1, 'too late'));
SELECT dlq_error(format('SELECT idem_dlq_discard(%s, NULL)', :flaky1));
SELECT dlq_error(format('SELECT idem_dlq_discard(%s, %L)', :flaky1, ''));
SELECT dlq_error(format('SELECT idem_dlq_discard(%s, repeat(%L, 1025))', :flaky1, 'r'));
\t off

-- idem_forget refuses a key whose entry is pending, and forgets a resolved
-- entry with its key
SELECT idem_try_apply('f-1', 'forgetting', 'select fails_with($1)', ARRAY['23000']);
SELECT id AS f1 FROM idem_dead_letters WHERE key = 'f-1' \gset
SELECT dlq_error($$SELECT idem_forget('f-1', 'forgetting')$$);
SELECT idem_dlq_discard(:f1, 'sent again under a new key');
SELECT idem_forget('f-1', 'forgetting');
SELECT count(*) AS entries FROM idem_dead_letters WHERE key = 'f-1';
SELECT idem_try_apply('f-1', 'forgetting', 'select 1');

--
-- Privileges
--
CREATE ROLE dlq_app;
-- an operator is a member of the consumer's owner, with its privileges
-- (a member without them, NOINHERIT, is refused: sql/membership.sql)
CREATE ROLE dlq_oncall IN ROLE dlq_app;
CREATE ROLE dlq_outsider;
CREATE TABLE inventory (sku text PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0));
INSERT INTO inventory VALUES ('a', 0);
GRANT SELECT, UPDATE ON inventory TO dlq_app;
-- the consumer role, which creates its consumer by using it
GRANT EXECUTE ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_consumer_create(text, regrole) TO dlq_app;
-- the documented operator grants
GRANT EXECUTE ON FUNCTION idem_dlq_replay(bigint), idem_dlq_replay(text, integer),
                          idem_dlq_discard(bigint, text) TO dlq_oncall;
GRANT SELECT ON idem_dead_letters TO dlq_oncall;

SET ROLE dlq_app;
SELECT idem_try_apply('p-1', 'inventory', 'update inventory set qty = qty - $1 where sku = $2', ARRAY['5', 'a']);
SELECT idem_try_apply('p-2', 'inventory', 'update inventory set qty = qty - $1 where sku = $2', ARRAY['5', 'a']);
-- a consumer can neither read nor resolve its dead letters
SELECT dlq_error('SELECT count(*) FROM idem_dead_letters');
SELECT dlq_error('SELECT count(*) FROM idem_consumer.dead_letters');
SELECT dlq_error('SELECT idem_dlq_replay(1)');
SELECT dlq_error($$SELECT * FROM idem_dlq_replay('inventory')$$);
SELECT dlq_error($$SELECT idem_dlq_discard(1, 'no')$$);
RESET ROLE;
SET ROLE dlq_outsider;
SELECT dlq_error($$SELECT idem_try_apply('p-3', 'inventory', 'select 1')$$);
RESET ROLE;
-- with EXECUTE and SELECT, a role that is no member of the owner is
-- refused the consumer and sees none of its entries
GRANT EXECUTE ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
                          idem_dlq_replay(bigint), idem_dlq_discard(bigint, text) TO dlq_outsider;
GRANT SELECT ON idem_dead_letters TO dlq_outsider;
SET ROLE dlq_outsider;
SELECT dlq_error($$SELECT idem_try_apply('p-3', 'inventory', 'select 1')$$);
SELECT count(*) AS entries_seen FROM idem_dead_letters WHERE consumer = 'inventory';
RESET ROLE;
SELECT id AS p1_outsider FROM idem_dead_letters WHERE key = 'p-1' \gset
SET ROLE dlq_outsider;
SELECT dlq_error('SELECT idem_dlq_replay(' || :p1_outsider || ')');
SELECT dlq_error('SELECT idem_dlq_discard(' || :p1_outsider || ', ''no'')');
RESET ROLE;

UPDATE inventory SET qty = 8;
SET ROLE dlq_oncall;
SELECT id AS p1 FROM idem_dead_letters WHERE key = 'p-1' \gset
SELECT id AS p2 FROM idem_dead_letters WHERE key = 'p-2' \gset
SELECT key, status, dead_lettered_by FROM idem_dead_letters WHERE consumer = 'inventory' ORDER BY key;
-- a replay runs the SQL as the role that parked it, with that role's
-- privileges (sql/dead_letter_roles.sql has more)
SELECT idem_dlq_replay(:p1);
SELECT status, sqlstate, message, attempts FROM idem_dead_letters WHERE id = :p1;
SELECT idem_dlq_discard(:p2, 'duplicate order, cancelled upstream');
SELECT key, status, resolved_by, discard_reason FROM idem_dead_letters WHERE consumer = 'inventory' ORDER BY key;
RESET ROLE;
SELECT qty FROM inventory;

DROP OWNED BY dlq_app;
DROP OWNED BY dlq_oncall;
DROP OWNED BY dlq_outsider;
DROP ROLE dlq_app;
DROP ROLE dlq_oncall;
DROP ROLE dlq_outsider;
