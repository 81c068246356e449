# Logical replication of the storage with retention by generations, the
# default, set up and taken over as docs/replication.md says.  The
# publisher's purge worker switches generations every second and retires
# those whose keys have expired, by TRUNCATE, carrying the live keys of a
# generation kept only by a pending dead letter or an idle consumer; the
# subscriber follows: the same generations, the same keys in each
# generation table, the same dead letters, and no key deleted one by one.
# A session connected to the subscriber throughout answers as the
# publisher does.  While the subscriber lags (its subscription disabled,
# then its apply waiting for a reader of a retired generation), the
# publisher retires a generation and goes round the ring into its place
# again; the subscriber catches up to the same state, and meanwhile a
# new session there does not wait behind the apply.  Then the subscriber
# takes over: every message the publisher applied is a duplicate there,
# new ones apply once, the parked message replays, and its own worker
# switches and retires generations.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ReplicatedStorage;
use Test::More;
use Time::HiRes qw(time sleep);

# a generation a second; the subscriber's worker starts at the takeover
my ($pub, $sub) = start_pair(
	"idem_consumer.purge_interval = 1\nidem_consumer.key_generation_interval = 1\n",
	"idem_consumer.purge_databases = 'postgres'\n");

# payments keeps its keys for an hour, events for a second
$pub->safe_psql('postgres', q{
	SELECT idem_consumer_create('payments', 'team_pay');
	SELECT idem_consumer_create('events', 'team_pay');
	SELECT idem_set_retention('payments', '1 hour');
	SELECT idem_set_retention('events', '1 second');
});
publish($pub);

# event(NODE, PREFIX, FROM, TO): delivers events PREFIX:FROM..TO twice
sub event
{
	my ($node, $prefix, $from, $to) = @_;
	return $node->safe_psql(
		'postgres', qq{
		SELECT count(*) FILTER (WHERE idem_apply('$prefix:' || g, 'events', 'select 1'))
		  FROM generate_series($from, $to) g, generate_series(1, 2) AS twice
		},
		extra_params => [ '-U', 'pay_app' ]);
}

# What the two servers must agree on: the generations, the keys of each
# generation table, who registered where, and the dead letters.
my $ring = q{SELECT string_agg(epoch || '@' || generation || ':' || coalesce(settled_at::text, '-'),
	' ' ORDER BY epoch) FROM idem_consumer.key_generations};
my $tables = join(
	"\nUNION ALL ",
	map {
		my $t = $_;
		map {
			qq{SELECT '$t$_:' || count(*) || ':'
			          || coalesce(md5(string_agg(consumer_id || '/' || key || '/' || processed_at, ','
			                                      ORDER BY consumer_id, key)), '-')
			     FROM idem_consumer.$t$_}
		} 1 .. 16
	} qw(processed_keys_ key_collisions_));
my $storage = qq{
	SELECT ($ring) || E'\n' || (SELECT string_agg(s, E'\n' ORDER BY s) FROM ($tables) AS t (s))
	       || E'\nregistered ' || (SELECT count(*) || ':' || coalesce(md5(string_agg(epoch || '/' || consumer_id || '/' || first_at, ',' ORDER BY epoch, consumer_id, first_at)), '-')
	                                 FROM idem_consumer.generation_consumers)
	       || E'\ndead letters ' || (SELECT coalesce(string_agg(dead_letter_id || '/' || key || '/' || status, ',' ORDER BY dead_letter_id), '-')
	                                   FROM idem_consumer.dead_letters)};
my $key_deletes = q{
	SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables
	 WHERE schemaname = 'idem_consumer'
	   AND (relname LIKE 'processed_keys%' OR relname LIKE 'key_collisions%')};
my $paid_known = q{SELECT count(*) FILTER (WHERE idem_is_processed('paid:' || g, 'payments'))
	FROM generate_series(1, 300) g};
my $events_known = q{SELECT string_agg(key, ' ' ORDER BY key) FROM idem_processed_keys WHERE consumer = 'events'};

