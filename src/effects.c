/*-------------------------------------------------------------------------
 *
 * effects.c
 *	  External effects: calls to payment providers, mailers or webhooks
 *	  that a transaction cannot roll back.  The state machine of an effect:
 *	  leases, fencing tokens, the stored result, retries with backoff, the
 *	  dead-letter queue, and the GUCs of the default retry policy.  Its SQL
 *	  functions are in effects_api.c.
 *
 * An effect is one row per (consumer, key) in idem_consumer.effects, or
 * per (route, consumer, key) in idem_consumer.routed_effects where keys
 * are routed (effects_store.c):
 *
 *	pending		enqueued in the outbox, never leased
 *	in_flight	leased to the holder of the current fence until lease_until
 *	waiting		failed retryably; due again at retry_at
 *	completed	the result is stored; every later begin replays it
 *	dead		failed permanently or out of attempts; parked in the
 *				dead-letter queue, whose replay makes it waiting and due
 *
 * A lease is handed out (begin's "execute", or a claim) only under the
 * row's lock, and every lease raises the fence by one, so fences of a key
 * grow strictly.  Only the current fence of an in-flight effect can
 * complete, fail or extend it: complete and fail lock the row in the
 * business transaction and raise IE001 for any other fence, so a worker
 * whose lease was taken over has its whole transaction rolled back.  A
 * lease that expired in flight says nothing about the provider (the worker
 * may have called it and died), so the next lease is handed out with
 * outcome_unknown set, for the caller to reconcile or rely on the
 * provider's own key, and the flag stays on the row for operators.
 *
 * A lease protects only once others can see it, so begin and claim refuse
 * to run inside a transaction block: their statement's own transaction
 * commits before the caller calls the provider.  PostgreSQL has no
 * autonomous transactions, and a claim inside the business transaction
 * would be invisible, and its external call unprotected, until commit.
 *
 * Counters are bumped when the event happens (stats.c), not at commit: a
 * fenced-off completion and a request mismatch raise, and their
 * transaction never commits.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/pg_prng.h"
#include "executor/spi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "effects.h"
#include "effects_store.h"

/* How much of a request an error detail quotes, in bytes. */
#define QUOTED_REQUEST_BYTES	200

static const char *const action_labels[] = {
	[ACTION_EXECUTE] = "execute",
	[ACTION_REPLAY] = "replay",
	[ACTION_BUSY] = "busy",
	[ACTION_WAIT] = "wait",
	[ACTION_DEAD] = "dead",
};

/* GUCs: the retry policy of consumers without one of their own */
static int	effect_max_attempts = 5;
static int	effect_base_delay_ms = 1000;
static int	effect_max_delay_ms = 5 * 60 * 1000;

/*
 * Defines the GUCs of the default retry policy.
 */
