# What a generation's seal promises retirement (src/keygen.c, "Who counts
# on a seal"): every consumer that recorded a key in the generation is
# registered there by a transaction of its own, and no key in it is newer
# than its seal.
#
# 1. A session that prepared a transaction recording a key (PREPARE
#    TRANSACTION, as an XA/JTA transaction manager does) and records
#    another key of the same consumer before the prepared one is resolved
#    registers the consumer again: once the prepared transaction is rolled
#    back, the generation still knows the consumer, retirement keeps it,
#    and the second key's redelivery is a duplicate.
# 2. A switch does not wait for a transaction that recorded a key and
#    stays open: it seals the generation at once, and the generation is
#    settling until the transaction ends.  Retirement keeps it meanwhile
#    (a key and a registration there may still commit), then settles it
#    at a time not older than the key, which stays a duplicate.
# 3. Nor does a prepared transaction that recorded a key hold back the
#    switch or the purge worker; what still holds a switch back is a lock
#    on key_generations (a delivery takes it only while it records a key),
#    and the switch's error and the worker's log name who holds it, and
#    the current generation's age in idem_metrics() shows it.
# Bounded: about 25 s.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = PostgreSQL::Test::Cluster->new('generation_seal');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
max_prepared_transactions = 5
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE applied (key text);
	SELECT idem_consumer_create('xa');
	SELECT idem_set_retention('xa', '1 hour');
	SELECT idem_consumer_create('late');
	SELECT idem_set_retention('late', '2 seconds');
});

my $apply = q{idem_apply(%s, %s, 'INSERT INTO applied VALUES ($1)', ARRAY[%s])};

sub apply_sql
{
	my ($key, $consumer) = @_;
	return sprintf($apply, "'$key'", "'$consumer'", "'$key'");
}

# 1. a prepared transaction and the same session's next key
my $outcome = $node->safe_psql(
	'postgres', sprintf(q{
	BEGIN;
	SELECT %s;
	PREPARE TRANSACTION 'branch-1';
	SELECT %s;
	ROLLBACK PREPARED 'branch-1';
}, apply_sql('xa-1', 'xa'), apply_sql('xa-2', 'xa')));
is($outcome, "t\nt", 'both keys applied, the first in a prepared transaction');
is( $node->safe_psql(
		'postgres', q{
	SELECT count(*) FROM idem_consumer.generation_consumers AS g
	  JOIN idem_consumer.consumers AS c USING (consumer_id)
	 WHERE c.name = 'xa'}),
	'1',
	'after ROLLBACK PREPARED the consumer is still registered in the generation of its second key');
$node->safe_psql('postgres', q{SELECT idem_key_generation_switch()});
is($node->safe_psql('postgres', q{SELECT idem_key_generation_retire()}),
	'0', 'retirement keeps the generation whose key is within its window');
is($node->safe_psql('postgres', 'SELECT ' . apply_sql('xa-2', 'xa')),
	'f', "the second key's redelivery is a duplicate");
is($node->safe_psql('postgres', q{SELECT count(*) FROM applied WHERE key = 'xa-2'}),
	'1', 'applied once');

# 2. a key recorded by a transaction open across the switch
$node->safe_psql('postgres', q{SELECT idem_key_generation_switch()});
my $holder = $node->background_psql('postgres', on_error_stop => 1);
$holder->query_safe('BEGIN');
$holder->query_safe('SELECT ' . apply_sql('late-0', 'late'));
cmp_ok($node->safe_psql('postgres', q{SELECT idem_key_generation_switch('0')}),
	'>', 0, 'the switch does not wait for the open transaction');
is($node->safe_psql('postgres', q{SELECT string_agg(state, ' ' ORDER BY epoch) FROM idem_key_generations}),
	'sealed sealed settling current', 'the generation of its key is settling');
# more than the key's window later
sleep 4;
$node->safe_psql('postgres', q{SELECT idem_key_generation_retire()});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_key_generations WHERE state = 'settling'}),
	'1', 'retirement keeps the settling generation');
