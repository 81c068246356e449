# Logical replication of the storage, set up and taken over as
# docs/replication.md says.  A publisher applies messages (each delivered
# twice) and parks one in the dead-letter queue; its storage tables and the
# business table are published, and a subscriber with the same roles and
# the extension receives them.  Forgetting and purging keys on the
# publisher works and the deletes reach the subscriber (which has its own
# identity index for them).  An owner given on the publisher reaches a
# session already connected to the subscriber, and so does a position
# rewound there.  Then the subscriber takes
# over and goes back to the full row as identity: it creates consumers and
# parks messages (new ids, none taken by a replicated row), every message
# the publisher applied is a duplicate there (the balances do not move),
# and new messages apply once.  Roles have other OIDs on the two servers: owners
# replicate by name.
use strict;
use warnings;

use FindBin;
use lib "$FindBin::RealBin/../lib";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use ReplicatedStorage;
use Test::More;

# keys purged one by one, whose deletes replicate row by row
my ($pub, $sub) = start_pair("idem_consumer.key_generation_interval = 0\n");
isnt($pub->safe_psql('postgres', q{SELECT 'team_pay'::regrole::oid}),
	$sub->safe_psql('postgres', q{SELECT 'team_pay'::regrole::oid}),
	'the owner role has another OID on the subscriber');

# Every table of the storage schema has a replica identity that logical
# replication can use: a primary key, or a full row.
my $without_identity = q{
	SELECT coalesce(string_agg(c.relname, ', ' ORDER BY c.relname), '')
	  FROM pg_class c
	 WHERE c.relnamespace = 'idem_consumer'::regnamespace
	   AND c.relkind IN ('r', 'p')
	   AND NOT (c.relreplident IN ('f', 'i')
	            OR (c.relreplident = 'd'
	                AND EXISTS (SELECT FROM pg_index i
	                             WHERE i.indrelid = c.oid AND i.indisprimary)))
};
is($pub->safe_psql('postgres', $without_identity), '',
	'every storage table has a replica identity');

$pub->safe_psql('postgres', q{SELECT idem_consumer_create('payments', 'team_pay')});
publish($pub);

# The subscriber's own index for the deletes it applies (PostgreSQL 15
# finds a row of a full replica identity by a sequential scan otherwise).
$sub->safe_psql('postgres', q{
	CREATE UNIQUE INDEX processed_keys_1_identity
	    ON idem_consumer.processed_keys_1 (consumer_id, key);
	ALTER TABLE idem_consumer.processed_keys_1
	    REPLICA IDENTITY USING INDEX processed_keys_1_identity;
});
subscribe($pub, $sub);

is(apply($pub, 1, 200), '200', 'the publisher applies 200 messages delivered twice once each');
is( $pub->safe_psql(
		'postgres',
		q{SELECT idem_try_apply('paid:bad', 'payments', 'select 1 / 0')},
		extra_params => [ '-U', 'pay_app' ]),
	'dead_lettered',
	'and parks one that fails');
my $expected = $pub->safe_psql('postgres', $balances);
$pub->wait_for_catchup('idem');

is($sub->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE idem_is_processed('paid:' || g, 'payments')) FROM generate_series(1, 200) g"),
	'200', 'the subscriber knows every applied key');
is($sub->safe_psql('postgres', $balances), $expected,
	'and has the balances they made');
is($sub->safe_psql('postgres', q{SELECT status FROM idem_dead_letters WHERE key = 'paid:bad'}),
	'pending', 'and the dead letter');
is( $sub->safe_psql(
		'postgres', q{
		SELECT c.owner::text || ' ' || d.dead_lettered_role::text
		  FROM idem_consumer.consumers c JOIN idem_consumer.dead_letters d USING (consumer_id)
		 WHERE c.name = 'payments'}),
	'team_pay pay_app',
	'with the roles of the subscriber, by name');
is($sub->safe_psql('postgres',
		q{SELECT count(*) FROM idem_stats WHERE consumer = 'payments' AND applied > 0}),
	'0', 'the counters stay with the server that counted them');

