# Upgrades: a database at 1.0 and a database at 1.1 keep their keys, dead
# letters, retention settings and counters through ALTER EXTENSION
# idem_consumer UPDATE, and end with the objects of a new install, which
# runs idem_consumer--1.2.sql alone, but for the objects that hold the keys
# recorded before 1.2 (@legacy_only below, docs/upgrading.md); the same
# workload then gives the same results on all three.  The library keeps
# serving databases still at 1.0 and at 1.1.
#
# The released scripts (1.0, 1.0--1.1, 1.1--1.2 and 1.2) are pinned by
# their checksums: an edit of a released script would change what an
# update starts from, or make a new install of a version differ from an
# updated one.  A change of SQL goes into the next version's scripts.
use strict;
use warnings;

use Digest::SHA;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $released_1_0_sha256 = '86d8eaadc82b08450a4b8f566207dbdba4d78fcea8de617b10aefce0a4af1eee';
my $released_1_1_sha256 = 'f84523684b97d79cb71edd6a1ed369ea8b088df4c8208321982de2a19b946072';
my $released_1_2_update_sha256 = 'edde26f951ea592462b9c4ad2820d2cc4c87dd59dddb848be37cec0fb7e2a58d';
my $released_1_2_sha256 = 'dc4e9f9c1955f3a85b49fa192a5e0b4572b3bbac065cb664bcb42abd405a5320';
my $current_version = '1.2';

# Every object of the extension and what a DBA or a client can see of it,
# one line per fact, by name (never by OID): functions with their whole
# definition, privileges and comments; tables and views with their columns,
# types, defaults, constraints, indexes, triggers, policies and privileges;
# types, sequences, schemas; initial privileges; the dumped configuration
# tables.  Lines are whitespace-normalised and sorted.
my $catalog_query = <<'SQL';
WITH ext AS (
    SELECT * FROM pg_catalog.pg_extension WHERE extname = 'idem_consumer'
), members AS (
    SELECT d.classid, d.objid,
           pg_catalog.pg_describe_object(d.classid, d.objid, 0) AS obj
      FROM pg_catalog.pg_depend d, ext
     WHERE d.refclassid = 'pg_catalog.pg_extension'::regclass
       AND d.refobjid = ext.oid AND d.deptype = 'e'
), parts AS (
    -- each member, and each column of a member relation, which comments
    -- and initial privileges may be attached to
    SELECT m.obj, m.classid, m.objid, 0 AS objsubid, '' AS part FROM members m
    UNION ALL
    SELECT m.obj, m.classid, m.objid, a.attnum, a.attname::text
      FROM members m JOIN pg_catalog.pg_attribute a
        ON m.classid = 'pg_catalog.pg_class'::regclass AND a.attrelid = m.objid
       AND a.attnum > 0 AND NOT a.attisdropped
), rels AS (
    SELECT m.obj, c.*, c.oid AS relid
      FROM members m JOIN pg_catalog.pg_class c
        ON m.classid = 'pg_catalog.pg_class'::regclass AND c.oid = m.objid
), facts(obj, fact) AS (
    SELECT obj, 'member' FROM members
    UNION ALL
    SELECT 'extension', 'version ' || extversion || ' relocatable ' || extrelocatable
           || ' schema ' || extnamespace::regnamespace::text FROM ext
    UNION ALL
    SELECT 'extension', 'dumps ' || c::regclass::text || ' where ' || coalesce(w, '')
      FROM ext, unnest(extconfig, extcondition) AS u(c, w)
    UNION ALL
    SELECT p.obj, 'comment ' || p.part || ': ' || ds.description
      FROM parts p JOIN pg_catalog.pg_description ds
        ON (ds.classoid, ds.objoid, ds.objsubid) = (p.classid, p.objid, p.objsubid)
    UNION ALL
    SELECT p.obj, 'initial privileges ' || ip.privtype::text || ' ' || p.part || ': '
           || ip.initprivs::text
      FROM parts p JOIN pg_catalog.pg_init_privs ip
        ON (ip.classoid, ip.objoid, ip.objsubid) = (p.classid, p.objid, p.objsubid)
    UNION ALL
    SELECT m.obj, 'definition ' || CASE WHEN p.prokind = 'a'
               THEN 'aggregate ' || ag.aggtransfn::regprocedure::text || ' '
                    || ag.aggtranstype::regtype::text || ' '
                    || coalesce(ag.aggfinalfn::regprocedure::text, '') || ' '
                    || coalesce(ag.agginitval, '')
               ELSE pg_catalog.pg_get_functiondef(p.oid) END
      FROM members m
      JOIN pg_catalog.pg_proc p ON m.classid = 'pg_catalog.pg_proc'::regclass AND p.oid = m.objid
      LEFT JOIN pg_catalog.pg_aggregate ag ON ag.aggfnoid = p.oid
    UNION ALL
    SELECT m.obj, 'owner ' || pg_catalog.pg_get_userbyid(p.proowner)
           || ' acl ' || coalesce(p.proacl::text, 'default')
      FROM members m
      JOIN pg_catalog.pg_proc p ON m.classid = 'pg_catalog.pg_proc'::regclass AND p.oid = m.objid
    UNION ALL
    SELECT obj, 'relation kind ' || relkind::text || ' persistence ' || relpersistence::text
           || ' options ' || coalesce(reloptions::text, '')
           || ' row security ' || relrowsecurity || ' forced ' || relforcerowsecurity
           || ' owner ' || pg_catalog.pg_get_userbyid(relowner)
           || ' acl ' || coalesce(relacl::text, 'default')
           || ' replica identity ' || relreplident::text
      FROM rels
    UNION ALL
    SELECT r.obj, 'column ' || (row_number() OVER (PARTITION BY r.relid ORDER BY a.attnum))
           || ' ' || a.attname || ' ' || pg_catalog.format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || ' identity ' || a.attidentity::text || ' generated ' || a.attgenerated::text
           || ' collation ' || coalesce(co.collname::text, '')
           || ' default ' || coalesce(pg_catalog.pg_get_expr(ad.adbin, ad.adrelid), '')
           -- NULL from 17 on where earlier versions store -1, the default
           || ' storage ' || a.attstorage::text
           || ' statistics ' || coalesce(a.attstattarget, -1)
           || ' acl ' || coalesce(a.attacl::text, 'default')
      FROM rels r
      JOIN pg_catalog.pg_attribute a ON a.attrelid = r.relid AND a.attnum > 0 AND NOT a.attisdropped
      LEFT JOIN pg_catalog.pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
      LEFT JOIN pg_catalog.pg_collation co ON co.oid = a.attcollation
    UNION ALL
    SELECT r.obj, 'constraint ' || con.conname || ': ' || pg_catalog.pg_get_constraintdef(con.oid)
           || CASE WHEN con.condeferrable THEN ' deferrable' ELSE '' END
      FROM rels r JOIN pg_catalog.pg_constraint con ON con.conrelid = r.relid
     -- NOT NULL, a constraint of its own from PostgreSQL 18 on, is compared
     -- with its column: its name follows the table it was copied from
     WHERE con.contype <> 'n'
    UNION ALL
    SELECT r.obj, 'index: ' || pg_catalog.pg_get_indexdef(i.indexrelid)
           || CASE WHEN i.indisclustered THEN ' clustered' ELSE '' END
           || ' comment ' || coalesce(pg_catalog.obj_description(i.indexrelid, 'pg_class'), '')
      FROM rels r JOIN pg_catalog.pg_index i ON i.indrelid = r.relid
    UNION ALL
    SELECT r.obj, 'trigger: ' || pg_catalog.pg_get_triggerdef(t.oid)
           || ' enabled ' || t.tgenabled::text
      FROM rels r JOIN pg_catalog.pg_trigger t ON t.tgrelid = r.relid AND NOT t.tgisinternal
    UNION ALL
    SELECT r.obj, 'policy ' || po.polname || ' ' || po.polcmd::text || ' permissive ' || po.polpermissive
           || ' roles ' || po.polroles::regrole[]::text
           || ' using ' || coalesce(pg_catalog.pg_get_expr(po.polqual, po.polrelid), '')
           || ' check ' || coalesce(pg_catalog.pg_get_expr(po.polwithcheck, po.polrelid), '')
      FROM rels r JOIN pg_catalog.pg_policy po ON po.polrelid = r.relid
    UNION ALL
    SELECT r.obj, 'rule ' || ru.rulename || ': ' || pg_catalog.pg_get_ruledef(ru.oid)
      FROM rels r JOIN pg_catalog.pg_rewrite ru ON ru.ev_class = r.relid
     WHERE ru.rulename <> '_RETURN'
    UNION ALL
    SELECT obj, 'view: ' || pg_catalog.pg_get_viewdef(relid) FROM rels WHERE relkind IN ('v', 'm')
    UNION ALL
    SELECT r.obj, 'sequence ' || s.seqtypid::regtype::text || ' start ' || s.seqstart
           || ' increment ' || s.seqincrement || ' min ' || s.seqmin || ' max ' || s.seqmax
           || ' cache ' || s.seqcache || ' cycle ' || s.seqcycle
      FROM rels r JOIN pg_catalog.pg_sequence s ON s.seqrelid = r.relid
    UNION ALL
    SELECT m.obj, 'type ' || t.typtype::text || ' owner ' || pg_catalog.pg_get_userbyid(t.typowner)
           || ' acl ' || coalesce(t.typacl::text, 'default')
           || ' base ' || CASE WHEN t.typbasetype <> 0
                               THEN pg_catalog.format_type(t.typbasetype, t.typtypmod) ELSE '' END
           || ' not null ' || t.typnotnull || ' default ' || coalesce(t.typdefault, '')
           || ' labels ' || coalesce((SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                        FROM pg_catalog.pg_enum e WHERE e.enumtypid = t.oid), '')
           || ' attributes ' || coalesce((SELECT string_agg(a.attname || ' '
                                                 || pg_catalog.format_type(a.atttypid, a.atttypmod),
                                                 ', ' ORDER BY a.attnum)
                                            FROM pg_catalog.pg_attribute a
                                           WHERE a.attrelid = t.typrelid AND a.attnum > 0
                                             AND NOT a.attisdropped), '')
      FROM members m
      JOIN pg_catalog.pg_type t ON m.classid = 'pg_catalog.pg_type'::regclass AND t.oid = m.objid
    UNION ALL
    SELECT m.obj, 'domain constraint ' || con.conname || ': ' || pg_catalog.pg_get_constraintdef(con.oid)
      FROM members m
      JOIN pg_catalog.pg_constraint con
        ON m.classid = 'pg_catalog.pg_type'::regclass AND con.contypid = m.objid
    UNION ALL
    SELECT m.obj, 'schema owner ' || pg_catalog.pg_get_userbyid(n.nspowner)
           || ' acl ' || coalesce(n.nspacl::text, 'default')
      FROM members m
      JOIN pg_catalog.pg_namespace n
        ON m.classid = 'pg_catalog.pg_namespace'::regclass AND n.oid = m.objid
    UNION ALL
    SELECT m.obj, 'operator ' || o.oprcode::regprocedure::text
      FROM members m
      JOIN pg_catalog.pg_operator o ON m.classid = 'pg_catalog.pg_operator'::regclass AND o.oid = m.objid
    UNION ALL
    SELECT m.obj, 'cast ' || c.castcontext::text || ' ' || c.castmethod::text || ' '
           || coalesce(c.castfunc::regprocedure::text, '')
      FROM members m
      JOIN pg_catalog.pg_cast c ON m.classid = 'pg_catalog.pg_cast'::regclass AND c.oid = m.objid
    UNION ALL
    SELECT m.obj, 'event trigger ' || et.evtevent || ' ' || et.evtfoid::regprocedure::text
           || ' enabled ' || et.evtenabled::text || ' tags ' || coalesce(et.evttags::text, '')
      FROM members m
      JOIN pg_catalog.pg_event_trigger et
        ON m.classid = 'pg_catalog.pg_event_trigger'::regclass AND et.oid = m.objid
    UNION ALL
    -- the settings the library defines, as the database sees them
    SELECT 'library', 'setting ' || s.name || ' ' || s.vartype || ' ' || s.context
           || ' boot ' || coalesce(s.boot_val, '') || ' min ' || coalesce(s.min_val, '')
           || ' max ' || coalesce(s.max_val, '') || ' unit ' || coalesce(s.unit, '')
           || ' values ' || coalesce(s.enumvals::text, '')
      FROM pg_catalog.pg_settings s
     WHERE s.name LIKE 'idem\_consumer.%'
)
-- a NULL fact would drop its line from both sides of a comparison
SELECT regexp_replace(obj || ' | ' || coalesce(fact, 'unknown (NULL)'), '\s+', ' ', 'g') AS line
  FROM facts ORDER BY 1
