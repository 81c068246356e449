--
-- Settings made by business SQL end with it: every call that runs business
-- SQL (idem_apply, idem_try_apply, idem_dlq_replay, idem_effect_complete)
-- runs it at a GUC nesting level of its own and undoes whatever it set,
-- with set_config(..., false) as well as set_config(..., true).  Before,
-- set_config('search_path', 'evil', false) in business SQL stayed in the
-- caller's session.
--
CREATE SCHEMA bss_evil;
CREATE TABLE bss_log (k text NOT NULL);
SET search_path = public;
SET TimeZone = 'UTC';

-- session-wide: the caller's settings are back once the call returns
SELECT idem_apply('s1', 'bss', 'select set_config(''search_path'', ''bss_evil'', false)');
SHOW search_path;
-- the business SQL itself ran with its setting, to the end of its statement
SELECT idem_apply('s2', 'bss',
    'insert into bss_log select current_setting(''search_path'') from (select set_config(''search_path'', ''bss_evil'', false)) s');
SELECT k FROM bss_log;
SHOW search_path;
-- local to the caller's transaction: undone at the end of the business SQL
-- too, not at the end of the transaction
BEGIN;
SELECT idem_apply('s3', 'bss', 'select set_config(''search_path'', ''bss_evil'', true)');
SHOW search_path;
SELECT idem_apply('s4', 'bss', 'select set_config(''TimeZone'', ''Asia/Tokyo'', true)');
SHOW TimeZone;
COMMIT;
-- a caller's own SET LOCAL before the call is kept
BEGIN;
SET LOCAL TimeZone = 'Europe/Paris';
SELECT idem_apply('s5', 'bss', 'select set_config(''TimeZone'', ''Asia/Tokyo'', false)');
SHOW TimeZone;
COMMIT;
SHOW TimeZone;
-- a custom setting does not leak either
SELECT idem_apply('s6', 'bss', 'select set_config(''bss.tenant'', ''other'', false)');
SELECT current_setting('bss.tenant', true) IS NULL OR current_setting('bss.tenant', true) = '' AS tenant_unset;

-- idem_try_apply, applied and dead-lettered
SELECT idem_try_apply('t1', 'bss', 'select set_config(''search_path'', ''bss_evil'', false)');
SHOW search_path;
SELECT idem_try_apply('t2', 'bss',
    'insert into bss_log select 1/0 from (select set_config(''search_path'', ''bss_evil'', false)) s');
SHOW search_path;

-- a replay
UPDATE idem_consumer.dead_letters
   SET sql = 'select set_config(''search_path'', ''bss_evil'', false)'
 WHERE dead_letter_id = (SELECT id FROM idem_dead_letters WHERE consumer = 'bss' AND key = 't2');
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE consumer = 'bss' AND key = 't2';
SHOW search_path;

-- a nested call is refused (55006) before its business SQL runs, so that
-- its setting is never made
SELECT idem_apply('n1', 'bss',
    'insert into bss_log select current_setting(''search_path'') from (select idem_apply(''n2'', ''bss'', ''select set_config(''''search_path'''', ''''bss_evil'''', false)'')) s');
SELECT k FROM bss_log ORDER BY k;
SHOW search_path;

-- the completion of an external effect that runs business SQL
SELECT action FROM idem_effect_begin('bss', 'e1');
SELECT idem_effect_complete('bss', 'e1', 1, '{}', 'select set_config(''search_path'', ''bss_evil'', false)');
SHOW search_path;

-- a plain SET in business SQL is still refused before anything runs
\set VERBOSITY sqlstate
SELECT idem_apply('s9', 'bss', 'set search_path = bss_evil');
\set VERBOSITY default
SELECT idem_is_processed('s9', 'bss') AS s9_recorded;

RESET search_path;
RESET TimeZone;
DROP TABLE bss_log;
DROP SCHEMA bss_evil;