# Deletes on the publisher: a key forgotten, keys purged.
my ($rc, $out, $err) = $pub->psql('postgres', q{SELECT idem_forget('paid:7', 'payments')});
is($out, 't', 'idem_forget works on a published key store');
is($err, '', 'without an error');
$pub->safe_psql('postgres', q{
	UPDATE idem_consumer.processed_keys_1 SET processed_at = processed_at - 30 * 86400
	 WHERE key IN (SELECT 'paid:' || g FROM generate_series(101, 150) g);
	SELECT idem_set_retention('payments', '1 day');
});
($rc, $out, $err) = $pub->psql('postgres', q{SELECT idem_purge('payments')});
is($out, '50', 'idem_purge works on a published key store');
is($err, '', 'without an error');
$pub->wait_for_catchup('idem');
is($sub->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE idem_is_processed('paid:' || g, 'payments')) FROM generate_series(1, 200) g"),
	'149', 'the deletes reach the subscriber');
is($sub->safe_psql('postgres', q{SELECT idem_is_processed('paid:7', 'payments')}),
	'f', 'the forgotten key among them');
$pub->safe_psql('postgres', q{SELECT idem_reset_retention('payments')});
$pub->wait_for_catchup('idem');

# Generations switched on the publisher reach the subscriber, and the
# sessions already connected there see them: one that read the generations
# before the switch records no key in the generation sealed upstream, even
# through a statement it prepared before, which nothing else makes it read
# the generations again.
$pub->safe_psql('postgres', q{SELECT idem_consumer_create('switching')});
$pub->wait_for_catchup('idem');
my $connected = $sub->background_psql('postgres', on_error_stop => 1);
$connected->query_safe(q{PREPARE deliver(text) AS SELECT idem_apply($1, 'switching', 'select 1')});
is($connected->query_safe(q{SELECT idem_is_processed('gen:1', 'switching')}),
	'f', 'a session connected to the subscriber reads the generations');
$pub->safe_psql('postgres', q{SELECT idem_key_generation_switch()});
$pub->safe_psql('postgres', q{
	SELECT idem_apply('gen:' || g, 'switching', 'select 1') FROM generate_series(1, 10) g});
$pub->wait_for_catchup('idem');
is($sub->safe_psql('postgres',
		q{SELECT string_agg(generation || ':' || state, ',' ORDER BY epoch) FROM idem_key_generations}),
	'1:sealed,2:current', 'the switch is replicated');

# An owner given on the publisher reaches a session already connected to
# the subscriber, which had the consumer's owner cached: the apply worker's
# change of the row invalidates it there (a trigger enabled ALWAYS).
$_->safe_psql('postgres', 'CREATE ROLE ops_team') for ($pub, $sub);
$pub->safe_psql('postgres', q{SELECT idem_consumer_create('handed', 'team_pay')});
$pub->wait_for_catchup('idem');
$sub->safe_psql('postgres', q{
	CREATE FUNCTION may_read(consumer text) RETURNS text LANGUAGE plpgsql AS $$
	BEGIN
		PERFORM idem_is_processed('h-1', consumer);
		RETURN 'allowed';
	EXCEPTION WHEN insufficient_privilege THEN
		RETURN 'refused';
	END
	$$;
	GRANT EXECUTE ON FUNCTION may_read(text), idem_is_processed(text, text, "any") TO pay_app;
});
my $member = $sub->background_psql('postgres', on_error_stop => 1);
$member->query_safe('SET ROLE pay_app');
is($member->query_safe(q{SELECT may_read('handed')}), 'allowed',
	'a member of the owner reads the consumer on the subscriber');
$pub->safe_psql('postgres', q{SELECT idem_consumer_set_owner('handed', 'ops_team')});
$pub->wait_for_catchup('idem');
is($sub->safe_psql('postgres', q{SELECT owner FROM idem_consumer.consumers WHERE name = 'handed'}),
	'ops_team', 'the new owner is replicated');
is($member->query_safe(q{SELECT may_read('handed')}), 'refused',
	'the session connected there sees it at once: refused');
$pub->safe_psql('postgres', q{SELECT idem_consumer_set_owner('handed', 'team_pay')});
$pub->wait_for_catchup('idem');
is($member->query_safe(q{SELECT may_read('handed')}), 'allowed',
	'and allowed again once the owner is given back');
$member->quit;

