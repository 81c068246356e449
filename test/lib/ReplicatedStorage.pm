# test/lib/ReplicatedStorage.pm -- what the TAP files of logical replication
# (t/070, t/071) share: a publisher and a subscriber set up as
# docs/replication.md says, with the same roles, the extension and a
# business table, the storage published and subscribed to, payments
# delivered twice, and the subscriber's takeover.
#
# start_pair(CONF, PUBLISHER_CONF) makes and starts the two nodes, CONF
# added to the configuration of both after the library, PUBLISHER_CONF to
# the publisher's only; the roles get other OIDs on the subscriber, where
# a role is created first, so that owners must replicate by name.
# publish(PUB) gives accounts 1 to 4 to the publisher and publishes the
# storage schema and accounts; subscribe(PUB, SUB) subscribes and waits
# for the copy; take_over(SUB) stops the subscription for good.
# apply(NODE, FROM, TO) delivers messages paid:FROM..TO of consumer
# payments as pay_app, each one twice, and returns how many ran their SQL
# (message paid:N adds N to an account); $balances reads the accounts.
package ReplicatedStorage;

use strict;
use warnings;

use Exporter 'import';
use PostgreSQL::Test::Cluster;

our @EXPORT = qw(start_pair publish subscribe take_over apply $balances);

our $balances = q{SELECT string_agg(id || ':' || balance, ' ' ORDER BY id) FROM accounts};

# the same on both nodes: roles first, then the extension and the
# business table
my $setup = q{
	CREATE ROLE team_pay;
	CREATE ROLE pay_app LOGIN IN ROLE team_pay;
	CREATE EXTENSION idem_consumer;
	CREATE TABLE accounts (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
	GRANT EXECUTE ON FUNCTION idem_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_try_apply(text, text, text, text[], timestamptz, text, bigint, "any"),
	                          idem_consumer_create(text, regrole)
	                          TO team_pay;
	GRANT SELECT, UPDATE ON accounts TO team_pay;
};

sub start_pair
{
	my ($conf, $publisher_conf) = @_;
	my $pub = PostgreSQL::Test::Cluster->new('publisher');
	my $sub = PostgreSQL::Test::Cluster->new('subscriber');
	for my $node ($pub, $sub)
	{
		$node->init(allows_streaming => 'logical');
		$node->append_conf('postgresql.conf',
			"shared_preload_libraries = 'idem_consumer'\n$conf");
		$node->append_conf('postgresql.conf', $publisher_conf)
		  if $node == $pub && defined $publisher_conf;
		$node->start;
		$node->safe_psql('postgres', 'CREATE ROLE only_here') if $node == $sub;
		$node->safe_psql('postgres', $setup);
	}
	return ($pub, $sub);
}

sub publish
{
	my ($pub) = @_;
	$pub->safe_psql('postgres', q{
		INSERT INTO accounts SELECT g FROM generate_series(1, 4) g;
		CREATE PUBLICATION idem FOR TABLES IN SCHEMA idem_consumer, TABLE public.accounts;
	});
}

sub subscribe
{
	my ($pub, $sub) = @_;
	my $pub_conn = $pub->connstr('postgres') =~ s/'/''/gr;
	$sub->safe_psql('postgres',
		"CREATE SUBSCRIPTION idem CONNECTION '$pub_conn' PUBLICATION idem");
	$sub->wait_for_subscription_sync($pub, 'idem');
}

sub take_over
{
	my ($sub) = @_;
	$sub->safe_psql('postgres', q{
		ALTER SUBSCRIPTION idem DISABLE;
		ALTER SUBSCRIPTION idem SET (slot_name = NONE);
		DROP SUBSCRIPTION idem;
	});
}

sub apply
{
	my ($node, $from, $to) = @_;
	return $node->safe_psql(
		'postgres', qq{
		SELECT count(*) FILTER (WHERE idem_apply('paid:' || g, 'payments',
		           'update accounts set balance = balance + \$1::bigint where id = \$2::int',
		           ARRAY[g::text, (g % 4 + 1)::text]))
		  FROM generate_series($from, $to) g, generate_series(1, 2) AS twice
		},
		extra_params => [ '-U', 'pay_app' ]);
}

1;
