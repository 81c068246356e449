#!/usr/bin/perl
# test/prometheus/dashboard.t -- docs/idem_consumer.dashboard.json and the
# rules of docs/prometheus/idem_consumer.rules.yml against a real
# Prometheus: Debian's prometheus scrapes, every 2 seconds, a database under
# load both ways the families reach it (idem_metrics() through a small HTTP
# endpoint, job "idem_metrics"; postgres_exporter with
# docs/prometheus/postgres_exporter-queries.yaml, job "postgres_exporter").
# Then every target of every panel, with the dashboard's variables set as
# a user would set them (job: each way in turn; database and consumer: the
# loaded ones), is evaluated through the HTTP API (/api/v1/query and
# /api/v1/query_range) and must give no error and at least one series;
# every rule's expression, read back from /api/v1/rules, must give no
# error, and the recording rules and the alerts the load provokes a series;
# the panels' thresholds must be the limits of the alerts.
# A target whose metric name does not exist gives no series: the check is
# run once on such a target and must refuse it.  Last, the data of a few
# panels is plotted into docs/dashboard.png (test/prometheus/dashboard-plot).
#
# Run by the prometheus suite of test/run-tests, against the scratch
# cluster (PGHOST, PGPORT in the environment; PG_BINDIR its binaries;
# EXPORTER_WORK a directory the server's OS user can read and write).
# Prometheus and the exporter run as that user when this runs as root, on
# free ports of 127.0.0.1, bounded by timeout.  DASHBOARD_LOAD_SECONDS
# (default 40) is how long the load runs.
use strict;
use warnings;
use Test::More;
use File::Basename qw(dirname);
use File::Copy qw(copy);
use Cwd qw(abs_path);
use IO::Socket::INET;
use JSON::PP;
use POSIX qw(WNOHANG);
use Time::HiRes qw(time sleep);

my $repo = abs_path(dirname(__FILE__) . '/../..');
my $bindir = $ENV{PG_BINDIR} or die "PG_BINDIR is not set";
my $work = $ENV{EXPORTER_WORK} or die "EXPORTER_WORK is not set";
my $dashboard_file = "$repo/docs/idem_consumer.dashboard.json";
my $rules = "$repo/docs/prometheus/idem_consumer.rules.yml";
my $queries = "$repo/docs/prometheus/postgres_exporter-queries.yaml";
my $db = 'idem_dashboard';
my $role = 'idem_dashboard_monitor';
my $load_seconds = $ENV{DASHBOARD_LOAD_SECONDS} // 40;
my @as_server_user = $> == 0 ? ('runuser', '-u', 'postgres', '--') : ();
my %jobs = (idem_metrics => undef, postgres_exporter => undef);	# job => port
my @children;

# psql SQL [USER]: the output, unaligned and tuples only; dies on error
sub psql
{
	my ($sql, $user, $dbname) = @_;
	open(my $fh, '-|', "$bindir/psql", '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1',
		'-U', $user // 'postgres', '-d', $dbname // $db, '-c', $sql)
	  or die "psql: $!";
	local $/;
	my $out = <$fh>;
	close($fh) or die "psql failed on: $sql\n";
	$out //= '';
	chomp $out;
	return $out;
}

# free_port: a port of 127.0.0.1 nobody listens on now
sub free_port
{
	for (1 .. 50)
	{
		my $port = 20000 + int(rand(40000));
		my $probe = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
			Proto => 'tcp', ReuseAddr => 0);
		next unless $probe;
		close($probe);
		return $port;
	}
	die "no free port";
}

# spawn LOG CMD...: runs CMD in the background, output to LOG
sub spawn
{
	my ($log, @cmd) = @_;
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		chdir $work;
		open(STDOUT, '>', $log);
		open(STDERR, '>&', \*STDOUT);
		exec(@cmd) or POSIX::_exit(127);
	}
	push @children, $pid;
	return $pid;
}

# wait_http URL PID: true once URL answers, false if PID died or 20 s passed
sub wait_http
{
	my ($url, $pid) = @_;
	for (1 .. 100)
	{
		return 1 if system('curl', '-sf', '-o', '/dev/null', '--max-time', '5', $url) == 0;
		return 0 if waitpid($pid, WNOHANG) == $pid;
		sleep(0.2);
	}
	return 0;
}

