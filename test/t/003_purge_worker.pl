# The purge worker: off by default; with idem_consumer.purge_databases it
# purges expired keys on its schedule (one by one here, with
# key_generation_interval = 0; by generations: t/006) and nothing else, waits (logging
# once) in a database without the extension, follows a reload of its
# interval, and is back after a restart.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Stores $n keys "$prefix-<i>" of $consumer recorded $age ago (an interval),
# straight into the storage, plus one key recorded now unless $age is '0'.
sub store_keys
{
	my ($node, $db, $consumer, $prefix, $n, $age) = @_;
	$node->safe_psql(
		$db, qq{
		INSERT INTO idem_consumer.consumers (name) VALUES ('$consumer') ON CONFLICT DO NOTHING;
		INSERT INTO idem_consumer.processed_keys_1 (consumer_id, processed_at, key)
		SELECT c.consumer_id,
		       floor(extract(epoch FROM now() - interval '$age' - timestamptz '2000-01-01 00:00:00+00'))::int,
		       '$prefix-' || g
		  FROM idem_consumer.consumers c, generate_series(1, $n) g
		 WHERE c.name = '$consumer'
		ON CONFLICT DO NOTHING;});
	return;
}

# Counts the stored keys of $consumer whose key starts with $prefix.
sub count_keys
{
	my ($node, $db, $consumer, $prefix) = @_;
	return $node->safe_psql($db,
		"SELECT count(*) FROM idem_processed_keys WHERE consumer = '$consumer' AND key LIKE '$prefix-%'"
	);
}

my $workers_sql =
  "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem_consumer purge worker'";

# 1. Off by default: preloaded, but no database listed, no worker.
my $off = PostgreSQL::Test::Cluster->new('purge_off');
$off->init;
$off->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idem_consumer'\nidem_consumer.purge_interval = 1\n");
$off->start;
$off->safe_psql('postgres', 'CREATE EXTENSION idem_consumer');
is($off->safe_psql('postgres', 'SHOW idem_consumer.purge_databases'),
	'', 'purge_databases is empty by default');
store_keys($off, 'postgres', 'w', 'new', 1, '0');
store_keys($off, 'postgres', 'w', 'old', 100, '30 days');
sleep 3;
is($off->safe_psql('postgres', $workers_sql), '0', 'no purge worker by default');
is(count_keys($off, 'postgres', 'w', 'old'), '100', 'nothing is purged by default');
$off->stop;

# 2. On for two databases, one of which does not have the extension yet.
# (A listed database that does not exist makes its worker exit at once and
# retry a minute later, so the databases exist before they are listed.)
my $node = PostgreSQL::Test::Cluster->new('purge_on');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem_consumer'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem_consumer');
$node->safe_psql('postgres', 'CREATE DATABASE "Shop"');
$node->append_conf(
	'postgresql.conf', qq{
idem_consumer.purge_databases = 'postgres, "Shop"'
idem_consumer.key_generation_interval = 0
idem_consumer.purge_interval = 1
idem_consumer.purge_delay = 1
idem_consumer.purge_batch_size = 500
});
$node->restart;
ok($node->poll_query_until('postgres', "SELECT ($workers_sql) = 2"),
	'one worker per listed database');

# On Linux the workers are batch processes for the scheduler (policy 3,
# SCHED_BATCH, field 41 of /proc/PID/stat), so that their wakeups do not
# preempt consumers.
SKIP:
{
	skip 'scheduling policies are checked on Linux only', 1 if $^O ne 'linux';
	my @policies;
	foreach my $pid (split /\n/,
		$node->safe_psql('postgres',
			"SELECT pid FROM pg_stat_activity WHERE backend_type = 'idem_consumer purge worker'"))
	{
		open(my $fh, '<', "/proc/$pid/stat") or die "cannot read /proc/$pid/stat: $!";
		my $stat = <$fh>;
		close($fh);
		# after the command name in parentheses, fields 3 onwards
		my @fields = split / /, substr($stat, rindex($stat, ')') + 2);
		push @policies, $fields[41 - 3];
	}
	is(join(',', @policies), '3,3', 'the workers run with the SCHED_BATCH policy');
}
ok( $node->wait_for_log(
		qr/extension "idem_consumer" is not installed in database "Shop"/),
	'the worker of a database without the extension says so');

# consumer w: 3000 expired keys (several chunks), some inside the window;
# consumer keep: expired by the default, but kept forever by its setting
store_keys($node, 'postgres', 'w', 'new', 1, '0');
store_keys($node, 'postgres', 'w', 'inside', 10, '3 days');
store_keys($node, 'postgres', 'keep', 'new', 1, '0');
$node->safe_psql('postgres', "SELECT idem_set_retention('keep', NULL)");
store_keys($node, 'postgres', 'keep', 'old', 10, '30 days');
my $log_offset = -s $node->logfile;
store_keys($node, 'postgres', 'w', 'old', 3000, '30 days');
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = 0 FROM idem_processed_keys WHERE key LIKE 'old-%' AND consumer = 'w'"),
	'the worker purges expired keys');
is(count_keys($node, 'postgres', 'w', 'inside'),
	'10', 'keys inside the window stay');
is(count_keys($node, 'postgres', 'w', 'new'), '1', 'the newest key stays');
is(count_keys($node, 'postgres', 'keep', 'old'),
	'10', 'a consumer whose retention is NULL keeps its keys');
ok( $node->wait_for_log(
		qr/idem_consumer purged \d+ expired keys in database "postgres"/,
		$log_offset),
	'the worker logs what it purged');

# The schedule: a long interval holds the next run back, a reload to a
# short one lets it run.
$node->append_conf('postgresql.conf', "idem_consumer.purge_interval = '1h'\n");
$node->reload;
sleep 3;    # let a run that started before the reload finish
store_keys($node, 'postgres', 'w', 'later', 50, '30 days');
sleep 3;
is(count_keys($node, 'postgres', 'w', 'later'),
	'50', 'no run before the interval has passed');
$node->append_conf('postgresql.conf', "idem_consumer.purge_interval = 1\n");
$node->reload;
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = 0 FROM idem_processed_keys WHERE key LIKE 'later-%'"),
	'after a reload to a short interval, the next run purges');

# The database that lacked the extension is served once it has it.
$node->safe_psql('Shop', 'CREATE EXTENSION idem_consumer');
store_keys($node, 'Shop', 'shop', 'new', 1, '0');
store_keys($node, 'Shop', 'shop', 'old', 200, '30 days');
ok( $node->poll_query_until(
		'Shop', "SELECT count(*) = 0 FROM idem_processed_keys WHERE key LIKE 'old-%'"),
	'the worker purges a database once the extension is installed');

# 3. After a restart the workers are back and purge again.
$node->restart;
ok($node->poll_query_until('postgres', "SELECT ($workers_sql) = 2"),
	'the workers are back after a restart');
store_keys($node, 'postgres', 'w', 'after-restart', 1000, '30 days');
ok( $node->poll_query_until(
		'postgres', "SELECT count(*) = 0 FROM idem_processed_keys WHERE key LIKE 'after-restart-%'"),
	'the worker purges after a restart');
is(count_keys($node, 'postgres', 'w', 'inside'),
	'10', 'keys inside the window still stay');

$node->stop;
done_testing();
