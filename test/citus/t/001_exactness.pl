# Exactly-once effects on a Citus cluster under faults, with routed keys
# (src/routed.c).
#
# A coordinator and two workers (test/citus/cluster), the business table
# distributed by order id, and idem_consumer's keys distributed with it by
# idem_citus_distribute().  For each fault, messages with unique keys are
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
# Two consumer shapes receive every fault's messages at once, and both
# must apply every message exactly once:
#  (i)  idem_apply with a route on the coordinator, its business SQL on the
#       distributed table: Citus sends the key and the payment to the
#       worker of the order's shard, in one transaction there;
#  (ii) idem_try_apply with a route in a function delegated to the shard's
#       worker (create_distributed_function, force_delegation): the key and
#       the payment are local writes of one transaction.  One message in 50
#       fails permanently (its amount breaks a constraint of the table) and
#       is parked in the routed dead letters, beside its key: it must be
#       parked exactly once and not applied, through the faults and the
#       shard moves, until the constraint goes and one statement on the
#       coordinator replays every entry, which applies each once.
# Without routed keys, shape (i) applied messages twice after the
# coordinator's and a worker's immediate stops: its keys stayed on the
# coordinator while the payments committed on a worker.
use strict;
use warnings;

use File::Basename qw(dirname);
use FindBin;
use List::Util qw(shuffle);
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

use lib "$FindBin::Bin/..";
use CitusCluster;

my $here = dirname(__FILE__);

# per fault and shape; three times as many for the shard move, so that
# the rebalance after it runs under load too
my $n_messages = $ENV{CITUS_MESSAGES} // 1000;
my $n_orders = 300;
my $n_clients = 4;
my $redelivered = 0.3;       # share of messages delivered twice in the load
my $chunk = 40;              # deliveries per client connection
my $deadline = 240;          # seconds for one phase of deliveries

start('idem_citus.XXXXXX');

# the README's block on Citus, as a reader pastes it after making orders
# (8 shards, as the tables below, so that they are colocated with it)
my $readme_block = do {
	open(my $rf, '<', "$here/../../../README.md") or die "README.md: $!";
	my ($heading, $in, $text) = ('', 0, undef);
	while (my $l = <$rf>)
	{
		if (!$in && $l =~ /^#+\s+(.*?)\s*$/) { $heading = $1; }
		elsif (!$in && $l =~ /^```sql\s*$/ && $heading eq 'Scale-out on Citus') { $in = 1; $text = ''; }
		elsif ($in && $l =~ /^```\s*$/) { last; }
		elsif ($in) { $text .= $l; }
	}
	close $rf;
	$text;
};
ok(defined $readme_block, 'README.md has a block on Citus');
query("SET citus.shard_count = 8;
       CREATE TABLE orders (order_id bigint PRIMARY KEY, paid boolean NOT NULL DEFAULT false);
       INSERT INTO orders SELECT g FROM generate_series(1, 100) AS g;
       $readme_block");
is(query(q{SELECT paid FROM orders WHERE order_id = 42}), 't', "the README's block applied its message");
is(query(q{SELECT idem_apply('order-paid:e-7', 'payments',
       'UPDATE orders SET paid = true WHERE order_id = $1::bigint', ARRAY['42'], route => 42::bigint)}),
	'f', "the README's message delivered again is a duplicate");

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
ALTER TABLE payments_ii ADD CONSTRAINT parked_amount CHECK (amount <> 13);
SELECT idem_citus_distribute('payments_i');
CREATE FUNCTION pay_ii(p_order_id bigint, p_key text, p_msg_id bigint, p_amount bigint)
RETURNS idem_outcome LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.idem_try_apply(p_key, 'citus_ii',
        'INSERT INTO public.payments_ii AS p (order_id, msg_id, amount) '
        'VALUES ($1::bigint, $2::bigint, $3::bigint) '
        'ON CONFLICT (order_id, msg_id) DO UPDATE SET applications = p.applications + 1',
        ARRAY[p_order_id::text, p_msg_id::text, p_amount::text], route => p_order_id);
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
                                    'idem_consumer.routed_keys'::regclass) AND partmethod = 'h'}),
	'1 3', 'payments_i, payments_ii and the routed keys are distributed by order id and colocated');
