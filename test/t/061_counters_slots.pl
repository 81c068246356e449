# Slots of the counters go to consumers that exist: calls refused by
# idem_consumer.create_consumers = off and calls on new names that roll back
# take none, before or after a restart; slots of consumers that are gone
# (their database dropped, their extension dropped) are given back when the
# table is full; a backend's memory does not grow with refused calls or
# with the calls of one transaction; the untracked warning comes once per
# consumer and session; a hot standby takes no slot for a name that does
# not exist.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('slots');
$node->init(allows_streaming => 1);
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.max_consumers = 16
statement_timeout = '120s'
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE ROLE team_pay;
	CREATE ROLE pay_app LOGIN IN ROLE team_pay;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO team_pay;
	ALTER ROLE pay_app SET idem_consumer.create_consumers = off;
	GRANT SELECT ON pg_backend_memory_contexts TO pay_app;
	GRANT EXECUTE ON FUNCTION pg_get_backend_memory_contexts() TO pay_app;
	SELECT idem_consumer_create('payments', 'team_pay');
	SELECT idem_consumer_create('refunds', 'team_pay');
});
my $memory = q{SELECT sum(total_bytes) FROM pg_backend_memory_contexts};

sub tracked
{
	return $node->safe_psql('postgres', 'SELECT consumers FROM idem_stats_info');
}

# the calls of one transaction: memory bounded, every call counted
my ($rc, $out, $err) = $node->psql('postgres', qq{
	BEGIN;
	SELECT count(idem_apply('t-' || g, 'payments', 'select 1')) FROM generate_series(1, 1000) g;
	$memory;
	SELECT count(idem_apply('t-' || g, 'payments', 'select 1')) FROM generate_series(1001, 21000) g;
	$memory;
	COMMIT;
});
my (undef, $in_before, undef, $in_after) = split /\n/, $out;
diag("one transaction: $in_before -> $in_after bytes");
cmp_ok($in_after - $in_before, '<', 512 * 1024,
	'20,000 more calls in one transaction grow the backend by less than 512 kB');
is($node->safe_psql('postgres', q{SELECT applied FROM idem_stats WHERE consumer = 'payments'}),
	'21000', 'and every call of it is counted');
is(tracked(), '1', 'payments has a slot');

# a role that may not create consumers, calling on 20 new names
($rc, $out, $err) = $node->psql('postgres', q{
	DO $$
	BEGIN
		FOR i IN 1..20 LOOP
			BEGIN
				PERFORM idem_apply('k', 'refused-' || i, 'select 1');
			EXCEPTION WHEN insufficient_privilege THEN NULL;
			END;
		END LOOP;
	END $$}, extra_params => [ '-U', 'pay_app' ]);
is($rc, 0, 'the refused calls ran');
is(tracked(), '1', 'calls refused for want of create_consumers take no slot');

# a role that rolls back its calls on 1,000 new names
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT count(idem_apply('k', 'rolled-back-' || g, 'select 1')) FROM generate_series(1, 1000) g;
	ROLLBACK;
});
is(tracked(), '1', 'calls on new names rolled back take no slot');
$node->safe_psql('postgres', q{
	DO $$
	BEGIN
		FOR i IN 1..30 LOOP
			BEGIN
				PERFORM idem_apply('k', 'savepoint-' || i, 'select 1 / 0');
			EXCEPTION WHEN division_by_zero THEN NULL;
			END;
		END LOOP;
	END $$});
is(tracked(), '1', 'nor calls on new names whose savepoint rolls back');
$node->restart;
is(tracked(), '1', 'and none after a restart');

# the owner's consumers are tracked, including a first call that fails
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT idem_apply('p-1', 'refunds', 'select 1 / 0')}, extra_params => [ '-U', 'pay_app' ]);
is($node->safe_psql('postgres', q{SELECT applied, failed FROM idem_stats WHERE consumer = 'refunds'}),
	'0|1', 'the failure of a consumer that exists is counted');
$node->safe_psql('postgres', q{SELECT idem_apply('p-2', 'refunds', 'select 1')});
is($node->safe_psql('postgres', q{SELECT applied, failed FROM idem_stats WHERE consumer = 'refunds'}),
	'1|1', 'and its applied calls');
is($node->safe_psql('postgres', q{SELECT applied FROM idem_stats WHERE consumer = 'payments'}),
	'21000', 'the counters of payments survived the restart');