# api PATH PARAMS: Prometheus's JSON answer to a GET of /api/v1/PATH
sub api
{
	my ($path, %params) = @_;
	my @args = map { ('--data-urlencode', "$_=$params{$_}") } sort keys %params;
	open(my $fh, '-|', 'curl', '-s', '--max-time', '30', '-G', @args,
		"http://127.0.0.1:$jobs{prometheus}/api/v1/$path")
	  or die "curl: $!";
	local $/;
	my $body = <$fh>;
	close($fh);
	my $answer = eval { decode_json($body // '') };
	return $answer // { status => 'error', error => 'not JSON: ' . ($body // '') };
}

END
{
	for my $pid (@children)
	{
		kill 'TERM', $pid;
		waitpid($pid, 0);
	}
	eval {
		psql("DROP DATABASE IF EXISTS $db", undef, 'postgres');
		psql("DROP ROLE IF EXISTS $role", undef, 'postgres');
	};
}

# the database, its consumer and the role that scrapes it
psql("DROP DATABASE IF EXISTS $db", undef, 'postgres');
psql("DROP ROLE IF EXISTS $role", undef, 'postgres');
psql("CREATE ROLE $role LOGIN IN ROLE pg_monitor", undef, 'postgres');
psql("CREATE DATABASE $db", undef, 'postgres');
psql(q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE orders (id int PRIMARY KEY, paid numeric NOT NULL DEFAULT 0);
	INSERT INTO orders SELECT g FROM generate_series(1, 100) AS g;
	SELECT idem_apply('warm-' || g, 'payments', 'update orders set paid = paid + 1 where id = $1',
	                  ARRAY[(1 + g % 100)::text], now()) FROM generate_series(1, 2000) AS g;
});
# a sealed generation with its filter: every gauge of the ring has a sample
psql('SELECT idem_key_generation_switch()');
psql('SELECT idem_key_generation_build_filters()');

# idem_metrics() over HTTP, one psql per scrape, as the monitoring role
my $direct_port = free_port();
my $sidecar = fork() // die "fork: $!";
if ($sidecar == 0)
{
	my $server = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $direct_port,
		Proto => 'tcp', Listen => 16, ReuseAddr => 1) or POSIX::_exit(1);
	while (my $client = $server->accept)
	{
		while (my $line = <$client>)
		{
			last if $line =~ /^\r?\n$/;
		}
		my $text = eval { psql('SELECT idem_metrics()', $role) } // '';
		print $client "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
		  . "Content-Length: " . (length($text) + 1) . "\r\n\r\n$text\n";
		close($client);
	}
	POSIX::_exit(0);
}
push @children, $sidecar;
$jobs{idem_metrics} = $direct_port;
ok(wait_http("http://127.0.0.1:$direct_port/metrics", $sidecar), 'idem_metrics() is served over HTTP');

# postgres_exporter with the queries file
copy($queries, "$work/dashboard-queries.yaml") or die "copy: $!";
chmod 0644, "$work/dashboard-queries.yaml";
$jobs{postgres_exporter} = free_port();
{
	local $ENV{DATA_SOURCE_NAME} =
	  "host=$ENV{PGHOST} port=$ENV{PGPORT} user=$role dbname=$db sslmode=disable";
	my $pid = spawn("$work/dashboard-exporter.log", 'timeout', '-k', '5', '300', @as_server_user,
		'prometheus-postgres-exporter', "--web.listen-address=127.0.0.1:$jobs{postgres_exporter}",
		"--extend.query-path=$work/dashboard-queries.yaml",
		'--disable-default-metrics', '--disable-settings-metrics',
		'--no-collector.database', '--no-collector.bgwriter');
	ok(wait_http("http://127.0.0.1:$jobs{postgres_exporter}/metrics", $pid),
		'postgres_exporter serves /metrics')
	  or BAIL_OUT('the exporter did not start: ' . `cat $work/dashboard-exporter.log`);
}

# Prometheus: both jobs every 2 s, the rules evaluated as often
copy($rules, "$work/dashboard.rules.yml") or die "copy: $!";
chmod 0644, "$work/dashboard.rules.yml";
$jobs{prometheus} = free_port();
open(my $cfg, '>', "$work/prometheus.yml") or die;
print $cfg "global:\n  scrape_interval: 2s\n  evaluation_interval: 2s\n"
  . "rule_files:\n  - $work/dashboard.rules.yml\nscrape_configs:\n";