# A position rewound on the publisher reaches a session already connected
# to the subscriber, which had it cached: the apply worker's update fires
# a trigger enabled ALWAYS, and the session's next check reads the row
# again (src/position_check.c).  A stale answer would skip the message.
$pub->safe_psql('postgres', q{SELECT idem_position_advance('handed', 'orders', 0, 100)});
$pub->wait_for_catchup('idem');
my $checker = $sub->background_psql('postgres', on_error_stop => 1);
is($checker->query_safe(q{SELECT idem_position_passed('handed', 'orders', 0, 50)}), 't',
	'a session connected to the subscriber finds offset 50 below the position');
$pub->safe_psql('postgres', q{SELECT idem_position_rewind('handed', 'orders', 0, 10, 'replay')});
$pub->wait_for_catchup('idem');
is($sub->safe_psql('postgres', q{SELECT "position" FROM idem_consumer.positions WHERE topic = 'orders'}),
	'10', 'the rewind is replicated');
is($checker->query_safe(q{SELECT idem_position_passed('handed', 'orders', 0, 50)}), 'f',
	'the session connected there sees it at once');
$checker->quit;

# Take over: the subscription stops for good, the publisher is gone.
take_over($sub);
$pub->stop;

is(scalar(grep { $connected->query_safe("EXECUTE deliver('gen:$_')") =~ /^t\s*$/ } 1 .. 12),
	'2', 'after the takeover, that session finds the keys of the current generation');
is($sub->safe_psql('postgres', q{
		SELECT count(*) FROM idem_consumer.processed_keys_2
		 WHERE consumer_id = (SELECT consumer_id FROM idem_consumer.consumers WHERE name = 'switching')}),
	'12', 'and records new ones there');
$connected->quit;

# The subscriber's index goes, and the full row is the identity again,
# in that order.
$sub->safe_psql('postgres', q{
	ALTER TABLE idem_consumer.processed_keys_1 REPLICA IDENTITY FULL;
	DROP INDEX idem_consumer.processed_keys_1_identity;
});
is($sub->safe_psql('postgres', $without_identity), '',
	'the new server has a replica identity on every storage table');

($rc, $out, $err) = $sub->psql('postgres',
	q{SELECT idem_consumer_create('refunds', 'team_pay')},
	extra_params => [ '-U', 'pay_app' ]);
is($err, '', 'the new server creates a consumer');
($rc, $out, $err) = $sub->psql(
	'postgres',
	q{SELECT idem_apply('refund:1', 'chargebacks', 'update accounts set balance = balance - 1 where id = 1')},
	extra_params => [ '-U', 'pay_app' ]);
is($out, 't', 'and one by its first use');
is($err, '', 'without an error');
is($sub->safe_psql('postgres', q{SELECT count(DISTINCT consumer_id) FROM idem_consumer.consumers}),
	'5', 'each with an id of its own');
($rc, $out, $err) = $sub->psql(
	'postgres',
	q{SELECT idem_try_apply('refund:bad', 'refunds', 'select 1 / 0')},
	extra_params => [ '-U', 'pay_app' ]);
is($out, 'dead_lettered', 'it parks a failing message beside the replicated one');
is($err, '', 'without an error');

# The forgotten and purged keys apply again, as they would have on the
# publisher; every other message is a duplicate.
is(apply($sub, 1, 200), '51', 'on the new server the applied messages are duplicates but the 51 forgotten and purged');
is($sub->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE idem_is_processed('paid:' || g, 'payments')) FROM generate_series(1, 200) g"),
	'200', 'every key is recorded again');
$expected = $sub->safe_psql('postgres', $balances);
is(apply($sub, 1, 200), '0', 'a second redelivery runs nothing');
is($sub->safe_psql('postgres', $balances), $expected, 'and leaves the balances as they were');
is(apply($sub, 201, 260), '60', 'new messages apply once');

# Message paid:N adds N: 1 to 260 once, the forgotten and purged ones
# (7, 101 to 150) twice, less the refund.
my $sum = -1;
$sum += $_ for (1 .. 260, 7, 101 .. 150);
is($sub->safe_psql('postgres', q{SELECT sum(balance) FROM accounts}),
	$sum, 'every message was applied exactly once');

$sub->stop;
done_testing();
