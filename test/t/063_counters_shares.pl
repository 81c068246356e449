# Slots of the counters per database, and who reads them across databases:
# with idem_consumer.max_consumers_per_database, the roles allowed to
# create consumers in one database cannot take the slots of the others:
# one database that creates more consumers than its share gets its share,
# is told so, naming the database and the setting, and another database's
# new consumer still gets counters.  A database at its share reclaims the
# slots of counters reset to zero; a reload changes the share.  A plain
# role reads the counters of its own consumers of its database only,
# pg_monitor every database's.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('shares');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.max_consumers = 16
idem_consumer.max_consumers_per_database = 10
statement_timeout = '60s'
});
$node->start;

$node->safe_psql('postgres', q{
	CREATE ROLE team_greedy LOGIN;
	CREATE ROLE team_quiet LOGIN;
	CREATE ROLE monitoring LOGIN IN ROLE pg_monitor;
});
for my $db ('greedy', 'quiet')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, qq{
		CREATE EXTENSION idem_consumer;
		GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
		                          idem_consumer_create(text, regrole), idem_metrics()
		    TO team_$db;
	});
}

# the greedy team creates 20 consumers: 10 get counters, the others are
# counted as untracked calls, with a warning that names the share
my ($rc, $out, $err) = $node->psql('greedy', q{
	SELECT count(idem_apply('k', 'g-' || g, 'select 1')) FROM generate_series(1, 20) g;
}, extra_params => [ '-U', 'team_greedy' ]);
is($rc, 0, 'the greedy team applies all its messages');
like($err,
	qr/WARNING:  counters of consumer "g-11" are not tracked\nDETAIL:  Database "greedy" holds its share of idem_consumer.max_consumers_per_database consumers \(10\) with counters/,
	'a consumer beyond the share is told which database holds its share');
is($node->safe_psql('greedy', 'SELECT consumers, untracked_calls FROM idem_stats_info'),
	'10|10', 'the greedy database has its share of slots, the other calls untracked');

# another database's new consumer still gets counters
$node->safe_psql('quiet', q{SELECT idem_apply('k', 'q-1', 'select 1')},
	extra_params => [ '-U', 'team_quiet' ]);
is($node->safe_psql('quiet', q{SELECT consumer, applied FROM idem_stats}),
	'q-1|1', 'a consumer of another database gets counters');

# each team reads its own counters, of its own database only
my $greedy_metrics = $node->safe_psql('greedy', 'SELECT idem_metrics()',
	extra_params => [ '-U', 'team_greedy' ]);
like($greedy_metrics, qr/^idem_applied_total\{database="greedy",consumer="g-1"\} 1$/m,
	'a team reads its own consumers in idem_metrics()');
unlike($greedy_metrics, qr/database="quiet"/, 'and nothing of another database');
is($node->safe_psql('greedy', q{SELECT count(*) FROM idem_stats},
	extra_params => [ '-U', 'team_quiet' ]), '0',
	'a role owning nothing in a database reads none of its counters');
my $all = $node->safe_psql('quiet', 'SELECT idem_metrics()',
	extra_params => [ '-U', 'monitoring' ]);
like($all, qr/^idem_applied_total\{database="greedy",consumer="g-1"\} 1$/m,
	'pg_monitor reads another database\'s consumers');
like($all, qr/^idem_applied_total\{database="quiet",consumer="q-1"\} 1$/m,
	'and its own database\'s');

# counters reset to zero leave their slots to a reclaim pass, which a
# database at its share runs
$node->safe_psql('greedy', q{SELECT idem_stats_reset('g-1')});
$node->safe_psql('greedy', q{SELECT idem_apply('k2', 'g-11', 'select 1')},
	extra_params => [ '-U', 'team_greedy' ]);
is($node->safe_psql('greedy',
	q{SELECT string_agg(consumer, ',' ORDER BY consumer) FROM idem_stats WHERE consumer IN ('g-1', 'g-11')}),
	'g-11', 'at its share, a database reclaims a slot reset to zero');

# a reload changes the share
$node->append_conf('postgresql.conf', "idem_consumer.max_consumers_per_database = 0\n");
$node->reload;
$node->safe_psql('greedy', q{SELECT idem_apply('k2', 'g-12', 'select 1')},
	extra_params => [ '-U', 'team_greedy' ]);
is($node->safe_psql('greedy', 'SELECT consumers FROM idem_stats_info'), '11',
	'with no share, a database takes slots beyond it');

$node->stop;
done_testing();
