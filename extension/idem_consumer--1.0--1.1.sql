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

--
-- Key reuse (src/fingerprint.c, keystore.c).
--
-- Every recorded key keeps a 32-bit fingerprint of its message: a hash of
-- the business SQL and its parameters, or of the caller's own fingerprint
-- text.  A redelivery with the same key and another fingerprint is not a
-- duplicate but a producer's bug, and is refused (SQLSTATE IK001) instead
-- of being silently skipped.  NULL: not known (keys recorded under 1.0, or
-- while the consumer's check is off); such keys are never compared.
--
ALTER TABLE idem_consumer.processed_keys ADD COLUMN fingerprint integer;
ALTER TABLE idem_consumer.key_collisions ADD COLUMN fingerprint integer;
ALTER TABLE idem_consumer.consumers
    ADD COLUMN check_fingerprint boolean NOT NULL DEFAULT true;
COMMENT ON COLUMN idem_consumer.consumers.check_fingerprint IS
    'whether keys of the consumer keep the fingerprint of their message and redeliveries are compared with it';

CREATE FUNCTION idem_set_fingerprint(consumer text, enabled boolean)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_set_fingerprint'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_set_fingerprint(text, boolean) IS
    'turn the key-reuse check of a consumer on or off';
REVOKE ALL ON FUNCTION idem_set_fingerprint(text, boolean) FROM PUBLIC;

-- idem_apply and idem_try_apply with the caller's own fingerprint of the
-- message, for messages whose parameters vary between deliveries.  These
-- are overloads without defaults, so that every call of the 1.0 functions
-- (and every GRANT naming them) means what it meant: only a call that
-- passes all six arguments reaches them.
CREATE FUNCTION idem_apply(key text, consumer text, sql text, params text[],
                           event_time timestamptz, fingerprint text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text) IS
    'idem_apply with the fingerprint of the message given by the caller';
REVOKE ALL ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text) FROM PUBLIC;

CREATE FUNCTION idem_try_apply(key text, consumer text, sql text, params text[],
                               event_time timestamptz, fingerprint text)
RETURNS idem_outcome
AS 'MODULE_PATHNAME', 'idem_try_apply'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text) IS
    'idem_try_apply with the fingerprint of the message given by the caller';
REVOKE ALL ON FUNCTION idem_try_apply(text, text, text, text[], timestamptz, text) FROM PUBLIC;

-- A batch with the fingerprints of its messages, aligned with the keys:
-- each new key once (reused = false), and each key recorded before with
-- another fingerprint (reused = true), which is not recorded again.
CREATE FUNCTION idem_record_batch(consumer text, keys text[], fingerprints text[])
RETURNS TABLE (key text, reused boolean)
AS 'MODULE_PATHNAME', 'idem_record_batch_fingerprinted'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION idem_record_batch(text, text[], text[]) IS
    'record every key of a batch with the fingerprint of its message; returns the new keys and the reused ones';
REVOKE ALL ON FUNCTION idem_record_batch(text, text[], text[]) FROM PUBLIC;
