# Every relative link of the committed Markdown files (README.md, docs/,
# node/README.md, ...) resolves: the file or folder exists, and an anchor
# names a heading of the target as GitHub makes anchors of headings.  Run
# from the top of the repository, by test/run-tests pgxn.
use strict;
use warnings;
use utf8;

use File::Basename qw(dirname);
use File::Spec;
use Test::More;

binmode(Test::More->builder->$_, ':encoding(UTF-8)')
  for qw(output failure_output todo_output);

my @files = grep { /\.md$/ } split /\n/, `git ls-files`;
is($?, 0, 'git ls-files lists the committed files');
ok((grep { $_ eq 'README.md' } @files), 'README.md is among them');

# read_lines FILE: the lines of FILE outside fenced code blocks
sub read_lines
{
	my ($file) = @_;
	open(my $fh, '<:encoding(UTF-8)', $file) or die "cannot read $file: $!";
	my ($fence, @lines) = (undef);
	while (my $line = <$fh>)
	{
		if (defined $fence)
		{
			$fence = undef if $line =~ /^\s*\Q$fence\E\s*$/;
			next;
		}
		if ($line =~ /^\s*(```+|~~~+)/)
		{
			$fence = $1;
			next;
		}
		push @lines, $line;
	}
	close($fh);
	return @lines;
}

# anchors FILE: the anchors GitHub gives the headings of FILE: the text as
# rendered, lower-cased, without punctuation but - and _, spaces made -,
# a repeated anchor suffixed -1, -2, ...
my %anchors_of;
sub anchors
{
	my ($file) = @_;
	return $anchors_of{$file} if $anchors_of{$file};
	my (%seen, %anchors);
	for my $line (read_lines($file))
	{
		next unless $line =~ /^#{1,6}\s+(.*?)\s*#*\s*$/;
		my $text = $1;
		$text =~ s/\[([^\]]*)\]\([^)]*\)/$1/g;
		$text =~ s/<[^>]*>//g;
		$text =~ s/[`*]//g;
		my $slug = lc($text);
		$slug =~ s/[^\p{L}\p{N}\p{M}\p{Pc} -]//g;
		$slug =~ s/ /-/g;
		my $n = $seen{$slug}++;
		$anchors{ $n ? "$slug-$n" : $slug } = 1;
	}
	return $anchors_of{$file} = \%anchors;
}

my $links = 0;
for my $file (@files)
{
	my $dir = dirname($file);
	my $text = join('', read_lines($file));
	$text =~ s/`[^`\n]*`//g;    # inline code is no link
	my @targets = $text =~ /\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g;
	push @targets, $text =~ /^\s*\[[^\]]+\]:\s*(\S+)/mg;
	for my $target (@targets)
	{
		next if $target =~ m{^[a-z][a-z0-9+.-]*:}i;    # http:, mailto:, ...
		$links++;
		my ($path, $anchor) = $target =~ /^([^#]*)(?:#(.*))?$/;
		my $resolved =
		  $path eq '' ? $file : File::Spec->canonpath("$dir/$path");
		1 while $resolved =~ s{(^|/)(?!\.\.(?:/|$))[^/]+/\.\.(?:/|$)}{$1};
		if (!-e $resolved)
		{
			fail("$file: $target: $resolved does not exist");
			next;
		}
		next unless defined $anchor;
		if ($resolved !~ /\.md$/ || !-f $resolved)
		{
			fail("$file: $target: an anchor into a file that is not Markdown");
			next;
		}
		ok(anchors($resolved)->{$anchor}, "$file: $target")
		  or diag("$resolved has no heading whose anchor is #$anchor");
	}
}
cmp_ok($links, '>', 50, "the Markdown files have their links ($links)");

done_testing();