SQL

# catalog_lines(node, db): the catalog description of the extension in db.
sub catalog_lines
{
	my ($node, $db) = @_;
	return [ split /\n/, $node->safe_psql($db, $catalog_query) ];
}

# difference(a, b): the lines of a missing from b, and those of b missing
# from a, each prefixed with "-" or "+".
sub difference
{
	my ($a, $b) = @_;
	my %in_a = map { $_ => 1 } @$a;
	my %in_b = map { $_ => 1 } @$b;
	return [ (map { "- $_" } grep { !$in_b{$_} } @$a),
			 (map { "+ $_" } grep { !$in_a{$_} } @$b) ];
}

# What a database updated from 1.0 or 1.1 keeps and a new install of 1.2
# never has: the tables of the keys recorded before 1.2, with their
# indexes on the 32-bit hash, that hash, the entries that dump the tables,
# and the two branches of idem_consumers that count their keys
# (docs/upgrading.md).  Every one of them is in an updated database, none
# in a new install; nothing else may differ.
my @legacy_only = (
	qr/^table idem_consumer\.processed_keys \| /,
	qr/^table idem_consumer\.key_collisions \| /,
	qr/^function idem_consumer\.key_hash\(integer,text\) \| /,
	qr/^extension \| dumps idem_consumer\.processed_keys where $/,
	qr/^extension \| dumps idem_consumer\.key_collisions where $/,
);
# the row types of the legacy tables and their arrays, which PostgreSQL 17
# and later list as members of the extension beside the tables (15 does
# not): legacy too, where they are listed
my @legacy_row_types = (
	qr/^type idem_consumer\.processed_keys(\[\])? \| /,
	qr/^type idem_consumer\.key_collisions(\[\])? \| /,
);
my $legacy_branches = qr/SELECT processed_keys\.processed_at FROM idem_consumer\.processed_keys WHERE \(processed_keys\.consumer_id = c\.consumer_id\) UNION ALL SELECT key_collisions\.processed_at FROM idem_consumer\.key_collisions WHERE \(key_collisions\.consumer_id = c\.consumer_id\) UNION ALL /;

