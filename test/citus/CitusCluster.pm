# test/citus/CitusCluster.pm -- what the Citus suite's TAP files share:
# their own cluster of a coordinator and two workers (test/citus/cluster)
# in a temporary directory, stopped when the file ends, also when its time
# bound signals it, and query() on the coordinator.
#
# start(TEMPLATE) makes the directory ($work, from a File::Temp template),
# starts the cluster ($dir, nodes on $port, $port + 1 and $port + 2;
# SCRATCH_PORT, else 55432) and sets @psql, the command that reaches the
# coordinator's test database (CITUS_DB, else idem_citus) with the psql of
# PG_CONFIG's installation.
package CitusCluster;

use strict;
use warnings;

use Exporter 'import';
use File::Basename qw(dirname);
use File::Temp qw(tempdir);

our @EXPORT = qw($work $dir $port @psql start cluster query worker_port);
our ($work, $dir, $port, @psql);

my $cluster_cmd = dirname(__FILE__) . '/cluster';
my $started_by;
my $n_queries = 0;

sub cluster { system('bash', $cluster_cmd, @_) == 0 or die "cluster @_ failed\n"; }

sub start
{
	my ($template) = @_;
	my $bindir = $ENV{PG_CONFIG} ? `"$ENV{PG_CONFIG}" --bindir` : '';
	chomp $bindir;

	$work = tempdir($template, TMPDIR => 1, CLEANUP => 1);
	chmod 0755, $work;
	$dir = "$work/cluster";
	$port = $ENV{SCRATCH_PORT} // 55432;
	# a run stopped by its time bound (run-tests' timeout signals the whole
	# process group) still stops its nodes, in END
	$SIG{TERM} = $SIG{INT} = sub { exit 1; };
	cluster('start', $dir, $port);
	$started_by = $$;
	@psql = ($bindir ? "$bindir/psql" : 'psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1',
		'-h', $dir, '-p', $port, '-U', 'postgres', '-d', $ENV{CITUS_DB} // 'idem_citus');
}

END
{
	# the children (clients, dispatchers) leave the cluster to the parent
	system('bash', $cluster_cmd, 'stop', $dir)
	  if defined $started_by && $$ == $started_by;
}

# query(SQL): run on the coordinator, each statement in a transaction of
# its own; its output, or die
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

sub worker_port { my ($w) = @_; return $port + $w; }

1;
