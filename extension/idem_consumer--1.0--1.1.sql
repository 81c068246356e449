/* extension/idem_consumer--1.0--1.1.sql */

-- complain if script is sourced in psql, rather than via ALTER EXTENSION
\echo Use "ALTER EXTENSION idem_consumer UPDATE TO '1.1'" to load this file. \quit

--
-- Version 1.1.  A fresh CREATE EXTENSION runs idem_consumer--1.0.sql and
-- then this script, so a new install and an upgraded 1.0 database have the
-- same objects by construction; the upgrade test compares their catalogs.
-- idem_consumer--1.0.sql is released and never changes.
--
