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

-- The views that show keys, messages and effects show the consumers the
-- current role may act on only (idem_dead_letters and idem_effects below).
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

--
-- External effects (src/effects.c, src/effects_store.c; README "External
-- effects").  A call to a payment provider, a mailer or a webhook cannot be
-- rolled back with the consumer's transaction.  An effect row per
-- (consumer, key) holds its state, a lease with a fencing token that rises
-- with every attempt, the provider key sent along as Idempotency-Key, and
-- the stored result, so that a redelivery replays the result instead of
-- calling again, and a worker whose lease was taken over cannot record an
-- outcome.  The same rows serve the transactional outbox: an effect
-- enqueued in the business transaction exists if and only if it commits.
--

-- What idem_effect_begin() tells the caller to do.
CREATE TYPE idem_effect_action AS ENUM ('execute', 'replay', 'busy', 'wait', 'dead');
COMMENT ON TYPE idem_effect_action IS
    'execute: call the provider now; replay: completed before, use result; busy: another worker holds the lease; wait: retry at retry_at; dead: attempts exhausted or failed permanently';

-- The answer of idem_effect_begin().
CREATE TYPE idem_effect AS (
    action idem_effect_action,
    fence bigint,
    provider_key text,
    attempt integer,
    outcome_unknown boolean,
    result jsonb,
    retry_at timestamptz,
    last_error text
);

-- One row per effect.  state: pending (enqueued, never claimed),
-- in_flight (leased to the holder of fence until lease_until), waiting
-- (failed retryably, due at retry_at), completed (result stored), dead.
-- fence only ever grows; attempts counts the leases handed out since the
-- effect was created or last re-armed.  Only src/effects_store.c writes
-- the table, and it keeps these rules itself: CHECK constraints here would
-- be parsed again by every insert and update of the inline cycle, which
-- cost a tenth of its time.  consumer_id has no foreign key, as in
-- processed_keys: consumers are never deleted, and the key's check would
-- lock the consumer's row at every begin (another tenth of the cycle, and
-- a multixact when two workers of a consumer begin at once).
CREATE TABLE idem_consumer.effects (
    consumer_id integer NOT NULL,
    key text COLLATE "C" NOT NULL,
    request jsonb,
    deferred boolean NOT NULL,
    state text NOT NULL,
    fence bigint NOT NULL DEFAULT 0,
    attempts integer NOT NULL DEFAULT 0,
    provider_key text NOT NULL DEFAULT pg_catalog.gen_random_uuid()::text,
    outcome_unknown boolean NOT NULL DEFAULT false,
    lease_until timestamptz,
    retry_at timestamptz,
    last_error text,
    result jsonb,
    dead_letter_id bigint,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    completed_at timestamptz,
    PRIMARY KEY (consumer_id, key)
) WITH (fillfactor = 70);
-- The outbox's effects of a consumer, oldest first.  No index names a
-- column that a lease, a completion or a failure changes, and pages keep
-- room, so that those updates are HOT: the inline cycle updates its row
-- once or twice in two short transactions.
CREATE INDEX effects_outbox
    ON idem_consumer.effects (consumer_id, created_at)
    WHERE deferred;

-- Retry policy per consumer; a consumer without a row follows the
-- idem_consumer.effect_* settings.
CREATE TABLE idem_consumer.effect_policies (
    consumer_id integer PRIMARY KEY REFERENCES idem_consumer.consumers,
    max_attempts integer NOT NULL CHECK (max_attempts >= 1),
    base_delay interval NOT NULL CHECK (base_delay OPERATOR(pg_catalog.>) interval '0'),
    max_delay interval NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT pg_catalog.now(),
    CHECK (max_delay OPERATOR(pg_catalog.>=) base_delay)
);

-- A dead effect is parked in the dead-letter queue like a message; kind
-- tells the two apart.  Its sql is a comment, which no message can have
-- (idem_try_apply refuses SQL that is only comments), so nothing ever runs
-- it: replaying the entry re-arms the effect instead.
ALTER TABLE idem_consumer.dead_letters
    ADD COLUMN kind text NOT NULL DEFAULT 'message' CHECK (kind IN ('message', 'effect'));

CREATE FUNCTION idem_effect_begin(consumer text, key text, request jsonb DEFAULT NULL,
                                  lease interval DEFAULT '30 seconds')
RETURNS idem_effect
AS 'MODULE_PATHNAME', 'idem_effect_begin'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_begin(text, text, jsonb, interval) IS
    'claim an external effect before calling the provider; run it alone, outside a transaction block';

