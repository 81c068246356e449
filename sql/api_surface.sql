--
-- The API: every function a fresh install puts in the public schema, with
-- its arguments and result as pg_proc has them, so that any change to the
-- surface shows here.  At most 35, one per name but for overloads on the
-- type of the first arguments, and none suffixed for a variant (_routed,
-- _v, _rows): a variant is a trailing argument with a default.
-- In a database of its own.
--
SELECT current_database() AS regression_db \gset
CREATE DATABASE idem_api_surface;
\c idem_api_surface
SET client_min_messages = warning;
CREATE EXTENSION idem_consumer;
\pset format unaligned
SELECT p.proname AS function,
       pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result
  FROM pg_proc AS p
 WHERE p.pronamespace = 'public'::regnamespace
 ORDER BY p.proname, pg_get_function_identity_arguments(p.oid);
\pset format aligned
SELECT count(*) AS functions, count(*) <= 35 AS at_most_35,
       count(*) FILTER (WHERE proname ~ '_(routed|v|rows)$') AS suffixed
  FROM pg_proc WHERE pronamespace = 'public'::regnamespace;
-- the functions the views read are not the API: they are in the
-- extension's own schema
SELECT p.oid::regprocedure AS view_function
  FROM pg_proc AS p
 WHERE p.proname IN ('idem_stats_internal', 'idem_stats_internal_1_1', 'idem_stats_info_internal')
 ORDER BY p.proname COLLATE "C";
SELECT count(*) AS stats_rows_readable FROM idem_stats;
\c :regression_db
DROP DATABASE idem_api_surface;
