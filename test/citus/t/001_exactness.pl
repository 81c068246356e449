# Exactly-once effects on a Citus cluster under faults.
#
# A coordinator and two workers (test/citus/cluster), the business table
# distributed by order id.  For each fault, messages with unique keys are
# delivered by concurrent clients with redeliveries (some of them by two
# clients at once); a client whose chunk of messages fails sends the whole
# chunk again, as a broker redelivers what was not acknowledged.  Mid-load
# comes the fault: (a) a worker stopped immediately and started again,
# (b) the coordinator stopped immediately and started again, each three
# times in the load (at a fifth, near half and at seven tenths of it: a
# commit cut in two is rare), (c) a shard moved to the other worker, then
# the rebalancer run to its end.  Then every message is delivered once
# more.  Each application of a message adds one to its row's counter, so
# that a message applied twice is a row whose counter is above one.
#
# Two consumer shapes receive every fault's messages at once:
#  (i)  idem_apply on the coordinator, its business SQL on the distributed
#       table: the key is recorded on the coordinator, the payment on a
#       worker, and a commit that reaches one and not the other applies the
#       message twice on redelivery.  Reported, not asserted (a TODO).
#  (ii) the key in a user table colocated with the business table (the
#       order id in its unique key), recorded by a function delegated to
#       the shard's worker in the same transaction as the payment: every
#       message applied exactly once, asserted.
# Every message must be applied at least once in both shapes.
use strict;
use warnings;

use File::Basename qw(dirname);
use File::Temp qw(tempdir);
use List::Util qw(shuffle);
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

my $here = dirname(__FILE__);
my $cluster_cmd = "$here/../cluster";
my $bindir =
  $ENV{PG_CONFIG} ? `"$ENV{PG_CONFIG}" --bindir` : '';
chomp $bindir;
my $psql_bin = $bindir ? "$bindir/psql" : 'psql';

# per fault and shape; three times as many for the shard move, so that
# the rebalance after it runs under load too
my $n_messages = $ENV{CITUS_MESSAGES} // 1000;
my $n_orders = 300;
my $n_clients = 4;
my $redelivered = 0.3;       # share of messages delivered twice in the load
my $chunk = 40;              # deliveries per client connection
my $deadline = 240;          # seconds for one phase of deliveries
my $db = $ENV{CITUS_DB} // 'idem_citus';

my $work = tempdir('idem_citus.XXXXXX', TMPDIR => 1, CLEANUP => 1);
chmod 0755, $work;
my $dir = "$work/cluster";
my $port = $ENV{SCRATCH_PORT} // 55432;

sub cluster { system('bash', $cluster_cmd, @_) == 0 or die "cluster @_ failed\n"; }

# a run stopped by its time bound (run-tests' timeout signals the whole
# process group) still stops its nodes, in END
$SIG{TERM} = $SIG{INT} = sub { exit 1; };
cluster('start', $dir, $port);
my $cluster_started_by = $$;
END
{
	# the children (clients) leave the cluster to the parent
	system('bash', $cluster_cmd, 'stop', $dir)
	  if defined $cluster_started_by && $$ == $cluster_started_by;
}

my @psql = ($psql_bin, '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1',
	'-h', $dir, '-p', $port, '-U', 'postgres', '-d', $db);

# query(SQL): run on the coordinator, each statement in a transaction of
# its own; its output, or die
my $n_queries = 0;
sub query
{
	my ($sql) = @_;
	my $file = "$work/query" . $n_queries++ . '.sql';
	open(my $q, '>', $file) or die;
	print $q $sql, "\n";
	close $q;
	local $ENV{PGOPTIONS} = '-c client_min_messages=warning';
	open(my $fh, '-|', @psql, '-f', $file) or die "psql: $!";
	local $/;
	my $out = <$fh> // '';
	close($fh) or die "psql failed ($?) on: $sql\n";
	$out =~ s/\s+\z//;
	return $out;
}

# the business tables, colocated, and shape (ii)'s keys and function
query(<<'SQL');
SET citus.shard_count = 8;
CREATE TABLE payments_i (
    order_id bigint NOT NULL,
    msg_id bigint NOT NULL,
    amount bigint NOT NULL,
    applications int NOT NULL DEFAULT 1,
    PRIMARY KEY (order_id, msg_id));
