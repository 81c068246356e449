--
-- Two different keys with the same 32-bit hash are two keys: the second
-- goes to key_collisions, and every operation still sees each key alone.
--
CREATE TABLE collision_log (key text);
SELECT idem_apply('seed', 'hashing', 'select 1');
-- find keys of this consumer whose hashes collide
CREATE TEMP TABLE colliding AS
    WITH c AS (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'hashing'),
         k AS (SELECT 'evt-' || g AS key, idem_consumer.key_hash64((SELECT consumer_id FROM c), 'evt-' || g) AS h
                 FROM generate_series(1, 400000) g),
         pair AS (SELECT h FROM k GROUP BY h HAVING count(*) >= 2 ORDER BY h LIMIT 1)
    SELECT row_number() OVER (ORDER BY key) AS n, key FROM k WHERE h = (SELECT h FROM pair);
SELECT count(*) >= 2 AS found_collision FROM colliding;
SELECT key AS k1 FROM colliding WHERE n = 1 \gset
SELECT key AS k2 FROM colliding WHERE n = 2 \gset
SELECT :'k1' <> :'k2' AS different_keys;

-- both keys apply once, and redeliveries of either are duplicates
SELECT idem_apply(:'k1', 'hashing', 'insert into collision_log values ($1)', ARRAY[:'k1']) AS k1_first;
SELECT idem_apply(:'k2', 'hashing', 'insert into collision_log values ($1)', ARRAY[:'k2']) AS k2_first;
SELECT idem_apply(:'k1', 'hashing', 'insert into collision_log values ($1)', ARRAY[:'k1']) AS k1_again;
SELECT idem_apply(:'k2', 'hashing', 'insert into collision_log values ($1)', ARRAY[:'k2']) AS k2_again;
SELECT count(*) AS log_rows, count(DISTINCT key) AS distinct_keys FROM collision_log;
SELECT (SELECT count(*) FROM idem_consumer.key_collisions_1 k JOIN idem_consumer.consumers c USING (consumer_id) WHERE c.name = 'hashing') AS collisions,
       idem_is_processed(:'k1', 'hashing') AS k1, idem_is_processed(:'k2', 'hashing') AS k2;

-- forgetting the occupant moves the collision into its place
SELECT idem_forget(:'k1', 'hashing');
SELECT (SELECT count(*) FROM idem_consumer.key_collisions_1 k JOIN idem_consumer.consumers c USING (consumer_id) WHERE c.name = 'hashing') AS collisions,
       idem_is_processed(:'k1', 'hashing') AS k1, idem_is_processed(:'k2', 'hashing') AS k2;
SELECT idem_apply(:'k2', 'hashing', 'insert into collision_log values ($1)', ARRAY[:'k2']) AS k2_still_duplicate;
SELECT idem_apply(:'k1', 'hashing', 'insert into collision_log values ($1)', ARRAY[:'k1']) AS k1_reapplied;
SELECT (SELECT count(*) FROM idem_consumer.key_collisions_1 k JOIN idem_consumer.consumers c USING (consumer_id) WHERE c.name = 'hashing') AS collisions;
-- forgetting the collision leaves the occupant alone
SELECT idem_forget(:'k1', 'hashing'), idem_is_processed(:'k1', 'hashing') AS k1, idem_is_processed(:'k2', 'hashing') AS k2;
SELECT idem_forget(:'k2', 'hashing'), idem_is_processed(:'k2', 'hashing') AS k2;
SELECT count(*) AS stored FROM idem_processed_keys WHERE consumer = 'hashing' AND key <> 'seed';
SELECT count(*) AS log_rows FROM collision_log;
