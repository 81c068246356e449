--
-- Footprint: table and indexes together stay under 100 bytes per key for
-- 30-character keys.
--
CREATE TEMP TABLE footprint_keys AS
    SELECT 'order-paid:' || substr(md5(g::text), 1, 19) AS key
      FROM generate_series(1, 100000) g;
SELECT min(length(key)), max(length(key)) FROM footprint_keys;
SELECT count(*) FILTER (WHERE idem_apply(key, 'footprint', 'select 1')) AS applied
  FROM footprint_keys;
SELECT count(*) AS stored FROM idem_processed_keys WHERE consumer = 'footprint';
SELECT (pg_total_relation_size('idem_consumer.processed_keys')
        + pg_total_relation_size('idem_consumer.key_collisions'))::numeric
       / (SELECT count(*) FROM idem_processed_keys) < 100 AS under_100_bytes_per_key;