# switch(): switches the publisher's generations by hand, retiring first
# what the worker has not yet, for a free place in the ring
sub switch
{
	my ($rc, $out, $err);
	for (1 .. 20)
	{
		($rc, $out, $err) = $pub->psql('postgres', q{
			SELECT idem_key_generation_retire();
			SELECT idem_key_generation_retire();
			SELECT idem_key_generation_switch();
		}, on_error_stop => 1);
		return if $rc == 0;
		sleep 0.2;
	}
	die "could not switch generations: $err";
}

# free_place(G): retires until generation G of the publisher's ring is
# dropped and emptied, so that a switch can open it again
sub free_place
{
	my ($g) = @_;
	for (1 .. 50)
	{
		return if $pub->safe_psql('postgres', qq{
			SELECT NOT EXISTS (SELECT FROM idem_consumer.key_generations WHERE generation = $g)
			   AND pg_relation_size('idem_consumer.processed_keys_$g')
			       + pg_relation_size('idem_consumer.key_collisions_$g')
			       + pg_relation_size('idem_consumer_local.key_filter_$g') = 0}) eq 't';
		$pub->safe_psql('postgres', q{SELECT idem_key_generation_retire()});
		sleep 0.2;
	}
	die "could not free generation $g";
}

# waits until the publisher's storage stays the same for 3 s: the worker
# neither switches (an interval of an hour) nor retires any more
sub publisher_quiet
{
	$pub->safe_psql('postgres', q{
		ALTER SYSTEM SET idem_consumer.key_generation_interval = '1h';
		SELECT pg_reload_conf();
	});
	my ($last, $since) = ('', time);
	for (my $start = time; time - $start < 120; sleep 0.5)
	{
		my $now = $pub->safe_psql('postgres', $storage);
		($last, $since) = ($now, time) if $now ne $last;
		return $last if time - $since >= 3;
	}
	die 'the publisher did not settle down';
}

# Keys before the subscription, copied with the tables; the first
# generation is switched at once.
is(apply($pub, 1, 100), '100', 'the publisher applies 100 messages delivered twice once each');
$pub->poll_query_until('postgres', q{SELECT count(*) >= 2 FROM idem_consumer.key_generations})
  or die 'no switch';

subscribe($pub, $sub);

# a session connected to the subscriber from the start
my $connected = $sub->background_psql('postgres', on_error_stop => 1);
$connected->query_safe(q{PREPARE known(text, text) AS SELECT idem_is_processed($1, $2)});
is($connected->query_safe("SELECT count(*) FILTER (WHERE (SELECT idem_is_processed('paid:' || g, 'payments'))) FROM generate_series(1, 100) g"),
	'100', 'a session connected to the subscriber knows the copied keys');

# A payment parked in the dead-letter queue.
is( $pub->safe_psql(
		'postgres', q{SELECT idem_try_apply('paid:bad', 'payments', 'select 1 / 0')},
		extra_params => [ '-U', 'pay_app' ]),
	'dead_lettered', 'the publisher parks a failing payment');

# Events for 8 s, a generation a second, and payments in the first 3 s;
# after 4 s, two events are parked, and one of them discarded.
my $first_epoch = $pub->safe_psql('postgres', q{SELECT max(epoch) FROM idem_consumer.key_generations});
my ($n, $paid, $parked) = (0, 100, 0);
for (my $start = time; time - $start < 8; sleep 0.2)
{
	$n++;
	event($pub, 'ev', $n, $n);
	if (time - $start < 3)
	{
		$paid++;
		apply($pub, $paid, $paid);
	}
	next if $parked || time - $start < 4;
	# in a generation without payments, which would keep it for an hour
	switch();
	is( $pub->safe_psql(
			'postgres', q{
			SELECT idem_try_apply('ev:bad', 'events', 'select 1 / 0'),
			       idem_try_apply('ev:discarded', 'events', 'select 1 / 0')},
			extra_params => [ '-U', 'pay_app' ]),
		'dead_lettered|dead_lettered',
		'and two failing events');
	$pub->safe_psql('postgres', q{
		SELECT idem_dlq_discard(dead_letter_id, 'not needed')
		  FROM idem_consumer.dead_letters WHERE key = 'ev:discarded'});
	$parked = 1;
}
my $quiet = publisher_quiet();
my $epochs = $pub->safe_psql('postgres', q{SELECT max(epoch) FROM idem_consumer.key_generations});
cmp_ok($epochs - $first_epoch, '>=', 5, 'the publisher\'s worker switched generations every second');
my $open = $pub->safe_psql('postgres', q{SELECT count(*) FROM idem_consumer.key_generations});
cmp_ok($open, '<', $epochs, "and retired generations ($open open of $epochs)");
is($pub->safe_psql('postgres', $key_deletes), '0', 'without deleting a key');
is($pub->safe_psql('postgres', q{SELECT count(*) FROM idem_consumer.dead_letters WHERE key = 'ev:discarded'}),
	'0', 'the discarded dead letter went with its generation');