is(query(q{SELECT force_delegation AND distribution_argument_index = 0
             AND colocationid = (SELECT colocationid FROM pg_dist_partition
                                 WHERE logicalrelid = 'idem_consumer.routed_keys'::regclass)
           FROM pg_dist_object
           WHERE objid = 'public.pay_ii(bigint,text,bigint,bigint)'::regprocedure}),
	't', 'pay_ii is distributed by its order id, colocated with the routed keys, delegation forced');
like(query(q{EXPLAIN (COSTS OFF) SELECT public.pay_ii(1, 'pay:1:0', 0, 1)}),
	qr/Citus Adaptive.*Task Count: 1\n.*Node: host=\S+ port=(?:@{[$port + 1]}|@{[$port + 2]})\b/s,
	'a call of pay_ii on the coordinator runs whole on the worker of its shard');

# once keys are routed, a call without a route is refused on every node,
# before it records anything
query(<<'SQL');
CREATE FUNCTION public.sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$f$;
SQL
is(query(q{SELECT string_agg(result, ' ' ORDER BY nodeid) FROM run_command_on_all_nodes(
             $c$SELECT public.sqlstate_of('SELECT idem_apply(''k'', ''citus_i'', ''SELECT 1'')')
                || ',' || public.sqlstate_of('SELECT idem_is_processed(''k'', ''citus_i'')')
                || ',' || public.sqlstate_of('SELECT idem_forget(''k'', ''citus_i'')')$c$)}),
	'0A000,0A000,0A000 0A000,0A000,0A000 0A000,0A000,0A000',
	'idem_apply, idem_is_processed and idem_forget without a route: 0A000 on the coordinator and both workers');
is(query(q{SELECT public.sqlstate_of($$SELECT idem_apply('k', 'citus_i', 'SELECT 1', NULL, route => 'x'::text)$$)
              || ',' || public.sqlstate_of($$SELECT idem_apply('k', 'citus_i', 'SELECT 1', NULL, route => NULL::bigint)$$)
              || ',' || public.sqlstate_of($$SELECT idem_citus_distribute('pg_class')$$)}),
	'42804,0A000,22023',
	'a route of another type, no route (NULL), and distributing by a table Citus does not distribute are refused');
query(q{CREATE TABLE other_colocation (id bigint PRIMARY KEY);
        SELECT create_distributed_table('other_colocation', 'id', colocate_with => 'none');});
is(query(q{SELECT public.sqlstate_of($$SELECT idem_citus_distribute('other_colocation')$$)
              || ',' || idem_citus_distribute('payments_ii')::text}),
	'55000,idem_consumer.routed_keys',
	'the keys stay colocated with the tables they were distributed with; calling again for those keeps them');
is(query(q{SELECT count(*) FROM idem_consumer.routed_keys WHERE key = 'k'}), '0',
	'nothing was recorded by the refused calls');
# a key lands in the shard of its route, with the payment
query(q{SELECT idem_apply('probe:1', 'citus_probe', 'SELECT 1', NULL, route => 42::bigint)});
is(query(q{SELECT (SELECT get_shard_id_for_distribution_column('idem_consumer.routed_keys', 42)
                   IN (SELECT shardid FROM pg_dist_shard_placement WHERE nodeport = p.nodeport
                         AND shardid IN (SELECT shardid FROM pg_dist_shard
                                          WHERE logicalrelid = 'idem_consumer.routed_keys'::regclass)))
             FROM pg_dist_shard_placement AS p
            WHERE p.shardid = get_shard_id_for_distribution_column('payments_i', 42)}),
	't', 'the key of route 42 is on the node of the payments of order 42');
is(query(q{SELECT idem_is_processed('probe:1', 'citus_probe', 42::bigint)::text || ','
              || idem_is_processed('probe:1', 'citus_probe', 43::bigint)::text || ','
              || idem_forget('probe:1', 'citus_probe', 42::bigint)::text || ','
              || idem_is_processed('probe:1', 'citus_probe', 42::bigint)::text}),
	'true,false,true,false', 'a routed key is found by its route only, and forgotten');
# a row demand under a route: the UPDATE's rows counted on the shard
is(query(q{SELECT idem_apply('rows:42', 'citus_rows',
               'UPDATE orders SET paid = paid WHERE order_id = $1::bigint', ARRAY['42'],
               route => 42::bigint, expect_rows => 1)})
	  . ',' . query(q{SELECT public.sqlstate_of($s$SELECT idem_apply('rows:1000', 'citus_rows',
               'UPDATE orders SET paid = paid WHERE order_id = $1::bigint', ARRAY['1000'],
               route => 1000::bigint, expect_rows => 1)$s$)})
	  . ',' . query(q{SELECT idem_is_processed('rows:1000', 'citus_rows', 1000::bigint)}),
	't,IK002,f', 'expect_rows with a route: one row on the shard applied; a missing row raises IK002 and records nothing');

