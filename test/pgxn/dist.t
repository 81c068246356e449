# The PGXN distribution: META.json follows the PGXN Meta Spec 1.0.0 and
# agrees with idem_consumer.control, and `make dist` packs the committed
# tree into idem_consumer-<version>.zip.
#
# Run from the repository root: prove test/pgxn/dist.t
# (PG_CONFIG in the environment selects the PostgreSQL installation whose
# PGXS the Makefile includes.)
use strict;
use warnings;

use File::Temp qw(tempdir);
use JSON::PP;
use Test::More;

my $meta_text = do { local (@ARGV, $/) = ('META.json'); <> };
my $meta = eval { decode_json($meta_text) };
ok($meta, 'META.json is valid JSON') or diag($@);
$meta ||= {};

# Required keys of the spec, and the optional ones a distribution of ours
# always carries.
for my $key (qw(name abstract version maintainer license provides meta-spec),
	qw(description prereqs resources generated_by tags release_status))
{
	ok(exists $meta->{$key}, "META.json has \"$key\"");
}
is($meta->{name}, 'idem_consumer', 'the distribution is idem_consumer');
is($meta->{'meta-spec'}{version}, '1.0.0', 'it follows version 1.0.0 of the spec');
like($meta->{'meta-spec'}{url} // '', qr{^https://pgxn\.org/meta/spec\.txt$}, 'and links to it');
my $semver = qr/^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$/;
like($meta->{version}, $semver, 'the version is a semantic version');
ok(ref $meta->{maintainer} eq 'ARRAY' ? @{ $meta->{maintainer} } > 0 : length($meta->{maintainer} // ''),
	'a maintainer is named');
like(ref $meta->{license} ? join(',', keys %{ $meta->{license} }) : $meta->{license} // '',
	qr/^(postgresql|bsd|mit|apache_2_0|gpl_[23]|lgpl_[23]_1?|artistic_2|mozilla_[12]_[01]|open_source|restricted|unrestricted|unknown)$/,
	'the license is one the spec names');
like($meta->{release_status} // '', qr/^(stable|testing|unstable)$/, 'the release status is valid');
is($meta->{prereqs}{runtime}{requires}{PostgreSQL}, '15.0.0', 'it requires PostgreSQL 15 or later');
# the same minimum as the build's: src/compat.h refuses an older server
{
	my $compat = do { local (@ARGV, $/) = ('src/compat.h'); <> } // '';
	my ($num) = $compat =~ /^#if PG_VERSION_NUM < (\d+)\s*\n#error/m;
	is(defined $num ? int($num / 10000) . '.0.0' : undef,
		$meta->{prereqs}{runtime}{requires}{PostgreSQL},
		"src/compat.h's lowest PG_VERSION_NUM is META.json's minimum");
}
ok(ref $meta->{resources} eq 'HASH' && %{ $meta->{resources} }, 'resources are given');
ok(ref $meta->{tags} eq 'ARRAY' && @{ $meta->{tags} }, 'tags are given');

# provides: each extension with an existing file and the same version
my $provides = $meta->{provides} // {};
ok(exists $provides->{idem_consumer}, 'it provides the idem_consumer extension');
for my $ext (sort keys %$provides)
{
	ok(-f ($provides->{$ext}{file} // ''), "the file of $ext exists");
	like($provides->{$ext}{version} // '', $semver, "the version of $ext is a semantic version");
	is($provides->{$ext}{version}, $meta->{version}, "the version of $ext is the distribution's");
}

# the control file's default_version, 1.1 or 1.1.0, is the same version
my $control = do { local (@ARGV, $/) = ('idem_consumer.control'); <> };
my ($default_version) = $control =~ /^default_version\s*=\s*'([^']+)'/m;
ok(defined $default_version, 'idem_consumer.control has a default_version');
$default_version //= '';
(my $as_semver = $default_version) =~ s/^(\d+\.\d+)$/$1.0/;
is($as_semver, $meta->{version},
	"META.json's version agrees with default_version $default_version");
ok((grep { -f $_ } glob("extension/idem_consumer--*--$default_version.sql")) || $default_version eq '1.0',
	"an update script leads to $default_version");

# make dist: a zip of the committed tree under idem_consumer-<version>/
my $zip = "idem_consumer-$meta->{version}.zip";
unlink $zip;
my $make_out = `make -s dist 2>&1`;
is($?, 0, 'make dist succeeds') or diag($make_out);
ok(-f $zip, "make dist writes $zip");
my @entries = split /\n/, `unzip -Z1 '$zip' 2>&1`;
is($?, 0, 'unzip can list it');
my %in_zip = map { $_ => 1 } @entries;
my $prefix = "idem_consumer-$meta->{version}/";
is((grep { index($_, $prefix) != 0 } @entries), 0, "every file is under $prefix");

my @committed = split /\n/, `git ls-tree -r --name-only HEAD`;
for my $file ('idem_consumer.control', 'Makefile', 'META.json', 'README.md',
	grep { m{^extension/.*\.sql$} } @committed)
{
	ok($in_zip{"$prefix$file"}, "the zip has $file");
}
my @sources = grep { m{^src/} } @committed;
ok(@sources > 0, 'src/ has committed files');
is_deeply([ grep { !$in_zip{"$prefix$_"} } @sources ], [], 'the zip has all of src/');

# what was packed builds: the zip holds a complete PGXS tree
my $dir = tempdir(CLEANUP => 1);
system('unzip', '-q', $zip, '-d', $dir);
my $pg_config = $ENV{PG_CONFIG} // 'pg_config';
my $build = `make -s -C '$dir/$prefix' PG_CONFIG='$pg_config' 2>&1`;
is($?, 0, 'the unpacked distribution builds') or diag($build);
ok(-f "$dir/${prefix}idem_consumer.so", 'into idem_consumer.so');
unlink $zip;

done_testing();
