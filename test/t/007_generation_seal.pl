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
# 2. A switch that waits for a transaction recording keys seals the
#    generation at the time it got its lock, not at its start: a key
#    recorded by a transaction that began while the switch waited is not
#    older than the seal, and retirement keeps it for its whole window.
# 3. A switch held back by a prepared transaction that recorded a key says
#    which, in its error and in the purge worker's log, and the current
#    generation's age in idem_metrics() shows it.
# Bounded: about 25 s.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

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

# 2. a key recorded while a switch waits, in a generation of its own
$node->safe_psql('postgres', q{SELECT idem_key_generation_switch()});
my $holder = $node->background_psql('postgres', on_error_stop => 1);
$holder->query_safe('BEGIN');
$holder->query_safe('SELECT ' . apply_sql('late-0', 'late'));
my $switcher = $node->background_psql('postgres', on_error_stop => 1);
$switcher->query_until(qr/switching/, qq{\\echo switching\nSELECT idem_key_generation_switch('30s');\n});
# the key comes more than its window after the switch began waiting
sleep 4;
is($node->safe_psql('postgres', 'SELECT ' . apply_sql('late-1', 'late')),
	't', 'a key recorded while the switch waits');
$holder->query_safe('COMMIT');
$holder->quit;
$switcher->quit;
is( $node->safe_psql(
		'postgres', q{
	SELECT opened_at >= (SELECT max(first_at) FROM idem_consumer.generation_consumers AS g
	                       JOIN idem_consumer.consumers AS c USING (consumer_id)
	                      WHERE c.name = 'late')
	                    * interval '1 second' + timestamptz '2000-01-01 00:00:00+00'
	  FROM idem_consumer.key_generations ORDER BY epoch DESC LIMIT 1}),
	't', 'the seal is not older than the key recorded while the switch waited');
$node->safe_psql('postgres', q{SELECT idem_key_generation_retire()});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_processed_keys WHERE key = 'late-1'}),
	'1', 'retirement keeps the generation of that key');
is($node->safe_psql('postgres', 'SELECT ' . apply_sql('late-1', 'late')),
	'f', 'the redelivery within its window is a duplicate');
is($node->safe_psql('postgres', q{SELECT count(*) FROM applied WHERE key = 'late-1'}),
	'1', 'applied once');

# 3. a switch held back by a prepared transaction says by which, and so
# does the purge worker's log, once
$node->safe_psql('postgres', sprintf(q{
	BEGIN;
	SELECT %s;
	PREPARE TRANSACTION 'branch-2';
}, apply_sql('xa-3', 'xa')));
my ($rc, $out, $err) = $node->psql('postgres', q{SELECT idem_key_generation_switch('200ms')});
like($err, qr/ERROR:  could not switch key generations: transactions recording keys in generation \d+ did not end in time\nDETAIL:  Generation \d+ is held by prepared transaction 'branch-2' \(prepared \d+ s ago\)\./,
	'the switch names the prepared transaction that holds it back');
$node->append_conf(
	'postgresql.conf', q{
idem_consumer.purge_databases = 'postgres'
idem_consumer.purge_interval = 1
idem_consumer.key_generation_interval = 1
});
my $log_offset = -s $node->logfile;
$node->restart;
ok( $node->wait_for_log(
		qr/LOG:  idem_consumer could not switch generations of keys in database "postgres": transactions recording keys in generation \d+ did not end in time\n.*DETAIL:  Generation \d+ is held by prepared transaction 'branch-2'/,
		$log_offset),
	'the worker logs the prepared transaction that holds its switch back');
sleep 3;
my $lines = () = slurp_file($node->logfile, $log_offset) =~ /could not switch generations of keys/g;
is($lines, 1, 'once, not at every run');
cmp_ok(
	$node->safe_psql('postgres', q~
		SELECT substring(idem_metrics() from E'\nidem_key_generation_current_age_seconds\\{[^}]*\\} ([0-9.]+)')~),
	'>', 3, 'and the age of the current generation in idem_metrics() passes the interval of 1 s');
$node->safe_psql('postgres', q{COMMIT PREPARED 'branch-2'});
ok( $node->wait_for_log(qr/idem_consumer opened generation \d+ of keys in database "postgres"/,
		$log_offset),
	'once it is resolved, the worker switches');

$node->stop;
done_testing();
