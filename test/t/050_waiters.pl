# Two deliveries of one key wait behind a transaction that holds the key,
# and that transaction aborts: exactly one of the two applies the message,
# the other waits for it and finds a duplicate, and neither fails.
#
# Both waiters met the key's place taken and gave their own row up before
# waiting.  This holds because a row given up is a speculative insertion
# killed at once, which nobody waits for; a row inserted plainly and then
# deleted by its own transaction would look, to the other waiter, like an
# insertion in progress until that transaction ends, so that once the
# holder is gone each waiter would wait for the other: a deadlock.  The
# rounds run through the fast path and the SQL statements, for idem_apply
# against idem_apply and idem_apply against a batch.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('waiters');
$node->init;
# a deadlock, if there were one, is reported a tenth of a second in
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idem_consumer'\ndeadlock_timeout = 100ms\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE paid (key text PRIMARY KEY, n int NOT NULL);
});

my $pay = q{INSERT INTO paid VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = paid.n + 1};

# the statement of one delivery; prints t when it applied the message
sub delivery
{
	my ($key, $batch) = @_;
	return "SELECT idem_apply('$key', 'waiters', '$pay', ARRAY['$key'])" unless $batch;
	# a second, new key of its own, so that a batch may also insert the
	# contended key without looking it up first
	return qq{WITH k AS (SELECT k FROM idem_record_batch('waiters', ARRAY['$key', '$key-own']) AS k),
	               p AS (INSERT INTO paid SELECT k, 1 FROM k ON CONFLICT (key) DO UPDATE SET n = paid.n + 1)
	          SELECT count(*) FILTER (WHERE k = '$key') = 1 FROM k};
}

# state of each backend, by pid
sub states
{
	my @pids = @_;
	my %state = map { split /\|/ } split /\n/, $node->safe_psql('postgres',
		"SELECT pid, state || coalesce('/' || wait_event_type, '') FROM pg_stat_activity WHERE pid IN ("
		  . join(',', @pids) . ")");
	return map { $state{$_} // '' } @pids;
}

sub contend
{
	my ($key, $fast_path, $batch) = @_;
	my $name = "$key (fast_path $fast_path" . ($batch ? ', against a batch' : '') . ')';
	my @s = map { $node->background_psql('postgres', on_error_stop => 0) } 0 .. 2;
	$_->query_safe("SET idem_consumer.fast_path = $fast_path") for @s;
	my @pids = map { $_->query_safe('SELECT pg_backend_pid()') } @s[1, 2];

	$s[0]->query_safe('BEGIN');
	$s[0]->query_safe(delivery($key, 0));
	$s[1]->query_safe('BEGIN');
	$s[2]->query_safe('BEGIN');
	$s[1]->query_until(qr/sent/, "\\echo sent\n" . delivery($key, 0) . ";\n");
	$s[2]->query_until(qr/sent/, "\\echo sent\n" . delivery($key, $batch) . ";\n");
	$node->poll_query_until('postgres',
		"SELECT count(*) = 2 FROM pg_stat_activity WHERE pid IN ($pids[0], $pids[1]) AND wait_event_type = 'Lock'")
	  or die "the deliveries of $name did not both wait";
	$s[0]->query_safe('ROLLBACK');

	# one of the two goes on (or, were there a deadlock, fails)
	$node->poll_query_until('postgres',
		"SELECT count(*) > 0 FROM pg_stat_activity WHERE pid IN ($pids[0], $pids[1]) AND state LIKE 'idle in transaction%'")
	  or die "neither delivery of $name went on";
	my @state = states(@pids);
	my ($first, $second) = $state[0] =~ /^idle in transaction/ ? (1, 2) : (2, 1);
	my ($out1, $err1) = $s[$first]->query('');
	$s[$first]->query('COMMIT');
	my ($out2, $err2) = $s[$second]->query('');
	$s[$second]->query('COMMIT');
	my $errors = join('', $s[$first]->{stderr}, $s[$second]->{stderr});

	is($err1 + $err2, 0, "$name: neither delivery fails") or diag($errors);
	is(join(' ', $out1, $out2), 't f', "$name: the first to go on applies, the other finds a duplicate");
	is($node->safe_psql('postgres', "SELECT n FROM paid WHERE key = '$key'"), '1',
		"$name: the message is applied once");
	$_->quit for @s;
}

my $round = 0;
for my $fast_path ('on', 'off')
{
	for my $batch (0, 1)
	{
		contend('k' . ++$round, $fast_path, $batch) for 1 .. 5;
	}
}

done_testing();
