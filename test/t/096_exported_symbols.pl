# The installed idem_consumer.so exports its entry points and nothing else,
# and takes one of the server's few relcache callback slots.
# The server loads a library with RTLD_GLOBAL, so any other global symbol
# (a helper named business_run, a hash table named stats_hash) can bind to,
# or be bound by, another library's symbol of the same name.  What must stay
# exported: _PG_init, Pg_magic_func, each C function an installed script
# names with 'MODULE_PATHNAME' and its pg_finfo_ record, and the purge
# worker's main function, which the postmaster looks up by its name
# (bgw_function_name).
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Only pg_config of the installation under test is run; no server starts.
my $node = PostgreSQL::Test::Cluster->new('symbols');
my $library = $node->config_data('--pkglibdir') . '/idem_consumer.so';
my $scriptdir = $node->config_data('--sharedir') . '/extension';
ok(-f $library, "$library is installed");

# What the scripts of every version make the server look up.
my %expected = map { $_ => 1 } qw(_PG_init Pg_magic_func idem_purge_worker_main);
my @scripts = glob("$scriptdir/idem_consumer--*.sql");
ok(@scripts > 0, 'the extension scripts are installed');
foreach my $script (@scripts)
{
	my $sql = slurp_file($script);
	while ($sql =~ /'MODULE_PATHNAME'\s*,\s*'([A-Za-z_0-9]+)'/g)
	{
		$expected{$1} = 1;
		$expected{"pg_finfo_$1"} = 1;
	}
}

# The dynamic symbols the library defines; absolute ones (type A, which
# some linkers add, such as _end) name no code or data.
my ($out, $err);
IPC::Run::run([ 'nm', '-D', '--defined-only', $library ], '>', \$out, '2>', \$err)
  or die "nm -D --defined-only $library failed: $err";
my %exported;
foreach my $line (split /\n/, $out)
{
	my ($type, $name) = $line =~ /^\S*\s+(\S)\s+(\S+)$/
	  or die "cannot read nm's line: $line";
	next if $type eq 'A';
	$name =~ s/@.*//;
	$exported{$name} = 1;
}

my @unexpected = sort grep { !$expected{$_} } keys %exported;
my @missing = sort grep { !$exported{$_} } keys %expected;
is(scalar(@unexpected), 0,
	'no symbol is exported but the entry points')
  or diag('exported but not an entry point: ' . join(' ', @unexpected));
is(scalar(@missing), 0, 'every entry point is exported')
  or diag('entry point not exported: ' . join(' ', @missing));

# A process has room for ten relcache callbacks, for every library it
# loads: a walsender of a Citus worker loads Citus and pgoutput beside
# this library, and ran out of them (a shard move then waited forever for
# its logical replication) when the modules each registered their own.
# The library registers one, which calls the modules' (storage.c).
IPC::Run::run([ 'objdump', '-d', $library ], '>', \$out, '2>', \$err)
  or die "objdump -d $library failed: $err";
my @sites = $out =~ /\b(?:call|jmp)\s+\S+\s+<CacheRegisterRelcacheCallback\@plt>/g;
is(scalar(@sites), 1, 'the library registers one relcache callback');

done_testing();