void
effects_init(void)
{
	DefineCustomIntVariable("idem_consumer.effect_max_attempts",
							"Sets how many times an external effect is attempted before it is dead-lettered.",
							"idem_set_effect_policy() overrides it per consumer.",
							&effect_max_attempts,
							5, 1, 1000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("idem_consumer.effect_base_delay",
							"Sets the delay before the first retry of a failed external effect.",
							"Each further retry waits twice as long, up to idem_consumer.effect_max_delay, "
							"with random jitter.",
							&effect_base_delay_ms,
							1000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("idem_consumer.effect_max_delay",
							"Sets the longest delay between retries of a failed external effect.",
							NULL,
							&effect_max_delay_ms,
							5 * 60 * 1000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);
}

/*
 * Returns a microsecond count as an interval datum.
 */
Datum
effect_interval(int64 us)
{
	Interval   *interval = palloc0(sizeof(Interval));

	interval->time = us;
	return IntervalPGetDatum(interval);
}

/*
 * Returns a jsonb value as text for an error detail, cut to a readable
 * length; "NULL" for none.
 */
static char *
quote_request(Jsonb *request)
{
	char	   *text;

	if (request == NULL)
		return "NULL";
	text = DatumGetCString(DirectFunctionCall1(jsonb_out, JsonbPGetDatum(request)));
	if (strlen(text) > QUOTED_REQUEST_BYTES)
	{
		int			cut = pg_mbcliplen(text, strlen(text), QUOTED_REQUEST_BYTES);

		text = psprintf("%.*s...", cut, text);
	}
	return text;
}

/*
 * Raises IE002 unless a call's request is the one stored with the effect
 * (NULL equals only NULL).
 */
void
effect_check_request(const char *consumer, text *key, const EffectRow *row, Jsonb *request)
{
	bool		same;

	if (row->request == NULL || request == NULL)
		same = row->request == NULL && request == NULL;
	else
		same = DatumGetBool(DirectFunctionCall2(jsonb_eq, JsonbPGetDatum(row->request),
												JsonbPGetDatum(request)));
	if (same)
		return;

	stats_count_effect(consumer, EFFECT_REQUEST_MISMATCH);
	ereport(ERROR,
			(errcode(ERRCODE_EFFECT_REQUEST_MISMATCH),
			 errmsg("effect \"%s\" of consumer \"%s\" was requested with a different request",
					text_to_cstring(key), consumer),
			 errdetail("The stored request is %s; this call passed %s.",
					   quote_request(row->request), quote_request(request)),
			 errhint("An effect key names one request: use a new key for a different request.")));
}

/*
 * Raises an error unless fence is the current lease of an in-flight
 * effect: IE001 for a fence that was superseded or whose effect is no
 * longer in flight, 22023 for one never handed out.
 */
void
effect_check_fence(const char *consumer, text *key, const EffectRow *row, int64 fence)
{
	if (fence > row->fence)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fence %lld was never issued for effect \"%s\" of consumer \"%s\"",
						(long long) fence, text_to_cstring(key), consumer),
				 errdetail("The highest fence issued is %lld.", (long long) row->fence)));
	if (fence == row->fence && row->state == ES_IN_FLIGHT)
		return;

	stats_count_effect(consumer, EFFECT_FENCED_OFF);
	ereport(ERROR,
			(errcode(ERRCODE_EFFECT_FENCED_OFF),
			 errmsg("effect \"%s\" of consumer \"%s\" is no longer leased to fence %lld",
					text_to_cstring(key), consumer, (long long) fence),
			 errdetail("The effect is %s under fence %lld.",
					   effect_state_name(row->state), (long long) row->fence),
			 fence < row->fence ?
			 errhint("Another worker took the effect over after the lease expired: roll back and let the message be redelivered.") :
			 errhint("This lease has already been completed or failed.")));
}

/*
 * Sets place->at.consumer_id to the id of an existing consumer, or raises
 * the error of an effect that does not exist.  A routed effect is in its
 * shard whatever node registered its consumer (a begin on the
 * coordinator, a completion delegated to the worker), so its consumer is
 * registered here if this node has not seen it, and the effect's row says
 * whether it exists.
 */
void
effect_consumer_id(EffectPlace *place)
{
	place->at.consumer_id = key_place_consumer_id(&place->at);
	if (place->at.consumer_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("effect \"%s\" of consumer \"%s\" does not exist",
						text_to_cstring(place->key), place->at.consumer),
				 errdetail("Consumer \"%s\" has no effects.", place->at.consumer),
				 errhint("Call idem_effect_begin first.")));
}

/*
 * Locks an effect row and reads it, or raises the error of an effect that
 * does not exist.
 */
void
effect_lock(const EffectPlace *place, EffectRow *row)
{
	if (!effects_fetch(EF_LOCK, place, NULL, NULL, 0, row))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("effect \"%s\" of consumer \"%s\" does not exist",
						text_to_cstring(place->key), place->at.consumer),
				 key_place_routed(&place->at) ?
				 errdetail("No effect of the key is stored under this route.") : 0,
				 errhint("Call idem_effect_begin first.")));
}