# legacy_difference(updated, new install): checks that the updated
# database has each object of @legacy_only and the new install none, and
# returns the difference of the two but for those objects, with the
# lines of idem_consumers' definition compared without the legacy branches.
sub legacy_difference
{
	my ($updated, $fresh, $label) = @_;
	for my $legacy (@legacy_only)
	{
		ok((grep { $_ =~ $legacy } @$updated), "$label keeps $legacy");
		ok(!(grep { $_ =~ $legacy } @$fresh), "a new install has no $legacy");
	}
	my @view = grep { /^view idem_consumers \| view: / } @$updated;
	ok(@view == 1 && $view[0] =~ $legacy_branches,
		"$label: idem_consumers counts the keys of the legacy tables");
	ok(!(grep { /^view idem_consumers \| view: / && $_ =~ $legacy_branches } @$fresh),
		'a new install: idem_consumers counts the keys of the ring alone');
	ok(!(grep { my $line = $_; grep { $line =~ $_ } @legacy_row_types } @$fresh),
		'a new install has no row type of a legacy table');
	my @kept = map { s/$legacy_branches//r }
	  grep { my $line = $_; !grep { $line =~ $_ } @legacy_only, @legacy_row_types } @$updated;
	return difference(\@kept, $fresh);
}

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem_consumer'\n");
$node->start;

# The scripts PostgreSQL installs from are the ones under test.
my $sharedir = $node->config_data('--sharedir') . '/extension';
is(Digest::SHA->new(256)->addfile("$sharedir/idem_consumer--1.0.sql")->hexdigest,
	$released_1_0_sha256, 'idem_consumer--1.0.sql is the released 1.0 script, unchanged');
is(Digest::SHA->new(256)->addfile("$sharedir/idem_consumer--1.0--1.1.sql")->hexdigest,
	$released_1_1_sha256, 'idem_consumer--1.0--1.1.sql is the released 1.1 update, unchanged');
is(Digest::SHA->new(256)->addfile("$sharedir/idem_consumer--1.1--1.2.sql")->hexdigest,
	$released_1_2_update_sha256, 'idem_consumer--1.1--1.2.sql is the released 1.2 update, unchanged');
is(Digest::SHA->new(256)->addfile("$sharedir/idem_consumer--1.2.sql")->hexdigest,
	$released_1_2_sha256, 'idem_consumer--1.2.sql is the released 1.2 script, unchanged');
ok(!-e "$sharedir/idem_consumer--1.1.sql" && -e "$sharedir/idem_consumer--$current_version.sql",
	"a new install runs idem_consumer--$current_version.sql; no --1.1.sql");

$node->safe_psql('postgres', q{
	CREATE DATABASE upgraded;
	CREATE DATABASE fresh;
	CREATE DATABASE stays_1_0;
	CREATE DATABASE upgraded_1_1;
	CREATE DATABASE stays_1_1;
	CREATE DATABASE tampered;
	CREATE DATABASE busy_1_1;
	CREATE DATABASE restored_1_1;
	CREATE DATABASE refused_1_1;
});

#
# A 1.0 database with history: applied keys of two consumers, a batch,
# dead letters (one discarded), retention settings and counters.
#
my $setup = q{
	CREATE EXTENSION idem_consumer VERSION '1.0';
	CREATE TABLE ledger (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
	INSERT INTO ledger VALUES (1);
	CREATE TABLE shipments (order_id int PRIMARY KEY);
	SELECT count(*) FROM (
		SELECT idem_apply('paid:' || g, 'payments',
		                  'update ledger set n = n + $1 where id = 1', ARRAY[g::text])
		  FROM generate_series(1, 200) g) s;
	SELECT count(*) FROM idem_record_batch('audit', ARRAY(SELECT 'audit:' || g FROM generate_series(1, 50) g));
	-- shipments of orders the shipping table does not accept yet
	ALTER TABLE shipments ADD CONSTRAINT not_yet CHECK (order_id < 0);
	SELECT idem_try_apply('ship:' || g, 'shipping',
	                      'insert into shipments values ($1)', ARRAY[g::text])
	  FROM generate_series(1, 5) g;
	SELECT idem_dlq_discard(id, 'duplicate order')
	  FROM idem_dead_letters WHERE consumer = 'shipping' AND key = 'ship:5';
	SELECT idem_set_retention('payments', '30 days');
	SELECT idem_set_retention('audit', NULL);
};
# The counters are per consumer name across the cluster: the database that
# stays at 1.0 gets consumers of its own.
$node->safe_psql('upgraded', $setup);
$node->safe_psql('stays_1_0', $setup =~ s/'(payments|audit|shipping)'/'old-$1'/gr);

is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	'1.0', 'the database starts at 1.0');

# A team's role that uses a consumer under 1.0 through a plain grant.
$node->safe_psql('upgraded', q{
	CREATE ROLE legacy_app;
	CREATE ROLE other_app;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz) TO legacy_app, other_app;
	GRANT EXECUTE ON FUNCTION idem_is_processed(text, text) TO legacy_app WITH GRANT OPTION;
	GRANT EXECUTE ON FUNCTION idem_forget(text, text) TO other_app;
	GRANT SELECT, UPDATE ON ledger TO legacy_app, other_app;
	SET ROLE legacy_app;
	SELECT idem_apply('legacy:1', 'legacy', 'update ledger set n = n + 0 where id = 1');
	RESET ROLE;
});

my %state_queries = (
	keys => q{SELECT consumer, count(*) FROM idem_processed_keys GROUP BY 1 ORDER BY 1},
	dead_letters => q{SELECT consumer, key, status, sqlstate, attempts, discard_reason
	                    FROM idem_dead_letters ORDER BY 1, 2},
	retention => q{SELECT consumer, retention, is_default FROM idem_retention ORDER BY 1},
	counters => q{SELECT consumer, applied, duplicates, failed, dead_lettered,
	                     latency_p50_ms, latency_max_ms, stats_reset
	                FROM idem_stats WHERE consumer IN ('payments', 'audit', 'shipping') ORDER BY 1},
	ledger => q{SELECT n FROM ledger},
);
my %before = map { $_ => $node->safe_psql('upgraded', $state_queries{$_}) } keys %state_queries;
like($before{dead_letters}, qr/shipping\|ship:4\|pending\|23514/,
	'the 1.0 database has pending dead letters');
like($before{counters}, qr/^payments\|200\|0\|0\|0\|/m, 'and counters');
like($before{retention}, qr/^audit\|\|f\n.*^payments\|30 days\|f$/ms, 'and retention settings');

