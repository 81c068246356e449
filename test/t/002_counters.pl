# Counters in shared memory: exact under concurrent clients, readable by
# promtool, kept across a clean restart, gone after a crash, bounded by
# idem_consumer.max_consumers, and absent (with a clear error) when the
# library is not preloaded while deduplication keeps working.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('counters');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idem_consumer'\nidem_consumer.max_consumers = 16\n");
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	SELECT idem_consumer_create('load');
	CREATE TABLE ledger (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0);
	INSERT INTO ledger VALUES (1);
});

# Four clients: 90% of transactions apply a random key of 300 and commit,
# 10% apply one and roll back.  A committed call also logs a row in its
# transaction, so the log counts exactly the calls that committed.  The
# consumer exists beforehand: a rollback that undoes its creation would
# take its failed calls with it.
$node->safe_psql('postgres', 'CREATE TABLE committed_calls (n int)');
my $dir = PostgreSQL::Test::Utils::tempdir;
my $apply = q{select idem_apply('k-' || :k, 'load', 'update ledger set n = n + 1 where id = 1');};
PostgreSQL::Test::Utils::append_to_file("$dir/commit.sql",
	"\\set k random(1, 300)\nbegin;\n$apply\ninsert into committed_calls values (1);\ncommit;\n");
PostgreSQL::Test::Utils::append_to_file("$dir/rollback.sql",
	"\\set k random(1, 300)\nbegin;\n$apply\nrollback;\n");
my ($out, $err) = run_command([
	'pgbench', '-n', '-h', $node->host, '-p', $node->port,
	'-c', '4', '-j', '2', '-t', '500',
	'-f', "$dir/commit.sql\@9", '-f', "$dir/rollback.sql\@1",
	'postgres' ]);
like($out, qr/number of transactions actually processed: 2000\/2000/,
	'pgbench ran 2000 transactions') or diag($err);
like($out, qr/number of failed transactions: 0/, 'pgbench ran without failures');
my $committed = $node->safe_psql('postgres', 'SELECT count(*) FROM committed_calls');
my $rolled_back = 2000 - $committed;
ok($committed > 0 && $rolled_back > 0, 'both scripts ran');

my ($applied, $duplicates, $failed) = split /\|/, $node->safe_psql('postgres',
	"SELECT applied, duplicates, failed FROM idem_stats WHERE consumer = 'load'");
is($applied + $duplicates, $committed, 'every committed call is applied or duplicate');
is($failed, $rolled_back, 'every rolled-back call is failed');
is($applied, $node->safe_psql('postgres', 'SELECT n FROM ledger'),
	'applied equals the business effects');
is($applied, $node->safe_psql('postgres',
	"SELECT keys_stored FROM idem_consumers WHERE consumer = 'load'"),
	'applied equals the keys stored');

# promtool validates the exposition, including an awkward label: a name
# that no new consumer may have, stored as one from before that rule
$node->safe_psql('postgres',
	q{INSERT INTO idem_consumer.consumers (name, owner)
	  VALUES (E'tab\there "quoted" back\\\\slash\nnewline', current_user::regrole);
	  SELECT idem_apply('x', E'tab\there "quoted" back\\\\slash\nnewline', 'select 1', event_time => now())});
# and the lag of Kafka positions, labelled with a topic and a partition
$node->safe_psql('postgres',
	q{SELECT idem_position_advance('load', 'order-paid', 3, 40, 52);
	  SELECT idem_position_advance('load', E'odd "topic"', 0, 7, 7)});
my $metrics = $node->safe_psql('postgres', 'SELECT idem_metrics()');
PostgreSQL::Test::Utils::append_to_file("$dir/metrics.txt", "$metrics\n");
# the acceptance below proves something only if promtool runs and rejects
# what is malformed (exit status 1, not 127 for a missing command)
my ($bad) = run_command([ 'sh', '-c',
	q~printf 'idem_applied_total{consumer="x" 1\n' | promtool check metrics 2>&1; echo rc=$?~ ]);
like($bad, qr/parsing error.*\nrc=1$/s, 'promtool runs and rejects a malformed exposition');
my ($pout, $perr) = run_command([ 'sh', '-c', "promtool check metrics < $dir/metrics.txt; echo rc=\$?" ]);
like($pout, qr/rc=0$/, 'promtool check metrics accepts idem_metrics()')
  or diag("$pout\n$perr");
like($metrics, qr/^idem_applied_total\{database="postgres",consumer="load"\} $applied$/m,
	'the exposition carries the counter');
like($metrics, qr/^idem_position_lag\{database="postgres",consumer="load",topic="order-paid",partition="3"\} 12$/m,
	'and the lag of a position: log-end offset minus position');
like($metrics, qr/^idem_position_lag\{database="postgres",consumer="load",topic="odd \\"topic\\"",partition="0"\} 0$/m,
	'with its labels escaped');

# a clean restart keeps the counters
my $before = $node->safe_psql('postgres',
	'SELECT consumer, applied, duplicates, failed, latency_p95_ms, lag_last_ms FROM idem_stats ORDER BY consumer');
$node->restart;
is($node->safe_psql('postgres',
	'SELECT consumer, applied, duplicates, failed, latency_p95_ms, lag_last_ms FROM idem_stats ORDER BY consumer'),
	$before, 'counters survive a clean restart');

# a crash, or an immediate shutdown, which needs crash recovery too, loses them
$node->stop('immediate');
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stats'), '0',
	'counters are empty after a crash');
is($node->safe_psql('postgres', "SELECT idem_is_processed('k-1', 'load') OR idem_is_processed('k-2', 'load')"),
	't', 'processed keys are not counters: they survive the crash');

# beyond max_consumers, calls are counted as untracked
my ($many_rc, $many_out, $many_err) = $node->psql('postgres',
	q{SELECT idem_apply('m', 'many-' || g, 'select 1') FROM generate_series(1, 20) g});
is($many_rc, 0, 'calls beyond max_consumers are applied');
like($many_err, qr/WARNING:  counters of consumer "many-20" are not tracked/,
	'a consumer beyond max_consumers is told its counters are not tracked');
is($node->safe_psql('postgres', 'SELECT consumers, max_consumers, untracked_calls FROM idem_stats_info'),
	'16|16|4', 'consumers beyond max_consumers are untracked and counted');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stats'), '16',
	'idem_stats shows max_consumers consumers');
$node->stop;

# without shared_preload_libraries, deduplication works and counters say why not
my $plain = PostgreSQL::Test::Cluster->new('not_preloaded');
$plain->init;
$plain->start;
$plain->safe_psql('postgres', 'CREATE EXTENSION idem_consumer');
is($plain->safe_psql('postgres',
	q{SELECT idem_apply('k', 'c', 'select 1')::text || idem_apply('k', 'c', 'select 1')::text}),
	'truefalse', 'idem_apply works without shared_preload_libraries');
my ($ret, $stdout, $stderr) = $plain->psql('postgres', 'SELECT * FROM idem_stats');
isnt($ret, 0, 'idem_stats fails without shared_preload_libraries');
like($stderr, qr/must be loaded via shared_preload_libraries/, 'the error says why');
($ret, $stdout, $stderr) = $plain->psql('postgres', '\set VERBOSITY verbose' . "\n" . 'SELECT idem_metrics()');
like($stderr, qr/55000.*\n(?:.*\n)*HINT:  Add idem_consumer to shared_preload_libraries/,
	'idem_metrics fails with SQLSTATE 55000 and a hint');
$plain->stop;

done_testing();
