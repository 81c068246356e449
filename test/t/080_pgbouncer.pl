# idem_consumer through Debian's PgBouncer in transaction mode, with the
# README's "Two teams" owners and login roles (docs/poolers.md).
# - 12 client sessions share two server connections per login: a stream
#   with redeliveries from both teams gives exact balances and counters.
# - Through one pooler login with SET LOCAL ROLE, a team is refused the
#   other's consumer on the server connection the other team used last, and
#   the plan that connection keeps runs with the caller's rights.
# - A session-level SET ROLE, SET or advisory lock is handed to the next
#   client of the server connection; SET LOCAL is not; session pooling
#   clears the session between clients.
# - A change of owner, a REVOKE of EXECUTE or of membership takes effect at
#   the next call on a warm server connection.
# - Dead letters are parked and replayed, and a batch applied.
# - Prepared statements: psycopg 3 with prepare_threshold=None, psycopg2,
#   node-postgres's unnamed queries and pgjdbc with prepareThreshold=0 work;
#   the server-side prepared statements of the other settings fail on
#   PgBouncer before 1.21, with the errors asserted here.
use strict;
use warnings;

use File::Basename qw(dirname);
use IO::Uncompress::Unzip qw(unzip $UnzipError);
use version;
use IPC::Run;
use Time::HiRes qw(time);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $pgbouncer = '/usr/sbin/pgbouncer';
plan skip_all => "$pgbouncer not found: install Debian's pgbouncer package to run this test"
  unless -x $pgbouncer;

my ($bouncer_version) = `$pgbouncer --version` =~ /PgBouncer (\d+\.\d+)/;
$bouncer_version //= 0;
note "PgBouncer $bouncer_version";
# max_prepared_statements (server-side prepared statements in transaction
# mode) came with PgBouncer 1.21
my $bouncer_tracks_prepares = $bouncer_version >= 1.21;

my $timeout = $PostgreSQL::Test::Utils::timeout_default;

my $node = PostgreSQL::Test::Cluster->new('pgbouncer');
# UTF8 whatever the environment's locale: psycopg 3 returns text as bytes from
# a SQL_ASCII database, which initdb makes under an unset LANG
$node->init(extra => [ "--encoding=UTF8", "--locale=C" ]);
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
max_connections = 60
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE orders (id int PRIMARY KEY, paid int NOT NULL DEFAULT 0);
	CREATE TABLE parcels (id int PRIMARY KEY, packed int NOT NULL DEFAULT 0);
	CREATE TABLE pay_ledger (id int PRIMARY KEY, order_id int NOT NULL REFERENCES orders);
	INSERT INTO orders SELECT generate_series(1, 20);
	INSERT INTO parcels SELECT generate_series(1, 20);
	-- the README's "Two teams"
	CREATE ROLE team_pay;   CREATE ROLE pay_app LOGIN IN ROLE team_pay;   CREATE ROLE pay_oncall LOGIN IN ROLE team_pay;
	CREATE ROLE team_ship;  CREATE ROLE ship_app LOGIN IN ROLE team_ship;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_is_processed(text, text, "any") TO team_pay, team_ship;
	GRANT EXECUTE ON FUNCTION idem_dlq_replay(bigint), idem_dlq_replay(text, integer),
	                          idem_dlq_discard(bigint, text), idem_forget(text, text, "any")
	                          TO pay_oncall;
	GRANT SELECT ON idem_dead_letters, idem_processed_keys TO pay_oncall;
	-- a replay runs as the role that parked the message (docs/dead-letters.md)
	GRANT pay_app TO pay_oncall;
	GRANT EXECUTE ON FUNCTION idem_record_batch(text, text[]) TO team_pay;
	GRANT SELECT, UPDATE ON orders TO team_pay, team_ship;
	GRANT SELECT, UPDATE ON parcels TO team_ship;
	GRANT SELECT, INSERT ON pay_ledger TO team_pay;
	SELECT idem_consumer_create('payments', 'team_pay');
	SELECT idem_consumer_create('shipping', 'team_ship');
	-- a pooler that logs in once and sets the team's role per transaction;
	-- NOINHERIT: by itself it may do nothing
	CREATE ROLE pooler LOGIN NOINHERIT IN ROLE pay_app, ship_app;
});

