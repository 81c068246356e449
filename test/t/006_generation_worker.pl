# Retention by whole generations, run by the purge worker: with
# idem_consumer.key_generation_interval set it switches generations on
# schedule and drops those whose keys have all expired, while a consumer
# delivers every message twice; no key is deleted one by one, every
# message is applied once, and a redelivery within the window is still a
# duplicate.  Bounded: about 20 s.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);

my $node = PostgreSQL::Test::Cluster->new('generations');
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
	CREATE TABLE applied (key text);
	SELECT idem_consumer_create('orders');
	SELECT idem_set_retention('orders', '3 seconds');
});

# Deliveries for about 14 s: each message twice, and the one of three
# deliveries before once more, well inside its window.
my $n = 0;
my $start = time;
my $redelivered_applied = 0;
while (time - $start < 14)
{
	$n++;
	my $earlier = 'm-' . ($n > 3 ? $n - 3 : $n);
	my $ran = $node->safe_psql(
		'postgres', qq{
		SELECT count(*) FILTER (WHERE idem_apply(k, 'orders', 'insert into applied values (\$1)', ARRAY[k]))
		  FROM (VALUES ('m-$n'), ('m-$n'), ('$earlier')) AS d (k)});
	$redelivered_applied++ if $ran ne '1';
	sleep 0.1;
}

is($redelivered_applied, 0,
	"$n messages delivered twice, and again three deliveries later: each applied once");
is($node->safe_psql('postgres', 'SELECT count(*) = count(DISTINCT key) FROM applied'),
	't', 'the business table has each message once');
cmp_ok($node->safe_psql('postgres', 'SELECT max(epoch) FROM idem_consumer.key_generations'),
	'>=', 4, 'the worker switched generations on schedule');
my $open = $node->safe_psql('postgres', 'SELECT count(*) FROM idem_key_generations');
cmp_ok($open, '<=', 5, "and dropped the expired ones ($open open)");
is($node->safe_psql('postgres', q{
	SELECT sum(n_tup_del) FROM pg_stat_user_tables
	 WHERE schemaname = 'idem_consumer'
	   AND (relname LIKE 'processed_keys%' OR relname LIKE 'key_collisions%')}),
	'0', 'without deleting a key');
my $stored = $node->safe_psql('postgres', 'SELECT count(*) FROM idem_processed_keys');
cmp_ok($stored, '<', $n, "the keys of dropped generations are gone ($stored of $n stored)");
ok($node->log_contains(qr/idem_consumer dropped \d+ expired generations of keys in database "postgres"/),
	'the worker logs its drops');

done_testing();