for my $job (qw(idem_metrics postgres_exporter))
{
	print $cfg "  - job_name: $job\n    scrape_timeout: 2s\n"
	  . "    static_configs:\n      - targets: ['127.0.0.1:$jobs{$job}']\n";
}
close($cfg);
mkdir "$work/prometheus-data";
system('chown', '-R', 'postgres:', "$work/prometheus-data") if $> == 0;
my $prometheus = spawn("$work/prometheus.log", 'timeout', '-k', '5', '300', @as_server_user,
	'prometheus', "--config.file=$work/prometheus.yml",
	"--storage.tsdb.path=$work/prometheus-data",
	"--web.listen-address=127.0.0.1:$jobs{prometheus}");
ok(wait_http("http://127.0.0.1:$jobs{prometheus}/-/ready", $prometheus), 'Prometheus is ready')
  or BAIL_OUT('Prometheus did not start: ' . `cat $work/prometheus.log`);
diag((split /\n/, `prometheus --version 2>&1`)[0]);

# The load, through pgbench at a bounded rate: deliveries of keys drawn
# from a range (so that redeliveries come back as duplicates) with an
# event_time up to two seconds old; 30 poison messages parked in the
# dead-letter queue and left pending (their redeliveries are duplicates);
# effects begun and completed (a
# redelivery replays them) and effects whose worker "dies" (a lease of one
# second never completed: the next begin finds its outcome unknown).
my %scripts = (
	'apply.sql' => q{\set k random(1, 3000)
SELECT idem_apply('m-' || :k, 'payments', 'update orders set paid = paid + 1 where id = $1', ARRAY[(1 + :k % 100)::text], now() - random() * interval '2 seconds');
},
	'poison.sql' => q{\set k random(1, 30)
SELECT idem_try_apply('poison-' || :k, 'payments', 'update orders set paid = paid / 0 where id = 1');
},
	'effect.sql' => q{\set e random(1, 400)
SELECT (action = 'execute')::int AS run, coalesce(fence, 0) AS fence FROM idem_effect_begin('payments', 'charge-' || :e, '{"amount": 1}', '30 seconds') \gset
\if :run
SELECT idem_effect_complete('payments', 'charge-' || :e, :fence, '{"ok": true}', 'update orders set paid = paid + 1 where id = 2');
\endif
},
	'lost.sql' => q{\set e random(1, 20)
SELECT action FROM idem_effect_begin('payments', 'lost-' || :e, '{"amount": 1}', '1 second');
},
);
for my $name (keys %scripts)
{
	open(my $fh, '>', "$work/$name") or die;
	print $fh $scripts{$name};
	close($fh);
}
my $load_start = time();
my $bench = system("cd $work && timeout -k 10 " . ($load_seconds + 60)
	  . " $bindir/pgbench -n -U postgres -c 2 -j 2 -T $load_seconds -R 120"
	  . " -f apply.sql\@12 -f poison.sql\@1 -f effect.sql\@4 -f lost.sql\@1 $db"
	  . " > $work/dashboard-pgbench.log 2>&1");
my $load_end = time();
is($bench >> 8, 0, "pgbench ran the load for $load_seconds s")
  or diag(`grep -iE "error|abort" $work/dashboard-pgbench.log | head -5`);
diag(`grep -E '^(number of transactions actually processed|tps)' $work/dashboard-pgbench.log`);
# two more scrapes after the last delivery
sleep(5);