# PgBouncer as the OS user running the test, on 127.0.0.1 (pgjdbc has no
# unix sockets) and a private socket directory, in front of the test node.
my $sockdir = PostgreSQL::Test::Utils::tempdir_short;
my $confdir = PostgreSQL::Test::Utils::tempdir;
my $bport = PostgreSQL::Test::Cluster::get_free_port();
my %password = (
	pay_app => 'pay-secret', ship_app => 'ship-secret',
	pay_oncall => 'oncall-secret');
open my $fh, '>', "$confdir/userlist.txt" or die $!;
print $fh qq{"$_" "$password{$_}"\n} for sort keys %password;
close $fh;
chmod 0600, "$confdir/userlist.txt";

my $server = 'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
my $logfile = "$PostgreSQL::Test::Utils::log_path/080_pgbouncer_pgbouncer.log";
open $fh, '>', "$confdir/pgbouncer.ini" or die $!;
print $fh <<"EOF";
[databases]
; per login role: pools of default_pool_size server connections
app = $server
; one server connection, so that consecutive clients share it
app1 = $server pool_size=1
; one login for every team, which sets the team's role per transaction
shared = $server user=pooler pool_size=1
; fresh pools for the prepared-statement cases
py_none = $server pool_size=1
py_default = $server pool_size=1
py_zero = $server pool_size=1
py_prepare = $server pool_size=1
py_moved = $server pool_size=2
jdbc_zero = $server pool_size=1
jdbc_default = $server pool_size=1
jdbc_moved = $server pool_size=2
jdbc_tx_default = $server pool_size=1
jdbc_tx_zero = $server pool_size=1
psycopg2 = $server pool_size=1
node_unnamed = $server pool_size=1
node_named = $server pool_size=1
; session pooling, for comparison
session_shared = $server user=pooler pool_size=1 pool_mode=session
py_session = $server pool_size=2 pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir = $sockdir
auth_type = scram-sha-256
auth_file = $confdir/userlist.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
; pgjdbc sends it at startup
ignore_startup_parameters = extra_float_digits
logfile = $logfile
pidfile = $confdir/pgbouncer.pid
EOF
close $fh;

my ($bouncer_out, $bouncer_err) = ('', '');
my $bouncer = IPC::Run::start([ $pgbouncer, "$confdir/pgbouncer.ini" ],
	'>', \$bouncer_out, '2>', \$bouncer_err);
# an aborted test must not leave the pooler running
local $SIG{TERM} = local $SIG{INT} = sub { die "killed\n" };
END { $bouncer->kill_kill if $bouncer && $bouncer->pumpable; }

# bpsql USER DB SQL: runs SQL in one psql session through the pooler (each
# statement its own transaction unless it opens one); returns (stdout,
# stderr), errors with their SQLSTATE.
sub bpsql
{
	my ($user, $db, $sql) = @_;
	my ($out, $err) = ('', '');
	local $ENV{PGPASSWORD} = $password{$user};
	IPC::Run::run(
		[ 'psql', '-X', '-A', '-t', '-q', '-v', 'VERBOSITY=verbose',
		  '-h', $sockdir, '-p', $bport, '-U', $user, '-d', $db, '-f', '-' ],
		'<', \$sql, '>', \$out, '2>', \$err,
		IPC::Run::timeout($timeout));
	chomp $out;
	return ($out, $err);
}

my $up = 0;
foreach (1 .. 10 * $timeout)
{
	my ($out) = bpsql('pay_app', 'app', 'SELECT 1');
	if ($out eq '1') { $up = 1; last; }
	select(undef, undef, undef, 0.1);
}
ok($up, 'PgBouncer runs in front of the test node') or BAIL_OUT("PgBouncer: $bouncer_err");

