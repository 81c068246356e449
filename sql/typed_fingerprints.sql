--
-- Typed fingerprints: a redelivery whose parameters write the same values
-- another way (10.0 and 10.00, a timestamptz with another offset, jsonb
-- with keys in another order) is a duplicate, not a reused key; values
-- that differ are still refused (IK001), text compared as text.
--
CREATE FUNCTION typed_error(stmt text) RETURNS text LANGUAGE plpgsql AS $f$
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
CREATE TABLE typed_log (n int GENERATED ALWAYS AS IDENTITY, v text);
\set put 'insert into typed_log (v) values ($1::text)'

-- numeric: 10.0 and 10.00 are equal
SELECT idem_apply('num', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['10.0']);
SELECT idem_apply('num', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['10.00']);
SELECT typed_error($$SELECT idem_apply('num', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['10.01'])$$);

-- timestamptz: one instant written with two offsets
SELECT idem_apply('ts', 'typed', 'insert into typed_log (v) select $1::timestamptz', ARRAY['2026-01-01 10:00:00+01']);
SELECT idem_apply('ts', 'typed', 'insert into typed_log (v) select $1::timestamptz', ARRAY['2026-01-01 09:00:00+00']);
SELECT typed_error($$SELECT idem_apply('ts', 'typed', 'insert into typed_log (v) select $1::timestamptz', ARRAY['2026-01-01 10:00:00+00'])$$);

-- jsonb: key order and whitespace do not matter, values do
SELECT idem_apply('js', 'typed', 'insert into typed_log (v) select $1::jsonb', ARRAY['{"a": 1, "b": [1, 2]}']);
SELECT idem_apply('js', 'typed', 'insert into typed_log (v) select $1::jsonb', ARRAY['{"b":[1,2],"a":1}']);
SELECT typed_error($$SELECT idem_apply('js', 'typed', 'insert into typed_log (v) select $1::jsonb', ARRAY['{"b":[2,1],"a":1}'])$$);

-- text is compared as text: any other spelling is another message
SELECT idem_apply('tx', 'typed', :'put', ARRAY['10.0']);
SELECT idem_apply('tx', 'typed', :'put', ARRAY['10.0']);
SELECT typed_error($$SELECT idem_apply('tx', 'typed', 'insert into typed_log (v) values ($1::text)', ARRAY['10.00'])$$);
SELECT typed_error($$SELECT idem_apply('tx', 'typed', 'insert into typed_log (v) values ($1::text)', ARRAY['10.0 '])$$);

-- NULL and '' differ, as before
SELECT idem_apply('nul', 'typed', :'put', ARRAY[NULL]);
SELECT idem_apply('nul', 'typed', :'put', ARRAY[NULL]);
SELECT typed_error($$SELECT idem_apply('nul', 'typed', 'insert into typed_log (v) values ($1::text)', ARRAY[''])$$);

-- arrays hash by their elements' equality
SELECT idem_apply('arr', 'typed', 'insert into typed_log (v) select $1::numeric[]', ARRAY['{1.5,2}']);
SELECT idem_apply('arr', 'typed', 'insert into typed_log (v) select $1::numeric[]', ARRAY['{1.50, 2.0}']);
SELECT typed_error($$SELECT idem_apply('arr', 'typed', 'insert into typed_log (v) select $1::numeric[]', ARRAY['{2,1.5}'])$$);

-- a type with no hash support (point) goes by its binary form
SELECT idem_apply('pt', 'typed', 'insert into typed_log (v) select $1::point', ARRAY['(1,2)']);
SELECT idem_apply('pt', 'typed', 'insert into typed_log (v) select $1::point', ARRAY[' ( 1.0 , 2.00 ) ']);
SELECT typed_error($$SELECT idem_apply('pt', 'typed', 'insert into typed_log (v) select $1::point', ARRAY['(2,1)'])$$);

-- the parameter's type is part of the message: a SQL text that binds
-- another type is another SQL text anyway, and the count of params too
SELECT typed_error($$SELECT idem_apply('num', 'typed', 'insert into typed_log (v) select $1::numeric', NULL)$$);

-- idem_try_apply fingerprints alike: a redelivery written another way is
-- a duplicate, another value is parked as reused
SELECT idem_try_apply('try', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['7.50']);
SELECT idem_try_apply('try', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['7.5']);
SELECT idem_try_apply('try', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['7.6']);
SELECT sqlstate FROM idem_dead_letters WHERE consumer = 'typed' AND key = 'try';
-- and the same call made with idem_apply meets the same fingerprint
SELECT idem_apply('try', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['7.500']);
-- a message idem_try_apply cannot bind is parked; its redelivery is a
-- duplicate of the parked message
SELECT idem_try_apply('bad', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['ten']);
SELECT idem_try_apply('bad', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['ten']);
SELECT sqlstate FROM idem_dead_letters WHERE consumer = 'typed' AND key = 'bad';

-- a bad value still records nothing
SELECT typed_error($$SELECT idem_apply('bad2', 'typed', 'insert into typed_log (v) select $1::numeric', ARRAY['ten'])$$);
SELECT idem_is_processed('bad2', 'typed');

-- each applied message ran once
SELECT n, v FROM typed_log ORDER BY n;

DROP TABLE typed_log;
DROP FUNCTION typed_error(text);
