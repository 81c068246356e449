# The purge worker releases the kernel's cached pages of a dropped
# generation before it truncates it, in steps, so that the truncation no
# longer frees them all at once.  A transaction holds a lock on the
# generation, so that the worker drops it but cannot truncate it yet: the
# pages its files had in the kernel's cache (fincore) are gone meanwhile,
# the files are untouched, and once the lock goes the next run truncates
# them.  Bounded: about 15 s.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = PostgreSQL::Test::Cluster->new('release');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.purge_databases = 'postgres'
idem_consumer.purge_interval = 1
idem_consumer.key_generation_interval = '1h'
fsync = on
});
# (fsync on, unlike other test clusters: a checkpoint then leaves the pages
# clean in the kernel's cache, as they are long before a generation
# expires; the kernel does not release a dirty page before writing it)
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	SELECT idem_consumer_create('orders');
	SELECT idem_set_retention('orders', '1 second');
});

sub wait_until
{
	my ($sql, $secs) = @_;
	my $deadline = time + $secs;
	while (time < $deadline)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		usleep(100_000);
	}
	return 0;
}

# the worker opens the second generation at once, the first being the one
# the extension was created with; the keys go there
ok( wait_until(
		q{SELECT count(*) = 1 FROM idem_key_generations WHERE state = 'current' AND generation = 2}, 30),
	'the worker opens the second generation');
$node->safe_psql('postgres', q{
	SELECT count(*) FROM idem_record_batch('orders',
		(SELECT array_agg('k-' || g) FROM generate_series(1, 300000) g));
	CHECKPOINT;
});

# the files of that generation's keys and their index, and how many
# of their pages the kernel holds
my @files = map { $node->data_dir . "/$_" } split /\n/, $node->safe_psql('postgres', q{
	SELECT pg_relation_filepath(r)
	  FROM (VALUES ('idem_consumer.processed_keys_2'::regclass),
	               ('idem_consumer.processed_keys_2_hash'::regclass)) AS t (r)});
sub cached_pages
{
	my ($stdout, $stderr) = run_command([ 'fincore', '--raw', '--noheadings', '--output', 'PAGES', @files ]);
	die "fincore failed: $stderr" if $stderr ne '';
	my $pages = 0;
	$pages += $_ for split /\s+/, $stdout;
	return $pages;
}
my $before = cached_pages();
cmp_ok($before, '>', 1000, "the kernel caches the generation's pages ($before pages)");

# seal it; a transaction holds it, so it cannot be truncated
my $log_offset = -s $node->logfile;
$node->safe_psql('postgres', 'SELECT idem_key_generation_switch()');
my $holder = $node->background_psql('postgres', on_error_stop => 1);
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{LOCK TABLE idem_consumer.processed_keys_2 IN ACCESS SHARE MODE});

# the consumer's latest activity moves past the seal and its window: the
# worker drops the generation at its next run
usleep(2_500_000);
is($node->safe_psql('postgres', q{SELECT idem_apply('fresh', 'orders', 'select 1')}),
	't', 'a new key goes into the current generation');
ok( wait_until(
		q{SELECT count(*) = 0 FROM idem_consumer.key_generations WHERE generation = 2}, 30),
	'the worker drops the expired generation');
ok( $node->wait_for_log(
		qr/idem_consumer released the cached pages of [0-9.]+ MB of dropped generations of keys in database "postgres"/,
		$log_offset),
	'and logs that it released its pages');

my $after = cached_pages();
cmp_ok($after, '<', $before / 10,
	"the kernel no longer caches them ($after pages of $before)");
cmp_ok($node->safe_psql('postgres', q{SELECT pg_relation_size('idem_consumer.processed_keys_2')}),
	'>', 0, 'while the held generation is not truncated yet');
is(join(',', map { -e $_ ? 1 : 0 } @files), '1,1', 'and its files are still there');
is($node->safe_psql('postgres', q{SELECT idem_apply('k-1', 'orders', 'select 1')}),
	't', 'an expired key of the dropped generation is a new message again');
is($node->safe_psql('postgres', q{SELECT idem_apply('fresh', 'orders', 'select 1')}),
	'f', 'a key of the current generation is still a duplicate');

# the lock goes: the next run truncates the generation
$holder->query_safe(q{COMMIT});
$holder->quit;
ok( wait_until(
		q{SELECT pg_relation_size('idem_consumer.processed_keys_2') = 0
		     AND pg_relation_size('idem_consumer.processed_keys_2_hash') <= 8192}, 30),
	'once nothing holds it, the worker truncates it');

done_testing();