$holder->query_safe('COMMIT');
$holder->quit;
$node->safe_psql('postgres', q{SELECT idem_key_generation_retire()});
is( $node->safe_psql(
		'postgres', q{
	SELECT settled_at >= (SELECT max(first_at) FROM idem_consumer.generation_consumers AS g
	                       JOIN idem_consumer.consumers AS c USING (consumer_id)
	                      WHERE c.name = 'late')
	                    * interval '1 second' + timestamptz '2000-01-01 00:00:00+00'
	  FROM idem_consumer.key_generations ORDER BY epoch DESC LIMIT 1 OFFSET 1}),
	't', 'once the transaction ended it settled, not before the key it recorded');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_processed_keys WHERE key = 'late-0'}),
	'1', 'retirement kept the generation of that key');
is($node->safe_psql('postgres', 'SELECT ' . apply_sql('late-0', 'late')),
	'f', 'the redelivery is a duplicate');
is($node->safe_psql('postgres', q{SELECT count(*) FROM applied WHERE key = 'late-0'}),
	'1', 'applied once');

# 3. a prepared transaction that recorded a key holds back no switch
$node->safe_psql('postgres', sprintf(q{
	BEGIN;
	SELECT %s;
	PREPARE TRANSACTION 'branch-2';
}, apply_sql('xa-3', 'xa')));
cmp_ok($node->safe_psql('postgres', q{SELECT idem_key_generation_switch('0')}),
	'>', 0, 'the switch goes on under a prepared transaction that recorded a key');
$node->append_conf(
	'postgresql.conf', q{
idem_consumer.purge_databases = 'postgres'
idem_consumer.purge_interval = 1
idem_consumer.key_generation_interval = 1
});
my $log_offset = -s $node->logfile;
$node->restart;
ok( $node->wait_for_log(qr/idem_consumer opened generation \d+ of keys in database "postgres"/,
		$log_offset),
	'nor the purge worker');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_key_generations WHERE state = 'settling'}),
	'1', 'its generation is settling until it is resolved');

# a lock on key_generations holds the switch back: it says by whom, and
# so does the purge worker's log, once
my $locker = $node->background_psql('postgres', on_error_stop => 1);
$locker->query_safe('BEGIN');
$locker->query_safe('LOCK TABLE idem_consumer.key_generations IN ROW SHARE MODE');
my $locker_pid = $locker->query_safe('SELECT pg_backend_pid()');
$log_offset = -s $node->logfile;
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT idem_key_generation_switch('200ms')});
like($err, qr/ERROR:  could not switch key generations: key_generations stayed locked for the whole wait\nDETAIL:  The switch sealing generation \d+ is held back by process $locker_pid \(role \w+, in a transaction for \d+ s\)\./,
	'the switch names the session that holds it back');
ok( $node->wait_for_log(
		qr/LOG:  idem_consumer could not switch generations of keys in database "postgres": key_generations stayed locked for the whole wait\n.*DETAIL:  The switch sealing generation \d+ is held back by process $locker_pid /,
		$log_offset),
	'the worker logs the session that holds its switch back');
sleep 3;
my $lines = () = slurp_file($node->logfile, $log_offset) =~ /could not switch generations of keys/g;
is($lines, 1, 'once, not at every run');
cmp_ok(
	$node->safe_psql('postgres', q~
		SELECT substring(idem_metrics() from E'\nidem_key_generation_current_age_seconds\\{[^}]*\\} ([0-9.]+)')~),
	'>', 3, 'and the age of the current generation in idem_metrics() passes the interval of 1 s');
$locker->query_safe('COMMIT');
$locker->quit;
$log_offset = -s $node->logfile;
ok( $node->wait_for_log(qr/idem_consumer opened generation \d+ of keys in database "postgres"/,
		$log_offset),
	'once it is released, the worker switches');

$node->safe_psql('postgres', q{COMMIT PREPARED 'branch-2'});
my $settling;
my $deadline = time + 10;
while (1)
{
	$settling = $node->safe_psql('postgres',
		q{SELECT count(*) FROM idem_key_generations WHERE state = 'settling'});
	last if $settling eq '0' || time > $deadline;
	sleep 0.2;
}
is($settling, '0', 'once the prepared transaction is resolved, its generation settles');
is($node->safe_psql('postgres', 'SELECT ' . apply_sql('xa-3', 'xa')),
	'f', 'and its key is a duplicate');

$node->stop;
done_testing();