# ---------------------------------------------------------------------------
# A stream with redeliveries from both teams, 12 client sessions, two server
# connections per team.  Event e of a team pays or packs order e % 20 + 1 an
# amount e % 7 + 1; every third event is delivered twice, the deliveries in
# an order of their own, each client a share of them.
my $events = 1500;
my $barrier = PostgreSQL::Test::Utils::tempdir;
my @clients;
foreach my $team ([ 'pay_app', 'payments', 'pay', 'orders', 'paid' ],
	[ 'ship_app', 'shipping', 'ship', 'parcels', 'packed' ])
{
	my ($role, $consumer, $prefix, $table, $column) = @$team;
	my @stream = (1 .. $events, grep { $_ % 3 == 0 } 1 .. $events);
	# a fixed shuffle (i * 7919 mod 2003, primes, is one-to-one below 2003):
	# redeliveries land in other clients, near their first delivery or far
	my @deliveries = map { $stream[$_] }
	  sort { ($a * 7919) % 2003 <=> ($b * 7919) % 2003 } 0 .. $#stream;
	# every client connects, says so, and waits for the others before its
	# first call
	my @scripts = map {
		"\\! touch $barrier/ready.$prefix.$_\n"
		  . "\\! i=0; while [ ! -e $barrier/go ] && [ \$i -lt 6000 ]; do sleep 0.01; i=\$((i + 1)); done\n"
	} 1 .. 6;
	my $i = 0;
	foreach my $e (@deliveries)
	{
		my ($order, $amount) = ($e % 20 + 1, $e % 7 + 1);
		$scripts[ $i++ % 6 ] .=
		  "SELECT idem_apply('$prefix:$e', '$consumer', "
		  . "'update $table set $column = $column + \$1 where id = \$2', "
		  . "ARRAY['$amount', '$order']);\n";
	}
	foreach my $n (1 .. 6)
	{
		my $file = "$barrier/$prefix.$n.sql";
		open my $sfh, '>', $file or die $!;
		print $sfh $scripts[ $n - 1 ];
		close $sfh;
		push @clients, { role => $role, consumer => $consumer, file => $file };
	}
}
# files rather than standard input: a started harness feeds its input
# only when pumped
foreach my $c (@clients)
{
	local $ENV{PGPASSWORD} = $password{ $c->{role} };
	($c->{out}, $c->{err}) = ('', '');
	$c->{h} = IPC::Run::start(
		[ 'psql', '-X', '-A', '-t', '-q', '-h', $sockdir, '-p', $bport,
		  '-U', $c->{role}, '-d', 'app', '-f', $c->{file} ],
		'<', \undef, '>', \$c->{out}, '2>', \$c->{err},
		IPC::Run::timeout($timeout));
}
# psql connects before it reads its script
foreach (1 .. 10 * $timeout)
{
	my @ready = glob "$barrier/ready.*";
	last if @ready == @clients;
	select(undef, undef, undef, 0.1);
}
is(scalar(my @ready = glob "$barrier/ready.*"), 12, '12 client sessions are connected to the pooler');
my $started = time;
open $fh, '>', "$barrier/go" or die $!;
close $fh;
my %outcomes;
foreach my $c (@clients)
{
	$c->{h}->finish;
	$outcomes{ $c->{consumer} }{$_}++ foreach split /\n/, $c->{out};
	$outcomes{ $c->{consumer} }{error}++ if $c->{err} ne '';
	note "client $c->{role}: $c->{err}" if $c->{err} ne '';
}
note 'the stream took ' . (time - $started) . ' s';
foreach my $consumer ('payments', 'shipping')
{
	is(join(',', map { "$_=" . ($outcomes{$consumer}{$_} // 0) } qw(t f error)),
		't=1500,f=500,error=0',
		"$consumer: 6 client sessions through the pooler, 2000 deliveries: 1500 applied, 500 redeliveries skipped, no error");
}
my $expected = join ',', map {
	my $o = $_;
	my $sum = 0;
	$sum += $_ % 7 + 1 foreach grep { $_ % 20 + 1 == $o } 1 .. $events;
	$sum
} 1 .. 20;
is($node->safe_psql('postgres', q{SELECT string_agg(paid::text, ',' ORDER BY id) FROM orders}),
	$expected, 'every order is paid exactly once per event');
is($node->safe_psql('postgres', q{SELECT string_agg(packed::text, ',' ORDER BY id) FROM parcels}),
	$expected, 'every parcel is packed exactly once per event');
is($node->safe_psql('postgres', q{
	SELECT string_agg(consumer || '=' || applied || '/' || duplicates || '/' || failed || '/' || dead_lettered,
	                  ',' ORDER BY consumer) FROM idem_stats}),
	'payments=1500/500/0/0,shipping=1500/500/0/0',
	'idem_stats counts exactly: applied/duplicates/failed/dead_lettered');
my $backends = $node->safe_psql('postgres', q{
	SELECT string_agg(usename || '=' || n, ',' ORDER BY usename)
	  FROM (SELECT usename, count(*) AS n FROM pg_stat_activity
	         WHERE usename IN ('pay_app', 'ship_app') GROUP BY usename) s});
note "server connections after the stream: $backends";
like($backends, qr/^pay_app=[12],ship_app=[12]$/,
	'the 12 client sessions were served by at most 2 server connections per team');

# ---------------------------------------------------------------------------
# One pooler login for both teams (pool of one server connection): each
# transaction sets its team's role with SET LOCAL ROLE.
my $pay_sql = q{'insert into pay_ledger values ($1, $2)'};
my ($out, $err) = bpsql('pay_app', 'shared', qq{
	BEGIN;
	SET LOCAL ROLE pay_app;
	SELECT pg_backend_pid();
	SELECT idem_apply('pay:shared:1', 'payments', $pay_sql, ARRAY['1', '1']);
	COMMIT;
	SELECT current_user;
});
my ($pid, $applied, $after) = split /\n/, $out;
is("$applied $after", 't pooler',
	'pay_app applies through the shared login with SET LOCAL ROLE; after COMMIT the connection is the pooler again');
($out, $err) = bpsql('ship_app', 'shared', qq{
	BEGIN;
	SET LOCAL ROLE ship_app;
	SELECT pg_backend_pid();
	SELECT idem_apply('pay:shared:2', 'payments', $pay_sql, ARRAY['2', '1']);
	ROLLBACK;
	BEGIN;
	SET LOCAL ROLE ship_app;
	SELECT idem_apply('ship:shared:1', 'shipping', $pay_sql, ARRAY['3', '1']);
	ROLLBACK;
	SELECT idem_apply('pay:shared:3', 'payments', $pay_sql, ARRAY['4', '1']);
});
is($out, $pid, 'the next client gets the server connection pay_app used last');
like($err, qr/ERROR:  42501: permission denied for consumer "payments"\nDETAIL:  Role "ship_app" does not/,
	'ship_app on it is refused the payments consumer (42501)');
like($err, qr/ERROR:  42501: permission denied for table pay_ledger/,
	'and the same business SQL text, whose plan that connection keeps, on its own consumer runs with its own rights');
like($err, qr/ERROR:  42501: permission denied for function idem_apply/,
	'without SET LOCAL ROLE the NOINHERIT pooler login itself may do nothing');
is($node->safe_psql('postgres', q{SELECT string_agg(id::text, ',' ORDER BY id) FROM pay_ledger}),
	'1', 'only the payment of pay_app was written');

# A session-level SET ROLE outlives the client that ran it: the server
# connection goes to the next client with it.
($out, $err) = bpsql('pay_app', 'shared', q{SET ROLE pay_app; SELECT pg_backend_pid();});
is($out, $pid, 'a client runs a session-level SET ROLE pay_app and disconnects');
($out, $err) = bpsql('ship_app', 'shared', qq{
	SELECT current_user;
	SELECT idem_apply('pay:leaked:1', 'payments', 'select 1');
	RESET ROLE;
	SELECT current_user;
});
is($out, "pay_app\nt\npooler",
	'the next client, of the other team, runs as pay_app and applies on payments: SET ROLE is unsafe, SET LOCAL ROLE is the form to use');

# The same for settings: idem_consumer.transient_sqlstates, a user setting.
my $fk_sql = q{'insert into pay_ledger values ($1, $2)'};
($out, $err) = bpsql('pay_app', 'app1', q{
	SET idem_consumer.transient_sqlstates = '23503';
	SELECT pg_backend_pid();
});
$pid = $out;
($out, $err) = bpsql('pay_app', 'app1', qq{
	SELECT pg_backend_pid();
	SHOW idem_consumer.transient_sqlstates;
	SELECT idem_try_apply('pay:fk:1', 'payments', $fk_sql, ARRAY['10', '999']);
	RESET idem_consumer.transient_sqlstates;
});
is($out, "$pid\n23503", 'a session-level SET of idem_consumer.transient_sqlstates reaches the next client');
like($err, qr/ERROR:  23503: insert or update on table "pay_ledger" violates foreign key constraint/,
	'whose idem_try_apply then raises a foreign-key violation instead of parking it');
($out, $err) = bpsql('pay_app', 'app1', qq{
	BEGIN;
	SET LOCAL idem_consumer.transient_sqlstates = '23503';
	SELECT idem_try_apply('pay:fk:2', 'payments', $fk_sql, ARRAY['11', '999']);
	ROLLBACK;
});
like($err, qr/ERROR:  23503/, 'SET LOCAL applies to its own transaction');
($out, $err) = bpsql('pay_app', 'app1', qq{
	SELECT pg_backend_pid();
	SHOW idem_consumer.transient_sqlstates;
	SELECT idem_try_apply('pay:fk:1', 'payments', $fk_sql, ARRAY['10', '999']);
	SELECT idem_try_apply('pay:fk:1', 'payments', $fk_sql, ARRAY['10', '999']);
});
is($out, "$pid\nIK002\ndead_lettered\ndead_lettered",
	'and not beyond: on the same server connection the next client parks the message, and its redelivery runs nothing');

# Session-level advisory locks too outlive the client that took them.
($out, $err) = bpsql('pay_app', 'app1', q{SELECT pg_backend_pid(); SELECT pg_advisory_lock(4242);});
is($out, "$pid\n", 'a client takes a session-level advisory lock and disconnects');
is($node->safe_psql('postgres', 'SELECT pg_try_advisory_lock(4242)'), 'f',
	'the lock is still held, by the pooled server connection');
($out, $err) = bpsql('pay_app', 'app1', q{SELECT pg_advisory_unlock(4242);});
is($out, 't', 'and the next client on that connection holds it (and here releases it)');

# Session pooling: a server connection serves one client until it leaves,
# then PgBouncer's server_reset_query (DISCARD ALL by default) clears it.
($out, $err) = bpsql('pay_app', 'session_shared',
	q{SELECT pg_backend_pid(); SET ROLE pay_app; SELECT pg_advisory_lock(4243);});
$pid = (split /\n/, $out)[0];
($out, $err) = bpsql('ship_app', 'session_shared', q{SELECT pg_backend_pid(); SELECT current_user;});
is($out, "$pid\npooler",
	'session pooling: the next client of the server connection no longer has the SET ROLE of the last one');
is($node->safe_psql('postgres', 'SELECT pg_try_advisory_lock(4243)'), 't',
	'nor its advisory lock');

# ---------------------------------------------------------------------------
# Dead letters: replayed through the pooler by the operator once the order
# exists.
$node->safe_psql('postgres', 'INSERT INTO orders VALUES (999)');
($out, $err) = bpsql('pay_oncall', 'app', q{
	SELECT status || ':' || sqlstate FROM idem_dead_letters WHERE key = 'pay:fk:1';
	SELECT outcome FROM idem_dlq_replay('payments');
	SELECT status FROM idem_dead_letters WHERE key = 'pay:fk:1';
});
is($out, "pending:23503\napplied\nreplayed",
	'pay_oncall replays the dead letter through the pooler') or diag $err;
is($node->safe_psql('postgres', 'SELECT order_id FROM pay_ledger WHERE id = 10'),
	'999', 'and the ledger row is written once');

# A batch in one statement (docs/batches.md), twice.
my $batch = q{
	WITH new_keys AS (
	    SELECT key FROM idem_record_batch('payments', ARRAY['pay:b:1', 'pay:b:2', 'pay:b:2', 'pay:1']) AS key)
	UPDATE orders SET paid = paid + (SELECT count(*) FROM new_keys) WHERE id = 999 RETURNING paid;
};
($out, $err) = bpsql('pay_app', 'app', $batch . $batch);
is($out, "2\n2", 'a batch through the pooler applies its two new keys, and its redelivery nothing')
  or diag $err;

# ---------------------------------------------------------------------------
# A REVOKE, or a change of owner, takes effect at the next call on a server
# connection that has the consumer and the plan cached.
($out, $err) = bpsql('pay_app', 'app1',
	q{SELECT pg_backend_pid(); SELECT idem_apply('pay:r:1', 'payments', 'update orders set paid = paid + 1 where id = 2');});
$pid = (split /\n/, $out)[0];
is($out, "$pid\nt", 'pay_app applies on a pooled server connection');
$node->safe_psql('postgres', q{SELECT idem_consumer_set_owner('payments', 'team_ship')});
($out, $err) = bpsql('pay_app', 'app1',
	q{SELECT pg_backend_pid(); SELECT idem_apply('pay:r:2', 'payments', 'update orders set paid = paid + 1 where id = 2');});
is($out, $pid, 'the next call, on the same server connection,');
like($err, qr/ERROR:  42501: permission denied for consumer "payments"/,
	'is refused once the consumer belongs to another team');
$node->safe_psql('postgres', q{
	SELECT idem_consumer_set_owner('payments', 'team_pay');
	REVOKE EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") FROM team_pay;
});
($out, $err) = bpsql('pay_app', 'app1',
	q{SELECT pg_backend_pid(); SELECT idem_apply('pay:r:3', 'payments', 'update orders set paid = paid + 1 where id = 2');});
is($out, $pid, 'on the same server connection again,');
like($err, qr/ERROR:  42501: permission denied for function idem_apply/,
	'a REVOKE EXECUTE takes effect at the next call');
$node->safe_psql('postgres', q{
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO team_pay;
	REVOKE team_pay FROM pay_app;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") TO pay_app;
});
($out, $err) = bpsql('pay_app', 'app1',
	q{SELECT idem_apply('pay:r:4', 'payments', 'update orders set paid = paid + 1 where id = 2');});
like($err, qr/ERROR:  42501: permission denied for consumer "payments"/,
	'and so does revoking the membership in the owner');
$node->safe_psql('postgres', q{
	REVOKE EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any") FROM pay_app;
	GRANT team_pay TO pay_app;
});
($out, $err) = bpsql('pay_app', 'app1',
	q{SELECT idem_apply('pay:r:5', 'payments', 'update orders set paid = paid + 1 where id = 2');});
is($out, 't', 'granting it back works at the next call too');
is($node->safe_psql('postgres', q{
	SELECT string_agg(key, ',' ORDER BY key) FROM idem_processed_keys WHERE key LIKE 'pay:r:%'}),
	'pay:r:1,pay:r:5', 'and no refused call recorded its key');

# ---------------------------------------------------------------------------
# Prepared statements.  psycopg 3 (Debian's python3-psycopg).
# beside this file, wherever prove runs it from
my $clientdir = dirname(__FILE__) . '/080_pgbouncer';
my $python = '/usr/bin/python3';

# client CMD...: runs a client program; returns its output lines (and,
# in list context, its error output)
sub client
{
	my ($out, $err) = ('', '');
	IPC::Run::run([@_], '>', \$out, '2>', \$err, IPC::Run::timeout($timeout));
	return ($out, $err) if wantarray;
	diag $err if $err ne '';
	return $out;
}

SKIP:
{
	skip 'python3-psycopg (psycopg 3) is not installed', 8
	  unless system($python, '-c', 'import psycopg') == 0;
	my @py = ($python, "$clientdir/psycopg_client.py", $sockdir, $bport,
		'pay_app', $password{pay_app});
	my $want = join '', map { "c1 $_ t\nc2 $_ f\n" } 1 .. 8;
	is(client(@py, 'py_none', 'apply', 'none', 'py:none'), $want,
		'psycopg 3, prepare_threshold=None: two connections on one server connection, 8 executions each, all right');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_processed_keys WHERE key LIKE 'py:none:%'}),
		'8', 'each of its messages recorded once');
	is(client(@py, 'py_session', 'apply', '5', 'py:session'), $want,
		'session pooling: psycopg 3 with its default prepare_threshold=5 works');

	skip "PgBouncer $bouncer_version tracks prepared statements", 5 if $bouncer_tracks_prepares;
	$out = client(@py, 'py_default', 'apply', '5', 'py:default');
	my @lines = split /\n/, $out;
	is(join("\n", @lines[0 .. 10]) . "\n", join('', map { "c1 $_ t\nc2 $_ f\n" } 1 .. 5) . "c1 6 t\n",
		'psycopg 3, default prepare_threshold=5: the first five executions are not prepared; the sixth of c1 prepares _pg3_0');
	is($lines[11],
		'c2 6 ERROR DuplicatePreparedStatement 42P05 prepared statement "_pg3_0" already exists',
		'and the sixth of c2, on the same server connection, fails');
	$out = client(@py, 'py_zero', 'apply', '0', 'py:zero');
	is(join("\n", (split /\n/, $out)[0, 1]),
		qq{c1 1 t\nc2 1 ERROR DuplicatePreparedStatement 42P05 prepared statement "_pg3_0" already exists},
		'prepare_threshold=0 is not "never" but "at the first execution": the second connection fails at once');
	is(client(@py, 'py_prepare', 'prepare'),
		qq{c1 one\nc2 ERROR DuplicatePreparedStatement 42P05 prepared statement "_pg3_0" already exists\n},
		'prepare=True: the second connection on the server connection fails (42P05)');
	$out = client(@py, 'py_moved', 'moved');
	is((split /\n/, $out)[6],
		'c1 7 ERROR InvalidSqlStatementName 26000 prepared statement "_pg3_0" does not exist',
		'and a statement prepared at the sixth execution is missing when the seventh goes to another server connection (26000)');
}

