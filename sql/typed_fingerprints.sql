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

-- json is compared as the jsonb it means: two drivers writing one object
-- with other spacing or key order send one message; a value with a \u
-- escape, which jsonb may refuse, is compared as written
SELECT idem_apply('jn', 'typed', 'insert into typed_log (v) select $1::json', ARRAY['{"a": 1, "b": [1, 2]}']);
SELECT idem_apply('jn', 'typed', 'insert into typed_log (v) select $1::json', ARRAY['{"b":[1,2],"a":1}']);
SELECT typed_error($$SELECT idem_apply('jn', 'typed', 'insert into typed_log (v) select $1::json', ARRAY['{"b":[2,1],"a":1}'])$$);
SELECT idem_apply('ju', 'typed', 'insert into typed_log (v) select $1::json', ARRAY['{"s": "\u0000"}']);
SELECT idem_apply('ju', 'typed', 'insert into typed_log (v) select $1::json', ARRAY['{"s": "\u0000"}']);
SELECT typed_error($$SELECT idem_apply('ju', 'typed', 'insert into typed_log (v) select $1::json', ARRAY['{"s":"\u0000"}'])$$);

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

-- how a parameter type is hashed is kept with the plan and looked up again
-- after DDL that changes it.  A composite type hashes by its columns'
-- hash functions while they all have one; a column without one (point)
-- makes it hash by its binary form from the next call on
CREATE TYPE typed_pair AS (a int);
SELECT idem_apply('pair', 'typed', 'insert into typed_log (v) select $1::typed_pair', ARRAY['(1)']);
ALTER TYPE typed_pair ADD ATTRIBUTE b point;
SELECT idem_apply('pair2', 'typed', 'insert into typed_log (v) select $1::typed_pair', ARRAY['(1,"(1,2)")']);
SELECT idem_apply('pair2', 'typed', 'insert into typed_log (v) select $1::typed_pair', ARRAY['(1,"(1.0,2.00)")']);
SELECT typed_error($$SELECT idem_apply('pair2', 'typed', 'insert into typed_log (v) select $1::typed_pair', ARRAY['(1,"(2,1)")'])$$);
-- a default hash operator class made for point is used by the next call
-- of a SQL text whose plan hashed points by their binary form, and no
-- longer once it is dropped
CREATE FUNCTION typed_point_hash(point) RETURNS int LANGUAGE sql IMMUTABLE
    AS 'SELECT hashfloat8($1[0]) # hashfloat8($1[1])';
CREATE FUNCTION typed_point_hash_ext(p point, seed bigint) RETURNS bigint
    LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
    RAISE NOTICE 'point hashed by typed_point_hash_ext';
    RETURN hashfloat8extended(p[0], seed) # hashfloat8extended(p[1], seed);
END
$f$;
CREATE OPERATOR CLASS typed_point_hash_ops DEFAULT FOR TYPE point USING hash AS
    OPERATOR 1 ~= (point, point),
    FUNCTION 1 typed_point_hash(point),
    FUNCTION 2 typed_point_hash_ext(point, bigint);
SELECT idem_apply('pt2', 'typed', 'insert into typed_log (v) select $1::point', ARRAY['(3,4)']);
SELECT idem_apply('pt2', 'typed', 'insert into typed_log (v) select $1::point', ARRAY['(3.0,4.0)']);
DROP OPERATOR FAMILY typed_point_hash_ops USING hash;
SELECT idem_apply('pt', 'typed', 'insert into typed_log (v) select $1::point', ARRAY['(1,2)']);

DROP TYPE typed_pair;
DROP FUNCTION typed_point_hash(point);
DROP FUNCTION typed_point_hash_ext(point, bigint);

DROP TABLE typed_log;
DROP FUNCTION typed_error(text);