# The dashboard: each target with the variables of a user looking at this
# database's consumer through one job, evaluated at the end of the load
# (instant) and over the load (range, a point every 2 s).
my $dashboard = decode_json(do { local $/; open(my $fh, '<', $dashboard_file) or die; <$fh> });
my @panels = grep { $_->{type} ne 'row' } @{ $dashboard->{panels} };
my %vars = map { $_->{name} => $_ } @{ $dashboard->{templating}{list} };
ok($vars{datasource} && $vars{datasource}{type} eq 'datasource' && $vars{datasource}{query} eq 'prometheus'
	  && $vars{consumer} && $vars{consumer}{definition} =~ /^label_values\(/,
	'the dashboard has a datasource variable and a consumer variable from label_values');

# the variables' own queries: label_values(selector, label) as /api/v1/series
my %var_values;
for my $name (qw(job database consumer))
{
	my ($selector, $label) = $vars{$name}{definition} =~ /^label_values\((.*),\s*(\w+)\)$/
	  or die "cannot read variable $name";
	$selector =~ s/\$job/(idem_metrics|postgres_exporter)/g;
	$selector =~ s/\$database/$db/g;
	my $answer = api('series', 'match[]' => $selector,
		start => int($load_start), end => int($load_end) + 3);
	my %values = map { ($_->{$label} // '') => 1 } @{ $answer->{data} // [] };
	$var_values{$name} = [sort keys %values];
}
# a role with pg_read_all_stats scrapes the counters of every database of
# the server, so other databases the suites ran in may be listed too; the
# consumers are those of the database chosen
is_deeply({ job => $var_values{job}, consumer => $var_values{consumer},
		has_database => scalar grep { $_ eq $db } @{ $var_values{database} } },
	{ job => [qw(idem_metrics postgres_exporter)], consumer => ['payments'], has_database => 1 },
	'the variables list both jobs, the database and its consumer')
  or diag explain \%var_values;

# substitute EXPR JOB: the expression as Grafana sends it
sub substitute
{
	my ($expr, $job) = @_;
	# Grafana's is at least 4 scrape intervals; 10 here, for a loaded machine
	$expr =~ s/\$__rate_interval/20s/g;
	$expr =~ s/\$job\b/$job/g;
	$expr =~ s/\$database\b/$db/g;
	$expr =~ s/\$consumer\b/payments/g;
	die "unknown variable in: $expr" if $expr =~ /\$/;
	return $expr;
}

# evaluate EXPR: '' if it returns at least one series at the end of the
# load and over it, else what is wrong
sub evaluate
{
	my ($expr) = @_;
	my $instant = api('query', query => $expr, time => sprintf('%.3f', $load_end));
	return "instant: $instant->{error}" if $instant->{status} ne 'success';
	return 'instant: no series' unless @{ $instant->{data}{result} };
	my $range = api('query_range', query => $expr, start => sprintf('%.3f', $load_start),
		end => sprintf('%.3f', $load_end), step => 2);
	return "range: $range->{error}" if $range->{status} ne 'success';
	return 'range: no series' unless @{ $range->{data}{result} };
	return '';
}

my (@panel_failures, $targets);
for my $panel (@panels)
{
	for my $target (@{ $panel->{targets} })
	{
		for my $job (qw(idem_metrics postgres_exporter))
		{
			my $expr = substitute($target->{expr}, $job);
			my $wrong = evaluate($expr);
			$targets++;
			push @panel_failures, "$panel->{title} [$job] $expr: $wrong" if $wrong ne '';
		}
	}
}
is_deeply(\@panel_failures, [], scalar(@panels) . ' panels, '
	  . "$targets targets (both jobs): each returns series, instant and over the load");

# the check itself: a target naming a metric that does not exist fails it
my $broken = substitute($panels[0]{targets}[0]{expr}, 'idem_metrics');
$broken =~ s/idem_applied_total/idem_applied_totals/ or die "the first target is not the applied rate";
is(evaluate($broken), 'instant: no series', 'a target naming a metric that does not exist is refused');

# The rules as Prometheus loaded them: every expression evaluates; the
# recording rules, and the alerts this load provokes, return series.
my $loaded = api('rules');
my @rules = map { @{ $_->{rules} } } @{ $loaded->{data}{groups} // [] };
my %must_fire = (IdemDeadLettered => 1, IdemEffectUnknownOutcome => 1);
my (@rule_failures, @quiet, @series);
for my $rule (@rules)
{
	my $name = $rule->{name};
	push @rule_failures, "$name: $rule->{health} $rule->{lastError}"
	  if ($rule->{health} // '') ne 'ok' && ($rule->{lastError} // '') ne '';
	my $answer = api('query', query => $rule->{query}, time => sprintf('%.3f', $load_end + 4));
	if ($answer->{status} ne 'success')
	{
		push @rule_failures, "$name: $answer->{error}";
		next;
	}
	my $n = scalar @{ $answer->{data}{result} };
	push @{ $n ? \@series : \@quiet }, $name;
	push @rule_failures, "$name: no series"
	  if $n == 0 && ($rule->{type} eq 'recording' || $must_fire{$name});
}
cmp_ok(scalar(@rules), '>=', 20, scalar(@rules) . ' rules loaded');
is_deeply(\@rule_failures, [], 'every rule evaluates; the recording rules and '
	  . join(', ', sort keys %must_fire) . ' return series');
diag('rules with series: ' . join(', ', @series));
diag('rules quiet under this load: ' . join(', ', @quiet));

# The panels' thresholds are the alerts' (as Prometheus loaded them): the
# first constant an alert compares with, times a factor where the panel
# shows the series in another unit (dead letters per minute, not per 5
# minutes), or the first whole count above it (an increase > 0: 1).
my %alert_limit;
for my $rule (grep { $_->{type} eq 'alerting' } @rules)
{
	$alert_limit{ $rule->{name} } = $1 if $rule->{query} =~ />=?\s*([0-9.]+)/;
}
my @threshold_of = (
	['Duplicate ratio', 'IdemDuplicateRatioSurge', 1],
	['Processing latency p50 / p95 / p99', 'IdemProcessingLatencyHigh', 1],
	['Lag: commit time minus event_time', 'IdemConsumerLagHigh', 1],
	['Lag: commit time minus event_time', 'IdemConsumerLagCritical', 1],
	['Dead letters parked per minute', 'IdemDeadLetterBurst', 1 / 5],
	['Oldest pending dead letter', 'IdemDeadLetterPendingTooLong', 1],
	['Oldest pending dead letter', 'IdemDeadLetterPendingCritical', 1],
	['Effects of unknown outcome, last 15 minutes', 'IdemEffectUnknownOutcome', 'count'],
	['Effects of unknown outcome, last 15 minutes', 'IdemEffectUnknownOutcomeBurst', 1]);
my %panel_by_title = map { $_->{title} => $_ } @panels;
my @thresholds_differ;
for my $t (@threshold_of)
{
	my ($title, $alert, $factor) = @$t;
	my $limit = $alert_limit{$alert};
	my $panel = $panel_by_title{$title};
	push(@thresholds_differ, "$alert: no limit read"), next unless defined $limit;
	push(@thresholds_differ, "$title: no such panel"), next unless $panel;
	my $want = $factor eq 'count' ? int($limit) + 1 : $limit * $factor;
	my @steps = grep { defined } map { $_->{value} }
	  @{ $panel->{fieldConfig}{defaults}{thresholds}{steps} };
	push @thresholds_differ, "$title: no threshold at $want ($alert), has @steps"
	  unless grep { abs($_ - $want) < 1e-9 } @steps;
}
is_deeply(\@thresholds_differ, [], 'the panels\' thresholds are the alerts\' limits');

# The preview: the data of a few panels over the load, for gnuplot.
my %plotted = (
	'Applied and duplicates per second' => 'rates',
	'Processing latency p50 / p95 / p99' => 'latency',
	'Lag: commit time minus event_time' => 'lag',
	'Dead letters parked per minute' => 'dlq',
	'Dead letters pending' => 'dlq_pending');
my $data = "$work/dashboard-data";
mkdir $data;
for my $panel (@panels)
{
	my $file = $plotted{ $panel->{title} } or next;
	open(my $out, '>', "$data/$file.tsv") or die;
	for my $target (@{ $panel->{targets} })
	{
		my $expr = substitute($target->{expr}, 'idem_metrics');
		my $range = api('query_range', query => $expr, start => sprintf('%.3f', $load_start),
			end => sprintf('%.3f', $load_end), step => 2);
		my $title = $target->{legendFormat} =~ s/ *\{\{.*//r;
		for my $series (@{ $range->{data}{result} })
		{
			print $out "\"$title\"\t\"$title\"\n";
			printf $out "%.1f\t%s\n", $_->[0] - $load_start, $_->[1] for @{ $series->{values} };
			print $out "\n\n";
		}
	}
	close($out);
}
my $plot = system('bash', "$repo/test/prometheus/dashboard-plot", $data, "$repo/docs/dashboard.png");
is($plot >> 8, 0, 'the preview is plotted into docs/dashboard.png');

done_testing();