# psycopg2 (Debian's python3-psycopg2) has no server-side prepared statements.
SKIP:
{
	skip 'python3-psycopg2 is not installed', 2
	  unless system($python, '-c', 'import psycopg2') == 0;
	is(client($python, "$clientdir/psycopg_client.py", $sockdir, $bport,
			'pay_app', $password{pay_app}, 'psycopg2', 'psycopg2', 'py2'),
		join('', map { "c1 $_ t\nc2 $_ f\n" } 1 .. 8),
		'psycopg2: two connections on one server connection, 8 executions each, all right');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_processed_keys WHERE key LIKE 'py2:%'}),
		'8', 'each of its messages recorded once');
}

# node-postgres (test/client/node's), unnamed and named queries.
my $node_modules = dirname(__FILE__) . '/../client/node/node_modules';
SKIP:
{
	skip 'node and node-postgres are needed (npm ci in test/client/node)', 3
	  unless -d "$node_modules/pg" && system('sh', '-c', 'command -v node >/dev/null') == 0;
	local $ENV{NODE_PATH} = $node_modules;
	my @js = ('node', "$clientdir/node_client.js", '127.0.0.1', $bport,
		'pay_app', $password{pay_app});
	is(client(@js, 'node_unnamed', 'unnamed', 'js:unnamed'),
		join('', map { "c1 $_ t\nc2 $_ f\n" } 1 .. 8),
		'node-postgres, unnamed parameterized queries: two clients on one server connection, 8 executions each, all right');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_processed_keys WHERE key LIKE 'js:unnamed:%'}),
		'8', 'each of its messages recorded once');

	skip "PgBouncer $bouncer_version tracks prepared statements", 1 if $bouncer_tracks_prepares;
	$out = client(@js, 'node_named', 'named', 'js:named');
	is(join("\n", (split /\n/, $out)[0, 1]),
		qq{c1 1 t\nc2 1 ERROR 42P05 prepared statement "idem_apply" already exists},
		'a named query: the second client that prepares it on the same server connection fails (42P05)');
}

