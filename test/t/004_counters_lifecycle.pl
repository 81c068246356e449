# Counters at the edges of their lifetime: calls of two-phase transactions,
# a counters file of another layout, max_consumers lowered across a
# restart, and idem_consumer.save = off.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('lifecycle');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.max_consumers = 32
max_prepared_transactions = 5
});
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem_consumer;
	CREATE TABLE t (n int NOT NULL);
	INSERT INTO t VALUES (0);
});

sub stats_of
{
	my ($consumer) = @_;
	return $node->safe_psql('postgres',
		"SELECT applied, duplicates, failed FROM idem_stats WHERE consumer = '$consumer'");
}

sub untracked
{
	return $node->safe_psql('postgres', 'SELECT untracked_calls FROM idem_stats_info');
}

# Two-phase commit: PREPARE TRANSACTION does not decide the outcome, so its
# calls are counted as untracked, never as applied or failed.
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_apply('p-1', 'tpc', 'update t set n = n + 1');
	PREPARE TRANSACTION 'tpc-rolled-back';
	ROLLBACK PREPARED 'tpc-rolled-back';
});
is(stats_of('tpc'), '', 'a prepared, then rolled back, message is not counted, and takes no slot');
is(untracked(), '1', 'its call is counted as untracked');
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT idem_apply('p-2', 'tpc', 'update t set n = n + 1');
	SELECT idem_apply('p-2', 'tpc', 'update t set n = n + 1');
	PREPARE TRANSACTION 'tpc-committed';
	COMMIT PREPARED 'tpc-committed';
});
is(stats_of('tpc'), '', 'a prepared, then committed, message is not counted per consumer either');
is(untracked(), '3', 'both of its calls are untracked');
is($node->safe_psql('postgres',
	q{SELECT idem_is_processed('p-1', 'tpc')::text || idem_is_processed('p-2', 'tpc')::text || n FROM t}),
	'falsetrue1', 'deduplication itself follows the prepared transactions\' outcomes');
# one-phase commits are counted as before, in the same session
$node->safe_psql('postgres', q{SELECT idem_apply('p-3', 'tpc', 'select 1')});
is(stats_of('tpc'), '1|0|0', 'a one-phase commit is counted as applied');

# A counters file of another layout is ignored, not read as counters: here
# the header of the format before it was dated (a fixed magic number).
$node->safe_psql('postgres',
	q{SELECT idem_apply('k', 'c' || g, 'select 1') FROM generate_series(1, 20) g});
$node->stop;
my $file = $node->data_dir . '/pg_stat/idem_consumer.stat';
ok(-f $file, 'the counters are saved at a clean shutdown');
my $saved = slurp_file($file);
substr($saved, 0, 4) = pack('V', 0x1de3c0a1);
open(my $fh, '>:raw', $file) or die "cannot write $file: $!";
print $fh $saved;
close($fh);
my $log_offset = -s $node->logfile;
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stats'), '0',
	'a file with the old header loads nothing');
ok($node->log_contains(qr/ignoring invalid data in file "pg_stat\/idem_consumer.stat"/, $log_offset),
	'the server log says why');

# Lowering max_consumers: the saved consumers beyond it are dropped at load.
$node->safe_psql('postgres',
	q{SELECT idem_apply('k2', 'c' || g, 'select 1') FROM generate_series(1, 20) g});
is($node->safe_psql('postgres', 'SELECT consumers FROM idem_stats_info'), '20',
	'20 consumers are counted');
$node->stop;
$node->append_conf('postgresql.conf', "idem_consumer.max_consumers = 16\n");
$node->start;
is($node->safe_psql('postgres', 'SELECT consumers, max_consumers FROM idem_stats_info'), '16|16',
	'after lowering max_consumers to 16, 16 consumers are loaded');
is($node->safe_psql('postgres', 'SELECT count(*), sum(applied) FROM idem_stats'), '16|16',
	'each with its own counters');
# and a new consumer finds the table full
$node->safe_psql('postgres', q{SELECT idem_apply('k', 'c-new', 'select 1')});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_stats WHERE consumer = 'c-new'}), '0',
	'a new consumer beyond max_consumers is not tracked');

# idem_consumer.save = off: nothing is written at shutdown, nothing loaded.
$node->append_conf('postgresql.conf', "idem_consumer.save = off\n");
$node->reload;
# the postmaster writes the file at shutdown: a session it starts after it
# has read the new setting has it too
ok($node->poll_query_until('postgres', q{SELECT current_setting('idem_consumer.save') = 'off'}),
	'the postmaster has read save = off');
$node->stop;
ok(!-e $file, 'with save = off no counters file is written');
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stats'), '0',
	'with save = off the counters start empty after a clean restart');
$node->stop;

done_testing();
