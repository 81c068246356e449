# A transaction left open after it recorded a key does not stop retention
# by generations, run by the purge worker (src/keygen.c): with generations
# switching every 2 s, one tenant records a key and keeps its transaction
# open for about 20 s while another consumer keeps delivering.
#  - The ring keeps switching meanwhile: the switch needs the gate only,
#    which a delivery holds while it records a key, not until it ends.
#  - The active consumer's keys expire on time: the generations after the
#    held one settle and are dropped within its window and a few
#    intervals.
#  - The held generation is kept, "settling", until the transaction ends,
#    with whatever keys other consumers recorded there before the switch
#    (as a consumer with a longer window keeps its generation): so the
#    active consumer starts delivering once it is sealed.
#  - The held key is never recorded twice: a redelivery while the
#    transaction is open waits for it (and gives up at its lock_timeout),
#    one that waits through the commit is a duplicate, and so is one after
#    it; the business table holds it once.
# A tenant gone idle after a few keys keeps them as duplicates throughout.
# On a key store whose switch waits for every transaction that recorded a
# key in the generation it seals, the ring stops for those 20 s and the
# active consumer's keys are kept for as long.
# Bounded: about 40 s.  IDEM_HOLD_SECONDS, IDEM_INTERVAL and IDEM_WINDOW
# (20, 2 and 3 s) make it a longer measurement, the bounds scaled: e.g.
# 600, 40 and 40 hold the transaction 10 minutes (the interval long enough
# that the ring does not come round to the held generation meanwhile).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $hold = $ENV{IDEM_HOLD_SECONDS} // 20;
my $interval = $ENV{IDEM_INTERVAL} // 2;
my $window = $ENV{IDEM_WINDOW} // 3;
# kept at most its window, about two intervals and the worker's period
my $age_bound = $window + 2 * $interval + 8;

my $node = PostgreSQL::Test::Cluster->new('open_transaction');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.purge_databases = 'postgres'
idem_consumer.purge_interval = 1
idem_consumer.key_generation_interval = $interval
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE applied (consumer text, key text);
	SELECT idem_consumer_create('held');
	SELECT idem_consumer_create('busy');
	SELECT idem_consumer_create('idle');
});
$node->safe_psql('postgres', "SELECT idem_set_retention(c, '$window seconds') FROM unnest(ARRAY['held', 'busy', 'idle']) AS c");

sub apply_sql
{
	my ($consumer, $key) = @_;
	return "SELECT idem_apply('$key', '$consumer', 'insert into applied values (\$1, \$2)', ARRAY['$consumer', '$key'])";
}

sub deliver
{
	my ($consumer, $key) = @_;
	return $node->safe_psql('postgres', apply_sql($consumer, $key));
}

sub epoch
{
	return $node->safe_psql('postgres',
		'SELECT coalesce(max(epoch), 1) FROM idem_consumer.key_generations');
}

# the first switch, so that the held key is in a generation of the ring
# that the worker would retire
my $deadline = time + 10 + $interval;
sleep 0.2 while epoch() < 2 && time < $deadline;
is(deliver('idle', "idle-$_"), 't', "idle-$_ applied") for 1 .. 3;

# the tenant records its key and keeps its transaction open
my $holder = $node->background_psql('postgres', on_error_stop => 1, timeout => $hold + 180);
$holder->query_safe('BEGIN');
is($holder->query_safe(apply_sql('held', 'held-1')), 't', 'held-1 applied in an open transaction');
my $epoch_at_hold = epoch();
# the worker seals its generation without waiting for it
$deadline = time + 10 + $interval;
sleep 0.1 while epoch() == $epoch_at_hold && time < $deadline;
cmp_ok(epoch(), '>', $epoch_at_hold, 'the worker sealed the generation of the open transaction');
$epoch_at_hold = epoch();

# a redelivery that waits for the open transaction through its commit
my $waiter = $node->background_psql('postgres', on_error_stop => 1, timeout => $hold + 180);
$waiter->query_until(qr/waiting/, "\\echo waiting\n" . apply_sql('held', 'held-1') . ";\n\\echo done\n");

