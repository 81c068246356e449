# Scale-out on PL/Proxy, with the recipe of docs/plproxy/ loaded as it is:
# two shard clusters (each with idem_consumer and its part of the orders)
# and a proxy cluster.  Four concurrent clients send order-paid messages,
# with redeliveries, through the proxy while one shard is stopped
# (immediate) and started again; a client whose chunk of messages fails
# sends the whole chunk again, as a broker redelivers what was not
# acknowledged.  Afterwards every key is recorded once, on the shard of its
# order, and every balance is exact.  Then the dead-letter queue per shard,
# a batch split by shard, and the counters and metrics summed over shards.
use strict;
use warnings;

use File::Basename qw(dirname);
use IPC::Run;
use List::Util qw(shuffle);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $recipe = dirname(__FILE__) . '/../../docs/plproxy';
-f "$recipe/shard.sql" && -f "$recipe/proxy.sql"
  or BAIL_OUT("the recipe is not in $recipe");

my $n_orders = 200;     # orders 1 .. 200, spread over the shards
my $n_events = 6000;    # event e pays order 1 + e % 200 the amount 1 + e % 50
my $n_amount = 50;
my $n_clients = 4;
my $chunk = 100;        # messages per client transaction batch (one psql)

# The key carries the order id: docs/plproxy/README.md, "Re-sharding".
sub key_of { my ($e) = @_; return 'order-paid:' . (1 + $e % $n_orders) . ":$e"; }

# A new database $db on $node, made partition $partition of $partitions by
# the recipe.
sub load_shard
{
	my ($node, $db, $partition, $partitions) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	command_ok(
		[
			'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1',
			'-v', "partition=$partition", '-v', "partitions=$partitions",
			'-d', $node->connstr($db), '-f', "$recipe/shard.sql"
		],
		"docs/plproxy/shard.sql makes $db partition $partition of $partitions");
}

#
# The clusters
#
my @shards;
for my $i (0, 1)
{
	my $node = PostgreSQL::Test::Cluster->new("shard$i");
	$node->init;
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'idem_consumer'\nmax_connections = 40\n");
	$node->start;
	load_shard($node, 'shop', $i, 2);
	push @shards, $node;
}

my $proxy = PostgreSQL::Test::Cluster->new('proxy');
$proxy->init;
$proxy->append_conf('postgresql.conf', "max_connections = 40\n");
$proxy->start;
is($proxy->safe_psql('postgres',
		q{SELECT count(*) FROM pg_available_extensions WHERE name = 'plproxy'}),
	'1',
	'PL/Proxy is installed (Debian package postgresql-'
	  . $proxy->pg_version->major . '-plproxy)')
  or BAIL_OUT('plproxy is not installed for this PostgreSQL');
$proxy->safe_psql('postgres', 'CREATE DATABASE shop_proxy');
my $shard_list = '{' . join(',', map { '"' . $_->connstr('shop') . '"' } @shards) . '}';
command_ok(
	[
		'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-v', "shards=$shard_list",
		'-d', $proxy->connstr('shop_proxy'), '-f', "$recipe/proxy.sql"
	],
	'docs/plproxy/proxy.sql loads on the proxy');

sub on_proxy { return $proxy->safe_psql('shop_proxy', $_[0]); }
sub on_shard { return $shards[ $_[0] ]->safe_psql('shop', $_[1]); }

is(on_proxy(q{SELECT string_agg(shard || '/' || partitions, ',' ORDER BY shard) FROM shop.shard_info()}),
	'0/2,1/2', 'partition i of the proxy is the shard that says it is partition i');

on_proxy("SELECT shop.create_order(o, 1000) FROM generate_series(1, $n_orders) o");
my @held = map { on_shard($_, 'SELECT count(*) FROM shop.orders') } 0, 1;
ok($held[0] > 0 && $held[1] > 0 && $held[0] + $held[1] == $n_orders,
	"orders created through the proxy are spread over both shards (@held)");