CREATE FUNCTION idem_effect_complete(consumer text, key text, fence bigint, result jsonb,
                                     sql text DEFAULT NULL, params text[] DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_effect_complete'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_complete(text, text, bigint, jsonb, text, text[]) IS
    'store the result of an effect (and run sql with params) in the business transaction; raises IE001 if fence is no longer current';

CREATE FUNCTION idem_effect_fail(consumer text, key text, fence bigint, error text,
                                 retryable boolean DEFAULT true)
RETURNS idem_effect_action
AS 'MODULE_PATHNAME', 'idem_effect_fail'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_fail(text, text, bigint, text, boolean) IS
    'record a failed attempt: wait (retry later with backoff) or dead (dead-letter queue)';

CREATE FUNCTION idem_effect_heartbeat(consumer text, key text, fence bigint, extend interval)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_effect_heartbeat'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_heartbeat(text, text, bigint, interval) IS
    'extend a live lease to now() + extend; false when the caller has been fenced off';

CREATE FUNCTION idem_effect_enqueue(consumer text, key text, request jsonb)
RETURNS boolean
AS 'MODULE_PATHNAME', 'idem_effect_enqueue'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_effect_enqueue(text, text, jsonb) IS
    'add an effect to the outbox in the business transaction; false if the key was enqueued before';

CREATE FUNCTION idem_effect_claim(consumer text, max_count integer DEFAULT 10,
                                  lease interval DEFAULT '30 seconds')
RETURNS TABLE (key text, request jsonb, fence bigint, provider_key text,
               attempt integer, outcome_unknown boolean)
AS 'MODULE_PATHNAME', 'idem_effect_claim'
LANGUAGE C VOLATILE PARALLEL UNSAFE ROWS 10;
COMMENT ON FUNCTION idem_effect_claim(text, integer, interval) IS
    'lease up to max_count due outbox effects, oldest first, skipping those other dispatchers hold';

CREATE FUNCTION idem_set_effect_policy(consumer text, max_attempts integer,
                                       base_delay interval, max_delay interval)
RETURNS void
AS 'MODULE_PATHNAME', 'idem_set_effect_policy'
LANGUAGE C VOLATILE PARALLEL UNSAFE;
COMMENT ON FUNCTION idem_set_effect_policy(text, integer, interval, interval) IS
    'set how often and how late a consumer''s failed effects are retried';

-- Readable view of the effects, for operators.
CREATE VIEW idem_effects AS
    SELECT c.name AS consumer,
           e.key,
           e.state,
           e.deferred,
           e.attempts,
           e.fence,
           e.provider_key,
           e.outcome_unknown,
           e.lease_until,
           e.retry_at,
           e.last_error,
           e.result,
           e.request,
           e.dead_letter_id,
           e.created_at,
           e.updated_at,
           e.completed_at
      FROM idem_consumer.effects AS e
      JOIN idem_consumer.consumers AS c USING (consumer_id)
     WHERE c.owner IS NULL OR pg_catalog.pg_has_role(c.owner, 'MEMBER');
COMMENT ON VIEW idem_effects IS 'external effects: state, lease, fence, retries and stored result';

-- The dead-letter view shows which entries are effects.
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
           d.discard_reason,
           d.kind
      FROM idem_consumer.dead_letters AS d
      JOIN idem_consumer.consumers AS c USING (consumer_id)
     WHERE c.owner IS NULL OR pg_catalog.pg_has_role(c.owner, 'MEMBER');

-- Counters: idem_stats gains the effect counters and key_reuse at its end.
CREATE FUNCTION idem_stats_internal_1_1(
    OUT consumer text,
    OUT applied bigint,
    OUT duplicates bigint,
    OUT failed bigint,
    OUT dead_lettered bigint,
    OUT duplicate_ratio double precision,
    OUT latency_p50_ms double precision,
    OUT latency_p95_ms double precision,
    OUT latency_p99_ms double precision,
    OUT latency_max_ms double precision,
    OUT lag_last_ms double precision,
    OUT lag_p95_ms double precision,
    OUT last_applied_at timestamptz,
    OUT last_duplicate_at timestamptz,
    OUT stats_reset timestamptz,
    OUT effects_executed bigint,
    OUT effects_replayed bigint,
    OUT effects_busy bigint,
    OUT effects_fenced_off bigint,
    OUT effects_request_mismatches bigint,
    OUT effects_unknown_outcomes bigint,
    OUT effects_dead bigint,
    OUT key_reuse bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idem_stats_internal_1_1'
LANGUAGE C STRICT VOLATILE PARALLEL SAFE;

CREATE OR REPLACE VIEW idem_stats AS SELECT * FROM idem_stats_internal_1_1();

-- Effects are recorded like keys: consumers' roles only.  The view shows
-- requests and results: operators only.
REVOKE ALL ON FUNCTION idem_effect_begin(text, text, jsonb, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_effect_complete(text, text, bigint, jsonb, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_effect_fail(text, text, bigint, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_effect_heartbeat(text, text, bigint, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_effect_enqueue(text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_effect_claim(text, integer, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION idem_set_effect_policy(text, integer, interval, interval) FROM PUBLIC;
REVOKE ALL ON idem_effects FROM PUBLIC;
REVOKE ALL ON idem_dead_letters FROM PUBLIC;
GRANT SELECT ON idem_stats TO PUBLIC;

SELECT pg_catalog.pg_extension_config_dump('idem_consumer.effects', '');
SELECT pg_catalog.pg_extension_config_dump('idem_consumer.effect_policies', '');

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
