-- docs/plproxy/proxy.sql -- the proxy database of the PL/Proxy recipe
-- (README, "Scale-out with PL/Proxy").
--
-- Run it once in the proxy database, as a superuser, with the connection
-- strings of the shards in partition order (their number a power of 2):
--
--   psql -v ON_ERROR_STOP=1 -d shop_proxy -f docs/plproxy/proxy.sql \
--        -v shards='{"host=shard0 dbname=shop","host=shard1 dbname=shop"}'
--
-- The proxy holds no data.  Each function below has the name and arguments
-- of a function of docs/plproxy/shard.sql; PL/Proxy runs that function on
-- the shard chosen by shop.order_hash(order_id), the same hash that placed
-- the order there, so a message's key is recorded next to the order it pays.
-- Connections to the shards are made as the role that called the proxy
-- function (PL/Proxy adds user=current_user), so the shards check that
-- role's privileges and the business SQL runs with its rights.

CREATE EXTENSION IF NOT EXISTS plproxy;

CREATE SCHEMA shop;

-- The routing hash: identical to the shards' function of the same name.
CREATE FUNCTION shop.order_hash(order_id bigint) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.hashint8(order_id);

-- The cluster: partition i is the i-th connection string.
SELECT pg_catalog.format(
    'CREATE SERVER shop_cluster FOREIGN DATA WRAPPER plproxy OPTIONS (%s)',
    pg_catalog.string_agg(pg_catalog.format('p%s %L', n - 1, c), ', ' ORDER BY n))
  FROM pg_catalog.unnest(:'shards'::text[]) WITH ORDINALITY AS s(c, n)
\gexec
CREATE USER MAPPING FOR PUBLIC SERVER shop_cluster;

--
-- Consumer operations: each runs on the shard that holds the order.
--

CREATE FUNCTION shop.create_order(order_id bigint, amount_due numeric) RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON shop.order_hash(order_id);
$$;

CREATE FUNCTION shop.pay(order_id bigint, key text, amount numeric,
                         event_time timestamptz DEFAULT NULL)
RETURNS boolean
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON shop.order_hash(order_id);
$$;

CREATE FUNCTION shop.try_pay(order_id bigint, key text, amount numeric,
                             event_time timestamptz DEFAULT NULL)
RETURNS text
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON shop.order_hash(order_id);
$$;

-- A batch: SPLIT hashes each order id and sends every shard, in parallel,
-- the elements of the three arrays whose order it holds; each shard applies
-- its part in one transaction of its own.
CREATE FUNCTION shop.pay_batch(keys text[], order_ids bigint[], amounts numeric[])
RETURNS SETOF text
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    SPLIT keys, order_ids, amounts;
    RUN ON shop.order_hash(order_ids);
$$;

--
-- Operations: every shard, or one shard by its partition number.
--

CREATE FUNCTION shop.shard_info() RETURNS TABLE (shard integer, partitions integer)
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON ALL;
$$;

CREATE FUNCTION shop.shard_stats()
RETURNS TABLE (shard integer, consumer text, applied bigint, duplicates bigint,
               failed bigint, dead_lettered bigint, latency_max_ms double precision,
               last_applied_at timestamptz, last_duplicate_at timestamptz)
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON ALL;
$$;

CREATE FUNCTION shop.shard_metrics() RETURNS SETOF text
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON ALL;
$$;

CREATE FUNCTION shop.shard_dead_letters()
RETURNS TABLE (shard integer, id bigint, consumer text, key text, status text,
               sqlstate text, message text, attempts integer,
               first_failed_at timestamptz)
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON ALL;
$$;

-- A partition number given as the routing value selects that partition.
CREATE FUNCTION shop.dlq_replay(on_shard integer, consumer text, max_count integer DEFAULT 100)
RETURNS TABLE (shard integer, id bigint, outcome text)
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON on_shard;
$$;

CREATE FUNCTION shop.dlq_discard(on_shard integer, id bigint, reason text)
RETURNS void
LANGUAGE plproxy AS $$
    CLUSTER 'shop_cluster';
    RUN ON on_shard;
$$;

