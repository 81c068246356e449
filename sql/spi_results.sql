--
-- What a function returns after SPI_finish must not live in SPI's memory,
-- which SPI_finish frees: here, the provider key and result of an effect,
-- read by the SQL statements (a table the fast path steps aside for, with
-- a provider key default of its own).  A value large enough to have a
-- block of its own, read after it was freed, comes back as garbage or
-- crashes the backend.  Each case starts in a new session, whose memory
-- has not been reused yet.
--
SET client_min_messages = warning;
ALTER TABLE idem_consumer.effects
  ALTER COLUMN provider_key SET DEFAULT pg_catalog.repeat('p', 300000);

\c
SELECT action, fence, length(provider_key) AS provider_key_length,
       provider_key = repeat('p', 300000) AS provider_key_intact
  FROM idem_effect_begin('spi-results', 'big-1', '{"n": 1}', '1 minute');

-- the same effect again: its lease is live, the row is read back
\c
SELECT action, length(provider_key) AS provider_key_length,
       provider_key = repeat('p', 300000) AS provider_key_intact
  FROM idem_effect_begin('spi-results', 'big-1', '{"n": 1}', '1 minute');

-- a result of its own block, completed and replayed
SELECT idem_effect_complete('spi-results', 'big-1', 1,
                            jsonb_build_object('body', repeat('r', 300000)));
\c
SELECT action, result->>'body' = repeat('r', 300000) AS result_intact,
       provider_key = repeat('p', 300000) AS provider_key_intact
  FROM idem_effect_begin('spi-results', 'big-1', '{"n": 1}', '1 minute');

-- the outbox: claimed effects come back whole
SELECT idem_effect_enqueue('spi-results', 'big-2', '{"n": 2}');
\c
SELECT key, fence, provider_key = repeat('p', 300000) AS provider_key_intact
  FROM idem_effect_claim('spi-results', 10, '1 minute');

-- the same with the fast path off
\c
SET idem_consumer.fast_path = off;
ALTER TABLE idem_consumer.effects
  ALTER COLUMN provider_key SET DEFAULT pg_catalog.gen_random_uuid()::text;
SELECT action, fence, length(provider_key) AS provider_key_length
  FROM idem_effect_begin('spi-results', 'small-1', NULL, '1 minute');
RESET idem_consumer.fast_path;

SELECT key, state, length(provider_key) AS provider_key_length
  FROM idem_effects WHERE consumer = 'spi-results' ORDER BY key;
DELETE FROM idem_consumer.effects
 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'spi-results');