$pub->wait_for_catchup('idem');
is($sub->safe_psql('postgres', $storage), $quiet,
	'the subscriber has the same generations, keys in each, registrations and dead letters');
is($sub->safe_psql('postgres', $key_deletes), '0', 'and had no key deleted');
is($connected->query_safe($paid_known), $paid, "the connected session knows the $paid payments");
is($connected->query_safe($events_known), $pub->safe_psql('postgres', $events_known),
	'and the events the publisher keeps');
is($connected->query_safe(q{EXECUTE known('ev:bad', 'events')}), 't',
	'among them the pending dead letter\'s, carried from generation to generation');

# The filters are each server's own: the subscriber probes without the
# publisher's until it builds its own, which an operator may do ahead of a
# takeover.
is($pub->safe_psql('postgres', q{SELECT bool_and(filtered) FROM idem_key_generations WHERE state = 'sealed'}),
	't', 'the publisher filters its sealed generations');
is($sub->safe_psql('postgres', q{SELECT bool_or(filtered) FROM idem_key_generations WHERE state = 'sealed'}),
	'f', 'the subscriber does not use the publisher\'s filters');
cmp_ok($sub->safe_psql('postgres', q{SELECT idem_key_generation_build_filters()}), '>', 0,
	'the subscriber builds its own');
is($sub->safe_psql('postgres', q{SELECT bool_and(filtered) FROM idem_key_generations WHERE state = 'sealed'}),
	't', 'and uses them');
is($connected->query_safe($paid_known), $paid, 'the connected session still knows every payment');

# The subscriber lags.  A generation G of events only, sealed, then
# payments in the next one.
switch();
event($pub, 'lag', 1, 20);
my ($g_epoch, $g) = split /\|/, $pub->safe_psql('postgres',
	q{SELECT epoch, generation FROM idem_consumer.key_generations ORDER BY epoch DESC LIMIT 1});
switch();
is(apply($pub, 201, 210), '10', 'payments apply in the next generation');
$pub->wait_for_catchup('idem');

# a reader of the subscriber in a transaction that probed G
my $reader = $sub->background_psql('postgres', on_error_stop => 1);
$reader->query_safe('BEGIN');
is($reader->query_safe(q{SELECT idem_is_processed('lag:1', 'events')}), 't',
	"a transaction on the subscriber finds a key of generation $g");
is( $sub->safe_psql(
		'postgres', qq{
		SELECT count(*) FROM pg_locks
		 WHERE relation = 'idem_consumer.processed_keys_$g'::regclass AND granted}),
	'1', 'and holds a lock on its table');

$sub->safe_psql('postgres', 'ALTER SUBSCRIPTION idem DISABLE');
$sub->poll_query_until('postgres', q{SELECT pid IS NULL FROM pg_stat_subscription WHERE subname = 'idem'})
  or die 'the subscription did not stop';

# Meanwhile the publisher's worker carries the live keys of the idle
# events out of G, drops G and truncates it.
ok( $pub->poll_query_until(
		'postgres', qq{
		SELECT NOT EXISTS (SELECT FROM idem_consumer.key_generations WHERE epoch = $g_epoch)
		   AND NOT EXISTS (SELECT FROM idem_consumer.processed_keys_$g)}),
	"the publisher retires generation $g while the subscriber lags");

