# The counters file carries a CRC-32C of its contents: a file truncated or
# corrupted between a clean shutdown and the next start is ignored, with a
# line in the server log, and the counters start from zero rather than
# from garbage.  A file saved by the 1.1 library is not loaded either.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('counters_file');
$node->init;
$node->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'idem_consumer'
idem_consumer.max_consumers = 16
statement_timeout = '60s'
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem_consumer');

my $file = $node->data_dir . '/pg_stat/idem_consumer.stat';

sub fill
{
	my ($round) = @_;
	$node->safe_psql('postgres',
		"SELECT idem_apply('k-$round-' || g, 'c' || (g % 3), 'select 1') FROM generate_series(1, 30) g");
}

sub rewrite
{
	my ($content) = @_;
	open(my $fh, '>:raw', $file) or die "cannot write $file: $!";
	print $fh $content;
	close($fh);
}

# an intact file loads
fill(1);
$node->restart;
is($node->safe_psql('postgres', 'SELECT sum(applied), sum(key_reuse) FROM idem_stats'), '30|0',
	'an intact file loads its counters');

# a file cut short: the last consumer's counters are missing
$node->stop;
my $saved = slurp_file($file);
rewrite(substr($saved, 0, length($saved) - 1000));
my $offset = -s $node->logfile;
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*), coalesce(sum(applied), 0) FROM idem_stats'), '0|0',
	'a truncated file loads nothing');
ok($node->log_contains(qr/ignoring file "pg_stat\/idem_consumer\.stat": checksum mismatch/, $offset),
	'the server log says why')
  or diag(slurp_file($node->logfile, $offset));

# a file whose bytes changed in the middle of a consumer's counters
fill(2);
$node->stop;
$saved = slurp_file($file);
my $at = int(length($saved) / 2);
substr($saved, $at, 16) = "\xff" x 16;
rewrite($saved);
$offset = -s $node->logfile;
$node->start;
is($node->safe_psql('postgres',
	'SELECT count(*), coalesce(min(applied), 0), coalesce(min(key_reuse), 0) FROM idem_stats'), '0|0|0',
	'a corrupted file loads nothing');
ok($node->log_contains(qr/ignoring file "pg_stat\/idem_consumer\.stat": checksum mismatch/, $offset),
	'the server log names the checksum')
  or diag(slurp_file($node->logfile, $offset));

# the counters count again from zero and are saved afresh
fill(3);
$node->restart;
is($node->safe_psql('postgres', 'SELECT sum(applied) FROM idem_stats'), '30',
	'counting starts again from zero and survives the next restart');

# the file of the 1.1 library, whose counters were not per database, is
# not loaded, and the log says so
$node->stop;
$saved = slurp_file($file);
substr($saved, 0, 4) = pack('V', 0x20261203);
rewrite($saved);
$offset = -s $node->logfile;
$node->start;
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_stats'), '0',
	'a counters file of 1.1 loads nothing');
ok($node->log_contains(
		qr/not loading the counters of file "pg_stat\/idem_consumer\.stat", saved by idem_consumer 1\.1 or earlier/,
		$offset),
	'the server log says the counters start from zero once');

$node->stop;
done_testing();