# pgjdbc (Debian's libpostgresql-jdbc-java), compiled here.
my $jar = '/usr/share/java/postgresql.jar';
my @java;
my $url = "jdbc:postgresql://127.0.0.1:$bport";
SKIP:
{
	skip "javac or $jar is missing", 8
	  unless -f $jar && system('sh', '-c', 'command -v javac >/dev/null') == 0;
	my $classes = PostgreSQL::Test::Utils::tempdir;
	my ($jout, $jerr) = ('', '');
	IPC::Run::run([ 'javac', '-d', $classes, "$clientdir/JdbcApply.java" ],
		'>', \$jout, '2>', \$jerr, IPC::Run::timeout($timeout))
	  or die "javac: $jerr";
	@java = ('java', '-cp', "$jar:$classes", 'JdbcApply');
	my $want = join '', map { "c1 $_ t\nc2 $_ f\n" } 1 .. 8;
	is(client(@java, "$url/jdbc_zero?prepareThreshold=0", 'pay_app', $password{pay_app}, 'jdbc:zero'),
		$want,
		'pgjdbc, prepareThreshold=0: two connections on one server connection, 8 executions each, all right');
	is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_processed_keys WHERE key LIKE 'jdbc:zero:%'}),
		'8', 'each of its messages recorded once');

	is(client(@java, "$url/jdbc_tx_zero?prepareThreshold=0", 'pay_app', $password{pay_app}, 'jdbc:txz', 'transactions'),
		join('', map { "c1 $_ t\nc1 $_ commit\nc2 $_ f\nc2 $_ commit\n" } 1 .. 3),
		'and with autocommit off, each delivery committed');
	skip "PgBouncer $bouncer_version tracks prepared statements", 5 if $bouncer_tracks_prepares;
	$out = client(@java, "$url/jdbc_default", 'pay_app', $password{pay_app}, 'jdbc:default');
	my @lines = split /\n/, $out;
	is(join("\n", @lines[0 .. 8]) . "\n", join('', map { "c1 $_ t\nc2 $_ f\n" } 1 .. 4) . "c1 5 t\n",
		'pgjdbc, default prepareThreshold=5: four executions with unnamed statements, the fifth of c1 prepares S_1');
	is($lines[9], 'c2 5 ERROR 42P05 ERROR: prepared statement "S_1" already exists',
		'and the fifth of c2, on the same server connection, fails (42P05)');
	my $logstart = -s $node->logfile;
	$out = client(@java, "$url/jdbc_moved", 'pay_app', $password{pay_app}, 'jdbc:moved', 'moved');
	is((split /\n/, $out)[6], 'c1 7 t',
		'a statement prepared at the fifth execution and missing on the server connection of the seventh');
	like(slurp_file($node->logfile, $logstart), qr/ERROR:  prepared statement "S_1" does not exist/,
		'is prepared again by pgjdbc, after the server said 26000');
	is(client(@java, "$url/jdbc_tx_default", 'pay_app', $password{pay_app}, 'jdbc:txd', 'transactions'),
		qq{c1 1 t\nc1 1 commit\nc2 1 f\nc2 1 commit ERROR 42P05 ERROR: prepared statement "S_1" already exists\n},
		'autocommit off: pgjdbc prepares COMMIT at its first use, and the second connection on the server connection fails to commit (42P05)');
}

