--
-- A resolved dead-letter entry (replayed or discarded) expires with its
-- key: the purge that removes the key removes the entry in the same
-- statement.  A redelivery after that is a new message, as after any
-- expiry: it is applied, or parked again as a new pending entry.  (Before,
-- the stale entry stayed: a permanent failure of the redelivery hit the
-- entry's unique (consumer, key) and raised 23505 on every redelivery,
-- and an applied redelivery of a discarded message still answered
-- dead_lettered.)  A pending entry keeps its key, as before.
--
-- keys purged one by one (by whole generations, the default: key_generation_retention)
SET idem_consumer.key_generation_interval = 0;
CREATE TABLE ex_stock (id int PRIMARY KEY, qty int NOT NULL CHECK (qty >= 0));
INSERT INTO ex_stock VALUES (1, 0);
-- ages every key of a consumer by 30 days, past the 7-day default window
CREATE FUNCTION ex_age(consumer text) RETURNS void LANGUAGE sql AS $$
    UPDATE idem_consumer.processed_keys_1 SET processed_at = processed_at - 30 * 86400
     WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = consumer);
$$;

-- three messages fail for want of stock and are parked
SELECT k, idem_try_apply(k, 'ex', 'update ex_stock set qty = qty - 1 where id = 1')
  FROM unnest(ARRAY['ex-replayed', 'ex-discarded', 'ex-pending']) AS k;
UPDATE ex_stock SET qty = 1;
SELECT idem_dlq_replay(id) FROM idem_dead_letters WHERE key = 'ex-replayed';
SELECT idem_dlq_discard(id, 'cancelled upstream') FROM idem_dead_letters WHERE key = 'ex-discarded';
SELECT key, status FROM idem_dead_letters WHERE consumer = 'ex' ORDER BY key;

-- the keys expire; a fresh key is the consumer's latest activity
SELECT ex_age('ex');
SELECT idem_apply('ex-fresh', 'ex', 'select 1');
SELECT idem_purge('ex') AS purged;
SELECT key FROM idem_processed_keys WHERE consumer = 'ex' ORDER BY key;
-- the resolved entries went with their keys, the pending one stays
SELECT key, status FROM idem_dead_letters WHERE consumer = 'ex' ORDER BY key;

-- the replayed message, redelivered after expiry, fails permanently
-- (no stock): it is parked again, as a new pending entry
SELECT idem_try_apply('ex-replayed', 'ex', 'update ex_stock set qty = qty - 1 where id = 1');
SELECT key, status, attempts FROM idem_dead_letters WHERE key = 'ex-replayed';
-- the discarded message, redelivered after expiry with stock at hand, is
-- applied, and its next redelivery is a duplicate
UPDATE ex_stock SET qty = 1;
SELECT idem_try_apply('ex-discarded', 'ex', 'update ex_stock set qty = qty - 1 where id = 1');
SELECT idem_try_apply('ex-discarded', 'ex', 'update ex_stock set qty = qty - 1 where id = 1');
SELECT count(*) AS entries FROM idem_dead_letters WHERE key = 'ex-discarded';
SELECT qty FROM ex_stock;

-- a key removed by other means than the purge (here by hand) leaves its
-- resolved entry behind: parking the redelivery replaces that entry
SELECT idem_dlq_discard(id, 'again') FROM idem_dead_letters WHERE key = 'ex-replayed';
DELETE FROM idem_consumer.processed_keys_1 WHERE key = 'ex-replayed';
SELECT idem_try_apply('ex-replayed', 'ex', 'update ex_stock set qty = qty - 1 where id = 1');
SELECT key, status, attempts, resolved_by, discard_reason FROM idem_dead_letters WHERE key = 'ex-replayed';

DROP FUNCTION ex_age(text);
DROP TABLE ex_stock;
