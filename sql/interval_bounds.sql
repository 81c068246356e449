--
-- Every interval argument has a documented maximum, and a value past it,
-- however large, is refused with 22023 before anything is written.  The
-- conversion to microseconds used to overflow: 213503983 days wrapped
-- around to about 16 hours and was taken as a lease.
--
SET client_min_messages = warning;

-- leases of idem_effect_begin: at most 1 day
SELECT action FROM idem_effect_begin('bounds', 'lease-1', NULL, '1 day');
SELECT action FROM idem_effect_begin('bounds', 'lease-2', NULL, '213503983 days');
\echo :SQLSTATE
SELECT action FROM idem_effect_begin('bounds', 'lease-3', NULL, '200000000 days');
\echo :SQLSTATE
SELECT action FROM idem_effect_begin('bounds', 'lease-4', NULL, '-200000000 days');
\echo :SQLSTATE
SELECT action FROM idem_effect_begin('bounds', 'lease-5', NULL, '2147483647 days 2562047788 hours');
\echo :SQLSTATE
SELECT action FROM idem_effect_begin('bounds', 'lease-6', NULL, '-2147483648 days -2562047788 hours');
\echo :SQLSTATE
SELECT action FROM idem_effect_begin('bounds', 'lease-7', NULL, '178000000 years');
\echo :SQLSTATE
SELECT action FROM idem_effect_begin('bounds', 'lease-8', NULL, '1 day 1 microsecond');
\echo :SQLSTATE
-- mixed signs count as their sum
SELECT action FROM idem_effect_begin('bounds', 'lease-9', NULL, '1 month -29 days');
SELECT action FROM idem_effect_begin('bounds', 'lease-10', NULL, '1 day -25 hours');
\echo :SQLSTATE
SELECT action FROM idem_effect_begin('bounds', 'lease-11', NULL, '-178000000 years 213503983 days');
\echo :SQLSTATE
-- fields past the range of microseconds that sum to 20 hours are 20 hours
SELECT action FROM idem_effect_begin('bounds', 'lease-12', NULL, '106751992 days -2562047788:00:54.775807');
SELECT action, retry_at - pg_catalog.now() BETWEEN interval '19 hours 58 minutes'
                                             AND interval '19 hours 59 minutes 6 seconds' AS busy_for_20_hours
  FROM idem_effect_begin('bounds', 'lease-12', NULL, '1 hour');

-- the lease of idem_effect_claim: at most 1 day
SELECT idem_effect_enqueue('bounds', 'outbox-1', '{}');
SELECT key FROM idem_effect_claim('bounds', 1, '213503983 days');
\echo :SQLSTATE
SELECT key FROM idem_effect_claim('bounds', 1, '-200000000 days');
\echo :SQLSTATE
SELECT key, fence FROM idem_effect_claim('bounds', 1, '1 day');

-- the extension of idem_effect_heartbeat: at most 1 day
SELECT idem_effect_heartbeat('bounds', 'lease-1', 1, '213503983 days');
\echo :SQLSTATE
SELECT idem_effect_heartbeat('bounds', 'lease-1', 1, '2147483647 days 2562047788 hours');
\echo :SQLSTATE
SELECT idem_effect_heartbeat('bounds', 'lease-1', 1, '1 day');

-- the delays of idem_set_effect_policy: at most 30 days
SELECT idem_set_effect_policy('bounds', 3, '213503983 days', '213503983 days');
\echo :SQLSTATE
SELECT idem_set_effect_policy('bounds', 3, '1 second', '200000000 days');
\echo :SQLSTATE
SELECT idem_set_effect_policy('bounds', 3, '1 second', '30 days 1 microsecond');
\echo :SQLSTATE
SELECT idem_set_effect_policy('bounds', 3, '1 second', '30 days');
SELECT max_attempts, base_delay, max_delay FROM idem_consumer.effect_policies
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'bounds');

-- a policy written into the table by hand past the maximum counts as 30 days
UPDATE idem_consumer.effect_policies SET base_delay = '200000000 days', max_delay = '200000000 days'
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'bounds');
SELECT idem_effect_fail('bounds', 'lease-1', 1, 'provider down', true);
SELECT state, retry_at - updated_at BETWEEN interval '15 days' AND interval '30 days' AS retry_within_30_days
  FROM idem_effects WHERE consumer = 'bounds' AND key = 'lease-1';

-- the window of idem_set_retention: at most 100 years
SELECT idem_apply('retained', 'bounds', 'select 1');
SELECT idem_set_retention('bounds', '213503983 days');
\echo :SQLSTATE
SELECT idem_set_retention('bounds', '200000000 days');
\echo :SQLSTATE
SELECT idem_set_retention('bounds', '100 years 1 microsecond');
\echo :SQLSTATE
SELECT idem_set_retention('bounds', '100 years');
SELECT idem_set_retention('bounds', NULL);

-- nothing refused was written
SELECT key, state FROM idem_effects WHERE consumer = 'bounds' ORDER BY key;
SELECT retention FROM idem_retention WHERE consumer = 'bounds';

DELETE FROM idem_consumer.effects
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'bounds');
DELETE FROM idem_consumer.effect_policies
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'bounds');
SELECT idem_forget('retained', 'bounds');
