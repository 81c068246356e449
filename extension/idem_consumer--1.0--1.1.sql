/* extension/idem_consumer--1.0--1.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem_consumer UPDATE TO '1.1'" to load this file. \quit

--
-- Version 1.1.  A fresh CREATE EXTENSION runs idem_consumer--1.0.sql and
-- then this script, so a new install and an upgraded 1.0 database have the
-- same objects by construction; the upgrade test compares their catalogs.
-- idem_consumer--1.0.sql is released and never changes.
--

--
-- Dead-letter replays run the stored SQL as the role that parked it
-- (src/replay_role.c), so each entry records that role.  Entries parked
-- before this version get the role their dead_lettered_by names, if it
-- still exists; a replay of an entry without a role is refused.  regrole
-- is dumped as the role's name, so a restored database maps it to the
-- role of that name.
--
ALTER TABLE idem_consumer.dead_letters ADD COLUMN dead_lettered_role regrole;
UPDATE idem_consumer.dead_letters AS d
   SET dead_lettered_role = r.oid
  FROM pg_catalog.pg_roles AS r
 WHERE r.rolname OPERATOR(pg_catalog.=) d.dead_lettered_by;
COMMENT ON COLUMN idem_consumer.dead_letters.dead_lettered_role IS
    'role that ran idem_try_apply; a replay runs sql as this role, for members of it only';
