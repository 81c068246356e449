--
-- Business SQL plans are cached per session by SQL text, replanned when
-- the tables they use change, and bounded by idem_consumer.plan_cache_size.
--
CREATE TABLE stock (sku text PRIMARY KEY, qty numeric NOT NULL);
INSERT INTO stock VALUES ('a', 100), ('b', 100);

SELECT idem_apply('pc-1', 'stock', 'update stock set qty = qty - $1 where sku = $2', ARRAY['1', 'a']);
-- the table changes under the cached plan: a new column, then a new type
ALTER TABLE stock ADD COLUMN reserved numeric NOT NULL DEFAULT 0;
SELECT idem_apply('pc-2', 'stock', 'update stock set qty = qty - $1 where sku = $2', ARRAY['1', 'a']);
ALTER TABLE stock ALTER COLUMN qty TYPE integer;
SELECT idem_apply('pc-3', 'stock', 'update stock set qty = qty - $1 where sku = $2', ARRAY['1', 'a']);
-- the table is dropped and created again
DROP TABLE stock;
CREATE TABLE stock (sku text PRIMARY KEY, qty bigint NOT NULL);
INSERT INTO stock VALUES ('a', 50);
SELECT idem_apply('pc-4', 'stock', 'update stock set qty = qty - $1 where sku = $2', ARRAY['1', 'a']);
SELECT * FROM stock;
-- and dropped for good: the error is the table's, and nothing is recorded
DROP TABLE stock;
SELECT idem_apply('pc-5', 'stock', 'update stock set qty = qty - $1 where sku = $2', ARRAY['1', 'a']);
SELECT idem_is_processed('pc-5', 'stock');

-- the same text resolves through the current search_path
CREATE SCHEMA tenant_a;
CREATE SCHEMA tenant_b;
CREATE TABLE tenant_a.counter (n int);
CREATE TABLE tenant_b.counter (n int);
INSERT INTO tenant_a.counter VALUES (0);
INSERT INTO tenant_b.counter VALUES (0);
SET search_path = tenant_a, public;
SELECT idem_apply('sp-1', 'counter', 'update counter set n = n + $1', ARRAY['1']);
SET search_path = tenant_b, public;
SELECT idem_apply('sp-2', 'counter', 'update counter set n = n + $1', ARRAY['10']);
RESET search_path;
SELECT (SELECT n FROM tenant_a.counter) AS a, (SELECT n FROM tenant_b.counter) AS b;

-- the cache keeps at most plan_cache_size plans; evicted texts still work
CREATE TABLE hits (id int PRIMARY KEY, n int NOT NULL DEFAULT 0);
INSERT INTO hits (id) SELECT g FROM generate_series(1, 6) g;
SET idem_consumer.plan_cache_size = 3;
SELECT count(*) FILTER (WHERE idem_apply('hit-' || g, 'hits',
                                         format('update hits set n = n + 1 where id = $1 /* plan %s */', g),
                                         ARRAY[g::text]))
  FROM generate_series(1, 6) g;
SELECT count(*) AS cached_plans
  FROM pg_backend_memory_contexts
 WHERE name = 'CachedPlanSource' AND ident LIKE 'update hits set n = n + 1 where id = $1 /* plan %';
-- texts used again after eviction are prepared again and run once
SELECT count(*) FILTER (WHERE idem_apply('hit-again-' || g, 'hits',
                                         format('update hits set n = n + 1 where id = $1 /* plan %s */', g),
                                         ARRAY[g::text]))
  FROM generate_series(1, 6) g;
SELECT id, n FROM hits ORDER BY id;
RESET idem_consumer.plan_cache_size;

-- a rejected text is not cached, and the cache stays usable
SELECT idem_apply('bad-1', 'hits', 'update hits set n = n + 1 where id = $1 and', ARRAY['1']);
SELECT idem_apply('bad-2', 'hits', 'update hits set n = n + 1 where id = $1', ARRAY['1']);
SELECT n FROM hits WHERE id = 1;