# a role other than the owner of the key store: refused with a clear error
# on the coordinator, where Citus would refuse its transaction (the key
# written as the owner, the payment as the role), served by a function
# delegated to the shard's worker
query(<<'SQL');
CREATE ROLE team_pay LOGIN;
GRANT SELECT, UPDATE ON orders TO team_pay;
SELECT run_command_on_all_nodes($c$GRANT EXECUTE ON FUNCTION
    idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO team_pay$c$);
SELECT run_command_on_all_nodes($c$SELECT idem_consumer_create('citus_team', 'team_pay')$c$);
CREATE FUNCTION team_pay(p_order bigint, p_key text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.idem_apply(p_key, 'citus_team',
        'UPDATE public.orders SET paid = true WHERE order_id = $1::bigint',
        ARRAY[p_order::text], route => p_order);
END
$f$;
SELECT create_distributed_function('team_pay(bigint,text)', 'p_order',
    colocate_with => 'orders', force_delegation => true);
SQL
is(query(q{SET ROLE team_pay;
           SELECT public.sqlstate_of($s$SELECT idem_apply('team:5', 'citus_team',
               'UPDATE public.orders SET paid = true WHERE order_id = $1::bigint', ARRAY['5'], route => 5::bigint)$s$)}),
	'0A000', 'a role other than the owner of the key store: idem_apply with a route on the coordinator refused');
is(query(q{SELECT paid FROM orders WHERE order_id = 5}), 'f', 'and nothing applied');
is(query(q{SET ROLE team_pay; SELECT team_pay(5, 'team:5')}) . ','
	  . query(q{SET ROLE team_pay; SELECT team_pay(5, 'team:5')}),
	't,f', 'the same role through the delegated function: applied once, then a duplicate');
is(query(q{SELECT paid FROM orders WHERE order_id = 5}) . ','
	  . query(q{SELECT count(*) FROM idem_consumer.routed_keys WHERE consumer = 'citus_team'}),
	't,1', 'its payment and its key are recorded');

# retention: the coordinator purges the expired routed keys from their
# shards; the workers leave them to it
query(q{SELECT idem_apply('probe:2', 'citus_probe', 'SELECT 1', NULL, route => 42::bigint),
               idem_apply('probe:3', 'citus_probe', 'SELECT 1', NULL, route => 43::bigint)});
query(q{UPDATE idem_consumer.routed_keys SET processed_at = processed_at - 30 * 86400
         WHERE consumer = 'citus_probe' AND key = 'probe:2'});
is(query(q{SELECT string_agg(result, ' ' ORDER BY nodeport) FROM run_command_on_workers('SELECT idem_purge()')}),
	'0 0', 'the workers leave the routed keys to the purge of the coordinator');
is(query(q{SELECT idem_purge('citus_probe')}), '1',
	'the coordinator purges the routed key older than the window from its shard');
is(query(q{SELECT string_agg(key, ',') FROM idem_consumer.routed_keys WHERE consumer = 'citus_probe'}),
	'probe:3', 'the newer routed key stays');

my $sql_i = 'INSERT INTO public.payments_i AS p (order_id, msg_id, amount) '
  . 'VALUES ($1::bigint, $2::bigint, $3::bigint) '
  . 'ON CONFLICT (order_id, msg_id) DO UPDATE SET applications = p.applications + 1';

sub order_of { my ($m) = @_; return 1 + $m % $n_orders; }
sub amount_of { my ($m) = @_; return 1 + $m % 50; }
# the messages shape (ii) parks until the constraint goes
sub parked { my ($m) = @_; return amount_of($m) == 13; }

# one delivery: [shape, msg]; its statement
sub statement
{
	my ($shape, $m) = @_;
	my ($o, $a) = (order_of($m), amount_of($m));
	return "SELECT public.pay_ii($o, 'pay:$o:$m', $m, $a);" if $shape eq 'ii';
	return "SELECT idem_apply('pay:$o:$m', 'citus_i', \$q\$$sql_i\$q\$, "
	  . "ARRAY['$o', '$m', '$a'], route => ${o}::bigint);";
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
	my $n_parked = grep { parked($_) } @msgs;
	for my $shape ('i', 'ii')
	{
		my ($rows, $twice, $extra) = split /\|/, query(
			"SELECT count(*), count(*) FILTER (WHERE applications > 1), "
			  . "coalesce(sum(applications - 1), 0) FROM payments_$shape WHERE $range");
		my $deliveries = $sent->{$shape} + $sent2->{$shape};
		my $expected = $shape eq 'ii' ? $n - $n_parked : $n;
		push @report,
		  sprintf("%-46s shape (%s): %d messages, %d deliveries, %d applied twice%s",
			$what, $shape, $n, $deliveries, $twice,
			$shape eq 'ii' ? ", $n_parked parked" : '');
		is($rows, $expected,
			"fault $what, shape ($shape): every message applied"
			  . ($shape eq 'ii' ? ' but the parked ones' : ''));
		is($twice, 0, "fault $what, shape ($shape): no message applied twice");
		is(query("SELECT count(*) FROM idem_consumer.routed_keys WHERE consumer = 'citus_$shape' "
				  . "AND split_part(key, ':', 3)::bigint BETWEEN $msgs[0] AND $msgs[-1]"),
			$n, "fault $what, shape ($shape): one routed key per message");
	}
	is(query("SELECT count(*) || ' ' || count(*) FILTER (WHERE status = 'pending' AND sqlstate = '23514') "
			  . "|| ' ' || count(*) FILTER (WHERE split_part(key, ':', 3)::bigint % 50 = 12) "
			  . "FROM idem_routed_dead_letters WHERE consumer = 'citus_ii' "
			  . "AND split_part(key, ':', 3)::bigint BETWEEN $msgs[0] AND $msgs[-1]"),
		"$n_parked $n_parked $n_parked",
		"fault $what, shape (ii): each failing message parked once, pending, and no other");
	diag(sprintf('fault %s: %.1f s', $what, $secs));
}

# the shard placements are where the rebalancer left them, all healthy
is(query('SELECT count(DISTINCT nodeport) FROM pg_dist_shard_placement'),
	'2', 'the shards are on both workers after the rebalance');

# the cause fixed, one statement on the coordinator replays every parked
# message of shape (ii), on both workers, where their entries moved with
# their keys; each is applied once, and a redelivery is a duplicate
my @all_parked = grep { parked($_) }
  map { my $f = $_; map { $f * 1_000_000 + $_ } 1 .. $n_messages * ($faults[$f][3] // 1) } 0 .. $#faults;
is(query(q{SELECT count(DISTINCT p.nodeport) FROM idem_routed_dead_letters AS d
             JOIN pg_dist_shard_placement AS p
               ON p.shardid = get_shard_id_for_distribution_column('idem_consumer.routed_dead_letters', d.route)
            WHERE d.consumer = 'citus_ii'}),
	'2', "idem_routed_dead_letters on the coordinator shows the entries of both workers");
query('ALTER TABLE payments_ii DROP CONSTRAINT parked_amount');
is(query(q{WITH pending AS MATERIALIZED (
               SELECT key, consumer, route FROM idem_routed_dead_letters
                WHERE consumer = 'citus_ii' AND status = 'pending')
           SELECT string_agg(outcome || ' ' || n, ',') FROM (
               SELECT idem_dlq_replay(key, consumer, route) AS outcome, count(*) AS n
                 FROM pending GROUP BY 1) AS r}),
	'applied ' . scalar(@all_parked), 'every parked message replayed in one statement: applied');
my @parked_again = shuffle(map { [ 'ii', $_ ] } @all_parked);
my (undef, $failed_again) = deliver('parked_again', \@parked_again);
is($failed_again, 0, 'the replayed messages delivered again');
is(query(q{SELECT count(*) || ' ' || count(*) FILTER (WHERE applications = 1)
             FROM payments_ii WHERE amount = 13}),
	scalar(@all_parked) . ' ' . scalar(@all_parked),
	'each replayed message applied exactly once, redelivered after its replay');
is(query(q{SELECT count(*) FILTER (WHERE status = 'replayed') || ' ' || count(*)
             FROM idem_routed_dead_letters WHERE consumer = 'citus_ii'}),
	scalar(@all_parked) . ' ' . scalar(@all_parked), 'and each entry is replayed');

# the counters of every node, summed: calls delegated to both workers and
# one on the coordinator, each message delivered twice
query(<<'SQL');
CREATE FUNCTION count_me(p_order bigint, p_key text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.idem_apply(p_key, 'citus_stats', 'SELECT 1', NULL, route => p_order);
END
$f$;
SELECT create_distributed_function('count_me(bigint,text)', 'p_order',
    colocate_with => 'payments_i', force_delegation => true);
SQL
query("SELECT count_me($_, 'stats:$_')") for (1 .. 20, 1 .. 20);
query(q{SELECT idem_apply('stats:21', 'citus_stats', 'SELECT 1', NULL, route => 21::bigint)});
query(q{SELECT idem_apply('stats:21', 'citus_stats', 'SELECT 1', NULL, route => 21::bigint)});
is(query(q{SELECT applied || ' ' || duplicates || ' ' || (nodes = 3)
             FROM idem_citus_stats() WHERE consumer = 'citus_stats'}),
	'21 21 true', 'idem_citus_stats sums the counters of the coordinator and both workers');
# and dead letters: parked by delegated calls and on the coordinator
query(<<'SQL');
CREATE FUNCTION park_me(p_order bigint, p_key text) RETURNS idem_outcome LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.idem_try_apply(p_key, 'citus_parked', 'SELECT 1 / 0', NULL, route => p_order);
END
$f$;
SELECT create_distributed_function('park_me(bigint,text)', 'p_order',
    colocate_with => 'payments_i', force_delegation => true);
SQL
query("SELECT park_me($_, 'parked:$_')") for (1 .. 20, 1 .. 20);
query(q{SELECT idem_try_apply('parked:21', 'citus_parked', 'SELECT 1 / 0', NULL, route => 21::bigint)}) for 1 .. 2;
is(query(q{SELECT dead_lettered || ' ' || duplicates || ' ' || (nodes = 3)
             FROM idem_citus_stats() WHERE consumer = 'citus_parked'}),
	'21 21 true', 'idem_citus_stats sums the dead letters of the coordinator and both workers');
is(query(q{SELECT count(*) FILTER (WHERE status = 'pending' AND sqlstate = '22012')
             FROM idem_routed_dead_letters WHERE consumer = 'citus_parked'}),
	'21', 'idem_routed_dead_letters lists each parked message once');
is(query(q{SELECT dead_letters_pending FROM idem_citus_stats() WHERE consumer = 'citus_parked'}),
	'21', 'idem_citus_stats counts the pending routed entries of every shard');

# a tenant's parked message: its replay runs as the tenant, so on the
# coordinator it is refused like the tenant's idem_apply with a route, and a
# function delegated to the worker replays it.  It fails for want of a
# grant, which is then given.
query(<<'SQL');
CREATE TABLE team_ledger (order_id bigint NOT NULL);
SELECT create_distributed_table('team_ledger', 'order_id', colocate_with => 'orders');
SELECT run_command_on_all_nodes($c$GRANT EXECUTE ON FUNCTION
    idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
    idem_dlq_replay(text, text, "any") TO team_pay$c$);
CREATE FUNCTION team_park(p_order bigint, p_key text, p_sql text) RETURNS idem_outcome LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.idem_try_apply(p_key, 'citus_team', p_sql, ARRAY[p_order::text], route => p_order);
END
$f$;
SELECT create_distributed_function('team_park(bigint,text,text)', 'p_order',
    colocate_with => 'orders', force_delegation => true);
CREATE FUNCTION team_replay(p_order bigint, p_key text) RETURNS idem_outcome LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.idem_dlq_replay(p_key, 'citus_team', p_order);
END
$f$;
SELECT create_distributed_function('team_replay(bigint,text)', 'p_order',
    colocate_with => 'orders', force_delegation => true);
SQL
is(query(q{SET ROLE team_pay;
           SELECT team_park(6, 'team:6', 'INSERT INTO public.team_ledger VALUES ($1::bigint)')}),
	'dead_lettered', "a tenant's message that fails for want of a grant parked through its delegated function");
is(query(q{SELECT sqlstate || ' ' || dead_lettered_by FROM idem_routed_dead_letters WHERE key = 'team:6'}),
	'42501 team_pay', 'its entry names the tenant');
query('GRANT INSERT ON team_ledger TO team_pay');
is(query(q{SELECT public.sqlstate_of($$SELECT idem_dlq_replay('team:6', 'citus_team', 6::bigint)$$)}),
	'0A000', "its replay on the coordinator refused: it would write the tenant's rows and the entry as two roles");
is(query(q{SET ROLE team_pay; SELECT team_replay(6, 'team:6')}) . ','
	  . query(q{SET ROLE team_pay; SELECT public.sqlstate_of($$SELECT team_replay(6, 'team:6')$$)}) . ','
	  . query(q{SELECT count(*) FROM team_ledger WHERE order_id = 6}),
	'applied,55000,1', 'the tenant replays it through a delegated function, as itself, once');

# batches on the coordinator: 4 clients each apply 25 batches of 30
# messages drawn from 200 over 40 orders, each batch in its own order, in
# one statement per batch (the business rows joined with the new keys and
# their routes).  Their keys overlap across shards and workers all the
# time; recorded in one order over the whole cluster, no two batches wait
# for each other in a circle (a deadlock would fail its client, 40P01),
# and each message is applied once.
query(<<'SQL');
SET citus.shard_count = 8;
CREATE TABLE payments_b (LIKE payments_i INCLUDING ALL);
SELECT create_distributed_table('payments_b', 'order_id', colocate_with => 'payments_i');
SQL
my $n_batch_msgs = 200;
my %batch_delivered;
my @batch_pids;
for my $c (0 .. $n_clients - 1)
{
	my $file = "$work/batches.$c.sql";
	open(my $fh, '>', $file) or die;
	for my $b (1 .. 25)
	{
		my @msgs = map { 1 + int(rand($n_batch_msgs)) } 1 .. 30;
		$batch_delivered{$_} = 1 for @msgs;
		my $keys = join(',', map { "'batch:" . (1 + $_ % 40) . ":$_'" } @msgs);
		my $routes = join(',', map { 1 + $_ % 40 } @msgs);
		print $fh "INSERT INTO public.payments_b AS p (order_id, msg_id, amount) "
		  . "SELECT k.route::bigint, split_part(k.key, ':', 3)::bigint, 1 "
		  . "FROM idem_record_batch('citus_batch', ARRAY[$keys], NULL, ARRAY[$routes]::bigint[]) AS k "
		  . "ON CONFLICT (order_id, msg_id) DO UPDATE SET applications = p.applications + 1;\n";
	}
	close $fh;
	my $pid = fork() // die "fork: $!";
	if ($pid == 0)
	{
		$SIG{TERM} = $SIG{INT} = 'DEFAULT';
		my $ok = system("@psql -o /dev/null -f '$file' 2>'$work/batches.$c.log'") == 0;
		POSIX::_exit($ok ? 0 : 1);
	}
	push @batch_pids, $pid;
}
my $batch_failed = 0;
for my $pid (@batch_pids)
{
	waitpid($pid, 0);
	$batch_failed++ if $? != 0;
}
diag("a batch client failed:\n" . `cat '$work'/batches.*.log`) if $batch_failed;
is($batch_failed, 0, 'overlapping batches on the coordinator: every client applied its batches, no deadlock');
is(query(q{SELECT count(*) || ' ' || count(*) FILTER (WHERE applications = 1) FROM payments_b}),
	scalar(keys %batch_delivered) . ' ' . scalar(keys %batch_delivered),
	'each message of the batches applied exactly once');
is(query(q{SELECT count(*) FROM idem_consumer.routed_keys WHERE consumer = 'citus_batch'}),
	scalar(keys %batch_delivered), 'one routed key per message of the batches');

# a table of idem_consumer made a Citus table by hand is refused on every
# node, before anything is written: the fast paths would write its shell
query(q{SELECT create_reference_table('idem_consumer.key_collisions_16')});
is(query(q{SELECT string_agg(result, ' ' ORDER BY nodeid) FROM run_command_on_all_nodes(
             $c$SELECT public.sqlstate_of('SELECT idem_apply(''refused'', ''citus_i'', ''SELECT 1'', NULL, route => 1::bigint)')$c$)}),
	'55000 55000 55000',
	'a storage table distributed by hand: every call refused on the coordinator and both workers');
is(query(q{SELECT count(*) FROM idem_consumer.routed_keys WHERE key = 'refused'}), '0',
	'and nothing recorded');

diag($_) for @report;
done_testing();