# pgjdbc before 42.7.6 sends extra_float_digits at startup: without
# ignore_startup_parameters PgBouncer refuses the connection.  (Later
# versions set it after connecting, to a server before PostgreSQL 12 only.)
SKIP:
{
	skip "javac or $jar is missing", 1
	  unless -f $jar && system('sh', '-c', 'command -v javac >/dev/null') == 0;
	unzip($jar => \my $manifest, Name => 'META-INF/MANIFEST.MF')
	  or die "cannot read the manifest of $jar: $UnzipError";
	my ($jdbc_version) = $manifest =~ /^Implementation-Version: *(\d+\.\d+\.\d+)/m;
	$jdbc_version //= '0.0.0';
	skip "pgjdbc $jdbc_version sends no extra_float_digits at startup", 1
	  if version->parse("v$jdbc_version") >= version->parse('v42.7.6');
	my $ini = slurp_file("$confdir/pgbouncer.ini");
	$ini =~ s/^ignore_startup_parameters = .*\n//m or die 'no ignore_startup_parameters';
	open $fh, '>', "$confdir/pgbouncer.ini" or die $!;
	print $fh $ini;
	close $fh;
	my $bouncer_pid = slurp_file("$confdir/pgbouncer.pid");
	chomp $bouncer_pid;
	kill 'HUP', $bouncer_pid;
	my $err = '';
	foreach (1 .. 20)
	{
		sleep 1;
		(undef, $err) = client(@java, "$url/jdbc_zero?prepareThreshold=0", 'pay_app', $password{pay_app}, 'jdbc:startup');
		last if $err ne '';
	}
	like($err, qr/FATAL: unsupported startup parameter: extra_float_digits/,
		'without ignore_startup_parameters = extra_float_digits, pgjdbc cannot connect');
}

$bouncer->kill_kill;
$node->stop;
done_testing();