SELECT create_distributed_table('payments_i', 'order_id');
CREATE TABLE payments_ii (LIKE payments_i INCLUDING ALL);
SELECT create_distributed_table('payments_ii', 'order_id', colocate_with => 'payments_i');
CREATE TABLE keys_ii (
    order_id bigint NOT NULL,
    key text NOT NULL,
    PRIMARY KEY (order_id, key));
SELECT create_distributed_table('keys_ii', 'order_id', colocate_with => 'payments_i');
CREATE FUNCTION pay_ii(p_order_id bigint, p_key text, p_msg_id bigint, p_amount bigint)
RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO public.keys_ii (order_id, key) VALUES (p_order_id, p_key)
        ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO public.payments_ii AS p (order_id, msg_id, amount)
        VALUES (p_order_id, p_msg_id, p_amount)
        ON CONFLICT (order_id, msg_id) DO UPDATE SET applications = p.applications + 1;
    RETURN true;
END
$f$;
SELECT create_distributed_function('pay_ii(bigint,text,bigint,bigint)', 'p_order_id',
    colocate_with => 'payments_ii', force_delegation => true);
SQL
# The coordinator's commits wait before their WAL flush, as on a slow disk
# (commit_delay, microseconds, CITUS_COMMIT_DELAY; it acts only with fsync
# on): the window where a worker has committed a transaction of the
# coordinator and the coordinator not yet is real but short; it is widened,
# not made, so that the stops of the coordinator find shape (i) inside it.
my $commit_delay = $ENV{CITUS_COMMIT_DELAY} // 10000;
query(<<"SQL");
ALTER SYSTEM SET fsync = on;
ALTER SYSTEM SET commit_delay = $commit_delay;
ALTER SYSTEM SET commit_siblings = 0;
SELECT pg_reload_conf();
SQL
is(query(q{SELECT count(DISTINCT colocationid) || ' ' || count(*) FROM pg_dist_partition
             WHERE logicalrelid IN ('payments_i'::regclass, 'payments_ii'::regclass,
                                    'keys_ii'::regclass) AND partmethod = 'h'}),
	'1 3', 'payments_i, payments_ii and keys_ii are distributed by order id and colocated');
is(query(q{SELECT force_delegation AND distribution_argument_index = 0
             AND colocationid = (SELECT colocationid FROM pg_dist_partition
                                 WHERE logicalrelid = 'keys_ii'::regclass)
           FROM pg_dist_object
           WHERE objid = 'public.pay_ii(bigint,text,bigint,bigint)'::regprocedure}),
	't', 'pay_ii is distributed by its order id, colocated with keys_ii, delegation forced');
like(query(q{EXPLAIN (COSTS OFF) SELECT public.pay_ii(1, 'pay:1:0', 0, 1)}),
	qr/Citus Adaptive.*Task Count: 1\n.*Node: host=\S+ port=(?:@{[$port + 1]}|@{[$port + 2]})\b/s,
	'a call of pay_ii on the coordinator runs whole on the worker of its shard');

my $sql_i = 'INSERT INTO public.payments_i AS p (order_id, msg_id, amount) '
  . 'VALUES ($1::bigint, $2::bigint, $3::bigint) '
  . 'ON CONFLICT (order_id, msg_id) DO UPDATE SET applications = p.applications + 1';

sub order_of { my ($m) = @_; return 1 + $m % $n_orders; }
sub amount_of { my ($m) = @_; return 1 + $m % 50; }

# one delivery: [shape, msg]; its statement
sub statement
{
	my ($shape, $m) = @_;
	my ($o, $a) = (order_of($m), amount_of($m));
	return "SELECT public.pay_ii($o, 'pay:$o:$m', $m, $a);" if $shape eq 'ii';
	return "SELECT idem_apply('pay:$o:$m', 'citus_i', \$q\$$sql_i\$q\$, "
	  . "ARRAY['$o', '$m', '$a']);";
}

