--
-- Retention never removes the key of a message that waits in the
-- dead-letter queue (an entry with status 'pending'): an operator may still
-- replay it.  Resolved entries do not hold their keys.
--
-- keys purged one by one (by whole generations, the default: key_generation_retention)
SET idem_consumer.key_generation_interval = 0;

-- dl_store_key() writes a key as if it had been recorded "age" ago; into
-- key_collisions_1 when collision is true (the current generation).
CREATE FUNCTION dl_store_key(consumer text, key text, age interval, collision bool DEFAULT false)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO idem_consumer.consumers (name) VALUES (consumer) ON CONFLICT DO NOTHING;
    EXECUTE format('INSERT INTO idem_consumer.%I (consumer_id, processed_at, key)
                    SELECT consumer_id, floor(extract(epoch FROM now() - $1 - timestamptz %L))::int, $2
                      FROM idem_consumer.consumers WHERE name = $3',
                   CASE WHEN collision THEN 'key_collisions_1' ELSE 'processed_keys_1' END,
                   '2000-01-01 00:00:00+00')
        USING age, key, consumer;
END
$$;

-- park() gives a key a dead-letter entry with the given status.
CREATE FUNCTION park(consumer text, key text, status text) RETURNS void
LANGUAGE sql AS $$
    INSERT INTO idem_consumer.dead_letters
        (consumer_id, key, sql, settings, sqlstate, message, dead_lettered_by,
         status, resolved_at, resolved_by, discard_reason)
    SELECT consumer_id, key, 'select 1', '{}', '23503', 'parked by the test', current_user,
           status,
           CASE WHEN status <> 'pending' THEN now() END,
           CASE WHEN status <> 'pending' THEN current_user::text END,
           CASE WHEN status = 'discarded' THEN 'test' END
      FROM idem_consumer.consumers WHERE name = consumer;
$$;
CREATE FUNCTION dl_keys_of(consumer text) RETURNS text
LANGUAGE sql AS $$
    SELECT coalesce(string_agg(key, ' ' ORDER BY key), '(none)')
      FROM idem_processed_keys k WHERE k.consumer = dl_keys_of.consumer;
$$;

-- expired keys: one parked and pending, two whose entries were resolved,
-- one never dead-lettered
SELECT dl_store_key('dlq', 'new', '0'),
       dl_store_key('dlq', 'pending', '30 days'), dl_store_key('dlq', 'replayed', '30 days'),
       dl_store_key('dlq', 'discarded', '30 days'), dl_store_key('dlq', 'plain', '30 days');
SELECT park('dlq', 'pending', 'pending'), park('dlq', 'replayed', 'replayed'),
       park('dlq', 'discarded', 'discarded');
SELECT idem_purge('dlq') AS purged, dl_keys_of('dlq');
-- once replayed, the key expires like any other
UPDATE idem_consumer.dead_letters SET status = 'replayed', resolved_at = now(), resolved_by = current_user
 WHERE key = 'pending' AND consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'dlq');
SELECT idem_purge('dlq') AS purged, dl_keys_of('dlq');

-- the same for a key in key_collisions: two colliding keys, the occupant
-- recent, the collision expired
SELECT dl_store_key('dlq-c', 'seed', '0');
CREATE TEMP TABLE dl_colliding AS
    WITH c AS (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'dlq-c'),
         k AS (SELECT 'evt-' || g AS key, idem_consumer.key_hash64((SELECT consumer_id FROM c), 'evt-' || g) AS h
                 FROM generate_series(1, 400000) g),
         pair AS (SELECT h FROM k GROUP BY h HAVING count(*) = 2 ORDER BY h LIMIT 1)
    SELECT row_number() OVER (ORDER BY key) AS n, key FROM k WHERE h = (SELECT h FROM pair);
SELECT key AS occupant FROM dl_colliding WHERE n = 1 \gset
SELECT key AS collision FROM dl_colliding WHERE n = 2 \gset
SELECT dl_store_key('dlq-c', :'occupant', '0'),
       dl_store_key('dlq-c', :'collision', '30 days', true);
SELECT park('dlq-c', :'collision', 'pending');
SELECT idem_purge('dlq-c') AS purged;
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1 WHERE key = :'collision'
   AND consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'dlq-c');
UPDATE idem_consumer.dead_letters
   SET status = 'discarded', resolved_at = now(), resolved_by = current_user, discard_reason = 'test'
 WHERE key = :'collision';
SELECT idem_purge('dlq-c') AS purged;
SELECT count(*) AS collisions FROM idem_consumer.key_collisions_1 WHERE key = :'collision'
   AND consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'dlq-c');
