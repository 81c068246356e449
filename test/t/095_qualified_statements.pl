# Every internal statement names its types, functions and operators with
# their schema, so that nothing it runs depends on the caller's
# search_path: the SQL texts of src/*.c (string literals, joined as the
# compiler joins them, the macros between them standing for their own
# texts, checked where they are defined) are read for a cast or a typed
# literal to a type without its schema (::timestamptz, timestamptz '...'),
# a function called without its schema (now()), an operator without
# OPERATOR(pg_catalog.x), and the constructs that look an operator up by
# name (IN (...), BETWEEN, LIKE, IS DISTINCT FROM, NULLIF, JOIN USING,
# CASE x WHEN).  The type names that the grammar itself maps to pg_catalog
# (integer, bigint, boolean, interval, timestamp ...) and the grammar's
# own forms (COALESCE, EXTRACT, ARRAY(...)) need none.  Every function of
# the extension scripts written in SQL or PL/pgSQL pins search_path to
# pg_catalog; views need nothing, being bound when they are created.
# sql/hostile_search_path.sql runs the statements under a hostile path.
use strict;
use warnings;

use File::Spec;
use Test::More;

my $root = File::Spec->catdir($ENV{TESTDIR}, '..');

my %keyword = map { $_ => 1 } qw(
  SELECT FROM WHERE AND OR NOT IN EXISTS ANY ALL SOME VALUES AS ON USING JOIN
  LATERAL OVER FILTER WITH ARRAY ROW COALESCE GREATEST LEAST CAST EXTRACT
  INTO CONFLICT KEY RETURNING BY UPDATE SET DELETE INSERT WHEN THEN ELSE CASE
  END LIMIT OFFSET UNION INTERSECT EXCEPT GROUPING ORDER GROUP HAVING IS NULL
  OPERATOR LOCK TABLE TABLES EXECUTE FUNCTION PROCEDURE CREATE INDEX ALTER DROP
  TRUNCATE DO NOTHING FOR SKIP LOCKED NOWAIT SHARE SUBSTRING POSITION TRIM
  OVERLAY PARTITION REFERENCES CHECK UNIQUE PRIMARY CONSTRAINT DEFAULT ONLY
  DISTINCT ASC DESC NULLS FIRST LAST INCLUDE TO MODE ATTACH DETACH OF COLLATE
  WINDOW RANGE ROWS ANALYZE VACUUM MATERIALIZED DOUBLE PRECISION ZONE);
# type names the grammar maps to pg_catalog's types itself
my %grammar_type = map { $_ => 1 } qw(int integer smallint bigint boolean
  bool real float numeric decimal char character varchar timestamp time
  interval bit);

