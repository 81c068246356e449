#!/usr/bin/perl
# test/prometheus/exporter.t -- docs/prometheus/postgres_exporter-queries.yaml
# under Debian's postgres_exporter: the metric families it exports are those
# of idem_metrics() (names, types, labels, values), agree with idem_stats,
# cover every family the rules use, pass promtool check metrics, and drive
# the rules of docs/prometheus/idem_consumer.rules.yml as expected.
#
# Run by the prometheus suite of test/run-tests, against the scratch
# cluster (PGHOST, PGPORT, PGUSER in the environment; PG_BINDIR its
# binaries; EXPORTER_WORK a directory the server's OS user can read and
# write).  The exporter runs as that user when this runs as root, on a free
# port of 127.0.0.1, bounded by timeout.
use strict;
use warnings;
use Test::More;
use File::Basename qw(dirname);
use File::Copy qw(copy);
use Cwd qw(abs_path);
use IO::Socket::INET;
use POSIX qw(WNOHANG);

my $repo = abs_path(dirname(__FILE__) . '/../..');
my $bindir = $ENV{PG_BINDIR} or die "PG_BINDIR is not set";
my $work = $ENV{EXPORTER_WORK} or die "EXPORTER_WORK is not set";
my $queries = "$repo/docs/prometheus/postgres_exporter-queries.yaml";
my $rules = "$repo/docs/prometheus/idem_consumer.rules.yml";
my $role = 'idem_exporter_test';
my @dbs = ('idem_exporter_shop', 'idem_exporter_billing');
my $exporter = 'prometheus-postgres-exporter';

# psql DB SQL [USER]: the output, unaligned and tuples only; dies on error
sub psql
{
	my ($db, $sql, $user) = @_;
	open(my $fh, '-|', "$bindir/psql", '-X', '-A', '-t', '-q', '-v', 'ON_ERROR_STOP=1',
		'-U', $user // 'postgres', '-d', $db, '-c', $sql)
	  or die "psql: $!";
	local $/;
	my $out = <$fh>;
	close($fh) or die "psql failed on: $sql\n";
	$out //= '';
	chomp $out;
	return $out;
}

# parse TEXT: the idem_* samples of an exposition, as
# { "name{sorted labels without server}" => value } and { family => type },
# and the raw label string of each sample (with server) for promtool.
sub parse_exposition
{
	my ($text) = @_;
	my (%samples, %types, %raw);
	for my $line (split /\n/, $text)
	{
		if ($line =~ /^# TYPE (idem_\w+) (\w+)$/)
		{
			$types{$1} = $2;
			next;
		}
		next unless $line =~ /^(idem_\w+)(?:\{(.*)\})? (\S+)$/;
		my ($name, $labels, $value) = ($1, $2 // '', $3);
		my %l;
		while ($labels =~ /\G(\w+)="((?:[^"\\]|\\.)*)",?/gc)
		{
			$l{$1} = $2;
		}
		die "cannot parse labels of: $line" if $labels ne '' && (pos($labels) // 0) != length($labels);
		my $server = delete $l{server};
		my $key = $name . '{' . join(',', map { "$_=\"$l{$_}\"" } sort keys %l) . '}';
		$samples{$key} = $value;
		$raw{$key} = $line =~ s/ \S+$//r;
	}
	return (\%samples, \%types, \%raw);
}

# the family a sample belongs to
sub family
{
	my ($name) = @_;
	return $name =~ s/_(bucket|sum|count)$//r;
}

# clean up what an earlier, interrupted run left
psql('postgres', "DROP DATABASE IF EXISTS $_") for @dbs;
psql('postgres', "DROP ROLE IF EXISTS $role");

# The exporter's role: a login with pg_monitor, nothing more.
psql('postgres', "CREATE ROLE $role LOGIN IN ROLE pg_monitor");
for my $db (@dbs)
{
	psql('postgres', "CREATE DATABASE $db");
	psql($db, q{
		CREATE EXTENSION idem_consumer;
		CREATE TABLE orders (id int PRIMARY KEY, paid numeric NOT NULL DEFAULT 0);
		INSERT INTO orders SELECT g FROM generate_series(1, 100) AS g;
	});
}
# a switch opens a second generation of keys: the ring's gauges all have a sample
psql($dbs[0], q{SELECT idem_key_generation_switch()});

# round 1: the consumers take their counters; a name to escape
psql($dbs[0], q{
	SELECT idem_apply('r1-' || g, 'payments', 'update orders set paid = paid + $1 where id = $2',
	                  ARRAY['10', g::text], now() - interval '90 seconds')
	  FROM generate_series(1, 3) AS g;
	SELECT idem_apply('r1-1', 'payments', 'update orders set paid = paid + $1 where id = $2',
	                  ARRAY['10', '1'], now() - interval '90 seconds');
	SELECT idem_apply('w1', 'pay"me\nt', 'update orders set paid = paid + 1 where id = 1');
	SELECT idem_apply('w1', 'pay"me\nt', 'update orders set paid = paid + 1 where id = 1');
	SELECT pg_stat_force_next_flush();
});
psql($dbs[1], q{
	SELECT idem_apply('r1-' || g, 'payments', 'update orders set paid = paid + 1 where id = $1',
	                  ARRAY[g::text])
	  FROM generate_series(1, 2) AS g;
	SELECT pg_stat_force_next_flush();
});

# the exporter, on a free port
my $dsn = "host=$ENV{PGHOST} port=$ENV{PGPORT} user=$role dbname=$dbs[0] sslmode=disable";
copy($queries, "$work/queries.yaml") or die "copy: $!";
chmod 0644, "$work/queries.yaml";
my @as_server_user = $> == 0 ? ('runuser', '-u', 'postgres', '--') : ();
my ($pid, $port);
for my $attempt (1 .. 5)
{
	$port = 20000 + int(rand(40000));
	my $probe = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $port,
		Proto => 'tcp', ReuseAddr => 0);
	next unless $probe;
	close($probe);
	$pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		chdir $work;
		open(STDOUT, '>', "$work/exporter.log");
		open(STDERR, '>&', \*STDOUT);
		$ENV{DATA_SOURCE_NAME} = $dsn;
		exec('timeout', '-k', '5', '300', @as_server_user, $exporter,
			"--web.listen-address=127.0.0.1:$port",
			"--extend.query-path=$work/queries.yaml",
			'--disable-default-metrics', '--disable-settings-metrics',
			'--no-collector.database', '--no-collector.bgwriter')
		  or die "exec: $!";
	}
	# up when /metrics answers; gone if the port was taken meanwhile
	for (1 .. 100)
	{
		last if system('curl', '-sf', '-o', '/dev/null', '--max-time', '5',
			"http://127.0.0.1:$port/metrics") == 0;
		last if waitpid($pid, WNOHANG) == $pid;
		select(undef, undef, undef, 0.2);
	}
	last if kill(0, $pid) && waitpid($pid, WNOHANG) == 0;
	undef $pid;
}
END
{
	if ($pid)
	{
		kill 'TERM', $pid;
		waitpid($pid, 0);
	}
	eval { psql('postgres', "DROP DATABASE IF EXISTS $_") for @dbs; psql('postgres', "DROP ROLE IF EXISTS $role"); };
}
ok($pid, "postgres_exporter serves /metrics on 127.0.0.1:$port")
  or BAIL_OUT("the exporter did not start: " . `cat $work/exporter.log`);
