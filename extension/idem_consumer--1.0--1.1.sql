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
-- cost a tenth of its time.
CREATE TABLE idem_consumer.effects (
    consumer_id integer NOT NULL REFERENCES idem_consumer.consumers,
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
      JOIN idem_consumer.consumers AS c USING (consumer_id);
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
      JOIN idem_consumer.consumers AS c USING (consumer_id);

-- Counters: idem_stats gains the effect counters at its end.
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
    OUT effects_dead bigint)
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