#
# The update.
#
$node->safe_psql('upgraded', 'ALTER EXTENSION idem_consumer UPDATE');
is($node->safe_psql('upgraded', q{SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	$current_version, "ALTER EXTENSION idem_consumer UPDATE brings 1.0 to $current_version");
is($node->safe_psql('fresh', q{
	CREATE EXTENSION idem_consumer;
	SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	$current_version, "a new install is $current_version");

for my $what (sort keys %state_queries)
{
	is($node->safe_psql('upgraded', $state_queries{$what}), $before{$what},
		"$what are unchanged by the update");
}

# every key recorded before the update is still a duplicate
is($node->safe_psql('upgraded', q{
	SELECT count(*) FILTER (WHERE NOT idem_apply('paid:' || g, 'payments',
	                                             'update ledger set n = n + 1000000 where id = 1'))
	  FROM generate_series(1, 200) g}),
	'200', 'every key applied at 1.0 is a duplicate after the update');
is($node->safe_psql('upgraded', 'SELECT n FROM ledger'), $before{ledger}, 'and changed nothing');

# Consumers of 1.0 have no owner and keep working for their roles, through
# the grants they had, until a superuser gives them an owner.
is($node->safe_psql('upgraded', q{SELECT count(*) FROM idem_consumers WHERE owner IS NULL}),
	'4', 'the consumers of 1.0 have no owner after the update');
is($node->safe_psql('upgraded', q{
	SET ROLE legacy_app;
	SELECT idem_apply('legacy:1', 'legacy', 'update ledger set n = n + 0 where id = 1'),
	       idem_apply('legacy:2', 'legacy', 'update ledger set n = n + 0 where id = 1')}),
	'f|t', 'a role granted idem_apply under 1.0 still records keys of its consumer');
is($node->safe_psql('upgraded', q{
	SET ROLE other_app;
	SELECT idem_apply('legacy:3', 'legacy', 'update ledger set n = n + 0 where id = 1')}),
	't', 'and so does any role with EXECUTE, as under 1.0');
$node->safe_psql('upgraded', q{SELECT idem_consumer_set_owner('legacy', 'legacy_app')});
my ($own_rc, $own_out, $own_err) = $node->psql('upgraded', q{
	SET ROLE other_app;
	SELECT idem_apply('legacy:4', 'legacy', 'update ledger set n = n + 0 where id = 1')});
like($own_err, qr/permission denied for consumer "legacy"/,
	'once a superuser gives the consumer an owner, other roles are refused');
is($node->safe_psql('upgraded', q{
	SET ROLE legacy_app;
	SELECT idem_apply('legacy:4', 'legacy', 'update ledger set n = n + 0 where id = 1')}),
	't', 'and its owner goes on');
# 1.2 replaces idem_apply, idem_is_processed and idem_forget of 1.0 with
# functions that take more arguments: the grants on the old ones are on the
# new ones, the grant option kept, and PUBLIC still has none
is($node->safe_psql('upgraded', q{
	SELECT string_agg(f || ':' || r || ':' || has_function_privilege(r, f, 'EXECUTE')
	                  || '/' || has_function_privilege(r, f, 'EXECUTE WITH GRANT OPTION'), ',' ORDER BY f, r)
	  FROM unnest(ARRAY['idem_apply(text, text, text, text[], timestamptz, text, bigint, "any")',
	                    'idem_is_processed(text, text, "any")', 'idem_forget(text, text, "any")']) AS f,
	       unnest(ARRAY['legacy_app', 'other_app']) AS r}),
	join(',', 'idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"):legacy_app:true/false',
		'idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"):other_app:true/false',
		'idem_forget(text, text, "any"):legacy_app:false/false',
		'idem_forget(text, text, "any"):other_app:true/false',
		'idem_is_processed(text, text, "any"):legacy_app:true/true',
		'idem_is_processed(text, text, "any"):other_app:false/false'),
	'the grants on the replaced functions of 1.0 are on the new ones, with their grant option');
is($node->safe_psql('upgraded', q{
	SELECT count(*) FROM pg_proc p, aclexplode(p.proacl) a
	 WHERE p.pronamespace = 'public'::regnamespace AND a.grantee = 0}),
	'0', 'and no function of the API is open to PUBLIC');
is($node->safe_psql('upgraded', q{
	SET ROLE legacy_app;
	SELECT idem_is_processed('legacy:1', 'legacy') || ' ' || idem_apply('legacy:1b', 'legacy', 'select 1', NULL, NULL)}),
	'true true', 'the role calls them as under 1.0');
# pg_dump dumps them: they are the DBA's, not the extension's initial privileges
my ($dump_out, $dump_err);
IPC::Run::run([ 'pg_dump', '-s', '-d', $node->connstr('upgraded') ], '>', \$dump_out, '2>', \$dump_err)
  or die "pg_dump failed: $dump_err";
like($dump_out, qr/^GRANT ALL ON FUNCTION public\.idem_is_processed\(key text, consumer text, route "any"\) TO legacy_app WITH GRANT OPTION;$/m,
	'pg_dump keeps a carried grant');
# the grants are the test's, not the extension's: out of the catalog comparison
$node->safe_psql('upgraded', q{
	REVOKE ALL ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                       idem_is_processed(text, text, "any"), idem_forget(text, text, "any")
	  FROM legacy_app, other_app CASCADE});
is($node->safe_psql('upgraded', q{
	SELECT count(*) FROM idem_record_batch('audit',
	    ARRAY(SELECT 'audit:' || g FROM generate_series(1, 51) g))}),
	'1', 'a batch after the update applies only its new key');
is($node->safe_psql('upgraded', q{
	SELECT string_agg(idem_try_apply('ship:' || g, 'shipping', 'insert into shipments values (0)')::text, ',')
	  FROM generate_series(1, 5) g}),
	'dead_lettered,dead_lettered,dead_lettered,dead_lettered,dead_lettered',
	'redeliveries of dead letters run nothing after the update');

# every pending dead letter replays once its cause is fixed
is($node->safe_psql('upgraded', q{
	ALTER TABLE shipments DROP CONSTRAINT not_yet;
	SELECT string_agg(r.outcome::text || ' ' || d.key, ',' ORDER BY d.key)
	  FROM idem_dlq_replay('shipping') AS r JOIN idem_dead_letters AS d USING (id)}),
	'applied ship:1,applied ship:2,applied ship:3,applied ship:4',
	'every pending dead letter of 1.0 replays after the update');
is($node->safe_psql('upgraded', 'SELECT string_agg(order_id::text, \',\' ORDER BY 1) FROM shipments'),
	'1,2,3,4', 'and the replays ran the business SQL');

# the counters go on from where they were
like($node->safe_psql('upgraded', q{SELECT applied, duplicates FROM idem_stats WHERE consumer = 'payments'}),
	qr/^200\|200$/, 'counters continue after the update');

#
# Same objects: an upgraded 1.0 and a new install.
#
my $fresh = catalog_lines($node, 'fresh');
my $upgraded = catalog_lines($node, 'upgraded');
cmp_ok(scalar(@$fresh), '>', 100, 'the catalog description covers the extension\'s objects')
  or diag(join("\n", @$fresh));
is(join("\n", grep { /\| unknown \(NULL\)$/ } @$fresh), '',
	'every fact of the catalog description is known');
my $drift = legacy_difference($upgraded, $fresh, 'a database updated from 1.0');
is(scalar(@$drift), 0, 'an upgraded 1.0 database and a new install have the same objects but the legacy ones')
  or diag("only in the upgraded database (-) or the new install (+):\n" . join("\n", @$drift));

# The comparison sees what an incomplete update script would leave out.
$node->safe_psql('tampered', q{
	CREATE EXTENSION idem_consumer;
	COMMENT ON FUNCTION idem_set_retention(text, interval) IS 'tampered';
	COMMENT ON COLUMN idem_consumer.dead_letters.key IS 'tampered';
	GRANT EXECUTE ON FUNCTION idem_set_retention(text, interval) TO pg_monitor;
	ALTER TABLE idem_consumer.dead_letters ALTER COLUMN attempts SET DEFAULT 2;
	ALTER TABLE idem_consumer.retention_settings ADD CONSTRAINT short CHECK (retention < '1 year');
	DROP INDEX idem_consumer.dead_letters_pending;
	ALTER TYPE idem_outcome ADD VALUE 'tampered';
	CREATE FUNCTION idem_extra(x int) RETURNS int LANGUAGE sql AS 'select x';
	ALTER EXTENSION idem_consumer ADD FUNCTION idem_extra(int);
	CREATE OR REPLACE VIEW idem_retention AS SELECT * FROM idem_retention WHERE true;
});
my $tampered = difference(catalog_lines($node, 'tampered'), $fresh);
for my $change (
	[ qr/^- function idem_set_retention\(text,interval\) \| comment : tampered/, 'a new comment' ],
	[ qr/^- table idem_consumer\.dead_letters \| comment key: tampered/, 'a new column comment' ],
	[ qr/^- function idem_set_retention\(text,interval\) \| owner \S+ acl .*pg_monitor=X/, 'a new grant' ],
	[ qr/^- table idem_consumer\.dead_letters \| column \d+ attempts .* default 2 /, 'another column default' ],
	[ qr/^- table idem_consumer\.retention_settings \| constraint short:/, 'a new constraint' ],
	[ qr/^\+ table idem_consumer\.dead_letters \| index: .*dead_letters_pending/, 'a dropped index' ],
	[ qr/^- type idem_outcome \| .*labels applied,duplicate,dead_lettered,tampered/, 'a new enum label' ],
	[ qr/^- function idem_extra\(integer\) \| member/, 'a new member function' ],
	[ qr/^- view idem_retention \| view: .*WHERE true/, 'another view definition' ])
{
	ok((grep { $_ =~ $change->[0] } @$tampered),
		"the catalog comparison sees $change->[1]")
	  or diag(join("\n", @$tampered));
}

#
# The library serves a database still at 1.0.
#
my $old = 'stays_1_0';
is($node->safe_psql($old, q{SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	'1.0', 'a second database stays at 1.0');
is($node->safe_psql($old, q{
	SELECT idem_apply('paid:201', 'old-payments', 'update ledger set n = n + 1 where id = 1'),
	       idem_apply('paid:1', 'old-payments', 'update ledger set n = n + 1 where id = 1'),
	       idem_is_processed('paid:201', 'old-payments')}),
	't|f|t', 'at 1.0: idem_apply applies and detects duplicates');
is($node->safe_psql($old, q{
	SELECT idem_try_apply('ship:6', 'old-shipping', 'insert into shipments values (6)'),
	       idem_try_apply('ship:1', 'old-shipping', 'insert into shipments values (1)')}),
	'dead_lettered|dead_lettered', 'at 1.0: idem_try_apply parks failing messages');
# a replay runs the entry's SQL as the role that parked it, which only 1.1
# records: at 1.0 it is refused, with the hint to update, and runs nothing
$node->safe_psql($old, 'ALTER TABLE shipments DROP CONSTRAINT not_yet');
my (undef, undef, $replay_err) = $node->psql($old, q{SELECT * FROM idem_dlq_replay('old-shipping')});
like($replay_err, qr/dead-letter replay needs version 1\.1 .*HINT:  Run ALTER EXTENSION idem_consumer UPDATE\./s,
	'at 1.0: idem_dlq_replay is refused with the hint to update');
is($node->safe_psql($old, q{
	SELECT applied, duplicates, dead_lettered FROM idem_stats WHERE consumer = 'old-payments'}),
	'201|1|0', 'at 1.0: idem_stats counts');
like($node->safe_psql($old, 'SELECT idem_metrics()'),
	qr/^idem_applied_total\{consumer="old-payments"\} 201\n.*^idem_dlq_pending\{consumer="old-shipping"\} 5$/ms,
	'at 1.0: idem_metrics() exports the counters and the dead-letter gauges');
$node->safe_psql($old, q{
	SELECT idem_set_retention('old-payments', '1 hour');
	UPDATE idem_consumer.processed_keys SET processed_at = processed_at - 7200
	 WHERE key LIKE 'paid:1_';
});
is($node->safe_psql($old, q{SELECT idem_purge('old-payments')}), '10',
	'at 1.0: idem_purge removes expired keys');
is($node->safe_psql($old, q{SELECT idem_is_processed('paid:12', 'old-payments'), idem_is_processed('paid:2', 'old-payments')}),
	'f|t', 'only those');

#
# A 1.1 database with history: owned consumers, keys with fingerprints, a
# batch, dead letters parked by a team's role, an external effect,
# retention settings and counters; updated to the current version.
#
my $setup_1_1 = q{
	CREATE EXTENSION idem_consumer VERSION '1.1';
	CREATE TABLE ledger (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
	INSERT INTO ledger VALUES (1);
	CREATE TABLE shipments (order_id int PRIMARY KEY);
	ALTER TABLE shipments ADD CONSTRAINT not_yet CHECK (order_id < 0);
	GRANT SELECT, UPDATE ON ledger TO team_a;
	GRANT SELECT, INSERT ON shipments TO team_a;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz),
	                          idem_try_apply(text, text, text, text[], timestamptz),
	                          idem_is_processed(text, text)
	   TO team_a;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text),
	                          idem_record_batch(text, text[], text[])
	   TO team_a WITH GRANT OPTION;
	SELECT idem_consumer_create('payments', 'team_a');
	SELECT idem_consumer_create('shipping', 'team_a');
	SET ROLE team_a;
	SELECT count(*) FROM (
		SELECT idem_apply('paid:' || g, 'payments',
		                  'update ledger set n = n + $1 where id = 1', ARRAY[g::text])
		  FROM generate_series(1, 200) g) s;
	SELECT idem_try_apply('ship:' || g, 'shipping',
	                      'insert into shipments values ($1)', ARRAY[g::text])
	  FROM generate_series(1, 5) g;
	RESET ROLE;
	SELECT count(*) FROM idem_record_batch('audit', ARRAY(SELECT 'audit:' || g FROM generate_series(1, 50) g));
	SELECT idem_dlq_discard(id, 'duplicate order')
	  FROM idem_dead_letters WHERE consumer = 'shipping' AND key = 'ship:5';
	SELECT idem_set_retention('payments', '30 days');
	SELECT fence FROM idem_effect_begin('mail', 'welcome:1', '{"to": "a@example.com"}');
	SELECT idem_effect_complete('mail', 'welcome:1', 1, '{"id": "m-1"}');
};
$node->safe_psql('postgres', 'CREATE ROLE team_a');
$node->safe_psql('upgraded_1_1', $setup_1_1);
$node->safe_psql('stays_1_1', $setup_1_1 =~ s/'(payments|audit|shipping|mail)'/'old11-$1'/gr);
is($node->safe_psql('upgraded_1_1', q{SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	'1.1', 'a database starts at 1.1');
my %state_queries_1_1 = (
	%state_queries,
	owners => q{SELECT consumer, owner FROM idem_consumers ORDER BY 1},
	effects => q{SELECT consumer, key, state, result FROM idem_effects ORDER BY 1, 2},
	parked_by => q{SELECT key, dead_lettered_by FROM idem_dead_letters ORDER BY 1},
);
my %before_1_1 = map { $_ => $node->safe_psql('upgraded_1_1', $state_queries_1_1{$_}) } keys %state_queries_1_1;
like($before_1_1{effects}, qr/^mail\|welcome:1\|completed\|\{"id": "m-1"\}$/m,
	'the 1.1 database has a completed effect');
like($before_1_1{owners}, qr/^payments\|team_a$/m, 'and owned consumers');
$node->safe_psql('upgraded_1_1', 'ALTER EXTENSION idem_consumer UPDATE');
is($node->safe_psql('upgraded_1_1', q{SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	$current_version, "ALTER EXTENSION idem_consumer UPDATE brings 1.1 to $current_version");
for my $what (sort keys %state_queries_1_1)
{
	is($node->safe_psql('upgraded_1_1', $state_queries_1_1{$what}), $before_1_1{$what},
		"1.1: $what are unchanged by the update");
}
# Keys recorded by the 1.1 library hold the hash of their parameters'
# text, not of the typed values.  legacy_fingerprint computes that hash in
# SQL (hashtext is the same hash_bytes, hashint4 the same hash of the
# count), pinned to a value the 1.1 library reported in key_reuse's
# expected output; the keys get it as if 1.1 had recorded them.
$node->safe_psql('upgraded_1_1', q{
	CREATE FUNCTION legacy_fingerprint(sql text, params text[]) RETURNS integer
	LANGUAGE plpgsql IMMUTABLE AS $f$
	DECLARE
	    m constant bigint := 4294967295;
	    h bigint := hashtext(sql)::bigint & m;
	    b bigint;
	    v text;
	BEGIN
	    IF cardinality(params) > 0 THEN
	        b := hashint4(cardinality(params))::bigint & m;
	        h := h # ((b + 2654435769 + ((h << 6) & m) + (h >> 2)) & m);
	        FOREACH v IN ARRAY params LOOP
	            b := CASE WHEN v IS NULL THEN 1853189228 ELSE hashtext(v)::bigint & m END;
	            h := h # ((b + 2654435769 + ((h << 6) & m) + (h >> 2)) & m);
	        END LOOP;
	    END IF;
	    RETURN (h - CASE WHEN h >= 2147483648 THEN 4294967296 ELSE 0 END)::integer;
	END
	$f$});
is($node->safe_psql('upgraded_1_1', q{
	SELECT to_hex(legacy_fingerprint('update reuse_orders set paid = paid + $1 where id = $2', ARRAY['10', '1']))}),
	'eb525adb', 'the test computes the fingerprint of 1.1');
is($node->safe_psql('upgraded_1_1', q{
	WITH legacy AS (
	    UPDATE idem_consumer.processed_keys AS p
	       SET fingerprint = legacy_fingerprint('update ledger set n = n + $1 where id = 1',
	                                            ARRAY[substr(p.key, 6)])
	      FROM idem_consumer.consumers AS c
	     WHERE c.consumer_id = p.consumer_id AND c.name = 'payments'
	    RETURNING p.fingerprint)
	SELECT count(*) FROM legacy WHERE fingerprint IS NOT NULL}),
	'200', '1.1: the keys hold the text fingerprints 1.1 recorded');
is($node->safe_psql('upgraded_1_1', q{
	SELECT count(*) FROM idem_consumer.key_collisions AS k
	  JOIN idem_consumer.consumers AS c USING (consumer_id) WHERE c.name = 'payments'}),
	'0', '1.1: no key of the test is a collision (all were rewritten above)');
is($node->safe_psql('upgraded_1_1', q{
	SET ROLE team_a;
	SELECT count(*) FILTER (WHERE NOT idem_apply('paid:' || g, 'payments',
	                                             'update ledger set n = n + $1 where id = 1', ARRAY[g::text]))
	  FROM generate_series(1, 200) g}),
	'200', '1.1: every key applied before the update is a duplicate after it, fingerprint and all');
is($node->safe_psql('upgraded_1_1', 'SELECT n FROM ledger'), $before_1_1{ledger}, '1.1: and changed nothing');
my ($reuse_rc, $reuse_out, $reuse_err) = $node->psql('upgraded_1_1', q{
	SET ROLE team_a;
	\set VERBOSITY verbose
	SELECT idem_apply('paid:7', 'payments', 'update ledger set n = n + $1 where id = 1', ARRAY['8'])});
like($reuse_err, qr/ERROR:  IK001: key "paid:7" of consumer "payments" was recorded for another message/,
	'1.1: another message under a key with a text fingerprint is still refused');
is($node->safe_psql('upgraded_1_1', 'SELECT n FROM ledger'), $before_1_1{ledger}, '1.1: and ran nothing');
$node->safe_psql('upgraded_1_1', 'DROP FUNCTION legacy_fingerprint(text, text[])');
is($node->safe_psql('upgraded_1_1', q{
	SELECT action, result FROM idem_effect_begin('mail', 'welcome:1', '{"to": "a@example.com"}')}),
	'replay|{"id": "m-1"}', '1.1: a completed effect returns its stored result after the update');
is($node->safe_psql('upgraded_1_1', q{
	ALTER TABLE shipments DROP CONSTRAINT not_yet;
	SELECT string_agg(r.outcome::text || ' ' || d.key, ',' ORDER BY d.key)
	  FROM idem_dlq_replay('shipping') AS r JOIN idem_dead_letters AS d USING (id)}),
	'applied ship:1,applied ship:2,applied ship:3,applied ship:4',
	'1.1: every pending dead letter replays after the update, as the role that parked it');
#
# The keys of 1.1 stay where they were, in processed_keys and
# key_collisions themselves (the old generation); new keys go into the
# first generation, processed_keys_1.
#
my $old_keys_query = q{
	SELECT (SELECT count(*) FROM idem_consumer.processed_keys)
	       || '/' || (SELECT count(*) FROM idem_consumer.key_collisions)
	       || '/' || (SELECT count(*) FROM idem_consumer.processed_keys_1)};
my ($old_keys, $old_collisions, $new_keys) = split m{/}, $node->safe_psql('upgraded_1_1', $old_keys_query);
cmp_ok($old_keys, '>=', 255, '1.1: the keys recorded before the update are still in processed_keys');
is($node->safe_psql('upgraded_1_1', q{SELECT idem_apply('after:1', 'payments', 'select 1')}),
	't', '1.1: a new key after the update is applied');
is($node->safe_psql('upgraded_1_1', $old_keys_query),
	"$old_keys/$old_collisions/" . ($new_keys + 1), '1.1: into the first generation');
# two keys of 1.1 that share a 32-bit hash: the second is a collision in
# the old generation
$node->safe_psql('busy_1_1', q{
	CREATE EXTENSION idem_consumer VERSION '1.1';
	CREATE TABLE pair AS
	    WITH k AS (SELECT 'evt-' || g AS key, idem_consumer.key_hash(1, 'evt-' || g) AS h
	                 FROM generate_series(1, 400000) g),
	         p AS (SELECT h FROM k GROUP BY h HAVING count(*) >= 2 ORDER BY h LIMIT 1)
	    SELECT row_number() OVER (ORDER BY key) AS n, key FROM k WHERE h = (SELECT h FROM p);
	SELECT idem_consumer_create('hashing');
	SELECT idem_apply(key, 'hashing', 'select 1') FROM pair WHERE n <= 2 ORDER BY n;
	SELECT count(*) FROM idem_record_batch('expiring', ARRAY(SELECT 'exp:' || g FROM generate_series(1, 30) g));
});
is($node->safe_psql('busy_1_1', q{SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'hashing'}),
	'1', 'the consumer of the colliding keys has the id they were searched for');
is($node->safe_psql('busy_1_1', q{SELECT count(*) FROM idem_consumer.key_collisions}),
	'1', '1.1: two keys of one hash, one of them a collision');

# The update waits for a transaction that has recorded a key and has not
# ended: from then on nothing inserts into processed_keys.
my $recorder = $node->background_psql('busy_1_1', on_error_stop => 1);
# the session meets the colliding key of 1.1 first: its statements on the
# tables of 1.1 are prepared
is($recorder->query_safe(q{SELECT idem_apply((SELECT key FROM pair WHERE n = 2), 'hashing', 'select 1')}),
	'f', 'a session of 1.1 finds the collision a duplicate');
$recorder->query_safe(q{BEGIN; SELECT idem_apply('inflight:1', 'hashing', 'select 1')});
my ($lock_rc, $lock_out, $lock_err) = $node->psql('busy_1_1',
	q{SET lock_timeout = '300ms'; ALTER EXTENSION idem_consumer UPDATE});
like($lock_err, qr/canceling statement due to lock timeout/,
	'the update waits for a transaction of 1.1 that recorded a key');
$recorder->query_safe(q{SELECT idem_apply('inflight:2', 'hashing', 'select 1'); COMMIT});
$node->safe_psql('busy_1_1', q{ALTER EXTENSION idem_consumer UPDATE});
# The session connected before the update goes on after it: it finds the
# collision of 1.1 in the old generation, and records a new key, through
# the SQL statements too, in the first generation.
is($recorder->query_safe(q{
	SELECT idem_apply((SELECT key FROM pair WHERE n = 2), 'hashing', 'select 1')
	       || ' ' || idem_apply('after-update:1', 'hashing', 'select 1')}),
	'false true', 'a session connected before the update finds old keys and records new ones after it');
is($recorder->query_safe(q{
	SET idem_consumer.fast_path = off;
	SELECT idem_apply((SELECT key FROM pair WHERE n = 2), 'hashing', 'select 1')
	       || ' ' || idem_apply('after-update:2', 'hashing', 'select 1');
	RESET idem_consumer.fast_path}),
	'false true', 'and so on the SQL path');
$recorder->quit;
is($node->safe_psql('busy_1_1', q{
	SELECT string_agg(key, ',' ORDER BY key) FROM idem_consumer.processed_keys_1 WHERE key LIKE 'after-update:%'}),
	'after-update:1,after-update:2', 'those new keys are in the first generation');
is($node->safe_psql('busy_1_1', q{
	SELECT string_agg(key, ',' ORDER BY key) FROM idem_consumer.processed_keys WHERE key LIKE 'inflight:%'}),
	'inflight:1,inflight:2', 'and then updates, with the keys of that transaction in the old generation');

is($node->safe_psql('busy_1_1', q{
	SELECT string_agg(idem_apply(key, 'hashing', 'select 1')::text, ',' ORDER BY n) FROM pair WHERE n <= 2}),
	'false,false', 'both colliding keys of 1.1 are duplicates after the update');
is($node->safe_psql('busy_1_1', q{SELECT idem_forget((SELECT key FROM pair WHERE n = 1), 'hashing')}),
	't', 'the occupant of a hash in the old generation is forgotten');
is($node->safe_psql('busy_1_1', q{
	SELECT (SELECT count(*) FROM idem_consumer.key_collisions)
	       || ' ' || (SELECT count(*) FROM idem_consumer.processed_keys WHERE key = (SELECT key FROM pair WHERE n = 2))
	       || ' ' || idem_is_processed((SELECT key FROM pair WHERE n = 2), 'hashing')
	       || ' ' || idem_is_processed((SELECT key FROM pair WHERE n = 1), 'hashing')}),
	'0 1 true false',
	'forgetting the occupant in the old generation moves its collision into its place');
is($node->safe_psql('busy_1_1', q{
	SELECT idem_apply((SELECT key FROM pair WHERE n = 1), 'hashing', 'select 1')
	       || ' ' || idem_apply((SELECT key FROM pair WHERE n = 1), 'hashing', 'select 1')}),
	'true false', 'the forgotten key is applied anew, once');
is($node->safe_psql('busy_1_1', q{
	SELECT count(*) FROM idem_consumer.processed_keys_1 WHERE key = (SELECT key FROM pair WHERE n = 1)}),
	'1', 'the forgotten key is applied anew, once, into the first generation');

# retention removes the expired keys of the old generation
$node->safe_psql('busy_1_1', q{
	UPDATE idem_consumer.processed_keys SET processed_at = processed_at - 40 * 86400
	 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'expiring');
	SELECT idem_apply('exp:new', 'expiring', 'select 1');
});
is($node->safe_psql('busy_1_1', q{SELECT idem_purge('expiring')}),
	'30', 'the purge removes the expired keys of the old generation');
is($node->safe_psql('busy_1_1', q{SELECT string_agg(key, ',') FROM idem_processed_keys WHERE consumer = 'expiring'}),
	'exp:new', 'and keeps the new one');
is($node->safe_psql('busy_1_1', q{SELECT idem_apply('exp:1', 'expiring', 'select 1')}),
	't', 'an expired key of the old generation is a new message again');

# A dump of an updated database restores both generations into a database
# whose extension was made the same way, at 1.1 and updated, before the
# restore (pg_dump writes CREATE EXTENSION IF NOT EXISTS); the restored
# database hashes the keys of the first generation with a seed of its own.
my $dump_1_1 = $node->basedir . '/busy_1_1.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump_1_1, '-d', $node->connstr('busy_1_1') ],
	'pg_dump of an updated database');
# A new install has no legacy tables: the restore fails on their rows
# rather than leave the keys of 1.1 out unsaid.
$node->safe_psql('postgres', 'CREATE DATABASE restored_fresh');
my ($fresh_restore_rc, $fresh_restore_out, $fresh_restore_err);
IPC::Run::run([ 'pg_restore', '-d', $node->connstr('restored_fresh'), $dump_1_1 ],
	'>', \$fresh_restore_out, '2>', \$fresh_restore_err);
like($fresh_restore_err, qr/relation "idem_consumer\.processed_keys" does not exist/,
	'a dump of an updated database does not restore into a new install of 1.2 without an error');
$node->safe_psql('restored_1_1', q{
	CREATE EXTENSION idem_consumer VERSION '1.1';
	ALTER EXTENSION idem_consumer UPDATE});
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored_1_1'), $dump_1_1 ],
	'pg_restore of it into a database updated from 1.1');
is($node->safe_psql('restored_1_1', q{
	SELECT count(*) FILTER (WHERE NOT idem_apply(key, 'hashing', 'select 1')) FROM pair WHERE n <= 2}),
	'2', 'the restored database knows the keys of both generations');
is($node->safe_psql('restored_1_1', q{
	SELECT idem_apply('inflight:1', 'hashing', 'select 1') || ' ' || idem_apply('exp:1', 'expiring', 'select 1')
	       || ' ' || idem_apply('restored:1', 'hashing', 'select 1')}),
	'false false true', 'old keys, new keys and a new delivery after the restore');
isnt($node->safe_psql('restored_1_1', q{SELECT k0 || ':' || k1 FROM idem_consumer_local.key_seed}),
	$node->safe_psql('busy_1_1', q{SELECT k0 || ':' || k1 FROM idem_consumer_local.key_seed}),
	'the restored database has a seed of its own');

# the grants of team_a on the functions 1.2 replaced are on the new ones,
# with the grant option of the 1.1 forms; its calls of 1.0 and 1.1 shapes
# work as they did
is($node->safe_psql('upgraded_1_1', q{
	SELECT string_agg(f || ':' || has_function_privilege('team_a', f, 'EXECUTE')
	                  || '/' || has_function_privilege('team_a', f, 'EXECUTE WITH GRANT OPTION'), ',' ORDER BY f)
	  FROM unnest(ARRAY['idem_apply(text, text, text, text[], timestamptz, text, bigint, "any")',
	                    'idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any")',
	                    'idem_is_processed(text, text, "any")',
	                    'idem_record_batch(text, text[], text[], "any")']) AS f}),
	join(',', 'idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"):true/true',
		'idem_is_processed(text, text, "any"):true/false',
		'idem_record_batch(text, text[], text[], "any"):true/true',
		'idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"):true/false'),
	'1.1: the grants on the replaced functions are on the new ones');
is($node->safe_psql('upgraded_1_1', q{
	SET ROLE team_a;
	SELECT idem_apply('granted:1', 'payments', 'select 1'),
	       idem_apply('granted:2', 'payments', 'select 1', NULL, NULL, 'fp-2'),
	       idem_try_apply('granted:3', 'shipping', 'select 1', NULL, NULL),
	       idem_is_processed('granted:2', 'payments'),
	       (SELECT string_agg(key || '/' || reused, ',') FROM idem_record_batch('payments', ARRAY['granted:2', 'granted:4'], ARRAY['fp-2', NULL]))}),
	't|t|applied|t|granted:4/false', '1.1: the role calls them as under 1.1');
# the grants are the test's, not the extension's: out of the catalog comparison
$node->safe_psql('upgraded_1_1', q{
	REVOKE ALL ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                       idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                       idem_is_processed(text, text, "any"),
	                       idem_record_batch(text, text[], text[], "any")
	  FROM team_a CASCADE});
my $drift_1_1 = legacy_difference(catalog_lines($node, 'upgraded_1_1'), $fresh, 'a database updated from 1.1');
is(scalar(@$drift_1_1), 0, 'an upgraded 1.1 database and a new install have the same objects but the legacy ones')
  or diag("only in the upgraded database (-) or the new install (+):\n" . join("\n", @$drift_1_1));

#
# The same workload on a new install and on the databases updated from 1.0
# and from 1.1 gives the same results: a team's role records keys, meets
# duplicates, parks a message and sees it replayed, forgets a key; an
# operator purges and retires generations; an effect runs once and
# replays its result.  Each step prints what it did; the outputs must be
# equal, and the new install's what the steps must do.
#
$node->safe_psql('postgres', 'CREATE ROLE wl_team');
my $workload_setup = q{
	CREATE TABLE wl_orders (id int PRIMARY KEY, paid int NOT NULL DEFAULT 0);
	INSERT INTO wl_orders (id) SELECT generate_series(1, 5);
	CREATE TABLE wl_ship (id int PRIMARY KEY CHECK (id < 0));
	GRANT SELECT, UPDATE ON wl_orders TO wl_team;
	GRANT INSERT ON wl_ship TO wl_team;
	GRANT EXECUTE ON FUNCTION idem_consumer_create(text, regrole),
	      idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	      idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	      idem_is_processed(text, text, "any"), idem_forget(text, text, "any"),
	      idem_record_batch(text, text[], text[], "any"),
	      idem_effect_begin(text, text, jsonb, interval, "any"),
	      idem_effect_complete(text, text, bigint, jsonb, text, text[], "any")
	   TO wl_team;
	GRANT SELECT ON idem_dead_letters, idem_processed_keys TO wl_team;
};
# Each step is statements of one row each; its output, their rows.
my @workload = (
	[ 'apply' => q{
		SET ROLE wl_team;
		SELECT 'created' FROM idem_consumer_create('wl');
		SELECT string_agg(idem_apply('order:' || g, 'wl', 'update wl_orders set paid = paid + 1 where id = $1',
		                             ARRAY[g::text])::text, ',' ORDER BY g)
		  FROM generate_series(1, 5) g;
		SELECT string_agg(paid::text, ',' ORDER BY id) FROM wl_orders} ],
	[ 'duplicate' => q{
		SET ROLE wl_team;
		SELECT idem_apply('order:1', 'wl', 'update wl_orders set paid = paid + 1 where id = $1', ARRAY['1']);
		SELECT string_agg(k.key || '/' || k.reused, ',' ORDER BY k.key)
		  FROM idem_record_batch('wl', ARRAY['order:2', 'batch:1'], NULL) AS k;
		SELECT string_agg(paid::text, ',' ORDER BY id) FROM wl_orders} ],
	[ 'dead letter' => q{
		SET ROLE wl_team;
		SELECT idem_try_apply('ship:1', 'wl', 'insert into wl_ship values ($1::int)', ARRAY['1']);
		SELECT idem_try_apply('ship:1', 'wl', 'insert into wl_ship values ($1::int)', ARRAY['1']);
		SELECT string_agg(key || '/' || status || '/' || sqlstate || '/' || attempts || '/' || dead_lettered_by, ',')
		  FROM idem_dead_letters WHERE consumer = 'wl'} ],
	[ 'replay' => q{
		ALTER TABLE wl_ship DROP CONSTRAINT wl_ship_id_check;
		SELECT string_agg(r.outcome::text, ',') FROM idem_dlq_replay('wl') AS r;
		SELECT string_agg(key || '/' || status || '/' || attempts, ',') FROM idem_dead_letters WHERE consumer = 'wl';
		SELECT string_agg(id::text, ',') FROM wl_ship} ],
	[ 'forget' => q{
		SET ROLE wl_team;
		SELECT idem_forget('order:5', 'wl');
		SELECT idem_is_processed('order:5', 'wl');
		SELECT idem_apply('order:5', 'wl', 'update wl_orders set paid = paid + 1 where id = $1', ARRAY['5']);
		SELECT count(*) FROM idem_processed_keys WHERE consumer = 'wl'} ],
	[ 'purge and retire' => q{
		SELECT 'window' FROM idem_set_retention('wl', '1 hour');
		UPDATE idem_consumer.processed_keys_1 SET processed_at = processed_at - 7200
		 WHERE key LIKE 'order:%' AND consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'wl');
		SET idem_consumer.key_generation_interval = 0;
		SELECT idem_purge('wl');
		SELECT idem_is_processed('order:1', 'wl') || ' ' || idem_is_processed('batch:1', 'wl');
		SELECT idem_key_generation_switch();
		SELECT idem_apply('order:1', 'wl', 'update wl_orders set paid = paid + 1 where id = $1', ARRAY['1']);
		SELECT idem_key_generation_retire();
		SELECT keys_stored FROM idem_consumers WHERE consumer = 'wl'} ],
	[ 'effects' => q{
		SET ROLE wl_team;
		SELECT action || '/' || fence FROM idem_effect_begin('wl', 'mail:1', '{"to": "b@example.com"}');
		SELECT 'completed' FROM idem_effect_complete('wl', 'mail:1', 1, '{"id": "m-9"}');
		SELECT action || '/' || result FROM idem_effect_begin('wl', 'mail:1', '{"to": "b@example.com"}')} ],
	[ 'state' => q{
		SELECT owner || '/' || keys_stored || '/' || dead_letters_pending FROM idem_consumers WHERE consumer = 'wl';
		SELECT applied || '/' || duplicates || '/' || dead_lettered FROM idem_stats WHERE consumer = 'wl';
		SELECT string_agg(key, ',' ORDER BY key) FROM idem_processed_keys WHERE consumer = 'wl';
		SELECT string_agg(paid::text, ',' ORDER BY id) FROM wl_orders} ],
);
my %expected_workload = (
	'apply' => "created\ntrue,true,true,true,true\n1,1,1,1,1",
	'duplicate' => "f\nbatch:1/false\n1,1,1,1,1",
	'dead letter' => "dead_lettered\ndead_lettered\nship:1/pending/23514/1/wl_team",
	'replay' => "applied\nship:1/replayed/2\n1",
	'forget' => "t\nf\nt\n7",
	'purge and retire' => "window\n5\nfalse true\n2\nt\n0\n3",
	'effects' => "execute/1\ncompleted\nreplay/{\"id\": \"m-9\"}",
	'state' => "wl_team/3/0\n8/3/1\nbatch:1,order:1,ship:1\n2,1,1,1,2",
);
my %workload_out;
for my $db ('fresh', 'upgraded', 'upgraded_1_1')
{
	$node->safe_psql($db, $workload_setup);
	$workload_out{$db} = [ map { $node->safe_psql($db, $_->[1]) } @workload ];
}
for my $i (0 .. $#workload)
{
	my $step = $workload[$i][0];
	is($workload_out{fresh}[$i], $expected_workload{$step}, "workload, $step: a new install");
	is($workload_out{upgraded}[$i], $workload_out{fresh}[$i], "workload, $step: the same from 1.0");
	is($workload_out{upgraded_1_1}[$i], $workload_out{fresh}[$i], "workload, $step: the same from 1.1");
}

#
# An update that would drop a function an object of the database depends
# on is refused before it changes anything, naming the objects; once they
# are gone it runs.
#
$node->safe_psql('refused_1_1', q{
	CREATE EXTENSION idem_consumer VERSION '1.1';
	CREATE VIEW seen AS SELECT idem_is_processed('k', 'c') AS processed;
	CREATE VIEW also_seen AS SELECT idem_apply('k', 'c', 'select 1', NULL, NULL, 'fp') AS applied WHERE false;
});
my ($refused_rc, $refused_out, $refused_err) = $node->psql('refused_1_1',
	'ALTER EXTENSION idem_consumer UPDATE', extra_params => [ '-v', 'VERBOSITY=verbose' ]);
isnt($refused_rc, 0, 'the update of a database whose views call functions 1.2 replaces fails');
like($refused_err, qr/ERROR:  2BP01: idem_consumer cannot be updated to 1\.2 while objects depend on functions it replaces/,
	'with SQLSTATE 2BP01 and a message that says why');
like($refused_err, qr/DETAIL: .*view also_seen \(on idem_apply\(text,text,text,text\[\],timestamp with time zone,text\)\).*view seen \(on idem_is_processed\(text,text\)\)/,
	'naming each object and the function it depends on');
like($refused_err, qr/HINT:  Drop the dependent objects, run ALTER EXTENSION idem_consumer UPDATE again/,
	'and saying what to do');
is($node->safe_psql('refused_1_1', q{
	SELECT extversion, to_regprocedure('idem_is_processed(text, text)') IS NOT NULL,
	       to_regclass('idem_consumer.key_generations') IS NULL
	  FROM pg_extension WHERE extname = 'idem_consumer'}),
	'1.1|t|t', 'and changes nothing');
$node->safe_psql('refused_1_1', 'DROP VIEW seen, also_seen; ALTER EXTENSION idem_consumer UPDATE');
is($node->safe_psql('refused_1_1', q{SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	$current_version, 'without them the update runs');

#
# The library serves a database still at 1.1.
#
is($node->safe_psql('stays_1_1', q{SELECT extversion FROM pg_extension WHERE extname = 'idem_consumer'}),
	'1.1', 'a second database stays at 1.1');
is($node->safe_psql('stays_1_1', q{
	SET ROLE team_a;
	SELECT idem_apply('paid:201', 'old11-payments', 'update ledger set n = n + 1 where id = 1'),
	       idem_apply('paid:1', 'old11-payments', 'update ledger set n = n + $1 where id = 1', ARRAY['1']),
	       idem_is_processed('paid:201', 'old11-payments')}),
	't|f|t', 'at 1.1: idem_apply applies and detects duplicates');
is($node->safe_psql('stays_1_1', q{
	SET ROLE team_a;
	SELECT idem_try_apply('ship:6', 'old11-shipping', 'insert into shipments values (6)')}),
	'dead_lettered', 'at 1.1: idem_try_apply parks failing messages');
is($node->safe_psql('stays_1_1', q{
	ALTER TABLE shipments DROP CONSTRAINT not_yet;
	SELECT string_agg(r.outcome::text, ',')
	  FROM idem_dlq_replay('old11-shipping') AS r}),
	'applied,applied,applied,applied,applied', 'at 1.1: idem_dlq_replay replays them');
is($node->safe_psql('stays_1_1', q{
	SELECT action, result FROM idem_effect_begin('old11-mail', 'welcome:1', '{"to": "a@example.com"}')}),
	'replay|{"id": "m-1"}', 'at 1.1: effects return their stored result');
like($node->safe_psql('stays_1_1', q{
	SELECT applied, duplicates FROM idem_stats WHERE consumer = 'old11-payments'}),
	qr/^201\|1$/, 'at 1.1: idem_stats counts');
like($node->safe_psql('stays_1_1', 'SELECT idem_metrics()'),
	qr/^idem_applied_total\{consumer="old11-payments"\} 201$/m,
	'at 1.1: idem_metrics() exports the counters');
$node->safe_psql('stays_1_1', q{
	SELECT idem_set_retention('old11-payments', '1 hour');
	UPDATE idem_consumer.processed_keys SET processed_at = processed_at - 7200
	 WHERE key LIKE 'paid:1_';
});
is($node->safe_psql('stays_1_1', q{SELECT idem_purge('old11-payments')}), '10',
	'at 1.1: idem_purge removes expired keys');

#
# The functions 1.1 and later versions add exist after the update and can be called: each is
# called with NULL arguments in a transaction that rolls back.  Returning, or
# refusing the arguments with an ordinary error, both show a working
# function; a missing symbol, an internal error or a crash do not.
#
my $added = $node->safe_psql('fresh', q{
	SELECT pg_catalog.string_agg(p.oid::regprocedure::text, E'\n' ORDER BY 1)
	  FROM pg_catalog.pg_depend d
	  JOIN pg_catalog.pg_proc p ON d.classid = 'pg_catalog.pg_proc'::regclass AND p.oid = d.objid
	  JOIN pg_catalog.pg_extension e ON d.refclassid = 'pg_catalog.pg_extension'::regclass
	   AND d.refobjid = e.oid AND d.deptype = 'e'
	 WHERE e.extname = 'idem_consumer' AND p.prokind IN ('f', 'p')
	   AND p.prorettype <> ALL ('{trigger,event_trigger,internal}'::regtype[])});
my %in_1_0 = map { $_ => 1 } split /\n/, $node->safe_psql('stays_1_0', q{
	SELECT pg_catalog.string_agg(p.oid::regprocedure::text, E'\n')
	  FROM pg_catalog.pg_depend d
	  JOIN pg_catalog.pg_proc p ON d.classid = 'pg_catalog.pg_proc'::regclass AND p.oid = d.objid
	  JOIN pg_catalog.pg_extension e ON d.refclassid = 'pg_catalog.pg_extension'::regclass
	   AND d.refobjid = e.oid AND d.deptype = 'e'
	 WHERE e.extname = 'idem_consumer'});
my @new_functions = grep { !$in_1_0{$_} } split /\n/, $added;
note('functions added since 1.0: ' . (@new_functions ? join(', ', @new_functions) : 'none yet'));
$node->safe_psql('upgraded', q{
	CREATE SCHEMA upgrade_test;
	CREATE FUNCTION upgrade_test.call_with_nulls(fn regprocedure) RETURNS text
	LANGUAGE plpgsql AS $$
	DECLARE
	    p pg_catalog.pg_proc;
	    args text;
	    state text;
	BEGIN
	    SELECT * INTO p FROM pg_catalog.pg_proc WHERE oid = fn;
	    SELECT string_agg(CASE WHEN p.provariadic <> 0 AND i = p.pronargs THEN 'VARIADIC ' ELSE '' END
	                      || 'NULL::' || p.proargtypes[i - 1]::regtype::text, ', ' ORDER BY i)
	      INTO args FROM generate_series(1, p.pronargs) i;
	    EXECUTE CASE WHEN p.prokind = 'p' THEN 'CALL ' ELSE 'SELECT ' END
	            || fn::oid::regproc::text || '(' || coalesce(args, '') || ')';
	    RAISE EXCEPTION USING ERRCODE = 'UT000', MESSAGE = 'returned';
	EXCEPTION WHEN OTHERS THEN
	    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
	    RETURN CASE WHEN state = 'UT000' THEN 'returned' ELSE state END;
	END
	$$;
});
# the harness itself: a function that returns, one that refuses NULLs
is($node->safe_psql('upgraded', q{
	SELECT upgrade_test.call_with_nulls('idem_consumer.key_hash(integer, text)'),
	       upgrade_test.call_with_nulls('idem_dlq_replay(bigint)')}),
	'returned|22004', 'calling with NULL arguments tells a function that runs');
for my $fn (@new_functions)
{
	my ($rc, $out, $err) = $node->psql('upgraded',
		"SELECT upgrade_test.call_with_nulls('$fn'::regprocedure)");
	ok($rc == 0 && $out ne '' && $out !~ /^(XX...|58P01|42883|0A000)$/,
		"function $fn (new since 1.0) exists after the update and runs (got " . ($out || $err) . ')');
}

$node->stop;
done_testing();
