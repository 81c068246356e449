# Concurrent redelivery: four pgbench clients apply random events from a
# small range (so many duplicates, and the same event applied by two clients
# at once), then every event is redelivered once, then once more.  Each event
# must change its order's balance exactly once.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $n_events = 2000;    # event ids 1 .. $n_events
my $n_orders = 100;     # event e pays order 1 + e % 100 ...
my $n_amount = 50;      # ... the amount 1 + e % 50

my $node = PostgreSQL::Test::Cluster->new('redelivery');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idem_consumer'\nlog_statement = none\n");
$node->start;

$node->safe_psql(
	'postgres', qq{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE orders (
		id bigint PRIMARY KEY,
		amount_due numeric NOT NULL DEFAULT 100,
		paid_amount numeric NOT NULL DEFAULT 0,
		status text NOT NULL DEFAULT 'NEW');
	INSERT INTO orders (id) SELECT generate_series(1, $n_orders);
});

# The one SQL expression that delivers event :e (a psql/pgbench variable
# or a column).
sub apply_expr
{
	my ($e) = @_;
	return "idem_apply(key => 'order-paid:' || ($e)::text, "
	  . "consumer => 'payments', "
	  . "sql => 'update orders set paid_amount = paid_amount + \$1, status = ''PAID'' where id = \$2', "
	  . "params => ARRAY[(1 + ($e) % $n_amount)::text, (1 + ($e) % $n_orders)::text], "
	  . "event_time => now())";
}

# Orders whose balance differs from the sum of the amounts of the distinct
# events listed by $events_sql (a query returning a column e).
sub wrong_balances
{
	my ($events_sql) = @_;
	return $node->safe_psql(
		'postgres', qq{
		SELECT count(*) FROM orders o
		LEFT JOIN (SELECT 1 + e % $n_orders AS id, sum(1 + e % $n_amount) AS due
		           FROM (SELECT DISTINCT e FROM ($events_sql) ev) d
		           GROUP BY 1) x USING (id)
		WHERE o.paid_amount <> coalesce(x.due, 0)
		   OR (o.status = 'PAID') <> (x.due IS NOT NULL)});
}

my $recorded_events = q{
	SELECT substr(key, length('order-paid:') + 1)::bigint AS e
	FROM idem_processed_keys};
my $all_events = "SELECT generate_series(1, $n_events) AS e";
my $balances =
  q{SELECT string_agg(id || ':' || paid_amount, ',' ORDER BY id) FROM orders};

# 1. Four concurrent clients, 3000 deliveries each, of random events.
$node->pgbench(
	'--no-vacuum --client=4 --jobs=2 --transactions=3000 --protocol=prepared',
	0,
	[qr{processed: 12000/12000}],
	[qr{^$}],
	'concurrent random deliveries',
	{
		'001_redelivery' => "\\set e random(1, $n_events)\n"
		  . 'SELECT ' . apply_expr(':e') . ";\n"
	});

my $recorded = $node->safe_psql('postgres',
	'SELECT count(*) FROM idem_processed_keys');
my $distinct = $node->safe_psql('postgres',
	"SELECT count(DISTINCT e) FROM ($recorded_events) r");
cmp_ok($recorded, '>', 0, 'some events were recorded');
is($recorded, $distinct, 'no event recorded twice');
is(wrong_balances($recorded_events),
	0, 'after concurrent deliveries, each recorded event was applied once');

# 2. Redeliver every event once, one transaction each.
my $sweep = join '',
  map { 'SELECT ' . apply_expr($_) . ";\n" } 1 .. $n_events;
my @first = split /\n/, $node->safe_psql('postgres', $sweep);
is(scalar(@first), $n_events, 'first sweep returned one result per event');
is( scalar(grep { $_ eq 't' } @first),
	$n_events - $distinct,
	'first sweep applied exactly the events not yet recorded');
is(wrong_balances($all_events),
	0, 'after the first sweep, every order has the sum of its distinct events');
is( $node->safe_psql(
		'postgres', 'SELECT count(*) FROM idem_processed_keys'),
	$n_events,
	'processed_keys holds one row per distinct event');

# 3. Redeliver everything again: nothing may be applied.
my $before = $node->safe_psql('postgres', $balances);
my @second = split /\n/, $node->safe_psql('postgres', $sweep);
is(scalar(@second), $n_events, 'second sweep returned one result per event');
is(scalar(grep { $_ ne 'f' } @second),
	0, 'second sweep returned false for every event');
is($node->safe_psql('postgres', $balances),
	$before,
	'second sweep changed no balance');
is( $node->safe_psql(
		'postgres', 'SELECT count(*) FROM idem_processed_keys'),
	$n_events,
	'second sweep recorded nothing new');

$node->stop;
done_testing();
