# Counters belong to a database: a consumer of one name in two databases
# has two sets of counters, each database's idem_stats and idem_stats_info
# show its own, idem_stats_reset resets its own, and idem_metrics() labels
# every sample with its database, showing every database to roles with the
# privileges of pg_read_all_stats and the current one to anyone else.  A
# database still at 1.1 reads its own counters through the SQL of 1.1.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('databases');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.max_consumers = 32
statement_timeout = '60s'
});
$node->start;

$node->safe_psql('postgres', q{
	CREATE ROLE metrics_reader LOGIN;
	CREATE ROLE monitoring LOGIN IN ROLE pg_monitor;
});
for my $db ('billing', 'shop')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, q{
		CREATE EXTENSION idem_consumer;
		GRANT EXECUTE ON FUNCTION idem_metrics() TO metrics_reader;
	});
}
$node->safe_psql('postgres', 'CREATE DATABASE old_shop');
$node->safe_psql('old_shop', q{CREATE EXTENSION idem_consumer VERSION '1.1'});

$node->safe_psql('billing', q{
	SELECT idem_consumer_create('payments', 'metrics_reader');
	SELECT idem_apply('r-1', 'refunds', 'select 1');
	SELECT idem_apply('b-' || g, 'payments', 'select 1') FROM generate_series(1, 3) g;
	SELECT idem_apply('b-1', 'payments', 'select 1');
});
$node->safe_psql('shop', q{SELECT idem_apply('s-1', 'payments', 'select 1')});
$node->safe_psql('old_shop', q{
	SELECT idem_apply('o-' || g, 'payments', 'select 1') FROM generate_series(1, 5) g});

sub stats_in
{
	my ($db) = @_;
	return $node->safe_psql($db,
		q{SELECT consumer, applied, duplicates FROM idem_stats WHERE consumer = 'payments'});
}

is(stats_in('billing'), 'payments|3|1', 'billing sees the counters of its payments only');
is(stats_in('shop'), 'payments|1|0', 'shop sees the counters of its payments only');
is(stats_in('old_shop'), 'payments|5|0', 'a database at 1.1 sees its own counters');
is($node->safe_psql('shop', 'SELECT consumers FROM idem_stats_info'), '1',
	'idem_stats_info counts the consumers of its database');

# a reset in one database leaves the consumer of the same name elsewhere
$node->safe_psql('shop', q{SELECT idem_stats_reset('payments')});
is(stats_in('billing'), 'payments|3|1', 'resetting payments in shop leaves billing\'s');
$node->safe_psql('shop', q{SELECT idem_stats_reset()});
is(stats_in('billing'), 'payments|3|1', 'resetting all of shop leaves billing\'s');
is(stats_in('old_shop'), 'payments|5|0', 'and those of the database at 1.1');

# idem_metrics(): every sample names its database
my $all = $node->safe_psql('shop', 'SET ROLE monitoring; SELECT idem_metrics()');
like($all, qr/^idem_applied_total\{database="billing",consumer="payments"\} 3$/m,
	'a role with pg_read_all_stats sees billing from shop');
like($all, qr/^idem_applied_total\{database="shop",consumer="payments"\} 0$/m,
	'and shop itself');
like($all, qr/^idem_applied_total\{database="old_shop",consumer="payments"\} 5$/m,
	'and the database still at 1.1');
like($all, qr/^idem_keys_stored\{database="shop"\} \d+$/m,
	'the stored keys are those of the database connected to, labelled');
my $own = $node->safe_psql('billing', 'SET ROLE metrics_reader; SELECT idem_metrics()');
like($own, qr/^idem_applied_total\{database="billing",consumer="payments"\} 3$/m,
	'a plain role granted idem_metrics() sees the consumers it owns');
unlike($own, qr/consumer="refunds"/,
	'not another role\'s of its database');
unlike($own, qr/database="(shop|old_shop)"/,
	'and no other database');

# a database at 1.1 keeps the exposition of 1.1: its own counters, unlabelled
my $old = $node->safe_psql('old_shop', 'SELECT idem_metrics()');
like($old, qr/^idem_applied_total\{consumer="payments"\} 5$/m,
	'at 1.1 idem_metrics() exports its own counters as before');
my @applied_lines = $old =~ /^idem_applied_total\{.*$/mg;
is(scalar(@applied_lines), 1, 'and not those of billing or shop');

# promtool accepts the labelled exposition
my $dir = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file("$dir/metrics.txt", "$all\n");
my ($pout, $perr) = run_command([ 'sh', '-c', "promtool check metrics < $dir/metrics.txt; echo rc=\$?" ]);
like($pout, qr/rc=0$/, 'promtool check metrics accepts the exposition with databases')
  or diag("$pout\n$perr");

# the counters of each database survive a clean restart, still apart
$node->restart;
is(stats_in('billing'), 'payments|3|1', 'after a restart billing has its counters');
is(stats_in('shop'), '', 'and shop, reset, none (counters all zero are not kept)');

$node->stop;
done_testing();