# deliver(NAME, DELIVERIES, FAULT, AT): the deliveries spread over the
# clients in chunks, FAULT (a code ref, optional) run each time the share
# of the chunks in the list AT is done.  Returns the deliveries sent per
# shape (the statements that reached the coordinator, the one that
# failed included), the number of
# clients that failed, the spans of chunks during the faults, the number
# of chunks and the first error of a fault.
sub deliver
{
	my ($name, $deliveries, $fault, $fault_at) = @_;
	$fault_at //= [];
	my @per_client = map { [] } 1 .. $n_clients;
	my $i = 0;
	push @{ $per_client[ $i++ % $n_clients ] }, $_ for @$deliveries;
	my $progress = "$work/$name.progress";
	open(my $pf, '>', $progress) or die;
	close $pf;
	my $n_chunks = 0;
	my %pids;
	for my $c (0 .. $n_clients - 1)
	{
		my @mine = @{ $per_client[$c] };
		my @chunks;
		push @chunks, [ splice(@mine, 0, $chunk) ] while @mine;
		$n_chunks += @chunks;
		my $log = "$work/$name.$c.log";
		my $parent = $$;
		my $pid = fork() // die "fork: $!";
		if ($pid == 0)
		{
			$SIG{TERM} = $SIG{INT} = 'DEFAULT';
			my %sent = (i => 0, ii => 0);
			my $t0 = time;
			for my $k (0 .. $#chunks)
			{
				my $file = "$work/$name.$c.$k.sql";
				open(my $fh, '>', $file) or die;
				print $fh statement(@$_), "\n" for @{ $chunks[$k] };
				close $fh;
				while (1)
				{
					my $before = -s $log // 0;
					my $ok = system("@psql -o /dev/null -f '$file' 2>>'$log'") == 0;
					# one statement a line: a chunk cut short at line N
					# delivered its first N messages, one that could not
					# connect none
					my $n = @{ $chunks[$k] };
					if (!$ok)
					{
						open(my $e, '<', $log) or die;
						seek($e, $before, 0);
						my $err = do { local $/; <$e> } // '';
						close $e;
						$n = $err =~ /^psql:[^\n]*?\.sql:(\d+): /m ? $1 : 0;
					}
					$sent{ $_->[0] }++ for @{ $chunks[$k] }[ 0 .. $n - 1 ];
					last if $ok;
					# the parent gone, or the cluster not back in time
					POSIX::_exit(3) if time - $t0 > $deadline || getppid() != $parent;
					sleep 0.2;
				}
				open(my $p, '>>', $progress) or die;
				print $p "$c $k\n";
				close $p;
			}
			open(my $r, '>', "$work/$name.$c.sent") or die;
			print $r "$sent{i} $sent{ii}\n";
			close $r;
			POSIX::_exit(0);
		}
		$pids{$pid} = $c;
	}
	# each fault once its share of the chunks is done; the chunks done
	# when each began and ended, as "began-ended"
	my (@spans, $fault_error);
	my $chunks_done = sub {
		open(my $p, '<', $progress) or die;
		my @lines = <$p>;
		return scalar @lines;
	};
	for my $at (@$fault_at)
	{
		my $t0 = time;
		sleep 0.05 while $chunks_done->() < $at * $n_chunks && time - $t0 < $deadline;
		my $began = $chunks_done->();
		eval { $fault->(); 1 } or $fault_error //= $@;
		push @spans, "$began-" . $chunks_done->();
	}
	diag("$name: faults in chunks @spans of $n_chunks") if @spans;
	my $failed = 0;
	for my $pid (keys %pids)
	{
		waitpid($pid, 0);
		next if $? == 0;
		$failed++;
		my $c = $pids{$pid};
		diag("client $c of $name failed; last lines of its errors:\n"
			  . `tail -n 5 '$work/$name.$c.log'`);
	}
	my %sent = (i => 0, ii => 0);
	for my $c (0 .. $n_clients - 1)
	{
		open(my $r, '<', "$work/$name.$c.sent") or next;
		my ($si, $sii) = split ' ', scalar <$r>;
		$sent{i} += $si;
		$sent{ii} += $sii;
	}
	return (\%sent, $failed, \@spans, $n_chunks, $fault_error);
}

sub worker_port { my ($w) = @_; return $port + $w; }

# each fault: what it is, when in the load (shares of its chunks), what
# it does, and how many times n_messages it takes (1 by default)
my @faults = (
	[
		'worker stopped (immediate) and restarted',
		[ 0.2, 0.45, 0.7 ],
		sub {
			cluster('node-stop', $dir, 'worker1', 'immediate');
			sleep 1;
			cluster('node-start', $dir, 'worker1');
		}
	],
	[
		'coordinator stopped (immediate) and restarted',
		[ 0.2, 0.45, 0.7 ],
		sub {
			cluster('node-stop', $dir, 'coordinator', 'immediate');
			sleep 1;
			cluster('node-start', $dir, 'coordinator');
		}
	],
	[
		'shard moved, then rebalanced',
		[0.2],
		sub {
			my ($shard, $from) = split /\|/, query(
				q{SELECT shardid, nodeport FROM pg_dist_shard_placement
				  WHERE shardid IN (SELECT shardid FROM pg_dist_shard
				                    WHERE logicalrelid = 'payments_i'::regclass)
				  ORDER BY shardid LIMIT 1});
			my $to = $from == worker_port(1) ? worker_port(2) : worker_port(1);
			query("SELECT citus_move_shard_placement($shard, '$dir', $from, '$dir', $to)");
			query('SELECT citus_rebalance_start()');
			query('SELECT citus_rebalance_wait()');
		},
		3
	]);

my @report;
for my $f (0 .. $#faults)
{
	my ($what, $at, $fault, $times) = @{ $faults[$f] };
	my $n = $n_messages * ($times // 1);
	my @msgs = map { $f * 1_000_000 + $_ } 1 .. $n;
	my @load;
	for my $shape ('i', 'ii')
	{
		push @load, map { [ $shape, $_ ] } @msgs;
		push @load, map { [ $shape, $_ ] } grep { rand() < $redelivered } @msgs;
	}
	@load = shuffle(@load);
	my $t0 = time;
	my ($sent, $failed, $spans, $n_chunks, $error) = deliver("load$f", \@load, $fault, $at);
	is($error, undef, "fault $what: done");
	is($failed, 0, "fault $what: every client delivered its messages, redelivering failed chunks");
	ok(@$spans == @$at && !grep({ !/^(\d+)-/ || $1 == 0 || $1 >= $n_chunks } @$spans),
		"fault $what: came mid-load (chunks @$spans of $n_chunks)");
	# then every message once more
	my @again = shuffle(map { my $m = $_; map { [ $_, $m ] } 'i', 'ii' } @msgs);
	my ($sent2, $failed2) = deliver("again$f", \@again);
	is($failed2, 0, "fault $what: every message redelivered afterwards");
	my $secs = time - $t0;

	my $range = "msg_id BETWEEN $msgs[0] AND $msgs[-1]";
	for my $shape ('i', 'ii')
	{
		my ($rows, $twice, $extra) = split /\|/, query(
			"SELECT count(*), count(*) FILTER (WHERE applications > 1), "
			  . "coalesce(sum(applications - 1), 0) FROM payments_$shape WHERE $range");
		my $deliveries = $sent->{$shape} + $sent2->{$shape};
		push @report,
		  sprintf("%-46s shape (%s): %d messages, %d deliveries, %d applied twice",
			$what, $shape, $n, $deliveries, $twice);
		is($rows, $n, "fault $what, shape ($shape): every message applied");
		if ($shape eq 'ii')
		{
			is($twice, 0, "fault $what, shape (ii): no message applied twice");
			is(query("SELECT count(*) FROM keys_ii WHERE key LIKE 'pay:%' AND "
					  . "split_part(key, ':', 3)::bigint BETWEEN $msgs[0] AND $msgs[-1]"),
				$n, "fault $what, shape (ii): one key per message");
		}
		else
		{
		  TODO:
			{
				local $TODO =
				  'idem_apply on the coordinator keeps its keys apart from the distributed rows';
				is($twice, 0, "fault $what, shape (i): no message applied twice");
			}
		}
	}
	diag(sprintf('fault %s: %.1f s', $what, $secs));
}

# the shard placements are where the rebalancer left them, all healthy
is(query('SELECT count(DISTINCT nodeport) FROM pg_dist_shard_placement'),
	'2', 'the shards are on both workers after the rebalance');

diag($_) for @report;
done_testing();
