# External effects on a Citus cluster, with routed effects
# (src/effects_store.c, src/effects_api.c).
#
# A coordinator and two workers (test/citus/cluster), a business table of
# orders distributed by order id, and idem_consumer's tables distributed
# with it by idem_citus_distribute(), routed_effects among them.
#
# For each fault, effects are enqueued into the outbox in one business
# transaction on the coordinator, across all shards, and three dispatchers
# drain it with idem_effect_claim of every route.  A dispatcher
# records each call it makes in a table of the coordinator (the provider:
# committed at once, as an external call is), then completes the effect
# with business SQL that counts its application on the effect's order.
# Mid-drain comes the fault: none, a worker stopped immediately and
# started again, the coordinator stopped immediately and started again,
# or a shard moved to the other worker.  Leases are short, so the effects
# whose dispatcher was cut off are leased again once they expire.
#
# What must hold, for every fault:
#  - every effect completed, and its business SQL applied exactly once
#    (the completion and the business rows commit in one transaction of
#    the shard's node: a completion under a superseded fence raises IE001
#    and rolls back);
#  - the provider called for every effect, again only by a lease that
#    says outcome_unknown (an earlier lease expired in flight), each call
#    under a fence of its own;
#  - without a fault, each effect leased exactly once: the claim of every
#    route locks each effect on its shard and checks again that it is due
#    (without that check, the same load leases effects twice).
# Then the inline cycle by a tenant role, a dead effect in the routed
# dead letters and its replay, and the refusals.
use strict;
use warnings;

use FindBin;
use POSIX ();
use Test::More;
use Time::HiRes qw(sleep time);

use lib "$FindBin::Bin/..";
use CitusCluster;

my $n_effects = $ENV{CITUS_EFFECTS} // 150;    # per fault
my $n_orders = 60;
my $n_dispatchers = 3;
my $deadline = 180;    # seconds for one fault's drain

start('idem_citus_fx.XXXXXX');

# query_retry(SQL): query, retried while a node restarts
sub query_retry
{
	my ($sql) = @_;
	for my $try (1 .. 60)
	{
		my $out = eval { query($sql) };
		return $out if defined $out;
		sleep 0.5;
	}
	die "query kept failing: $sql\n";
}

query(<<'SQL');
SET citus.shard_count = 8;
CREATE TABLE orders (order_id bigint PRIMARY KEY);
SELECT create_distributed_table('orders', 'order_id');
CREATE TABLE effect_pays (
    order_id bigint NOT NULL,
    key text NOT NULL,
    applications int NOT NULL DEFAULT 1,
    PRIMARY KEY (order_id, key));
SELECT create_distributed_table('effect_pays', 'order_id', colocate_with => 'orders');
SELECT idem_citus_distribute('orders');
-- the provider: a plain table of the coordinator, written in a transaction
-- of its own, as an external call is made
CREATE TABLE provider_calls (
    consumer text NOT NULL,
    key text NOT NULL,
    fence bigint NOT NULL,
    provider_key text NOT NULL,
    outcome_unknown boolean NOT NULL);
CREATE FUNCTION public.sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $f$
BEGIN
    EXECUTE sql;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$f$;
SQL
is(query(q{SELECT count(DISTINCT colocationid) || ' ' || count(*) FROM pg_dist_partition
             WHERE logicalrelid IN ('orders'::regclass, 'effect_pays'::regclass,
                                    'idem_consumer.routed_effects'::regclass,
                                    'idem_consumer.routed_dead_letters'::regclass)}),
	'1 4', 'the routed effects and dead letters are colocated with the business tables');

my $business_sql = 'INSERT INTO public.effect_pays AS p (order_id, key) VALUES ($1::bigint, $2) '
  . 'ON CONFLICT (order_id, key) DO UPDATE SET applications = p.applications + 1';

# one round of a dispatcher: claim of every route (its own transaction),
# then for each effect the provider's call (30 ms) and the completion
# with the business SQL, each a statement of its own
sub round_file
{
	my ($consumer) = @_;
	my $file = "$work/round.$consumer.sql";
	open(my $fh, '>', $file) or die;
	print $fh <<"SQL";
SELECT format('INSERT INTO public.provider_calls SELECT %L, %L, %s, %L, %L FROM pg_sleep(0.03)',
              '$consumer', c.key, c.fence, c.provider_key, c.outcome_unknown),
       format('SELECT idem_effect_complete(%L, %L, %s, %L, route => %s::bigint, sql => %L, params => ARRAY[%L, %L])',
              '$consumer', c.key, c.fence, '{"sent": true}', c.route, \$q\$$business_sql\$q\$,
              c.route, c.key)
  FROM idem_effect_claim('$consumer', 10, '2 seconds', route => NULL::bigint) AS c
\\gexec
SQL
	close $fh;
	return $file;
}

