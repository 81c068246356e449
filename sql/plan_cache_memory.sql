--
-- The plans of business SQL that a session keeps are bounded in bytes by
-- idem_consumer.plan_cache_memory, which only a superuser sets: the least
-- recently used are evicted once the memory of the cache's contexts (the
-- texts, and each plan's source, query trees and generic plan) passes
-- it, the plan in use excepted.  Before, only the number of texts was
-- bounded, by a setting any session could raise to 65536: 200 texts of a
-- megabyte held 400 MB of the backend's memory after the calls.
--
CREATE TABLE pcm (x int);
-- a text of some 23 kB whose plan holds about 400 kB
CREATE FUNCTION pcm_sql(n int) RETURNS text LANGUAGE sql AS $$
    SELECT 'insert into pcm select x from (values ' || string_agg('(' || g || ')', ', ')
           || ') AS v(x) where x = ' || n
      FROM generate_series(1, 3000) AS g
$$;
-- the cached plans of these texts, as PostgreSQL's plan cache names them
CREATE VIEW pcm_plans AS
    SELECT count(*) AS plans, coalesce(sum(total_bytes), 0) AS bytes
      FROM pg_backend_memory_contexts
     WHERE name = 'CachedPlanSource' AND ident LIKE 'insert into pcm select%';

SET idem_consumer.plan_cache_memory = '4MB';
SELECT idem_apply('warm', 'pcm', pcm_sql(0));
SELECT sum(total_bytes) AS before FROM pg_backend_memory_contexts \gset
SELECT count(*) FILTER (WHERE idem_apply('m' || n, 'pcm', pcm_sql(n))) AS applied
  FROM generate_series(1, 40) AS n;
-- some plans were evicted, the rest fit the bound, and so does what the
-- backend holds more than before (the plans' query trees included, in
-- contexts of their own)
SELECT plans < 40 AS evicted, bytes <= 4 * 1024 * 1024 AS plans_fit
  FROM pcm_plans;
SELECT sum(total_bytes) - :before <= 4 * 1024 * 1024 AS growth_fits
  FROM pg_backend_memory_contexts;
-- a plan larger than the bound is kept while it is used, and evicted by
-- the next text
SET idem_consumer.plan_cache_memory = '64kB';
SELECT idem_apply('big1', 'pcm', pcm_sql(1001));
SELECT plans FROM pcm_plans;
SELECT idem_apply('big2', 'pcm', pcm_sql(1002));
SELECT plans FROM pcm_plans;
SELECT idem_apply('big1', 'pcm', pcm_sql(1001)) AS duplicate;
RESET idem_consumer.plan_cache_memory;
SHOW idem_consumer.plan_cache_memory;

-- a session of another role cannot raise it
CREATE ROLE pcm_tenant;
SET ROLE pcm_tenant;
\set VERBOSITY terse
SET idem_consumer.plan_cache_memory = '1GB';
\set VERBOSITY default
RESET ROLE;
DROP ROLE pcm_tenant;
DROP VIEW pcm_plans;
DROP FUNCTION pcm_sql(int);
DROP TABLE pcm;
