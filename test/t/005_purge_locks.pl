# The purge worker, purging keys one by one, never waits for a lock a
# consumer holds: an open transaction holding an expired key (here an
# idem_forget that has not committed) costs that key a run, not the worker.  The worker purges the
# other consumers' expired keys and the rest of that consumer's, and the
# held key goes on the run after the lock is released.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = PostgreSQL::Test::Cluster->new('purge_locks');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.purge_databases = 'postgres'
idem_consumer.key_generation_interval = 0
idem_consumer.purge_interval = '1h'
idem_consumer.purge_delay = 1
idem_consumer.purge_batch_size = 500
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE ROLE team_a LOGIN;
	GRANT EXECUTE ON FUNCTION idem_forget(text, text, "any"), idem_apply(text, text, text, text[], timestamptz, text, bigint, "any")
	   TO team_a;
	SELECT idem_consumer_create('a', 'team_a');
	SELECT idem_consumer_create('b');
});

# $n keys "$prefix-<i>" of $consumer recorded 30 days ago, and one now
sub store_expired
{
	my ($consumer, $prefix, $n) = @_;
	$node->safe_psql(
		'postgres', qq{
		INSERT INTO idem_consumer.processed_keys_1 (consumer_id, processed_at, key)
		SELECT c.consumer_id,
		       floor(extract(epoch FROM now() - interval '30 days' - timestamptz '2000-01-01 00:00:00+00'))::int,
		       '$prefix-' || g
		  FROM idem_consumer.consumers c, generate_series(1, $n) g
		 WHERE c.name = '$consumer';
		INSERT INTO idem_consumer.processed_keys_1 (consumer_id, processed_at, key)
		SELECT c.consumer_id,
		       floor(extract(epoch FROM now() - timestamptz '2000-01-01 00:00:00+00'))::int,
		       '$prefix-new'
		  FROM idem_consumer.consumers c WHERE c.name = '$consumer';});
	return;
}

# the expired keys of $consumer still stored
sub expired_left
{
	my ($consumer) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM idem_processed_keys WHERE consumer = '$consumer' AND key NOT LIKE '%-new'");
}

# polls $sql until it returns 't', for at most $secs seconds
sub wait_until
{
	my ($sql, $secs) = @_;
	my $deadline = time() + $secs;
	while (time() < $deadline)
	{
		return 1 if $node->safe_psql('postgres', $sql) eq 't';
		usleep(100_000);
	}
	return 0;
}

store_expired('a', 'a', 1200);
store_expired('b', 'b', 1200);

# team_a holds the first expired key of its consumer in an open transaction
my $holder = $node->background_psql('postgres', on_error_stop => 1,
	extra_params => [ '-U', 'team_a' ]);
$holder->query_safe(q{BEGIN});
# (chomp: BackgroundPsql of some minor releases, 16.2 among them, keeps
# the result's newline)
my $held = $holder->query_safe(q{SELECT idem_forget('a-1', 'a')});
chomp $held;
is($held, 't', 'a transaction holds an expired key');

# now the worker runs every second
$node->append_conf('postgresql.conf', "idem_consumer.purge_interval = 1\n");
$node->reload;

ok( wait_until(
		q{SELECT count(*) = 0 FROM idem_processed_keys WHERE consumer = 'b' AND key NOT LIKE '%-new'}, 30),
	'the worker purges the other consumer within 30 s');
is(expired_left('a'), '1', 'and every expired key of the holding consumer but the held one');
ok( wait_until(
		q{SELECT count(*) = 0 FROM pg_stat_activity
		   WHERE backend_type = 'idem_consumer purge worker' AND wait_event_type = 'Lock'}, 10),
	'the worker is not waiting for the lock');

# more expired keys after that: the runs go on while the lock is held
store_expired('b', 'b2', 600);
ok( wait_until(
		q{SELECT count(*) = 0 FROM idem_processed_keys WHERE consumer = 'b' AND key LIKE 'b2-%' AND key <> 'b2-new'}, 30),
	'later runs purge too while the lock is held');

# the transaction gives the key up; the next run purges it
$holder->query_safe(q{ROLLBACK});
$holder->quit;
ok(wait_until(q{SELECT count(*) = 0 FROM idem_processed_keys WHERE key = 'a-1'}, 30),
	'the held key is purged once the lock is released');
ok( wait_until(
		q{SELECT count(*) = 0 FROM idem_processed_keys WHERE key NOT LIKE '%-new'}, 30),
	'and no expired key stays');
$node->stop;
done_testing();