# Slots of consumers that are gone come back when the table is full: fill
# it from another database, drop that database, and a new consumer here
# gets a slot.
$node->safe_psql('postgres', 'CREATE DATABASE gone');
$node->safe_psql('gone', q{
	CREATE EXTENSION idem_consumer;
	SELECT idem_apply('k', 'gone-' || g, 'select 1') FROM generate_series(1, 14) g;
});
is(tracked(), '2', 'postgres counts its two consumers');
is($node->safe_psql('gone', 'SELECT consumers FROM idem_stats_info'), '14',
	'the other database fills the table');
($rc, $out, $err) = $node->psql('postgres', q{SELECT idem_apply('k', 'late', 'select 1')});
like($err, qr/WARNING:  counters of consumer "late" are not tracked/,
	'a consumer beyond max_consumers is told');
$node->safe_psql('postgres', 'DROP DATABASE gone');
$node->safe_psql('postgres', q{SELECT idem_apply('k2', 'late', 'select 1')});
is($node->safe_psql('postgres', q{SELECT applied FROM idem_stats WHERE consumer = 'late'}), '1',
	'after its database is dropped, the slots of its consumers are reclaimed');

# the same when the extension is dropped and created again in a database
$node->safe_psql('postgres', 'CREATE DATABASE recreated');
$node->safe_psql('recreated', q{
	CREATE EXTENSION idem_consumer;
	SELECT idem_apply('k', 'old-' || g, 'select 1') FROM generate_series(1, 13) g;
	DROP EXTENSION idem_consumer;
	CREATE EXTENSION idem_consumer;
});
$node->safe_psql('recreated', q{SELECT idem_apply('k', 'new-one', 'select 1')});
is($node->safe_psql('recreated', q{SELECT string_agg(consumer || ':' || applied, ',') FROM idem_stats}),
	'new-one:1', 'slots of consumers dropped with their extension are reclaimed');

# the untracked warning: once per consumer and session
$node->safe_psql('recreated', q{
	SELECT idem_apply('k', 'fill-' || g, 'select 1') FROM generate_series(1, 20) g});
($rc, $out, $err) = $node->psql('recreated', q{
	SELECT idem_apply('w-' || g, 'fill-20', 'select 1') FROM generate_series(1, 5) g;
	SELECT idem_apply('w-' || g, 'fill-20', 'select 1') FROM generate_series(6, 9) g;
});
my $warnings = () = $err =~ /counters of consumer "fill-20" are not tracked/g;
is($warnings, 1, 'an untracked consumer is warned about once per session');

# memory: 20,000 refused calls on new names, after 1,000 that warm the caches
($rc, $out, $err) = $node->psql('postgres', qq{
	SET client_min_messages = error;
	DO \$\$
	BEGIN
		FOR i IN 1..1000 LOOP
			BEGIN
				PERFORM idem_apply('k', 'warm-up-' || i, 'select 1');
			EXCEPTION WHEN insufficient_privilege THEN NULL;
			END;
		END LOOP;
	END \$\$;
	$memory;
	DO \$\$
	BEGIN
		FOR i IN 1..20000 LOOP
			BEGIN
				PERFORM idem_apply('k', 'name-' || i, 'select 1');
			EXCEPTION WHEN insufficient_privilege THEN NULL;
			END;
		END LOOP;
	END \$\$;
	$memory;
}, extra_params => [ '-U', 'pay_app' ]);
my ($before, $after) = split /\n/, $out;
diag("refused calls: $before -> $after bytes");
cmp_ok($after - $before, '<', 256 * 1024,
	'20,000 refused calls on new names grow the backend by less than 256 kB');
is(tracked(), '3', 'and take no slot');

# a hot standby takes no slot for names that do not exist
$node->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($node, 'backup', has_streaming => 1);
$standby->start;
$node->wait_for_catchup($standby);
($rc, $out, $err) = $standby->psql('postgres', q{
	SELECT idem_apply('k', 'standby-' || g, 'select 1') FROM generate_series(1, 5) g});
isnt($rc, 0, 'a standby refuses to record');
is($standby->safe_psql('postgres', 'SELECT consumers FROM idem_stats_info'), '0',
	'and takes no slot for a consumer that does not exist');
($rc, $out, $err) = $standby->psql('postgres', q{SELECT idem_apply('k9', 'refunds', 'select 1')});
is($standby->safe_psql('postgres', q{SELECT failed FROM idem_stats WHERE consumer = 'refunds'}), '1',
	'while the failure of a consumer that exists is counted');
$standby->stop;

$node->stop;
done_testing();
