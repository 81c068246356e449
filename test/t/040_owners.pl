# Owners of consumers with real login roles, as the README's "Two teams"
# sets them up: each role connects as itself.  The payments team applies
# and operates its consumer; the shipping team's role, with the same
# EXECUTE grants, is refused it and sees none of its keys or dead letters;
# a monitoring role reads every consumer's counters; a role without the
# privilege to create consumers (EXECUTE on idem_consumer_create) cannot
# make one, even implicitly, with or without ALTER ROLE ... SET.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('owners');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem_consumer'\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE orders (id int PRIMARY KEY, paid int NOT NULL DEFAULT 0);
	CREATE TABLE shipments (id int PRIMARY KEY);
	INSERT INTO orders VALUES (1), (2);
	CREATE ROLE team_pay;   CREATE ROLE pay_app LOGIN IN ROLE team_pay;   CREATE ROLE pay_oncall LOGIN IN ROLE team_pay;
	CREATE ROLE team_ship;  CREATE ROLE ship_app LOGIN IN ROLE team_ship;
	CREATE ROLE monitoring LOGIN IN ROLE pg_monitor;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_record_batch(text, text[], text[], "any"),
	                          idem_is_processed(text, text, "any") TO team_pay, team_ship;
	GRANT EXECUTE ON FUNCTION idem_dlq_replay(bigint), idem_dlq_replay(text, integer),
	                          idem_dlq_discard(bigint, text), idem_forget(text, text, "any")
	                          TO pay_oncall, ship_app;
	GRANT SELECT ON idem_dead_letters, idem_processed_keys TO pay_oncall, ship_app;
	GRANT SELECT, UPDATE ON orders TO team_pay, team_ship;
	GRANT SELECT, INSERT ON shipments TO team_ship;
	SELECT idem_consumer_create('payments', 'team_pay');
	SELECT idem_consumer_create('shipping', 'team_ship');
	ALTER ROLE pay_app SET idem_consumer.create_consumers = off;
});

# as_role ROLE SQL: runs SQL in a session of ROLE; returns (stdout, stderr)
sub as_role
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', $sql, extra_params => [ '-U', $role ]);
	return ($out, $err);
}

my ($out, $err) = as_role('pay_app',
	q{SELECT idem_apply('paid:1', 'payments', 'update orders set paid = paid + 10 where id = 1')});
is($out, 't', 'the payments role applies a message of its consumer');
($out, $err) = as_role('pay_app',
	q{SELECT idem_try_apply('paid:2', 'payments', 'select 1 / 0')});
is($out, 'dead_lettered', 'and parks one that fails');

($out, $err) = as_role('ship_app',
	q{SELECT idem_apply('paid:3', 'payments', 'update orders set paid = paid + 1000 where id = 1')});
like($err, qr/ERROR:  permission denied for consumer "payments"/,
	'the shipping role, with the same grants, is refused the payments consumer');
like($err, qr/HINT:  Ask an administrator to grant the owner of the consumer/,
	'and told to be granted the owner');
unlike($err, qr/team_pay/, 'without being told which role owns it');
($out, $err) = as_role('ship_app', q{SELECT idem_forget('paid:1', 'payments')});
like($err, qr/permission denied for consumer "payments"/, 'it cannot forget a key of payments');
($out, $err) = as_role('ship_app', q{SELECT * FROM idem_dlq_replay('payments')});
like($err, qr/permission denied for consumer "payments"/, 'nor replay its dead letters');
($out, $err) = as_role('ship_app',
	q{SELECT count(*) FROM idem_processed_keys WHERE consumer = 'payments'});
is($out, '0', 'and sees none of its keys');
($out, $err) = as_role('ship_app', q{SELECT count(*) FROM idem_dead_letters});
is($out, '0', 'nor its dead letters');
($out, $err) = as_role('ship_app', q{SELECT idem_apply('ship:1', 'shipping', 'insert into shipments values (1)')});
is($out, 't', 'its own consumer works');

# every argument of 1.2 checks the consumer's owner as idem_apply does
my %other_forms = (
	typed_params =>
	  q{SELECT idem_apply('paid:4', 'payments', 'update orders set paid = paid + $1 where id = $2', ARRAY[1000::text, 1::text])},
	expect_rows =>
	  q{SELECT idem_apply('paid:4', 'payments', 'update orders set paid = paid + 1000 where id = 1', expect_rows => 1)},
	try_expect_rows =>
	  q{SELECT idem_try_apply('paid:4', 'payments', 'update orders set paid = paid + 1000 where id = 1', expect_rows => 1)},
	route =>
	  q{SELECT idem_apply('paid:4', 'payments', 'update orders set paid = paid + 1000 where id = 1', route => 1)},
	batch_with_routes =>
	  q{SELECT * FROM idem_record_batch('payments', ARRAY['paid:4'], NULL, ARRAY[1])},
);
for my $form (sort keys %other_forms)
{
	($out, $err) = as_role('ship_app', $other_forms{$form});
	like($err, qr/ERROR:  permission denied for consumer "payments"/,
		"idem_apply with $form refuses the shipping role the payments consumer");
}
($out, $err) = as_role('monitoring', $other_forms{typed_params});
like($err, qr/ERROR:  permission denied for function idem_apply/,
	'a role without EXECUTE cannot call idem_apply');
is($node->safe_psql('postgres', 'SELECT paid FROM orders WHERE id = 1'), '10',
	'nothing the shipping role tried changed a balance');
is($node->safe_psql('postgres', q{SELECT idem_is_processed('paid:4', 'payments')}), 'f',
	'nor recorded a key of payments');
($out, $err) = as_role('pay_app',
	q{SELECT idem_apply('paid:4', 'payments', 'update orders set paid = paid + $1 where id = $2', ARRAY['5', '1'], expect_rows => 1)});
is($out, 't', 'the payments role applies it with expect_rows');

($out, $err) = as_role('pay_oncall',
	q{SELECT consumer || ':' || key || ':' || status FROM idem_dead_letters});
is($out, 'payments:paid:2:pending', 'the operator of payments sees its dead letter, and only it');
($out, $err) = as_role('pay_oncall',
	q{SELECT count(*) FROM idem_processed_keys WHERE consumer = 'shipping'});
is($out, '0', 'and no key of shipping');

($out, $err) = as_role('monitoring',
	q{SELECT string_agg(consumer || '=' || applied || '/' || dead_lettered, ',' ORDER BY consumer) FROM idem_stats});
is($out, 'payments=2/1,shipping=1/0', 'the monitoring role reads the counters of every consumer');
($out, $err) = as_role('monitoring', q{SELECT idem_metrics() LIKE '%idem_applied_total{database="postgres",consumer="shipping"} 1%'});
is($out, 't', 'and the metrics');
($out, $err) = as_role('monitoring', q{SELECT count(*) FROM idem_processed_keys});
like($err, qr/permission denied for view idem_processed_keys/, 'but no key');

($out, $err) = as_role('pay_app', q{SELECT idem_apply('x:1', 'payments-new', 'select 1')});
like($err, qr/permission denied to create consumer "payments-new"/,
	'a role without the privilege cannot create a consumer by using it');
($out, $err) = as_role('pay_app', q{SET idem_consumer.create_consumers = on});
like($err, qr/permission denied to set parameter/, 'nor turn the switch back on');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_consumers WHERE consumer = 'payments-new'}),
	'0', 'and no consumer was created');

$node->stop;
done_testing();
