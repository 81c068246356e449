--
-- Bad input: each call fails with its own SQLSTATE and records nothing.
--
-- show_error runs a statement and shows the SQLSTATE, message, detail and
-- hint of its error.
CREATE FUNCTION show_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    state text;
    message text;
    detail text;
    hint text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                            detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RETURN state || ' ' || message
        || coalesce(E'\nDETAIL: ' || nullif(detail, ''), '')
        || coalesce(E'\nHINT: ' || nullif(hint, ''), '');
END
$f$;
\t on
CREATE TABLE accounts (id bigint PRIMARY KEY, balance numeric NOT NULL DEFAULT 0);
INSERT INTO accounts VALUES (1, 0);

-- key
SELECT show_error($$SELECT idem_apply(NULL, 'c', 'select 1')$$);
SELECT show_error($$SELECT idem_apply('', 'c', 'select 1')$$);
SELECT show_error($$SELECT idem_apply(repeat('k', 1025), 'c', 'select 1')$$);
SELECT idem_apply(repeat('k', 1024), 'c', 'select 1') AS longest_key_accepted;
-- consumer
SELECT show_error($$SELECT idem_apply('k', NULL, 'select 1')$$);
SELECT show_error($$SELECT idem_apply('k', '', 'select 1')$$);
SELECT show_error($$SELECT idem_apply('k', repeat('c', 129), 'select 1')$$);
SELECT show_error($$SELECT idem_is_processed('k', NULL)$$);
SELECT show_error($$SELECT idem_forget(NULL, 'c')$$);
-- sql
SELECT show_error($$SELECT idem_apply('k1', 'c', NULL)$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', '')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', '  ;  -- nothing')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = 1; update accounts set balance = 2')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'updte accounts set balance = 1')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update no_such_table set x = 1')$$);
-- transaction control and statements that cannot run inside a function
SELECT show_error($$SELECT idem_apply('k1', 'c', 'commit')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'rollback')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'savepoint s')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'vacuum accounts')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'create table t (a int)')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'select 1 into new_table')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'copy accounts to stdout')$$);
-- params
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = $1 where id = $2', ARRAY['1'])$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = $1 where id = 1', ARRAY['1', '2'])$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = 1 where id = 1', ARRAY['1'])$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = $1 where id = $2')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = $1 where id = $2', ARRAY['ten', '1'])$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = $1 where id = $2', ARRAY['1', '99999999999999999999'])$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'update accounts set balance = $1 where id = $2', ARRAY[ARRAY['1', '1']])$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'select $2::int')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'select 1 where $1 is null', ARRAY['x'])$$);
-- event_time
SELECT show_error($$SELECT idem_apply('k1', 'c', 'select 1', NULL, 'infinity')$$);
SELECT show_error($$SELECT idem_apply('k1', 'c', 'select 1', NULL, '-infinity')$$);

\t off
-- nothing above recorded a key or changed the table (but the long key)
SELECT key FROM idem_processed_keys WHERE consumer = 'c' AND key <> repeat('k', 1024);
SELECT * FROM accounts;

-- the same bad calls inside a transaction that catches the errors record nothing
DO $$
DECLARE
    bad text[] := ARRAY[
        'update accounts set balance = $1 where id = $2',
        'commit',
        'update accounts set balance = 1; select 1'];
    s text;
BEGIN
    FOREACH s IN ARRAY bad LOOP
        BEGIN
            PERFORM idem_apply('k-caught', 'c', s, ARRAY['x', '1']);
        EXCEPTION WHEN OTHERS THEN
            RAISE NOTICE '% %', SQLSTATE, SQLERRM;
        END;
    END LOOP;
END $$;
SELECT idem_is_processed('k-caught', 'c');

-- a syntax error points into the business SQL
SELECT idem_apply('k1', 'c', 'update accounts set balance = 1 wher id = 1');
-- a value that does not parse names its parameter
SELECT idem_apply('k1', 'c', 'update accounts set balance = $1 where id = $2', ARRAY['1', '1.5']);
