# A tenant that goes idle does not stop retention by generations, run by
# the purge worker: with generations switching every 2 s, one consumer
# records a few keys and goes idle while another keeps delivering.  The
# ring keeps switching, the active consumer's keys expire on time (their
# generations are dropped within their window and a few intervals), and
# the idle consumer's keys, whose window counts from its latest key, stay
# duplicates throughout: retirement carries them from generation to
# generation instead of keeping every generation they are in.  Without
# the carry the idle consumer holds its first generation, the ring fills
# within 16 switches, and the active consumer's keys stop expiring.
# Bounded: about 60 s.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = PostgreSQL::Test::Cluster->new('idle_tenant');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.purge_databases = 'postgres'
idem_consumer.purge_interval = 1
idem_consumer.key_generation_interval = 2
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE applied (consumer text, key text);
	SELECT idem_consumer_create('idle');
	SELECT idem_consumer_create('busy');
	SELECT idem_set_retention('idle', '3 seconds');
	SELECT idem_set_retention('busy', '3 seconds');
});

sub deliver
{
	my ($consumer, $key) = @_;
	return $node->safe_psql('postgres',
		"SELECT idem_apply('$key', '$consumer', 'insert into applied values (\$1, \$2)', ARRAY['$consumer', '$key'])");
}

is(deliver('idle', "idle-$_"), 't', "idle-$_ applied") for 1 .. 5;

# the busy consumer delivers for 40 s, 16 ring places' worth of switches
# and more; every 10th delivery it redelivers the idle tenant's keys and,
# from 25 s on, looks at the age of its oldest key: its window, plus
# about two intervals, plus the worker's period
my ($n, $idle_reapplied, $busy_reapplied, $oldest) = (0, 0, 0, 0);
my $start = time;
while (time - $start < 40)
{
	$n++;
	$busy_reapplied++ if deliver('busy', "busy-$n") ne 't';
	$busy_reapplied++ if $n > 1 && deliver('busy', 'busy-' . ($n - 1)) ne 'f';
	if ($n % 10 == 0)
	{
		$idle_reapplied += deliver('idle', "idle-$_") eq 't' ? 1 : 0 for 1 .. 5;
		if (time - $start > 25)
		{
			my $age = $node->safe_psql('postgres', q{
				SELECT coalesce(extract(epoch FROM now() - min(processed_at)), 0)::int
				  FROM idem_processed_keys WHERE consumer = 'busy'});
			$oldest = $age if $age > $oldest;
		}
	}
	sleep 0.1;
}
is($busy_reapplied, 0, "$n new keys of the busy consumer applied once, each redelivered at once");
is($idle_reapplied, 0, 'the idle consumer\'s keys stayed duplicates throughout');
cmp_ok($node->safe_psql('postgres', 'SELECT max(epoch) FROM idem_consumer.key_generations'),
	'>=', 17, 'the ring kept switching past its 16 places');
my $open = $node->safe_psql('postgres', 'SELECT count(*) FROM idem_key_generations');
cmp_ok($open, '<=', 8, "the expired generations were dropped ($open open)");
is($node->safe_psql('postgres',
		q{SELECT count(*) FROM idem_processed_keys WHERE consumer = 'idle'}),
	'5', 'the idle consumer\'s keys are stored once each');
cmp_ok($oldest, '<', 15, "while it delivered, the busy consumer's keys were kept no more than 15 s (at most $oldest s)");
# now idle, the busy consumer's keys inside its window counted from its
# latest activity are carried on and stay duplicates; the older ones go
# with their generations, once the worker has sealed and retired them
my $left;
my $deadline = time + 15;
while (1)
{
	$left = $node->safe_psql(
		'postgres', q{
	SELECT count(*) FROM idem_processed_keys
	 WHERE consumer = 'busy'
	   AND processed_at < timestamptz '2000-01-01 00:00:00+00'
	       + make_interval(secs => (SELECT max(r.first_at) - 3
	                                  FROM idem_consumer.generation_consumers AS r
	                                  JOIN idem_consumer.consumers AS c USING (consumer_id)
	                                 WHERE c.name = 'busy'))});
	last if $left eq '0' || time > $deadline;
	sleep 0.5;
}
is($left, '0', 'once it is idle, no key of the busy consumer older than its window is left');
is(deliver('busy', "busy-$n"), 'f', 'its latest key is still a duplicate');
is($node->safe_psql('postgres', 'SELECT deliver_count FROM (SELECT count(*) AS deliver_count FROM applied WHERE consumer = \'idle\') AS a'),
	'5', 'the idle consumer\'s business rows: one each');
is($node->safe_psql('postgres', q{
	SELECT sum(n_tup_del) FROM pg_stat_user_tables
	 WHERE schemaname = 'idem_consumer'
	   AND (relname LIKE 'processed_keys%' OR relname LIKE 'key_collisions%')}),
	'0', 'no key was deleted one by one');

$node->stop;
done_testing();
