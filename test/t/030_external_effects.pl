# External effects end to end: a local HTTP payment provider and consumer
# processes in Node.js (node-postgres) charging cards for a stream of
# order-paid messages with redeliveries, SIGKILLed between the call and
# the complete (and anywhere else) and restarted; see test/effects/run.js.
#
# With a provider that honours Idempotency-Key every charge exists exactly
# once; with one that ignores it, every effect charged twice is flagged
# outcome_unknown; with one that hangs past the lease, the late worker is
# fenced off.  In every mode each order's balance is exact and no effect is
# left in flight.
use strict;
use warnings;

use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $events = 150;
my $node_modules = "$ENV{TESTDIR}/client/node/node_modules";
plan skip_all => 'node and node-postgres are needed (npm ci in test/client/node)'
  unless -d "$node_modules/pg";

my $node = PostgreSQL::Test::Cluster->new('effects');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idem_consumer'\nlog_statement = none\nmax_connections = 40\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem_consumer');

# Runs one mode and returns its summary.
sub run_mode
{
	my ($mode) = @_;
	local $ENV{PGHOST} = $node->host;
	local $ENV{PGPORT} = $node->port;
	local $ENV{PGUSER} = $ENV{USER} // scalar getpwuid($<);
	local $ENV{PGDATABASE} = 'postgres';
	local $ENV{NODE_PATH} = $node_modules;
	my ($out, $err) = run_command(
		[ 'timeout', '120', 'node', "$ENV{TESTDIR}/effects/run.js", $mode, $events, '4' ]);
	my ($line) = grep { /^\{/ } split /\n/, $out;
	ok(defined $line, "$mode: the run finished") or diag("stdout: $out\nstderr: $err");
	note("$mode: $line") if defined $line;
	return defined $line ? decode_json($line) : {};
}

# Checks the database after a run of one mode.
sub check_database
{
	my ($mode, $summary) = @_;
	my $consumer = "charges-$mode";
	is($node->safe_psql('postgres', 'SELECT count(*) FROM fx_orders WHERE paid <> due'),
		'0', "$mode: every order's balance is exact");
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM idem_effects WHERE consumer = '$consumer' AND state <> 'completed'"),
		'0', "$mode: nothing is left in flight");
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM idem_effects WHERE consumer = '$consumer'"),
		$events, "$mode: one effect per event");
	ok($summary->{restarts} > 0, "$mode: consumers were killed and restarted ($summary->{restarts})");
	ok($summary->{deliveries} > $summary->{messages},
		"$mode: messages were redelivered ($summary->{deliveries} deliveries of $summary->{messages})");
}

# Returns one counter of idem_stats for a mode's consumer.
sub counter
{
	my ($mode, $column) = @_;
	return $node->safe_psql('postgres',
		"SELECT $column FROM idem_stats WHERE consumer = 'charges-$mode'");
}

# the provider honours Idempotency-Key: exactly one charge per event
my $s = run_mode('honours');
is($s->{charges}, $events, 'honours: one charge per event at the provider');
is($s->{keys_charged_twice}, 0, 'honours: no key charged twice');
is($s->{provider_orders_off}, 0, 'honours: the provider charged every order exactly');
ok(counter('honours', 'effects_unknown_outcomes') > 0,
	'honours: some consumers died between the call and the complete');
check_database('honours', $s);

# the provider ignores it: a retry after an unknown outcome charges again,
# and every such effect is flagged
$s = run_mode('ignores');
is($s->{keys_charged}, $events, 'ignores: every event charged');
my $twice = $s->{charged_twice} // [];
ok(@$twice > 0, 'ignores: consumers that died after the call made the provider charge twice ('
	  . scalar(@$twice) . ')');
my $list = join(',', map { "'$_'" } @$twice) || "''";
is($node->safe_psql('postgres',
		"SELECT count(*) FROM idem_effects WHERE provider_key IN ($list) AND outcome_unknown"),
	scalar(@$twice),
	'ignores: every effect charged twice is flagged outcome_unknown ('
	  . scalar(@$twice) . ')');
check_database('ignores', $s);

# the provider hangs past the lease: the late worker is fenced off
$s = run_mode('hangs');
ok($s->{hung} > 0, "hangs: answers were held past the lease ($s->{hung})");
is($s->{charges}, $events, 'hangs: one charge per event at the provider');
is($s->{provider_orders_off}, 0, 'hangs: the provider charged every order exactly');
ok(counter('hangs', 'effects_fenced_off') > 0, 'hangs: late workers were fenced off');
ok(counter('hangs', 'effects_unknown_outcomes') > 0, 'hangs: their leases expired with the outcome unknown');
check_database('hangs', $s);

like($node->safe_psql('postgres', 'SELECT idem_metrics()'),
	qr/^idem_effect_unknown_outcome_total\{database="postgres",consumer="charges-hangs"\} [1-9]/m,
	'idem_metrics exports the unknown outcomes');

$node->stop;
done_testing();
