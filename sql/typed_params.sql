--
-- Typed parameters: idem_apply_v and idem_try_apply_v take the values with
-- their own types (mixed, as drivers bind them), behave as idem_apply and
-- idem_try_apply, and fingerprint the values as the SQL binds them.
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
SELECT idem_apply_v('v-1', 'typed-v', :'ins', 10.0, timestamptz '2026-01-01 10:00:00+01', 'first', 7);
SELECT idem_apply_v('v-1', 'typed-v', :'ins', 10.00::numeric, timestamptz '2026-01-01 09:00:00+00', 'first', 7::bigint);
SELECT typed_v_error($$SELECT idem_apply_v('v-1', 'typed-v', 'insert into typed_v (amount, at, note, id) values ($1, $2, $3, $4)', 10.01, now(), 'first', 7)$$);
-- the text[] form of the same message is the same message
SELECT idem_apply('v-1', 'typed-v', :'ins', ARRAY['10', '2026-01-01 09:00:00+00', 'first', '7']);

-- unknown literals arrive as text; NULLs as NULL
SELECT idem_apply_v('v-2', 'typed-v', :'ins', '2.5', '2026-02-01 00:00:00+00', NULL, '8');
SELECT idem_apply_v('v-2', 'typed-v', :'ins', 2.50, '2026-02-01 00:00:00+00', NULL::text, 8);

-- VARIADIC ARRAY[...] works too, and so does no parameter at all
SELECT idem_apply_v('v-3', 'typed-v', 'insert into typed_v (amount) values ($1)', VARIADIC ARRAY[3.0]);
SELECT idem_apply_v('v-3', 'typed-v', 'insert into typed_v (amount) values ($1)', VARIADIC ARRAY[3]);
SELECT idem_apply_v('v-4', 'typed-v', 'insert into typed_v (note) values (''none'')');
SELECT idem_apply_v('v-4', 'typed-v', 'insert into typed_v (note) values (''none'')');

-- the wrong number of parameters fails as with idem_apply, recording nothing
SELECT typed_v_error($$SELECT idem_apply_v('v-5', 'typed-v', 'insert into typed_v (amount) values ($1)', 1, 2)$$);
SELECT typed_v_error($$SELECT idem_apply('v-5', 'typed-v', 'insert into typed_v (amount) values ($1)', ARRAY['1', '2'])$$);
SELECT typed_v_error($$SELECT idem_apply_v('v-5', 'typed-v', 'insert into typed_v (amount) values ($1)')$$);
SELECT idem_is_processed('v-5', 'typed-v');

-- idem_try_apply_v parks a failing message; its replay binds the same values
CREATE TABLE typed_v_ship (order_id bigint PRIMARY KEY, at timestamptz, CHECK (order_id < 0));
SELECT idem_try_apply_v('s-1', 'typed-v', 'insert into typed_v_ship values ($1, $2)', 41, timestamptz '2026-03-01 12:00:00+05');
SELECT idem_try_apply_v('s-1', 'typed-v', 'insert into typed_v_ship values ($1, $2)', 41::bigint, timestamptz '2026-03-01 07:00:00+00');
SELECT sqlstate, params FROM idem_dead_letters WHERE consumer = 'typed-v';
ALTER TABLE typed_v_ship DROP CONSTRAINT typed_v_ship_order_id_check;
SET TimeZone = 'Asia/Tokyo';
SET DateStyle = 'SQL, DMY';
SELECT outcome FROM idem_dlq_replay('typed-v');
RESET TimeZone;
RESET DateStyle;
SELECT order_id, at = timestamptz '2026-03-01 07:00:00+00' AS same_instant FROM typed_v_ship;
SELECT idem_try_apply_v('s-2', 'typed-v', 'insert into typed_v_ship values ($1, $2)', 42, NULL::timestamptz);

SELECT n, amount, at, note, id FROM typed_v ORDER BY n;

-- not open to PUBLIC, as idem_apply
SELECT has_function_privilege('public', 'idem_apply_v(text, text, text, "any")', 'EXECUTE'),
       has_function_privilege('public', 'idem_try_apply_v(text, text, text)', 'EXECUTE');

DROP TABLE typed_v, typed_v_ship;
DROP FUNCTION typed_v_error(text);
