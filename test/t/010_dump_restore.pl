# pg_dump and restore keep the storage: a restored database still knows
# every processed key and dead letter, and new consumers get fresh ids.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init;
$node->start;
$node->safe_psql('postgres', q{
	CREATE DATABASE source;
	CREATE DATABASE restored;
});
$node->safe_psql('source', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE orders (id int PRIMARY KEY, paid numeric NOT NULL DEFAULT 0);
	INSERT INTO orders VALUES (1);
	SELECT idem_apply('order-paid:' || g, 'payments',
	                  'update orders set paid = paid + $1 where id = 1', ARRAY[g::text])
	  FROM generate_series(1, 60) g;
});
# the keys in two generations: 1 sealed, with its filter, 2 current
$node->safe_psql('source', 'SELECT idem_key_generation_switch()');
$node->safe_psql('source', 'SELECT idem_key_generation_build_filters()');
$node->safe_psql('source', q{
	SELECT idem_apply('order-paid:' || g, 'payments',
	                  'update orders set paid = paid + $1 where id = 1', ARRAY[g::text])
	  FROM generate_series(61, 100) g;
	SELECT idem_try_apply('order-paid:bad', 'payments', 'update orders set paid = paid / 0');
});

my $dump = PostgreSQL::Test::Utils::tempdir . '/source.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('source') ],
	'pg_dump of a database using idem_consumer');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into an empty database');

is($node->safe_psql('restored', 'SELECT count(*) FROM idem_processed_keys'), '101',
	'processed keys are restored');
is($node->safe_psql('restored',
	q{SELECT string_agg(generation || ':' || state || ':' || filtered, ',' ORDER BY epoch) FROM idem_key_generations}),
	'1:sealed:false,2:current:false',
	'the generations are restored, but not the filter, made with the seed of the source');
is($node->safe_psql('restored',
	q{SELECT (SELECT count(*) FROM idem_consumer_local.key_filter_all) || '/' ||
	         (SELECT count(*) FROM idem_consumer_local.key_filter_all_1) || '/' ||
	         (SELECT count(*) FROM idem_consumer_local.key_filter_all_2)}),
	'0/0/0', 'nor the filter of all sealed generations');
is($node->safe_psql('restored',
	q{SELECT count(*) FILTER (WHERE idem_apply('order-paid:' || g, 'payments',
	                                           'update orders set paid = paid + $1 where id = 1', ARRAY[g::text]))
	    FROM generate_series(1, 100) g}),
	'0', 'a redelivery after the restore is a duplicate, in either generation');
is($node->safe_psql('restored',
	q{SELECT (SELECT count(*) FROM idem_consumer.processed_keys_1) || '/' ||
	         (SELECT count(*) FROM idem_consumer.processed_keys_2)}),
	'60/41', 'each key in its generation');
is($node->safe_psql('restored', 'SELECT idem_key_generation_build_filters()'),
	'2', 'the restored database builds its own filters: its generation\'s, and the one of all sealed generations');
is($node->safe_psql('restored',
	q{SELECT count(*) FILTER (WHERE idem_apply('order-paid:' || g, 'payments',
	                                           'update orders set paid = paid + $1 where id = 1', ARRAY[g::text]))
	    FROM generate_series(1, 100) g}),
	'0', 'which finds every key of its generation');
$node->safe_psql('restored', 'SELECT idem_key_generation_switch()');
is($node->safe_psql('restored',
	q{SELECT idem_apply('order-paid:70', 'payments', 'update orders set paid = paid + $1 where id = 1', ARRAY['70'])
	      || '/' || idem_apply('order-paid:101', 'payments', 'select 1')}),
	'false/true', 'the ring goes on from where it was');
is($node->safe_psql('restored', 'SELECT key FROM idem_consumer.processed_keys_3'),
	'order-paid:101', 'new keys going into its next generation');
my ($reuse_rc, $reuse_out, $reuse_err) = $node->psql('restored',
	q{SELECT idem_apply('order-paid:7', 'payments', 'update orders set paid = paid + 1000 where id = 1')});
like($reuse_err, qr/key "order-paid:7" of consumer "payments" was recorded for another message/,
	'fingerprints are restored: another message under the key is refused');
is($node->safe_psql('restored', 'SELECT paid FROM orders'), '5050',
	'and changed nothing');
is($node->safe_psql('restored',
	q{SELECT owner::text = current_user FROM idem_consumers WHERE consumer = 'payments'}),
	't', 'consumers keep their owner, dumped by name');
is($node->safe_psql('restored', q{SELECT status FROM idem_dead_letters WHERE key = 'order-paid:bad'}),
	'pending', 'dead letters are restored');
is($node->safe_psql('restored', q{SELECT idem_apply('k', 'new-consumer', 'select 1')}),
	't', 'a new consumer applies after the restore');
is($node->safe_psql('restored', 'SELECT count(DISTINCT consumer_id) FROM idem_consumer.consumers'),
	'2', 'with an id of its own');

done_testing();
