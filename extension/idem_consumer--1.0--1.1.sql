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
-- Owners of consumers (src/consumers.c, keystore.c).
--
-- Every consumer has an owner role; only members of it (and superusers)
-- act on the consumer: record or forget its keys, replay or discard its
-- dead letters, purge it, change its settings, reset its counters.  A
-- consumer first used by idem_apply and friends is owned by the role that
-- used it.  Consumers created under 1.0 have no owner (NULL) and keep
-- working for every role with EXECUTE on the API, as in 1.0, until a
-- superuser gives them one with idem_consumer_set_owner().
--
-- The owner is a regrole so that pg_dump writes it by name and a restore
-- into another cluster finds the same role.
--
ALTER TABLE idem_consumer.consumers ADD COLUMN owner regrole;
COMMENT ON COLUMN idem_consumer.consumers.owner IS
    'role whose members may act on the consumer; NULL for consumers created under 1.0, open to every role with EXECUTE';

CREATE FUNCTION idem_consumer_create(consumer text, owner regrole DEFAULT current_user::regrole)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_consumer_create'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_consumer_create(text, regrole) IS
    'create a consumer owned by owner (the current role when NULL)';

CREATE FUNCTION idem_consumer_set_owner(consumer text, owner regrole)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_consumer_set_owner'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_consumer_set_owner(text, regrole) IS
    'give a consumer to another owner; for members of the present owner and superusers';

REVOKE ALL ON FUNCTION idem_consumer_create(text, regrole) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_consumer_set_owner(text, regrole) FROM PUBLIC;

-- The views that show keys and messages show the consumers the current
-- role may act on only.
CREATE OR REPLACE VIEW idem_processed_keys AS
    SELECT c.name AS consumer,
           k.key,
           timestamptz '2000-01-01 00:00:00+00'
               OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => k.processed_at)
               AS processed_at
      FROM (SELECT consumer_id, processed_at, key
              FROM idem_consumer.processed_keys
            UNION ALL
            SELECT consumer_id, processed_at, key
              FROM idem_consumer.key_collisions) AS k
      JOIN idem_consumer.consumers AS c USING (consumer_id)
     WHERE c.owner IS NULL OR pg_catalog.pg_has_role(c.owner, 'MEMBER');

CREATE OR REPLACE VIEW idem_dead_letters AS
    SELECT d.dead_letter_id AS id,
           c.name AS consumer,
           d.key,
           d.status,
           d.sqlstate,
           d.message,
           d.detail,
           d.hint,
           d.context,
           d.attempts,
           d.first_failed_at,
           d.last_failed_at,
           d.event_time,
           d.sql,
           d.params,
           d.settings,
           d.dead_lettered_by,
           d.resolved_at,
           d.resolved_by,
           d.discard_reason
      FROM idem_consumer.dead_letters AS d
      JOIN idem_consumer.consumers AS c USING (consumer_id)
     WHERE c.owner IS NULL OR pg_catalog.pg_has_role(c.owner, 'MEMBER');

-- idem_consumers gains the owner of each consumer (NULL: created under 1.0).
CREATE OR REPLACE VIEW idem_consumers AS
    SELECT c.name AS consumer,
           c.created_at,
           keys.keys_stored,
           keys.oldest_processed_at,
           keys.newest_processed_at,
           dlq.dead_letters_pending,
           dlq.oldest_pending_age,
           c.owner
      FROM idem_consumer.consumers AS c
     CROSS JOIN LATERAL (
           SELECT pg_catalog.count(*) AS keys_stored,
                  timestamptz '2000-01-01 00:00:00+00'
                      OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => pg_catalog.min(k.processed_at))
                      AS oldest_processed_at,
                  timestamptz '2000-01-01 00:00:00+00'
                      OPERATOR(pg_catalog.+) pg_catalog.make_interval(secs => pg_catalog.max(k.processed_at))
                      AS newest_processed_at
             FROM (SELECT processed_at FROM idem_consumer.processed_keys
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id
                   UNION ALL
                   SELECT processed_at FROM idem_consumer.key_collisions
                    WHERE consumer_id OPERATOR(pg_catalog.=) c.consumer_id) AS k) AS keys
     CROSS JOIN LATERAL (
           SELECT pg_catalog.count(*) AS dead_letters_pending,
                  pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(d.first_failed_at)
                      AS oldest_pending_age
             FROM idem_consumer.dead_letters AS d
            WHERE d.consumer_id OPERATOR(pg_catalog.=) c.consumer_id
              AND d.status OPERATOR(pg_catalog.=) 'pending') AS dlq;