for my $i (0, 1)
{
	is(on_shard($i, "SELECT count(*) FROM shop.orders WHERE shop.order_hash(id) & 1 <> $i"),
		'0', "shard $i holds only orders that hash to it");
}

# Orders of shard $i whose balance or status differs from the sum of the
# amounts of the distinct events listed by $events_sql (column e).
sub wrong_balances
{
	my ($i, $events_sql) = @_;
	return on_shard(
		$i, qq{
		SELECT count(*) FROM shop.orders o
		LEFT JOIN (SELECT 1 + e % $n_orders AS id, sum(1 + e % $n_amount) AS due
		           FROM (SELECT DISTINCT e FROM ($events_sql) ev) d
		           GROUP BY 1) x USING (id)
		WHERE o.id <= $n_orders
		  AND (o.paid_amount <> coalesce(x.due, 0)
		       OR (o.status = 'PAID') <> (x.due IS NOT NULL))});
}

# Keys of 'payments' recorded on shard $i, and how many of them belong to an
# order that shard does not hold.
sub keys_on
{
	my ($i) = @_;
	return on_shard(
		$i, q{
		SELECT count(*) || '/' || count(*) FILTER (WHERE NOT EXISTS (
		           SELECT FROM shop.orders o WHERE o.id = split_part(k.key, ':', 2)::bigint))
		  FROM idem_processed_keys k WHERE k.consumer = 'payments'});
}

#
# 1. Concurrent clients with redeliveries, a shard stopped and started.
#
# Every event once, spread over the clients, plus 30% of them again,
# delivered by another client (so that some run at the same time as their
# first delivery); each client's list in random order.
srand(18);
my @lists = map { [] } 1 .. $n_clients;
for my $e (1 .. $n_events)
{
	my $c = int(rand($n_clients));
	push @{ $lists[$c] }, $e;
	push @{ $lists[ ($c + 1 + int(rand($n_clients - 1))) % $n_clients ] }, $e
	  if rand() < 0.3;
}
my $tmp = PostgreSQL::Test::Utils::tempdir;
my $deliveries = 0;
for my $c (0 .. $n_clients - 1)
{
	my @l = shuffle(@{ $lists[$c] });
	$deliveries += @l;
	my $k = 0;
	while (my @part = splice(@l, 0, $chunk))
	{
		my $sql = join '',
		  map { sprintf("SELECT shop.pay(%d, '%s', %d, now());\n",
				1 + $_ % $n_orders, key_of($_), 1 + $_ % $n_amount) } @part;
		PostgreSQL::Test::Utils::append_to_file(sprintf('%s/c%d_%04d.sql', $tmp, $c, $k++), $sql);
	}
}

# A client: each chunk in one psql session, one message per statement; a
# chunk that fails is sent again from its start (bounded: 150 tries).
my $client_sh = <<'EOF';
c=$1; conn=$2; dir=$3
for f in "$dir"/c${c}_*.sql; do
    tries=0
    until psql -X -q -v ON_ERROR_STOP=1 -d "$conn" -f "$f" >/dev/null 2>>"$dir/c$c.err"; do
        tries=$((tries + 1))
        [ "$tries" -ge 150 ] && { echo "gave up on $f" >>"$dir/c$c.err"; exit 1; }
        sleep 0.2
    done
    [ "$tries" -gt 0 ] && echo "$f $tries" >>"$dir/retried"
done
touch "$dir/c$c.done"
exit 0
EOF
PostgreSQL::Test::Utils::append_to_file("$tmp/client.sh", $client_sh);

my $timer = IPC::Run::timeout(90);
my @clients = map {
	IPC::Run::start([ 'bash', "$tmp/client.sh", $_, $proxy->connstr('shop_proxy'), $tmp ], $timer)
} 0 .. $n_clients - 1;

# Once shard 1 has a quarter of its keys, stop it (immediate: a crash) and
# start it again while the clients keep sending.
my $expected1 = on_shard(1,
	"SELECT count(*) FROM generate_series(1, $n_events) e JOIN shop.orders o ON o.id = 1 + e % $n_orders");