-- Operators only: the shards check the calling role's grants as well.
REVOKE ALL ON FUNCTION shop.shard_dead_letters(), shop.dlq_replay(integer, text, integer),
    shop.dlq_discard(integer, bigint, text) FROM PUBLIC;

--
-- The shards' counters summed.  Quantiles cannot be summed, so only the
-- counts, the largest latency and the latest times are; the Prometheus
-- histograms below can be, bucket by bucket.
--
CREATE VIEW shop.idem_stats_all AS
    SELECT s.consumer,
           pg_catalog.sum(s.applied)::bigint AS applied,
           pg_catalog.sum(s.duplicates)::bigint AS duplicates,
           pg_catalog.sum(s.failed)::bigint AS failed,
           pg_catalog.sum(s.dead_lettered)::bigint AS dead_lettered,
           pg_catalog.sum(s.duplicates)::double precision
               / NULLIF(pg_catalog.sum(s.applied + s.duplicates + s.dead_lettered), 0)
               AS duplicate_ratio,
           pg_catalog.max(s.latency_max_ms) AS latency_max_ms,
           pg_catalog.max(s.last_applied_at) AS last_applied_at,
           pg_catalog.max(s.last_duplicate_at) AS last_duplicate_at,
           pg_catalog.count(*) AS shards
      FROM shop.shard_stats() AS s
     GROUP BY s.consumer;

-- Every shard's idem_metrics() merged into one exposition: each sample is
-- the sum of that series over the shards (counters, histogram buckets,
-- sums and counts, keys stored), except the last-lag gauge, which is the
-- largest.  Families keep their order, each consumer's samples theirs.
CREATE FUNCTION shop.idem_metrics_all() RETURNS text
LANGUAGE sql STABLE
BEGIN ATOMIC
WITH lines AS (
    SELECT t.s, l.n, l.line,
           pg_catalog.count(*) FILTER (WHERE l.line LIKE '# TYPE %')
               OVER (PARTITION BY t.s ORDER BY l.n) AS fam_no
      FROM shop.shard_metrics() WITH ORDINALITY AS t(m, s),
           pg_catalog.regexp_split_to_table(pg_catalog.rtrim(t.m, E'\n'), E'\n')
               WITH ORDINALITY AS l(line, n)
),
headers AS (
    -- a family's HELP line comes before its TYPE line
    SELECT lines.line, lines.n,
           CASE WHEN lines.line LIKE '# HELP %' THEN lines.fam_no + 1 ELSE lines.fam_no END AS fam_no
      FROM lines
     WHERE lines.s = 1 AND lines.line LIKE '#%'
),
families AS (
    SELECT headers.fam_no, pg_catalog.split_part(headers.line, ' ', 3) AS family
      FROM headers WHERE headers.line LIKE '# TYPE %'
),
samples AS (
    SELECT lines.fam_no,
           pg_catalog.substring(lines.line, '^(.*) [^ ]*$') AS series,
           pg_catalog.substring(lines.line, ' ([^ ]*)$')::numeric AS value,
           pg_catalog.substring(lines.line, 'consumer="((?:[^"\\]|\\.)*)"') AS consumer,
           pg_catalog.row_number() OVER (
               PARTITION BY lines.s, lines.fam_no,
                            pg_catalog.substring(lines.line, 'consumer="((?:[^"\\]|\\.)*)"')
               ORDER BY lines.n) AS k
      FROM lines
     WHERE lines.line NOT LIKE '#%' AND lines.line <> ''
),
merged AS (
    SELECT samples.fam_no, samples.consumer, pg_catalog.min(samples.k) AS k,
           samples.series || ' ' ||
           CASE WHEN families.family = 'idem_consumer_lag_seconds'
                THEN pg_catalog.max(samples.value) ELSE pg_catalog.sum(samples.value) END AS line
      FROM samples JOIN families USING (fam_no)
     GROUP BY samples.fam_no, samples.consumer, samples.series, families.family
)
SELECT pg_catalog.string_agg(o.line, E'\n' ORDER BY o.fam_no, o.part, o.consumer, o.k) || E'\n'
  FROM (SELECT headers.fam_no, 0 AS part, '' AS consumer, headers.n AS k, headers.line
          FROM headers
        UNION ALL
        SELECT merged.fam_no, 1, merged.consumer, merged.k, merged.line
          FROM merged) AS o;
END;
