# Becoming a role versus having its privileges.  Making a role the owner
# of a consumer (creating one for it, giving one to it) and replaying SQL
# that role dead-lettered take the right to SET ROLE to it; acting on its
# consumers takes its privileges.  On every version a member with a plain
# grant does all of it and a role outside does none of it.  From 16 on a
# grant can carry the privileges without the right to become the role
# (WITH INHERIT TRUE, SET FALSE): such a member acts on the consumer but
# may neither make the role an owner nor replay as it.  The README's grant
# of idem_stats_reset to an operator does what it says.
use strict;
use warnings;

use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('set_role_grants');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'idem_consumer'\n");
$node->start;
my $with_set_option = $node->pg_version >= 16;

$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE ROLE team;
	CREATE ROLE member IN ROLE team;
	CREATE ROLE outsider;
	CREATE TABLE divisor (n int);
	INSERT INTO divisor VALUES (0);
	GRANT SELECT ON divisor TO team;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_consumer_create(text, regrole),
	                          idem_consumer_set_owner(text, regrole),
	                          idem_dlq_replay(bigint)
	                          TO team, member, outsider;
	SELECT idem_consumer_create('orders', 'team');
	SELECT idem_consumer_create('spare', 'outsider');
});
$node->safe_psql('postgres', q{
	CREATE ROLE privileges_only;
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_consumer_create(text, regrole),
	                          idem_consumer_set_owner(text, regrole),
	                          idem_dlq_replay(bigint)
	                          TO privileges_only;
	GRANT team TO privileges_only WITH INHERIT TRUE, SET FALSE;
}) if $with_set_option;

# as_role ROLE SQL: runs SQL after SET ROLE ROLE; returns (stdout, stderr)
sub as_role
{
	my ($role, $sql) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE $role;\n$sql");
	return ($out, $err);
}

# park KEY: a dead-letter entry of orders that team parked, whose SQL
# succeeds when replayed; returns its id
sub park
{
	my ($key) = @_;
	$node->safe_psql('postgres', 'UPDATE divisor SET n = 0');
	my ($out, $err) = as_role('team',
		qq{SELECT idem_try_apply('$key', 'orders', 'select 1 / n from divisor')});
	is($out, 'dead_lettered', "team parks $key");
	$node->safe_psql('postgres', 'UPDATE divisor SET n = 1');
	return $node->safe_psql('postgres',
		qq{SELECT dead_letter_id FROM idem_consumer.dead_letters WHERE key = '$key'});
}

my ($out, $err);

# a member with a plain grant
($out, $err) = as_role('member', q{SELECT idem_apply('m:1', 'orders', 'select 1')});
is($out, 't', 'a member applies a message of the consumer of its role');
($out, $err) = as_role('member', q{SELECT idem_consumer_create('orders-member', 'team')});
is($err, '', 'and creates a consumer owned by its role');
my $id = park('m:2');
($out, $err) = as_role('member', qq{SELECT idem_dlq_replay($id)});
is($out, 'applied', 'and replays an entry its role parked');

# a role outside
($out, $err) = as_role('outsider', q{SELECT idem_consumer_create('orders-outsider', 'team')});
like($err, qr/permission denied to create consumer "orders-outsider" owned by role "team"/,
	'a role outside cannot create a consumer owned by team');
($out, $err) = as_role('outsider', q{SELECT idem_consumer_set_owner('spare', 'team')});
like($err, qr/permission denied to give consumer "spare" to role "team"/,
	'nor give one of its own to team');

SKIP:
{
	skip 'grants WITH SET FALSE exist from PostgreSQL 16 on', 7 unless $with_set_option;

	($out, $err) = as_role('privileges_only', q{SELECT idem_apply('p:1', 'orders', 'select 1')});
	is($out, 't', 'a member granted WITH SET FALSE applies a message of the consumer of its role');
	($out, $err) = as_role('privileges_only', q{SELECT idem_consumer_create('orders-p', 'team')});
	like($err, qr/permission denied to create consumer "orders-p" owned by role "team"/,
		'but cannot create a consumer owned by that role');
	$node->safe_psql('postgres', q{SELECT idem_consumer_create('spare-p', 'privileges_only')});
	($out, $err) = as_role('privileges_only', q{SELECT idem_consumer_set_owner('spare-p', 'team')});
	like($err, qr/permission denied to give consumer "spare-p" to role "team"/,
		'nor give one of its own to that role');
	$id = park('p:2');
	($out, $err) = as_role('privileges_only', qq{SELECT idem_dlq_replay($id)});
	like($err, qr/permission denied to replay dead-letter entry $id of consumer "orders"/,
		'nor replay an entry that role parked');
	is($node->safe_psql('postgres',
			qq{SELECT status FROM idem_consumer.dead_letters WHERE dead_letter_id = $id}),
		'pending', 'which stays pending');
	is($node->safe_psql('postgres',
			q{SELECT string_agg(consumer, ',' ORDER BY consumer) FROM idem_consumers WHERE consumer LIKE '%-p'}),
		'spare-p', 'no consumer was made for that role');
}

# The README's grant of idem_stats_reset, as written, lets a role that
# owns no consumer reset the counters of a team's, one or all: the EXECUTE
# grant is the permission, as for pg_stat_statements_reset()
my $readme = slurp_file(File::Spec->catfile($ENV{TESTDIR}, '..', 'README.md'));
$readme =~ s/\s+/ /g;
my ($reset_grant) = $readme =~ /`(GRANT EXECUTE ON FUNCTION idem_stats_reset\(text\) TO ops)`/;
ok(defined $reset_grant, 'README.md grants idem_stats_reset to ops');
$node->safe_psql('postgres', "CREATE ROLE ops; $reset_grant");
cmp_ok($node->safe_psql('postgres', q{SELECT applied FROM idem_stats WHERE consumer = 'orders'}),
	'>', 0, 'the team\'s consumer has counted');
($out, $err) = as_role('ops', q{SELECT idem_stats_reset('orders')});
is($err, '', 'ops resets the counters of a team\'s consumer');
is($node->safe_psql('postgres', q{SELECT applied FROM idem_stats WHERE consumer = 'orders'}),
	'0', 'which are zero');
$node->safe_psql('postgres', q{SELECT idem_apply('r:1', 'orders', 'select 1')});
($out, $err) = as_role('ops', q{SELECT idem_stats_reset()});
is($err, '', 'and all of the database\'s');
is($node->safe_psql('postgres', q{SELECT applied FROM idem_stats WHERE consumer = 'orders'}),
	'0', 'which are zero again');
($out, $err) = as_role('outsider', q{SELECT idem_stats_reset('orders')});
like($err, qr/permission denied for function idem_stats_reset/,
	'a role without the grant resets nothing');

$node->stop;
done_testing();