# and goes round the ring into G's place again, by hand
my $turns = 0;
while ($pub->safe_psql('postgres',
		q{SELECT generation FROM idem_consumer.key_generations ORDER BY epoch DESC LIMIT 1}) != $g)
{
	die 'the ring did not come round' if ++$turns > 20;
	switch();
}
is(apply($pub, 211, 220), '10', "payments apply in generation $g opened again");
event($pub, 'reuse', 1, 5);
$quiet = publisher_quiet();

# The subscriber catches up as far as the truncation of G, which waits
# for the reader; a new session is not held up behind it.  (The apply
# worker's backend_type is "logical replication apply worker" from
# PostgreSQL 17 on.)
$sub->safe_psql('postgres', 'ALTER SUBSCRIPTION idem ENABLE');
ok( $sub->poll_query_until(
		'postgres', q{
		SELECT count(*) > 0 FROM pg_stat_activity
		 WHERE backend_type IN ('logical replication worker', 'logical replication apply worker')
		   AND wait_event_type = 'Lock'}),
	'the apply of the truncation waits for the reader');
my ($rc, $out, $err) = $sub->psql('postgres',
	q{SET statement_timeout = '10s'; SELECT idem_is_processed('paid:1', 'payments')});
is("$out$err", 't', 'a new session of the subscriber finds a key meanwhile, without waiting');
is($reader->query_safe(q{SELECT idem_is_processed('lag:1', 'events')}), 't',
	'and the reader finds the key carried out of the generation it probed');
$reader->query_safe('COMMIT');
$reader->quit;

$pub->wait_for_catchup('idem');
is($sub->safe_psql('postgres', $storage), $quiet,
	'the subscriber caught up to the same storage');
is($sub->safe_psql('postgres', $key_deletes), '0', 'still without a key deleted');
is($sub->safe_psql('postgres', q{SELECT count(*) FILTER (WHERE filtered) FROM idem_key_generations}),
	'0', 'the subscriber uses none of the filters it built before the ring came round');
is($connected->query_safe($paid_known), $paid + 20, 'the connected session knows every payment');
is($connected->query_safe($events_known), $pub->safe_psql('postgres', $events_known),
	'and the events the publisher keeps');
$connected->quit;

# Left unfinished on the publisher when it stops: generation H, dropped
# but not emptied, as a reader holds it, and generation C settling, as a
# transaction that recorded a key there is open.
my $last_generation = q{SELECT epoch, generation FROM idem_consumer.key_generations ORDER BY epoch DESC LIMIT 1};
switch();
event($pub, 'held', 1, 5);
my ($h_epoch, $h) = split /\|/, $pub->safe_psql('postgres', $last_generation);
my $holder = $pub->background_psql('postgres', on_error_stop => 1);
$holder->query_safe('BEGIN');
$holder->query_safe("LOCK TABLE idem_consumer.processed_keys_$h IN ACCESS SHARE MODE");
switch();
my ($c_epoch, $c) = split /\|/, $pub->safe_psql('postgres', $last_generation);
# The place after C, which the switch below opens, is freed first: the
# transaction probes every generation of the ring, none that it probed
# can be emptied before it ends, and a place is opened again only once
# emptied.  (The ring has 16 places.)
free_place($c % 16 + 1);
my $open_tx = $pub->background_psql('postgres', on_error_stop => 1);
$open_tx->query_safe('BEGIN');
$open_tx->query_safe(q{SELECT idem_apply('open:1', 'events', 'select 1')});
switch();
ok( $pub->poll_query_until(
		'postgres',
		qq{SELECT NOT EXISTS (SELECT FROM idem_consumer.key_generations WHERE epoch = $h_epoch)}),
	"the publisher drops generation $h");
is($pub->safe_psql('postgres', qq{SELECT count(*) > 0 FROM idem_consumer.processed_keys_$h}),
	't', 'but does not empty it while a reader holds it');
