--
-- Footprint: table and indexes together stay under 100 bytes per key for
-- 30-character keys without fingerprints, and under 108 with them.  Each
-- figure is what 100,000 new keys add to the storage.
--
CREATE TEMP TABLE footprint_keys AS
    SELECT 'order-paid:' || substr(md5(g::text), 1, 19) AS key
      FROM generate_series(1, 100000) g;
SELECT min(length(key)), max(length(key)) FROM footprint_keys;
-- the tables of keys of the first generation, which takes them
CREATE FUNCTION storage_bytes() RETURNS numeric LANGUAGE sql AS $$
    SELECT sum(pg_total_relation_size(t.rel))::numeric
      FROM unnest(ARRAY['idem_consumer.processed_keys_1', 'idem_consumer.key_collisions_1']::regclass[]) AS t (rel)
$$;

SELECT idem_consumer_create('footprint');
SELECT idem_set_fingerprint('footprint', false);
SELECT storage_bytes() AS bytes_before \gset
SELECT count(*) FILTER (WHERE idem_apply(key, 'footprint', 'select 1')) AS applied
  FROM footprint_keys;
SELECT count(*) AS stored, count(*) FILTER (WHERE k.fingerprint IS NOT NULL) AS with_fingerprint
  FROM (SELECT consumer_id, fingerprint FROM idem_consumer.processed_keys_1
        UNION ALL
        SELECT consumer_id, fingerprint FROM idem_consumer.key_collisions_1) AS k
  JOIN idem_consumer.consumers AS c USING (consumer_id)
 WHERE c.name = 'footprint';
SELECT (storage_bytes() - :bytes_before) / 100000 < 100 AS under_100_bytes_per_key;

SELECT storage_bytes() AS bytes_before \gset
SELECT count(*) FILTER (WHERE idem_apply(key, 'footprint-fp', 'select $1::text', ARRAY[key])) AS applied
  FROM footprint_keys;
SELECT count(*) AS stored, count(*) FILTER (WHERE k.fingerprint IS NOT NULL) AS with_fingerprint
  FROM (SELECT consumer_id, fingerprint FROM idem_consumer.processed_keys_1
        UNION ALL
        SELECT consumer_id, fingerprint FROM idem_consumer.key_collisions_1) AS k
  JOIN idem_consumer.consumers AS c USING (consumer_id)
 WHERE c.name = 'footprint-fp';
SELECT (storage_bytes() - :bytes_before) / 100000 < 108 AS under_108_bytes_per_key_with_fingerprints;
DROP FUNCTION storage_bytes();