my $seen = 0;
while (!$timer->is_expired)
{
	$seen = on_shard(1, q{SELECT count(*) FROM idem_processed_keys});
	last if $seen >= $expected1 / 4;
	usleep(50_000);
}
my $still_running = grep { !-f "$tmp/c$_.done" } 0 .. $n_clients - 1;
$shards[1]->stop('immediate');
$shards[1]->start;
ok($seen >= $expected1 / 4 && $still_running > 0,
	"shard 1 stopped (immediate) and started with $seen of its $expected1 keys recorded, $still_running clients running");

my $all_ok = 1;
for my $h (@clients)
{
	$all_ok = 0 unless eval { $h->finish };
}
ok($all_ok, 'every client delivered all its messages (retrying failed chunks)');
my $errors = join '', map { -f "$tmp/c$_.err" ? slurp_file("$tmp/c$_.err") : '' } 0 .. $n_clients - 1;
my $retried = 0;
$retried = () = slurp_file("$tmp/retried") =~ /\n/g if -f "$tmp/retried";
like($errors, qr/ERROR:  PL\/Proxy function shop\.pay\(4\): \[shop\]/,
	'clients saw shard 1 fail through the proxy while it restarted');
cmp_ok($retried, '>', 0, "$retried chunks were sent again after a failure");
note("client errors (first lines):\n" . join("\n", (split /\n/, $errors)[ 0 .. 5 ]));

my $all_events = "SELECT generate_series(1, $n_events) AS e";
for my $i (0, 1)
{
	my $expected = on_shard($i,
		"SELECT count(*) FROM generate_series(1, $n_events) e JOIN shop.orders o ON o.id = 1 + e % $n_orders");
	is(keys_on($i), "$expected/0",
		"shard $i recorded each of its $expected events once, and no key of another shard");
	is(wrong_balances($i, $all_events), '0',
		"every balance of shard $i is exact: each event applied once");
}