# the busy consumer delivers for about 20 s while the transaction is open;
# every 10th delivery a redelivery of the held key gives up at its
# lock_timeout, and from 12 s on the age of the busy consumer's oldest key
# is read: its window, plus about two intervals, plus the worker's period
my ($n, $busy_reapplied, $held_timeouts, $held_other, $oldest, $settling, $idle_reapplied) = (0, 0, 0, 0, 0, 0, 0);
my $start = time;
while (time - $start < $hold)
{
	$n++;
	$busy_reapplied++ if deliver('busy', "busy-$n") ne 't';
	$busy_reapplied++ if $n > 1 && deliver('busy', 'busy-' . ($n - 1)) ne 'f';
	if ($n % 10 == 0)
	{
		my ($rc, $out, $err) = $node->psql('postgres',
			"SET lock_timeout = '200ms'; " . apply_sql('held', 'held-1'));
		if ($err =~ /canceling statement due to lock timeout/) { $held_timeouts++ }
		else { $held_other++ }
		$idle_reapplied += deliver('idle', "idle-$_") eq 't' ? 1 : 0 for 1 .. 3;
		$settling++ if $node->safe_psql('postgres',
			q{SELECT count(*) FROM idem_key_generations WHERE state = 'settling'}) ne '0';
		if (time - $start > $age_bound - 3)
		{
			my $age = $node->safe_psql('postgres', q{
				SELECT coalesce(extract(epoch FROM now() - min(processed_at)), 0)::int
				  FROM idem_processed_keys WHERE consumer = 'busy'});
			$oldest = $age if $age > $oldest;
		}
	}
	sleep 0.1;
}
my $switches = epoch() - $epoch_at_hold;
cmp_ok($switches, '>=', int(0.3 * $hold / $interval),
	"the ring kept switching while the transaction was open ($switches switches in $hold s)");
is($busy_reapplied, 0, "$n new keys of the busy consumer applied once, each redelivered at once");
cmp_ok($oldest, '<', $age_bound, "the busy consumer's keys were kept no more than $age_bound s (at most $oldest s)");
is($idle_reapplied, 0, "the idle tenant's keys stayed duplicates throughout");
ok($held_timeouts > 0 && $held_other == 0,
	"every redelivery of the held key waited for its transaction ($held_timeouts gave up at their lock_timeout)");
is($settling, $held_timeouts + $held_other, 'its generation stayed settling meanwhile');
is($node->safe_psql('postgres', q{SELECT count(*) FROM applied WHERE key = 'held-1'}),
	'0', 'nothing of the held key committed yet');
# the runbook's query finds the session that keeps the generation
my $holder_pid = $holder->query_safe('SELECT pg_backend_pid()');
is( $node->safe_psql(
		'postgres', q{
	SELECT string_agg(l.pid::text, ',')
	  FROM idem_key_generations AS g
	  JOIN pg_locks AS l
	    ON l.locktype = 'relation' AND l.granted AND l.mode = 'RowShareLock'
	   AND l.relation = ('idem_consumer_local.key_filter_' || g.generation)::regclass
	 WHERE g.state = 'settling'}),
	$holder_pid, "the runbook's query names the open transaction's process");

$holder->query_safe('COMMIT');
$holder->quit;
like($waiter->query_until(qr/done/, ''), qr/^f\ndone$/m,
	'the redelivery that waited through the commit was a duplicate');
$waiter->quit;
is(deliver('held', 'held-1'), 'f', 'a redelivery after the commit is a duplicate');

# once the transaction has ended, its generation settles and goes
my $left;
$deadline = time + 15 + $interval;
while (1)
{
	$left = $node->safe_psql('postgres',
		q{SELECT count(*) FROM idem_key_generations WHERE state = 'settling'});
	last if $left eq '0' || time > $deadline;
	sleep 0.5;
}
is($left, '0', 'the held generation settled once the transaction ended');
is(deliver('held', 'held-1'), 'f', 'the held key is still a duplicate');
is($node->safe_psql('postgres', 'SELECT count(*) = count(DISTINCT (consumer, key)) FROM applied'),
	't', 'the business table has each message once');
is($node->safe_psql('postgres', q{SELECT count(*) FROM applied WHERE key = 'held-1'}),
	'1', 'the held key applied once');

$node->stop;
done_testing();