my $version = `$exporter --version 2>&1`;
diag((split /\n/, $version)[0]);

# scrape SUFFIX: one scrape of the exporter, saved to a file, and
# idem_metrics() as the same role just after
sub scrape
{
	my ($suffix) = @_;
	my $text = `curl -sf --max-time 30 http://127.0.0.1:$port/metrics`;
	die "curl failed" if $? != 0;
	open(my $fh, '>', "$work/scrape$suffix.prom") or die;
	print $fh $text;
	close($fh);
	my $direct = psql($dbs[0], 'SELECT idem_metrics()', $role);
	return ($text, $direct);
}

my ($scrape1) = scrape(1);

# round 2, a minute of traffic for the rules: shop's payments applies 10
# messages 90 s after their event time, sees 4 redeliveries and
# dead-letters one, whose first failure is put two hours back; billing's
# payments applies 5.
psql($dbs[0], q{
	SELECT idem_apply('r2-' || g, 'payments', 'update orders set paid = paid + $1 where id = $2',
	                  ARRAY['10', g::text], now() - interval '90 seconds')
	  FROM generate_series(1, 10) AS g;
	SELECT idem_apply('r2-' || g, 'payments', 'update orders set paid = paid + $1 where id = $2',
	                  ARRAY['10', g::text], now() - interval '90 seconds')
	  FROM generate_series(1, 4) AS g;
	SELECT idem_try_apply('r2-poison', 'payments', 'update orders set paid = paid / 0 where id = 1');
	UPDATE idem_consumer.dead_letters SET first_failed_at = now() - interval '2 hours';
	SELECT pg_stat_force_next_flush();
});
psql($dbs[1], q{
	SELECT idem_apply('r2-' || g, 'payments', 'update orders set paid = paid + 1 where id = $1',
	                  ARRAY[g::text])
	  FROM generate_series(1, 5) AS g;
	SELECT pg_stat_force_next_flush();
});