# Every event redelivered once more, through the proxy: nothing applies.
my $balances = q{SELECT string_agg(id || ':' || paid_amount, ',' ORDER BY id) FROM shop.orders};
my @before = map { on_shard($_, $balances) } 0, 1;
is( on_proxy(
		"SELECT count(*) FILTER (WHERE shop.pay(1 + e % $n_orders, 'order-paid:' || 1 + e % $n_orders || ':' || e, 1 + e % $n_amount))
		   FROM generate_series(1, $n_events) e"),
	'0', "a redelivery of all $n_events events through the proxy applies none");
is_deeply([ map { on_shard($_, $balances) } 0, 1 ], \@before, 'and changes no balance');

#
# 2. The dead-letter queue, per shard.
#
# Payments of orders 1001..1008, which do not exist yet, are parked on the
# shard their order will live on.
my $poison = q{SELECT o, 'order-paid:' || o || ':' || (9000 + o), 7 FROM generate_series(1001, 1008) o};
is(on_proxy("SELECT string_agg(DISTINCT shop.try_pay(o, k, a), ',') FROM ($poison) m(o, k, a)"),
	'dead_lettered', 'try_pay parks payments of orders that do not exist yet');
is(on_proxy("SELECT string_agg(DISTINCT shop.try_pay(o, k, a), ',') FROM ($poison) m(o, k, a)"),
	'dead_lettered', 'their redeliveries are dead_lettered again');
is( on_proxy(
		q{SELECT count(*) || '/' || count(*) FILTER (WHERE shard = shop.order_hash(split_part(key, ':', 2)::bigint) & 1)
		    || '/' || count(DISTINCT shard) || '/' || max(attempts)
		    FROM shop.shard_dead_letters() WHERE status = 'pending'}),
	'8/8/2/1',
	'shard_dead_letters() lists the 8 entries, each on the shard of its order, on both shards, tried once');
my ($ret, $out, $err) = $proxy->psql('shop_proxy', q{SELECT * FROM shop.dlq_replay(2, 'payments')});
like($err, qr/this is shard 0, not shard 2/, 'a replay aimed at a shard that does not exist is refused');
on_proxy('SELECT shop.create_order(o, 1000) FROM generate_series(1001, 1008) o');
is( on_proxy(
		q{SELECT string_agg(r.outcome || ':' || r.n, ',' ORDER BY r.outcome)
		    FROM (SELECT outcome, count(*) AS n
		            FROM generate_series(0, 1) s, shop.dlq_replay(s, 'payments') GROUP BY outcome) r}),
	'applied:8', 'once the orders exist, a replay on each shard applies its entries');
is( join(',', map { on_shard($_, q{SELECT coalesce(sum(paid_amount), 0) FROM shop.orders WHERE id > 1000}) } 0, 1),
	join(',', map { 7 * on_shard($_, q{SELECT count(*) FROM shop.orders WHERE id > 1000}) } 0, 1),
	'each replayed payment was applied on its shard');
is(on_proxy("SELECT string_agg(DISTINCT shop.try_pay(o, k, a), ',') FROM ($poison) m(o, k, a)"),
	'duplicate', 'redeliveries of replayed messages are duplicates');

#
# 3. A batch split by shard.
#
# 250 new events, 50 already applied, and 20 of the new ones twice.
my $batch_events = "SELECT e FROM generate_series($n_events + 1, $n_events + 250) e
	UNION ALL SELECT e FROM generate_series(1, 50) e
	UNION ALL SELECT e FROM generate_series($n_events + 1, $n_events + 20) e";
my $batch_call = qq{SELECT k FROM (SELECT array_agg('order-paid:' || 1 + e % $n_orders || ':' || e ORDER BY e) AS ks,
	                      array_agg(1 + e % $n_orders ORDER BY e) AS os,
	                      array_agg((1 + e % $n_amount)::numeric ORDER BY e) AS am
	                 FROM ($batch_events) b) a, shop.pay_batch(a.ks, a.os, a.am) k};
is( on_proxy("SELECT count(*) || '/' || count(DISTINCT k) || '/' || min(split_part(k, ':', 3)::int) FROM ($batch_call) r"),
	'250/250/' . ($n_events + 1),
	'pay_batch returns the 250 new keys of the batch, each once, from both shards');
my $events_now = "SELECT generate_series(1, $n_events + 250) AS e";
for my $i (0, 1)
{
	is(wrong_balances($i, $events_now), '0', "after the batch, every balance of shard $i is exact");
	like(keys_on($i), qr{/0$}, "after the batch, shard $i holds no key of another shard");
}
is(on_proxy("SELECT count(*) FROM ($batch_call) r"), '0', 'the same batch redelivered returns no key');
is(wrong_balances(0, $events_now) + wrong_balances(1, $events_now), 0, 'and changes no balance');
($ret, $out, $err) = $proxy->psql('shop_proxy',
	q{SELECT * FROM shop.pay_batch(ARRAY['order-paid:5000:1'], ARRAY[5000::bigint], ARRAY[1::numeric])});
like($err, qr/order 5000 is not on this shard/, 'a batch paying an order no shard holds is refused');
is( on_shard(0, q{SELECT count(*) FROM idem_processed_keys WHERE key = 'order-paid:5000:1'})
	  + on_shard(1, q{SELECT count(*) FROM idem_processed_keys WHERE key = 'order-paid:5000:1'}),
	0, 'and records its key nowhere');

#
# 4. Counters and metrics, summed over the shards.
#
$_->safe_psql('shop', 'SELECT idem_stats_reset()') for @shards;
on_proxy("SELECT shop.pay(1 + e % $n_orders, 'order-paid:' || 1 + e % $n_orders || ':' || e, 1) FROM generate_series(20001, 20030) e");
on_proxy("SELECT shop.pay(1 + e % $n_orders, 'order-paid:' || 1 + e % $n_orders || ':' || e, 1 + e % $n_amount) FROM generate_series(1, 20) e");
on_proxy(q{SELECT shop.try_pay(o, 'order-paid:' || o || ':1', 1) FROM generate_series(3001, 3005) o});
is( on_proxy(q{SELECT applied || '/' || duplicates || '/' || dead_lettered || '/' || shards
	             FROM shop.idem_stats_all WHERE consumer = 'payments'}),
	'30/20/5/2', 'idem_stats_all sums the counters of both shards');
is( on_proxy(q{SELECT applied || '/' || duplicates || '/' || dead_lettered FROM shop.idem_stats_all WHERE consumer = 'payments'}),
	join('/', map { my $c = $_; my $s = 0; $s += on_shard($_, "SELECT $c FROM idem_stats WHERE consumer = 'payments'") for 0, 1; $s }
		  qw(applied duplicates dead_lettered)),
	'which are the sums of the shards\' own idem_stats');
my $metrics = on_proxy('SELECT shop.idem_metrics_all()');
PostgreSQL::Test::Utils::append_to_file("$tmp/metrics.txt", "$metrics\n");
my ($pout, $perr) = run_command([ 'sh', '-c', "promtool check metrics < $tmp/metrics.txt; echo rc=\$?" ]);
like($pout, qr/rc=0$/, 'promtool check metrics accepts idem_metrics_all()') or diag("$pout\n$perr");
like($metrics, qr/^idem_applied_total\{consumer="payments"\} 30$/m, 'the merged exposition sums applied');
like($metrics, qr/^idem_processing_latency_seconds_count\{consumer="payments"\} 30$/m,
	'and the latency histograms');
like($metrics, qr/^idem_processing_latency_seconds_bucket\{consumer="payments",le="\+Inf"\} 30$/m,
	'bucket by bucket');
# idem_keys_stored is one unlabelled gauge per shard (all consumers, from
# the statistics, which a shard's session flushes with a delay): summed once
like($metrics, qr/^idem_keys_stored \d+$/m, 'and the keys stored, summed into one sample');

#
# 5. Re-sharding: from two partitions to four.  Partitions 2 and 3 are new
# databases (on the clusters of shards 0 and 1); the orders of partition i
# that hash to i + 2 leave for it with their keys, then the proxy lists
# four partitions.
#
my @parts = ([ $shards[0], 'shop' ], [ $shards[1], 'shop' ], [ $shards[0], 'shop2' ], [ $shards[1], 'shop3' ]);
sub on_part { my ($i, $sql) = @_; return $parts[$i][0]->safe_psql($parts[$i][1], $sql); }
load_shard(@{ $parts[$_] }, $_, 4) for 2, 3;
# All balances and all keys, whatever database they are in.
sub all_balances
{
	return join ',', sort map { split /\n/, on_part($_, q{SELECT id || ':' || paid_amount FROM shop.orders}) } 0 .. $#parts;
}
sub all_keys
{
	return join ',', sort map {
		split /\n/, on_part($_, q{SELECT key FROM idem_processed_keys WHERE consumer = 'payments'})
	} 0 .. $#parts;
}
my $balances_before = all_balances();
my $keys_before = all_keys();

# Pending dead letters cannot move: the payments of orders 3001, 3003 and
# 3005 (partition 2 of 4) stop the move until they are resolved.
($ret, $out, $err) = $shards[0]->psql('shop', 'SELECT count(*) FROM shop.leaving_keys(4, 2)');
like($err, qr/3 pending dead letters would leave this shard/,
	'keys with pending dead letters are not moved');
is( on_proxy(q{SELECT count(shop.dlq_discard(shard, id, 'order never created'))
	             FROM shop.shard_dead_letters() WHERE status = 'pending'}),
	'5', 'the operator discards them through the proxy');

my %moved;
for my $i (0, 1)
{
	my $t = $i + 2;
	my $f = "$tmp/move$i";
	my $counts = on_part($i, "SELECT (SELECT count(*) FROM shop.leaving_orders(4, $t)) || '/' || (SELECT count(*) FROM shop.leaving_keys(4, $t))");
	on_part($i, "\\copy (SELECT * FROM shop.leaving_orders(4, $t)) TO '$f.orders'\n"
		  . "\\copy (SELECT * FROM shop.leaving_keys(4, $t)) TO '$f.keys'");
	is( on_part($t, "\\copy shop.incoming_orders FROM '$f.orders'\n"
			  . "\\copy shop.incoming_keys FROM '$f.keys'\n"
			  . q{SELECT orders || '/' || keys FROM shop.import_incoming()}),
		$counts, "partition $t imports the $counts orders/keys that leave partition $i");
	$moved{$i} = $counts;
}
for my $i (0, 1)
{
	is(on_part($i, 'SELECT orders || \'/\' || keys FROM shop.drop_leaving(4)'),
		$moved{$i}, "partition $i forgets the keys and deletes the orders that left it");
}
my @new_parts = map { $parts[$_][0]->connstr($parts[$_][1]) =~ s/'/''/gr } 2, 3;
on_proxy("ALTER SERVER shop_cluster OPTIONS (ADD p2 '$new_parts[0]', ADD p3 '$new_parts[1]')");
is(on_proxy(q{SELECT string_agg(shard || '/' || partitions, ',' ORDER BY shard) FROM shop.shard_info()}),
	'0/4,1/4,2/4,3/4', 'the proxy routes over four partitions');
is(all_balances(), $balances_before, 'every order moved with its balance');
is(all_keys(), $keys_before, 'every key is recorded once, in one of the four databases');
for my $i (0 .. 3)
{
	is(on_part($i, "SELECT count(*) FROM shop.orders WHERE shop.order_hash(id) & 3 <> $i"),
		'0', "partition $i holds only its orders");
	is( on_part($i, qq{SELECT count(*) FROM idem_processed_keys
	                    WHERE consumer = 'payments' AND shop.order_hash(shop.key_order(key)) & 3 <> $i}),
		'0', "partition $i holds only the keys of its orders");
}
ok(on_part(2, 'SELECT count(*) FROM shop.orders') > 0 && on_part(3, 'SELECT count(*) FROM shop.orders') > 0,
	'both new partitions received orders');

# Everything redelivered through the new routing: nothing applies.
is( on_proxy(
		"SELECT count(*) FILTER (WHERE shop.pay(1 + e % $n_orders, 'order-paid:' || 1 + e % $n_orders || ':' || e,
		                                       CASE WHEN e > 20000 THEN 1 ELSE 1 + e % $n_amount END))
		   FROM (SELECT generate_series(1, $n_events + 250) UNION ALL SELECT generate_series(20001, 20030)) ev(e)"),
	'0', 'after the move, a redelivery of every payment applies none');
is(on_proxy("SELECT string_agg(DISTINCT shop.try_pay(o, k, a), ',') FROM ($poison) m(o, k, a)"),
	'duplicate', 'nor does a redelivery of the replayed dead letters');
is(all_balances(), $balances_before, 'and no balance changed');

# New messages after the move land on the partition of their order.
is( on_proxy(
		"SELECT count(*) FILTER (WHERE shop.pay(1 + e % $n_orders, 'order-paid:' || 1 + e % $n_orders || ':' || e, 1))
		   FROM generate_series(30001, 30200) e"),
	'200', 'new messages after the move are applied');
my $paid = 0;
$paid += on_part($_, 'SELECT sum(paid_amount) FROM shop.orders') for 0 .. 3;
my $paid_before = 0;
$paid_before += (split /:/)[1] for split /,/, $balances_before;
is($paid, $paid_before + 200, 'each exactly once');
for my $i (0 .. 3)
{
	is( on_part($i, qq{SELECT count(*) FROM idem_processed_keys
	                    WHERE consumer = 'payments' AND shop.order_hash(shop.key_order(key)) & 3 <> $i}),
		'0', "partition $i still holds only the keys of its orders");
}

$_->stop for @shards, $proxy;
done_testing();
