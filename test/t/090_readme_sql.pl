# Every SQL block of README.md runs as written, in the order a reader meets
# them, in a fresh database of a fresh cluster: a block that a reader
# cannot paste fails here.  The one on Citus runs in the citus suite.  A statement whose line ends with a comment
# giving its result ("-- false", "-- 1") must return exactly that.
use strict;
use warnings;

use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $readme = File::Spec->catfile($ENV{TESTDIR}, '..', 'README.md');
open(my $fh, '<', $readme) or die "cannot read $readme: $!";
my @lines = <$fh>;
close($fh);

# blocks: [ heading, first line number, text ]
my @blocks;
my ($heading, $in_sql, $start, $text) = ('(top)', 0, 0, '');
for my $i (0 .. $#lines)
{
	my $line = $lines[$i];
	if (!$in_sql && $line =~ /^#+\s+(.*?)\s*$/)
	{
		$heading = $1;
	}
	elsif (!$in_sql && $line =~ /^```sql\s*$/)
	{
		($in_sql, $start, $text) = (1, $i + 2, '');
	}
	elsif ($in_sql && $line =~ /^```\s*$/)
	{
		push @blocks, [ $heading, $start, $text ];
		$in_sql = 0;
	}
	elsif ($in_sql)
	{
		$text .= $line;
	}
}
die "README.md has an unterminated sql block" if $in_sql;
cmp_ok(scalar(@blocks), '>=', 5, 'README.md has its sql blocks');

# split_statements TEXT: the statements of TEXT, each as [ sql, result ],
# result being the comment that ends the statement's last line, if any.
# Splits at semicolons outside quotes, dollar quotes and comments.
sub split_statements
{
	my ($sql) = @_;
	my (@statements, $current, $dollar_tag);
	my $state = 'code';
	$current = '';
	my $i = 0;
	my $n = length($sql);
	while ($i < $n)
	{
		my $c = substr($sql, $i, 1);
		my $rest = substr($sql, $i);
		if ($state eq 'quote')
		{
			$current .= $c;
			$state = 'code' if $c eq "'";
			$i++;
		}
		elsif ($state eq 'dollar')
		{
			if (substr($sql, $i, length($dollar_tag)) eq $dollar_tag)
			{
				$current .= $dollar_tag;
				$i += length($dollar_tag);
				$state = 'code';
			}
			else
			{
				$current .= $c;
				$i++;
			}
		}
		elsif ($rest =~ /^(--[^\n]*)/)
		{
			$current .= $1;
			$i += length($1);
		}
		elsif ($c eq "'")
		{
			$current .= $c;
			$state = 'quote';
			$i++;
		}
		elsif ($rest =~ /^(\$[A-Za-z_]*\$)/)
		{
			$dollar_tag = $1;
			$current .= $dollar_tag;
			$i += length($dollar_tag);
			$state = 'dollar';
		}
		elsif ($c eq ';')
		{
			my ($result, $skip) = (undef, 1);
			if ($rest =~ /^;([ \t]*--[ \t]*([^\n]*?)[ \t]*)(?:\n|$)/)
			{
				($result, $skip) = ($2, 1 + length($1));
			}
			push @statements, [ $current . ';', $result ];
			$current = '';
			$i += $skip;
		}
		else
		{
			$current .= $c;
			$i++;
		}
	}
	die "statement without a semicolon: $current" if $current =~ /\S/
	  && $current !~ /^(\s|--[^\n]*)*$/;
	return @statements;
}

my $node = PostgreSQL::Test::Cluster->new('readme');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'idem_consumer'\n");
$node->start;
$node->safe_psql('postgres', 'CREATE DATABASE readme');

# The section on Citus needs a Citus cluster: test/citus/t/001_exactness.pl
# runs its block there.
my @citus = grep { $_->[0] eq 'Scale-out on Citus' } @blocks;
is(scalar(@citus), 1, 'README.md has one sql block on Citus, run by the citus suite');
@blocks = grep { $_->[0] ne 'Scale-out on Citus' } @blocks;

for my $block (@blocks)
{
	my ($where, $line, $sql) = @$block;
	my @statements = split_statements($sql);
	my $script = '';
	for my $k (0 .. $#statements)
	{
		$script .= "\\echo \@\@statement $k\n$statements[$k][0]\n";
	}
	my ($rc, $out, $err) = $node->psql('readme', $script,
		extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
	is($rc, 0, "README.md line $line ($where) runs as written")
	  or diag($err);

	my %output;
	my $k;
	for my $o (split /\n/, $out)
	{
		if ($o =~ /^\@\@statement (\d+)$/)
		{
			$k = $1;
			$output{$k} = [];
		}
		elsif (defined $k)
		{
			push @{ $output{$k} }, $o;
		}
	}
	for my $s (0 .. $#statements)
	{
		my $expected = $statements[$s][1];
		next unless defined $expected;
		my %as_psql = (true => 't', false => 'f');
		$expected = $as_psql{$expected} if exists $as_psql{$expected};
		is(join("\n", @{ $output{$s} // [] }), $expected,
			"README.md line $line ($where): statement "
			  . ($s + 1) . " returns $statements[$s][1]");
	}
}

$node->stop;
done_testing();