my ($scrape2, $direct2) = scrape(2);

# promtool check metrics: the whole scrape, the exporter's own families too
my $lint = `promtool check metrics < $work/scrape2.prom 2>&1`;
is($? >> 8, 0, 'promtool check metrics passes on the scrape') or diag($lint);

my ($exp, $exp_types, $exp_raw) = parse_exposition($scrape2);
my ($dir, $dir_types) = parse_exposition($direct2);

# every sample carries the server label of the exporter
my @no_server = grep { $exp_raw->{$_} !~ /server="/ } keys %$exp;
is_deeply(\@no_server, [], 'every idem_ sample has the server label');

# the same families with the same types
is_deeply($exp_types, $dir_types, 'the same idem_ families and types as idem_metrics()');

# the same samples with the same labels, and the same values
is_deeply([sort keys %$exp], [sort keys %$dir],
	'the same samples (names and labels) as idem_metrics()');
my @differ;
for my $k (sort keys %$dir)
{
	next unless exists $exp->{$k};
	my ($a, $b) = ($exp->{$k}, $dir->{$k});
	# the age of a dead letter or a generation moves on between the two reads
	my $tolerance = $k =~ /^idem_(dlq_oldest_pending|key_generation_current|key_generation_settling)_age_seconds/ ? 10 : 1e-9 * abs($b);
	push @differ, "$k: exporter $a, idem_metrics() $b"
	  unless $a =~ /^[-+0-9.eE]+$/ && abs($a - $b) <= $tolerance;
}
is_deeply(\@differ, [], 'the same values as idem_metrics()');

# both databases (the role has pg_read_all_stats), with a consumer of the
# same name in each kept apart, and the escaped name read back
ok(exists $exp->{qq(idem_applied_total{consumer="payments",database="$dbs[0]"})}
	  && exists $exp->{qq(idem_applied_total{consumer="payments",database="$dbs[1]"})}
	  && exists $exp->{qq(idem_applied_total{consumer="pay\\"me\\\\nt",database="$dbs[0]"})},
	'counters of both databases, payments twice, the escaped consumer name intact');

# every family the rules read exists, with its type and labels
open(my $rfh, '<', $rules) or die;
my %used;
while (<$rfh>)
{
	next if /^\s*#/;
	# metric names, not the SQL objects the annotations name
	$used{$1} = 1 while /\b(idem_[a-z_]+_(?:total|bucket|sum|count|seconds|stored|pending))\b/g;
}
close($rfh);
my @missing;
for my $name (sort keys %used)
{
	my $fam = family($name);
	my $want_type = $name =~ /_bucket$/ ? 'histogram' : $name =~ /_total$/ ? 'counter' : 'gauge';
	my @samples = grep { /^\Q$name\E\{/ } keys %$exp;
	# the families of the whole database: the ring of key generations
	my $want_labels = $name =~ /_bucket$/ ? 'consumer,database,le,server'
	  : $name =~ /^idem_key_generation/ ? 'database,server' : 'consumer,database,server';
	my @bad = grep {
		my %l = map { /^(\w+)=/ ? ($1 => 1) : () } ($exp_raw->{$_} =~ /(\w+="(?:[^"\\]|\\.)*")/g);
		join(',', sort keys %l) ne $want_labels
	} @samples;
	push @missing, "$name: no sample" unless @samples;
	push @missing, "$name: type " . ($exp_types->{$fam} // 'none') . ", not $want_type"
	  unless ($exp_types->{$fam} // '') eq $want_type;
	push @missing, "$name: labels of $bad[0] are not $want_labels" if @bad;
}
ok(keys(%used) >= 7, 'the rules read ' . join(', ', sort keys %used));
is_deeply(\@missing, [], 'each family the rules read is exported with its type and labels');

# the counters are idem_stats' of each database
my @stats_differ;
for my $db (@dbs)
{
	for my $row (split /\n/, psql($db,
		q{SELECT consumer, applied, duplicates, failed, dead_lettered, key_reuse FROM idem_stats}))
	{
		my ($consumer, @v) = split /\|/, $row;
		(my $label = $consumer) =~ s/(["\\])/\\$1/g;
		$label =~ s/\n/\\n/g;
		my @names = qw(idem_applied_total idem_duplicate_detected_total idem_failed_total
		  idem_dlq_enqueue_total idem_key_reuse_total);
		for my $i (0 .. $#names)
		{
			my $k = qq($names[$i]\{consumer="$label",database="$db"\});
			push @stats_differ, "$k: exporter " . ($exp->{$k} // 'none') . ", idem_stats $v[$i]"
			  unless defined $exp->{$k} && $exp->{$k} == $v[$i];
		}
	}
}
is_deeply(\@stats_differ, [], 'counters equal idem_stats in both databases');
is($exp->{qq(idem_dlq_pending{consumer="payments",database="$dbs[0]"})}, 1,
	'one dead letter pending');
cmp_ok($exp->{qq(idem_dlq_oldest_pending_age_seconds{consumer="payments",database="$dbs[0]"})},
	'>=', 7200, 'its age counts from its first failure');
ok(!exists $exp->{qq(idem_dlq_oldest_pending_age_seconds{consumer="payments",database="$dbs[1]"})}
	  && !exists $exp->{qq(idem_consumer_lag_seconds{consumer="payments",database="$dbs[1]"})},
	'no age and no last lag for a consumer without them (no NaN sample)');

# The rules on the scraped series: scrape 1 at minute 0, then the counters
# grow every minute by what round 2 added (the measured minute repeated)
# and the gauges keep scrape 2's values, for 40 minutes.
my ($s1, undef, $raw1) = parse_exposition($scrape1);
open(my $tfh, '>', "$work/exporter.rules.test.yml") or die;
print $tfh "rule_files:\n  - $rules\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n";
for my $k (sort keys %$exp)
{
	my $name = $k =~ s/\{.*//sr;
	my $series = $exp_raw->{$k} =~ s/'/''/gr;
	my $cumulative = ($exp_types->{family($name)} // '') eq 'counter' || $name =~ /_(bucket|sum|count)$/;
	my $values;
	if ($cumulative && defined $s1->{$k})
	{
		my $d = $exp->{$k} - $s1->{$k};
		$values = "$s1->{$k}+${d}x40";
	}
	else
	{
		$values = "$exp->{$k}x40";
	}
	print $tfh "      - series: '$series'\n        values: '$values'\n";
}
my $server = ($exp_raw->{qq(idem_applied_total{consumer="payments",database="$dbs[0]"})} =~ /server="([^"]*)"/)[0];
my $shop = qq(consumer="payments", database="$dbs[0]", server="$server");
my %fires = (
	IdemDeadLettered => 'warning',
	IdemDeadLetterShareHigh => 'critical',
	IdemDeadLetterPendingTooLong => 'warning',
	IdemConsumerLagHigh => 'warning',
	IdemDeadLetterBurst => undef,
	IdemDeadLetterPendingCritical => undef,
	IdemConsumerLagCritical => undef,
	IdemDuplicateRatioSurge => undef,
	IdemEffectUnknownOutcome => undef,
	IdemEffectUnknownOutcomeBurst => undef);
print $tfh "    promql_expr_test:\n";
# 4 duplicates among 10 applied, 4 duplicates and 1 dead letter a minute;
# 1 dead letter among 11 new messages
print $tfh "      - expr: 'idem:duplicate_ratio:rate5m{$shop}'\n        eval_time: 20m\n"
  . "        exp_samples:\n          - labels: 'idem:duplicate_ratio:rate5m{$shop}'\n"
  . "            value: " . sprintf('%.17g', 4 / 15) . "\n";
print $tfh "      - expr: 'idem:dlq_share:rate15m{$shop}'\n        eval_time: 20m\n"
  . "        exp_samples:\n          - labels: 'idem:dlq_share:rate15m{$shop}'\n"
  . "            value: " . sprintf('%.17g', 1 / 11) . "\n";
for my $alert (sort keys %fires)
{
	print $tfh "      - expr: 'ALERTS{alertname=\"$alert\", alertstate=\"firing\"}'\n        eval_time: 25m\n";
	if (defined $fires{$alert})
	{
		print $tfh "        exp_samples:\n          - labels: 'ALERTS{alertname=\"$alert\", "
		  . "alertstate=\"firing\", severity=\"$fires{$alert}\", $shop}'\n            value: 1\n";
	}
	else
	{
		print $tfh "        exp_samples: []\n";
	}
}
close($tfh);
my $rule_test = `cd $work && timeout -k 10 120 promtool test rules exporter.rules.test.yml 2>&1`;
is($? >> 8, 0, 'the rules on the scraped series: '
	  . join(', ', map { "$_ fires" } grep { defined $fires{$_} } sort keys %fires)
	  . ' for shop payments only, the others do not')
  or diag($rule_test);

done_testing();