sub completed
{
	my ($consumer) = @_;
	return query_retry("SELECT count(*) FROM idem_routed_effects
	                     WHERE consumer = '$consumer' AND state = 'completed'");
}

my @faults = (
	[ 'no fault', undef ],
	[
		'worker stopped (immediate) and restarted',
		sub {
			cluster('node-stop', $dir, 'worker1', 'immediate');
			sleep 1;
			cluster('node-start', $dir, 'worker1');
		}
	],
	[
		'coordinator stopped (immediate) and restarted',
		sub {
			cluster('node-stop', $dir, 'coordinator', 'immediate');
			sleep 1;
			cluster('node-start', $dir, 'coordinator');
		}
	],
	[
		'shard moved',
		sub {
			my ($shard, $from) = split /\|/, query(
				q{SELECT shardid, nodeport FROM pg_dist_shard_placement
				  WHERE shardid IN (SELECT shardid FROM pg_dist_shard
				                    WHERE logicalrelid = 'orders'::regclass)
				  ORDER BY shardid LIMIT 1});
			my $to = $from == worker_port(1) ? worker_port(2) : worker_port(1);
			query("SELECT citus_move_shard_placement($shard, '$dir', $from, '$dir', $to)");
		}
	]);

my @report;
my $phase = 0;
for my $f (@faults)
{
	my ($name, $fault) = @$f;
	my $consumer = 'fx_' . $phase++;
	my $t0 = time;

	# the outbox, filled by one business transaction across the shards
	is(query("SELECT count(*) FILTER (WHERE idem_effect_enqueue('$consumer', 'mail:$consumer:' || g,
	                                       jsonb_build_object('n', g), route => (1 + g % $n_orders)::bigint))
	            FROM generate_series(1, $n_effects) AS g"),
		$n_effects, "$name: $n_effects effects enqueued in one transaction");

	my $round = round_file($consumer);
	my $stop = "$work/stop.$consumer";
	my @pids;
	for my $d (1 .. $n_dispatchers)
	{
		my $pid = fork() // die "fork: $!";
		if ($pid == 0)
		{
			$SIG{TERM} = $SIG{INT} = 'DEFAULT';
			my $end = time + $deadline;
			# a round cut off by a fault is a dispatcher that died: the next
			# one starts afresh, and the leases it held expire
			until (-e $stop || time > $end)
			{
				system("@psql -v ON_ERROR_STOP=0 -o /dev/null -f '$round' >>'$work/$consumer.$d.log' 2>&1");
				sleep 0.05;
			}
			POSIX::_exit(0);
		}
		push @pids, $pid;
	}

	# the fault, once a third of the provider's calls are made
	if ($fault)
	{
		my $until = time + 60;
		sleep 0.1
		  while time < $until
		  && query_retry("SELECT count(*) FROM provider_calls WHERE consumer = '$consumer'")
		  < $n_effects / 3;
		$fault->();
	}
	my $until = time + $deadline;
	sleep 0.5 while time < $until && completed($consumer) < $n_effects;
	open(my $sf, '>', $stop) or die;
	close $sf;
	waitpid($_, 0) for @pids;

	is(completed($consumer), $n_effects, "$name: every effect completed");
	is(query("SELECT count(*) || ' ' || count(*) FILTER (WHERE applications = 1)
	            FROM effect_pays WHERE key LIKE 'mail:$consumer:%'"),
		"$n_effects $n_effects", "$name: the business SQL of each effect applied exactly once");
	my ($calls, $keys, $fenced, $unannounced, $unknown) = split /\|/, query(
		"SELECT count(*), count(DISTINCT key), count(DISTINCT (key, fence)),
		        (SELECT count(*) FROM (SELECT key FROM provider_calls WHERE consumer = '$consumer'
		                                GROUP BY key
		                               HAVING count(*) > 1
		                                  AND count(*) FILTER (WHERE outcome_unknown) < count(*) - 1) AS x),
		        count(*) FILTER (WHERE outcome_unknown)
		   FROM provider_calls WHERE consumer = '$consumer'");
	is($keys, $n_effects, "$name: the provider called for every effect");
	is($calls, $fenced, "$name: each call under a fence of its own");
	is($unannounced, 0, "$name: every call after an effect's first came with outcome_unknown");
	is($calls, $n_effects, "$name: without a fault, each effect leased exactly once")
	  unless $fault;
	push @report, sprintf('%s: %d effects, %d provider calls (%d with outcome_unknown), %.0f s',
		$name, $n_effects, $calls, $unknown, time - $t0);
}

# the inline cycle of a tenant: begin on the coordinator (the lease is the
# only write, as the owner of the storage); the completion with business
# SQL is refused there (Citus refuses a transaction that writes colocated
# shards as two roles) and served by a function delegated to the worker
query(<<'SQL');
CREATE ROLE team_fx LOGIN;
GRANT SELECT, INSERT, UPDATE ON effect_pays TO team_fx;
SELECT run_command_on_all_nodes($c$GRANT EXECUTE ON FUNCTION
    idem_effect_begin(text, text, jsonb, interval, "any"),
    idem_effect_complete(text, text, bigint, jsonb, text, text[], "any"),
    idem_effect_fail(text, text, bigint, text, boolean, "any"),
    idem_dlq_replay(text, text, "any") TO team_fx$c$);
SELECT run_command_on_all_nodes($c$GRANT SELECT ON idem_routed_effects, idem_routed_dead_letters TO team_fx$c$);
SELECT run_command_on_all_nodes($c$SELECT idem_consumer_create('fx_team', 'team_fx')$c$);
CREATE FUNCTION team_complete(p_order bigint, p_key text, p_fence bigint) RETURNS void LANGUAGE plpgsql AS $f$
BEGIN
    PERFORM public.idem_effect_complete('fx_team', p_key, p_fence, '{"charge": "ch_1"}',
        route => p_order,
        sql => 'INSERT INTO public.effect_pays (order_id, key) VALUES ($1::bigint, $2)',
        params => ARRAY[p_order::text, p_key]);
END
$f$;
SELECT create_distributed_function('team_complete(bigint,text,bigint)', 'p_order',
    colocate_with => 'orders', force_delegation => true);
SQL
is(query(q{SET ROLE team_fx;
           SELECT action || ' ' || fence FROM idem_effect_begin('fx_team', 'charge:7', route => 7::bigint,
                                                             request => '{"amount": 5}')}),
	'execute 1', "a tenant's begin on the coordinator leases the effect");
is(query(q{SET ROLE team_fx;
           SELECT public.sqlstate_of($s$SELECT idem_effect_complete('fx_team', 'charge:7', 1, '{}',
               route => 7::bigint, sql => 'INSERT INTO public.effect_pays (order_id, key) VALUES (7, ''charge:7'')')$s$)}),
	'0A000', "its completion with business SQL on the coordinator is refused: two roles");
query(q{SET ROLE team_fx; SELECT team_complete(7, 'charge:7', 1)});
is(query(q{SET ROLE team_fx;
           SELECT action || ' ' || (result ->> 'charge')
             FROM idem_effect_begin('fx_team', 'charge:7', route => 7::bigint,
                                           request => '{"amount": 5}')}) . ' '
	  . query(q{SELECT count(*) FROM effect_pays WHERE order_id = 7 AND key = 'charge:7'}),
	'replay ch_1 1', 'completed through the delegated function: a new begin replays the stored result, the business row once');
is(query(q{SELECT string_agg(n.nodeport::text, ',')
             FROM pg_dist_shard_placement AS n
            WHERE n.shardid = get_shard_id_for_distribution_column('idem_consumer.routed_effects', 7)}),
	query(q{SELECT string_agg(n.nodeport::text, ',')
             FROM pg_dist_shard_placement AS n
            WHERE n.shardid = get_shard_id_for_distribution_column('effect_pays', 7)}),
	'the effect of route 7 is on the node of the business rows of order 7');

# an effect enqueued by a function delegated to the worker, for a
# consumer the coordinator has never seen: claimed and completed on the
# coordinator all the same (the effect is in its shard, whatever node
# registered its consumer)
query(<<'SQL');
CREATE FUNCTION enqueue_on_worker(p_order bigint, p_key text) RETURNS boolean LANGUAGE plpgsql AS $f$
BEGIN
    RETURN public.idem_effect_enqueue('fx_worker_only', p_key, '{"n": 1}', route => p_order);
END
$f$;
SELECT create_distributed_function('enqueue_on_worker(bigint,text)', 'p_order',
    colocate_with => 'orders', force_delegation => true);
SQL
is(query(q{SELECT enqueue_on_worker(5, 'w:5')}) . ' '
	  . query(q{SELECT count(*) FROM idem_consumer.consumers WHERE name = 'fx_worker_only'}),
	't 0', 'an effect enqueued on the worker, its consumer unknown to the coordinator');
is(query(q{SELECT key || ' ' || route || ' ' || fence FROM idem_effect_claim('fx_worker_only', route => NULL::bigint)}),
	'w:5 5 1', 'a claim of every route on the coordinator leases it');
query(q{SELECT idem_effect_complete('fx_worker_only', 'w:5', 1, '{"sent": true}', route => 5::bigint)});
is(query(q{SELECT state FROM idem_routed_effects WHERE consumer = 'fx_worker_only'}), 'completed',
	'and completes it');

# a dead effect: parked in the routed dead letters beside its route, and
# replayed from there, which re-arms it
query(q{SELECT idem_set_effect_policy('fx_dead', 1, '1 second', '1 second')});
query(q{SELECT fence FROM idem_effect_begin('fx_dead', 'charge:9', route => 9::bigint)});
is(query(q{SELECT idem_effect_fail('fx_dead', 'charge:9', 1, 'card declined', route => 9::bigint, retryable => false)}),
	'dead', 'an effect failed permanently is dead');
is(query(q{SELECT kind || ' ' || status || ' ' || sqlstate || ' ' || message
             FROM idem_routed_dead_letters WHERE consumer = 'fx_dead'}),
	'effect pending IE003 card declined', 'its entry is in the routed dead letters, of kind effect');
is(query(q{SELECT effects_executed || ' ' || effects_dead || ' ' || dead_letters_pending
             FROM idem_citus_stats() WHERE consumer = 'fx_dead'}),
	'1 1 1', 'idem_citus_stats sums its counters and counts its pending entry');
is(query(q{SELECT idem_dlq_replay('charge:9', 'fx_dead', 9::bigint)}) . ' '
	  . query(q{SELECT state || ' ' || attempts FROM idem_routed_effects WHERE consumer = 'fx_dead'}) . ' '
	  . query(q{SELECT action FROM idem_effect_begin('fx_dead', 'charge:9', route => 9::bigint)}),
	'applied waiting 0 execute', 'its replay re-arms the effect, and the next begin executes it');

# without their route, the effect functions are refused on every node
is(query(q{SELECT string_agg(result, ' ' ORDER BY nodeid) FROM run_command_on_all_nodes(
             $c$SELECT public.sqlstate_of('SELECT idem_effect_begin(''fx_x'', ''k'')')
                || ',' || public.sqlstate_of('SELECT idem_effect_enqueue(''fx_x'', ''k'', ''{}'')')
                || ',' || public.sqlstate_of('SELECT idem_effect_claim(''fx_x'')')$c$)}),
	'0A000,0A000,0A000 0A000,0A000,0A000 0A000,0A000,0A000',
	'idem_effect_begin, _enqueue and _claim without a route: 0A000 on the coordinator and both workers');
# the SQLSTATE of a statement run alone (begin and claim refuse to run
# inside a transaction block, as in a function's exception block)
sub state_of
{
	my ($sql) = @_;
	my $out = `@psql -v VERBOSITY=sqlstate -c "$sql" 2>&1`;
	return $out =~ /ERROR:\s+([0-9A-Z]{5})/ ? $1 : 'ok';
}
is(join(',', map { state_of($_) }
		q{SELECT * FROM idem_effect_claim('fx_x', route => NULL::integer)},
		q{SELECT idem_effect_begin('fx_x', 'k', route => 'x'::text)},
		q{SELECT idem_effect_begin('fx_x', 'k', route => NULL::bigint)},
		q{BEGIN; SELECT idem_effect_begin('fx_x', 'k', route => 1::bigint)}),
	'42804,42804,0A000,25001',
	'a claim of every route with a NULL of another type, a route of another type, no route (NULL), a begin in a transaction block: refused');
is(query(q{SELECT count(*) FROM idem_routed_effects WHERE consumer = 'fx_x'}), '0',
	'and nothing stored');

diag($_) for @report;
done_testing();