is($pub->safe_psql('postgres', qq{SELECT state FROM idem_key_generations WHERE epoch = $c_epoch}),
	'settling', "and generation $c is settling");

# Take over: the consumers stop, the subscription goes, the publisher is
# gone.
$pub->wait_for_catchup('idem');
my $expected = $pub->safe_psql('postgres', $balances);
take_over($sub);
$_->quit for ($holder, $open_tx);
$pub->stop;
is($sub->safe_psql('postgres', $balances), $expected, 'the subscriber has the balances');
is( $sub->safe_psql(
		'postgres', qq{
		SELECT (SELECT count(*) > 0 FROM idem_consumer.processed_keys_$h)
		       AND NOT EXISTS (SELECT FROM idem_consumer.key_generations WHERE epoch = $h_epoch)}),
	't', "it has generation $h dropped but not emptied");
is($sub->safe_psql('postgres', qq{SELECT state FROM idem_key_generations WHERE epoch = $c_epoch}),
	'settling', "and generation $c settling");

# the new server's worker
$sub->append_conf('postgresql.conf', "idem_consumer.purge_databases = 'postgres'\n");
$sub->restart;

ok( $sub->poll_query_until(
		'postgres', qq{
		SELECT NOT EXISTS (SELECT FROM idem_consumer.processed_keys_$h)
		   AND NOT EXISTS (SELECT FROM idem_key_generations WHERE epoch = $c_epoch AND state = 'settling')}),
	"the new server's worker empties generation $h and settles generation $c");
is($sub->safe_psql('postgres', q{SELECT idem_is_processed('open:1', 'events')}),
	'f', 'the key of the transaction left open on the publisher is not there');
ok( $sub->poll_query_until(
		'postgres', q{SELECT bool_and(filtered) FROM idem_key_generations WHERE state = 'sealed'}),
	'and builds the filters of the sealed generations');

my @paid_ranges = ([ 1, $paid ], [ 201, 220 ]);
is(apply($sub, $_->[0], $_->[1]), '0', "payments $_->[0] to $_->[1] are duplicates on the new server")
  for @paid_ranges;
is( $sub->safe_psql(
		'postgres', q{
		SELECT idem_dlq_replay(dead_letter_id)
		  FROM idem_consumer.dead_letters WHERE key = 'paid:bad'}),
	'dead_lettered', 'the parked payment replays there, and fails again');
$first_epoch = $sub->safe_psql('postgres', q{SELECT max(epoch) FROM idem_consumer.key_generations});
is(apply($sub, 301, 340), '40', 'new messages apply once');
is(apply($sub, 301, 340), '0', 'and once only');

# the new server's own ring: events and payments for 6 s
$n = 0;
for (my $start = time; time - $start < 6; sleep 0.2)
{
	$n++;
	event($sub, 'after', $n, $n);
}
is(apply($sub, 341, 350), '10', 'and later ones once too');
$epochs = $sub->safe_psql('postgres', q{SELECT max(epoch) FROM idem_consumer.key_generations});
cmp_ok($epochs - $first_epoch, '>=', 3, 'the new server\'s worker switches generations');
ok( $sub->poll_query_until(
		'postgres', qq{
		SELECT count(*) < max(epoch) - $first_epoch
		  FROM idem_consumer.key_generations WHERE epoch > $first_epoch}),
	'and retires the generations of expired events');
is($sub->safe_psql('postgres', $key_deletes), '0', 'without deleting a key');
is(apply($sub, $_->[0], $_->[1]), '0', "payments $_->[0] to $_->[1] are still duplicates")
  for (@paid_ranges, [ 301, 350 ]);

# Message paid:N adds N, each once.
my $sum = 0;
$sum += $_ for (1 .. $paid, 201 .. 220, 301 .. 350);
is($sub->safe_psql('postgres', q{SELECT sum(balance) FROM accounts}),
	$sum, 'every message was applied exactly once');

$sub->stop;
done_testing();