# The problems of one SQL text, each a short description.
sub problems
{
	my ($sql) = @_;
	my @found;
	my $s = $sql;
	# what keystore_sql.c and psprintf fill in is qualified where it is made
	$s =~ s/\@\w+\@|%s/idem_consumer.q/g;
	while ($s =~ /(?<![.\w"])([A-Za-z_]\w*)\s+'/g)
	{
		my $w = $1;
		next if $keyword{ uc $w } || $grammar_type{ lc $w } || $w eq 'M';
		next if $w =~ /^(like|ilike|similar|escape)$/i;
		push @found, "typed literal $w '...'";
	}
	$s =~ s/'(?:[^']|'')*'/''/g;
	$s =~ s/"(?:[^"]|"")*"/q/g;
	$s =~ s/OPERATOR\(\s*[a-z_]+\.[^)\s]+\s*\)/ 0 /g;
	while ($s =~ /::\s*([A-Za-z_]\w*)(\s*\.)?/g)
	{
		push @found, "cast ::$1" unless $2 || $grammar_type{ lc $1 };
	}
	while ($s =~ /\bCAST\s*\([^()]*?\bAS\s+([A-Za-z_]\w*)(\s*\.)?/gi)
	{
		push @found, "cast AS $1" unless $2 || $grammar_type{ lc $1 };
	}
	$s =~ s/::\s*[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)?(?:\[\])?/ /g;
	while ($s =~ /(?<![.\w\$])([A-Za-z_]\w*)\s*\(/g)
	{
		my $w = $1;
		next if $keyword{ uc $w } || $grammar_type{ lc $w } || $w eq 'M';
		next if substr($s, 0, $-[1]) =~ /\bAS\s+$/i;    # an alias's columns
		push @found, "function $w()";
	}
	for my $construct ('\bIN\s*\(', '\bBETWEEN\b', '\bI?LIKE\b',
		'\bIS\s+(?:NOT\s+)?DISTINCT\b', '\bNULLIF\b', '\bUSING\s*\(',
		'\bCASE\s+(?!WHEN)\S+\s+WHEN\b')
	{
		push @found, "operator looked up by name in \"$&\""
		  if $s =~ /$construct/i;
	}
	$s =~ s/=>/ /g;                                      # named arguments
	$s =~ s/(^|\bSET\b|,)\s*[\w.]+\s*=(?![=>])/$1 /g;    # assignments
	$s =~ s/\(\s*\*\s*\)|\.\s*\*|\b(?:SELECT|RETURNING)\s+\*|,\s*\*/ /g;
	$s =~ s/-\s*[0-9]/ /g;                               # negative numbers
	push @found, "operator $1" while $s =~ m{([-+*/<>=~!@#%^&|?]+)}g;
	return @found;
}

# The SQL texts of a C file: [line, text].
sub c_statements
{
	my ($file) = @_;
	open(my $fh, '<', $file) or die "cannot read $file: $!";
	local $/;
	my $c = <$fh>;
	close($fh);
	$c =~ s{/\*.*?\*/}{my $m = $&; $m =~ s/[^\n]//g; $m}gse;
	my $lit = qr/"(?:[^"\\\n]|\\.)*"/;
	my @stmts;
	while ($c =~ /($lit(?:\s*(?:$lit|[A-Z][A-Z0-9_]*\b))*)/g)
	{
		my ($run, $pos) = ($1, $-[1]);
		my $sql = '';
		while ($run =~ /\G\s*(?:"((?:[^"\\\n]|\\.)*)"|([A-Z][A-Z0-9_]*))/g)
		{
			if (defined $1)
			{
				my $part = $1;
				$part =~ s/\\[nt]/ /g;
				$part =~ s/\\(["\\])/$1/g;
				$sql .= $part;
			}
			else
			{
				$sql .= $2 =~ /SCHEMA/ ? 'idem_consumer' : ' M ';
			}
		}
		next
		  unless $sql =~ /pg_catalog\.|OPERATOR\(|^\s*(?:SELECT|INSERT INTO|UPDATE \S+ SET|DELETE FROM|WITH|LOCK TABLE|CREATE|ALTER|DROP|TRUNCATE)\b|\b(?:FROM|WHERE|SET|VALUES|RETURNING)\b.*\$[0-9]/;
		push @stmts, [ 1 + (substr($c, 0, $pos) =~ tr/\n//), $sql ];
	}
	return @stmts;
}

# the check finds what it is for
my @bad = (
	"SELECT x::timestamptz", "SELECT timestamptz '2000-01-01'",
	"SELECT now()", "SELECT count(*) FROM t", "WHERE a = \$1",
	"WHERE a OPERATOR(pg_catalog.=) \$1 AND b < 2", "WHERE a IN (1, 2)",
	"SELECT a || b", "WHERE a IS DISTINCT FROM b", "JOIN t USING (a)",
	"SELECT CAST(\$1 AS timestamptz)");
is(scalar(grep { problems($_) } @bad), scalar(@bad), 'the check flags each unqualified form');
my @good = (
	"SELECT x::pg_catalog.timestamptz, '2000-01-01'::pg_catalog.timestamptz",
	"SELECT pg_catalog.count(*), pg_catalog.now() FROM idem_consumer.t AS t (a, b)",
	"UPDATE idem_consumer.t SET a = \$2, b = pg_catalog.now() WHERE a OPERATOR(pg_catalog.=) \$1",
	"SELECT COALESCE(\$1, 0)::bigint, ARRAY(SELECT 1), -1, x.* FROM idem_consumer.t AS x",
	"SELECT CAST(\$1 AS pg_catalog.timestamptz), CAST(\$2 AS bigint)");
is(scalar(grep { problems($_) } @good), 0, 'the check passes qualified forms');

my @found;
for my $file (sort glob(File::Spec->catfile($root, 'src', '*.c')))
{
	my $name = File::Spec->abs2rel($file, $root);
	for my $stmt (c_statements($file))
	{
		push @found, "$name:$stmt->[0]: $_ in: $stmt->[1]" for problems($stmt->[1]);
	}
}
diag($_) for @found;
is(scalar(@found), 0, 'every internal statement of src/*.c is schema-qualified');

# functions of the extension scripts in SQL or PL/pgSQL pin search_path
my @unpinned;
for my $file (sort glob(File::Spec->catfile($root, 'extension', '*.sql')))
{
	open(my $fh, '<', $file) or die "cannot read $file: $!";
	local $/;
	my $script = <$fh>;
	close($fh);
	$script =~ s/--[^\n]*//g;
	$script =~ s/(\$\w*\$).*?\1/\$body\$/gs;
	while ($script =~ /\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([\w.]+)([^;]*);/gi)
	{
		my ($fn, $def) = ($1, $2);
		next if $def =~ /\bLANGUAGE\s+'?c'?\b/i;
		push @unpinned, File::Spec->abs2rel($file, $root) . ": $fn"
		  unless $def =~ /\bSET\s+search_path\s*(?:=|TO)\s*'?pg_catalog\b/i;
	}
}
diag("function without a pinned search_path: $_") for @unpinned;
is(scalar(@unpinned), 0, 'every SQL and PL/pgSQL function of the extension scripts pins search_path');

done_testing();