/*
 * Returns a consumer's retry policy: its own, or the GUCs'.
 */
EffectPolicy
effect_policy(int32 consumer_id)
{
	EffectPolicy policy;

	if (!effects_policy(consumer_id, &policy))
	{
		policy.max_attempts = effect_max_attempts;
		policy.base_delay_us = (int64) effect_base_delay_ms * 1000;
		policy.max_delay_us = Max((int64) effect_max_delay_ms * 1000, policy.base_delay_us);
	}
	return policy;
}

/*
 * Returns the delay before retrying after failed attempt number attempts:
 * base_delay doubled per earlier attempt, capped at max_delay, of which a
 * random half is jitter ("equal jitter"), so that effects failing together
 * do not come back together.
 */
int64
effect_backoff_us(const EffectPolicy *policy, int32 attempts)
{
	int64		delay = policy->base_delay_us;

	for (int i = 1; i < attempts && delay < policy->max_delay_us; i++)
		delay *= 2;
	delay = Min(delay, policy->max_delay_us);
	return delay / 2 + (int64) (pg_prng_double(&pg_global_prng_state) * (delay - delay / 2));
}

/*
 * Makes a locked effect dead: parks it in the dead-letter queue with the
 * error and records the entry; unknown marks a death by an expired lease.
 */
void
effect_kill(const EffectPlace *place, const char *message, const char *detail,
			bool unknown)
{
	int64		entry_id;
	Datum		args[3];

	if (!effects_park(place, message, detail, &entry_id))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("cannot dead-letter effect \"%s\" of consumer \"%s\"",
						text_to_cstring(place->key), place->at.consumer),
				 errdetail("A dead-lettered message of the consumer has the same key."),
				 errhint("Give effects keys of their own, for example with a prefix such as \"charge:\".")));
	args[0] = CStringGetTextDatum(message);
	args[1] = Int64GetDatum(entry_id);
	args[2] = BoolGetDatum(unknown);
	effects_fetch(EF_DEAD, place, args, NULL, 3, NULL);
	stats_count_effect(place->at.consumer, EFFECT_DEAD);
}

/*
 * Hands a new lease on a locked effect that is due (pending, waiting and
 * due, or in flight under an expired lease) to the caller, and rereads the
 * row.  A lease that expired in flight is an unknown outcome; if it was
 * the last attempt allowed, the effect dies instead.  Returns
 * ACTION_EXECUTE or ACTION_DEAD.
 */
EffectAction
effect_take_lease(const EffectPlace *place, EffectRow *row, int64 lease_us)
{
	bool		unknown = row->state == ES_IN_FLIGHT;
	Datum		args[3];

	if (unknown)
	{
		EffectPolicy policy = effect_policy(place->at.consumer_id);

		stats_count_effect(place->at.consumer, EFFECT_UNKNOWN_OUTCOME);
		if (row->attempts >= policy.max_attempts)
		{
			effect_kill(place, "lease expired with the outcome unknown",
						psprintf("Attempt %d of %d held fence %lld and neither completed nor failed before its lease expired.",
								 row->attempts, policy.max_attempts, (long long) row->fence),
						true);
			effects_fetch(EF_READ, place, NULL, NULL, 0, row);
			return ACTION_DEAD;
		}
	}

	args[0] = Int32GetDatum(row->attempts + 1);
	args[1] = BoolGetDatum(unknown);
	args[2] = effect_interval(lease_us);
	effects_fetch(EF_LEASE, place, args, NULL, 3, row);
	stats_count_effect(place->at.consumer, EFFECT_EXECUTED);
	return ACTION_EXECUTE;
}

/*
 * Returns the enum datum of an action, for an enum type known by OID.
 */
Datum
effect_action_datum(EffectAction action, Oid enumtypoid)
{
	return DirectFunctionCall2(enum_in, CStringGetDatum(action_labels[action]),
							   ObjectIdGetDatum(enumtypoid));
}
