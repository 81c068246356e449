--
-- Typed parameters: a driver that binds each value with its own type
-- passes them in params through their types' output functions,
-- ARRAY[$4::text, $5::text] (docs/clients.md).  The business SQL reads
-- each back with its parameter's type, and the fingerprint is of the
-- values as the SQL binds them, so a redelivery written another way is
-- the same message.
--
CREATE FUNCTION typed_v_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
    state text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
    RETURN state;
END
$f$;
CREATE TABLE typed_v (n int GENERATED ALWAYS AS IDENTITY, amount numeric, at timestamptz, note text, id bigint);
\set ins 'insert into typed_v (amount, at, note, id) values ($1, $2, $3, $4)'

-- mixed types in one call; a redelivery written another way is a duplicate
SELECT idem_apply('v-1', 'typed-v', :'ins',
                  ARRAY[10.0::text, timestamptz '2026-01-01 10:00:00+01'::text, 'first', 7::text]);
SELECT idem_apply('v-1', 'typed-v', :'ins',
                  ARRAY[10.00::numeric::text, timestamptz '2026-01-01 09:00:00+00'::text, 'first', 7::bigint::text]);
SELECT typed_v_error($$SELECT idem_apply('v-1', 'typed-v', 'insert into typed_v (amount, at, note, id) values ($1, $2, $3, $4)', ARRAY[10.01::text, now()::text, 'first', 7::text])$$);
-- the values written as text by hand are the same message
SELECT idem_apply('v-1', 'typed-v', :'ins', ARRAY['10', '2026-01-01 09:00:00+00', 'first', '7']);

-- NULLs stay NULL
SELECT idem_apply('v-2', 'typed-v', :'ins', ARRAY['2.5', '2026-02-01 00:00:00+00', NULL, '8']);
SELECT idem_apply('v-2', 'typed-v', :'ins', ARRAY[2.50::text, '2026-02-01 00:00:00+00', NULL::text, 8::text]);

-- the wrong number of parameters fails, recording nothing
SELECT typed_v_error($$SELECT idem_apply('v-5', 'typed-v', 'insert into typed_v (amount) values ($1)', ARRAY[1::text, 2::text])$$);
SELECT typed_v_error($$SELECT idem_apply('v-5', 'typed-v', 'insert into typed_v (amount) values ($1)')$$);
SELECT idem_is_processed('v-5', 'typed-v');

-- idem_try_apply parks a failing message; its replay binds the same
-- values, under the TimeZone and DateStyle it was parked with
CREATE TABLE typed_v_ship (order_id bigint PRIMARY KEY, at timestamptz, CHECK (order_id < 0));
SELECT idem_try_apply('s-1', 'typed-v', 'insert into typed_v_ship values ($1, $2)',
                      ARRAY[41::text, timestamptz '2026-03-01 12:00:00+05'::text]);
SELECT idem_try_apply('s-1', 'typed-v', 'insert into typed_v_ship values ($1, $2)',
                      ARRAY[41::bigint::text, timestamptz '2026-03-01 07:00:00+00'::text]);
SELECT sqlstate, params FROM idem_dead_letters WHERE consumer = 'typed-v';
ALTER TABLE typed_v_ship DROP CONSTRAINT typed_v_ship_order_id_check;
SET TimeZone = 'Asia/Tokyo';
SET DateStyle = 'SQL, DMY';
SELECT outcome FROM idem_dlq_replay('typed-v');
RESET TimeZone;
RESET DateStyle;
SELECT order_id, at = timestamptz '2026-03-01 07:00:00+00' AS same_instant FROM typed_v_ship;
SELECT idem_try_apply('s-2', 'typed-v', 'insert into typed_v_ship values ($1, $2)',
                      ARRAY[42::text, NULL::timestamptz::text]);

SELECT n, amount, at, note, id FROM typed_v ORDER BY n;

-- the same through a prepared statement, the way a driver sends it: each
-- $n cast to text in the call, NULL kept
PREPARE typed_call(text, numeric, timestamptz, text, bigint) AS
    SELECT idem_apply($1, 'typed-v', 'insert into typed_v (amount, at, note, id) values ($1, $2, $3, $4)',
                      ARRAY[$2::text, $3::text, $4::text, $5::text]);
EXECUTE typed_call('v-6', 6.5, '2026-04-01 00:00:00+00', NULL, 9);
EXECUTE typed_call('v-6', 6.50, '2026-04-01 02:00:00+02', NULL, 9);
SELECT amount, at, note IS NULL AS note_is_null, id FROM typed_v WHERE id = 9;
DEALLOCATE typed_call;

-- every value reaches its own parameter, read in place from the array:
-- NULLs past the first byte of its null bitmap, and values as long as
-- and longer than the buffer they are copied to for the input function
CREATE TABLE typed_w (a text, b int, c text, d text, e int, f text, g text, h int, i text, j text, k text);
\set w_ins 'insert into typed_w values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)'
SELECT idem_apply('w-1', 'typed-v', :'w_ins',
                  ARRAY[repeat('a', 127), '2', NULL, repeat('d', 128), '5', NULL, 'g', '8', repeat('i', 3000), NULL, 'k']);
SELECT length(a) AS a, b, c, length(d) AS d, e, f, g, h, length(i) AS i, j, k,
       a = repeat('a', 127) AND d = repeat('d', 128) AND i = repeat('i', 3000) AS texts_intact
  FROM typed_w;
-- a redelivery of it is a duplicate: the fingerprint saw the same values
SELECT idem_apply('w-1', 'typed-v', :'w_ins',
                  ARRAY[repeat('a', 127), '2', NULL, repeat('d', 128), '5', NULL, 'g', '8', repeat('i', 3000), NULL, 'k']);
SELECT typed_v_error(format('SELECT idem_apply(%L, %L, %L, %L::text[])', 'w-1', 'typed-v', :'w_ins',
                            ARRAY[repeat('a', 127), '2', NULL, repeat('d', 128), '5', NULL, 'g', '8', repeat('i', 2999), NULL, 'k']));
DROP TABLE typed_w;

DROP TABLE typed_v, typed_v_ship;
DROP FUNCTION typed_v_error(text);
