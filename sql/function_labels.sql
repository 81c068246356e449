--
-- The volatility, parallel safety and strictness of every function of the
-- extension, as its C code behaves: a function that takes a snapshot of
-- its own per call or writes is VOLATILE, and one that runs statements
-- through SPI or changes shared state is PARALLEL UNSAFE.  A function
-- added without its labels thought through shows up here.
--
SELECT p.oid::regprocedure AS function,
       CASE p.provolatile WHEN 'i' THEN 'immutable' WHEN 's' THEN 'stable'
            ELSE 'volatile' END AS volatility,
       CASE p.proparallel WHEN 's' THEN 'safe' WHEN 'r' THEN 'restricted'
            ELSE 'unsafe' END AS parallel,
       p.proisstrict AS strict,
       p.prosecdef AS security_definer,
       p.proleakproof AS leakproof
  FROM pg_catalog.pg_depend AS d
  JOIN pg_catalog.pg_proc AS p ON p.oid = d.objid
 WHERE d.classid = 'pg_catalog.pg_proc'::regclass
   AND d.refclassid = 'pg_catalog.pg_extension'::regclass
   AND d.refobjid = (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'idem_consumer')
   AND d.deptype = 'e'
 ORDER BY p.oid::regprocedure::text;
