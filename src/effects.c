/*-------------------------------------------------------------------------
 *
 * effects.c
 *	  External effects: calls to payment providers, mailers or webhooks
 *	  that a transaction cannot roll back.  The state machine of an effect
 *	  (leases, fencing tokens, the stored result, retries with backoff, the
 *	  dead-letter queue) and its SQL functions: idem_effect_begin,
 *	  _complete, _fail, _heartbeat, the outbox's idem_effect_enqueue and
 *	  idem_effect_claim, and idem_set_effect_policy.
 *
 * An effect is one row per (consumer, key) in idem_consumer.effects:
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
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "idem_consumer.h"
#include "effects_store.h"
#include "effects_fastpath.h"

/* Longest error text idem_effect_fail accepts, in bytes. */
#define MAX_ERROR_BYTES			8192
/* How much of a request an error detail quotes, in bytes. */
#define QUOTED_REQUEST_BYTES	200

/* The labels of the SQL enum idem_effect_action, in this order. */
typedef enum EffectAction
{
	ACTION_EXECUTE,
	ACTION_REPLAY,
	ACTION_BUSY,
	ACTION_WAIT,
	ACTION_DEAD
} EffectAction;

static const char *const action_labels[] = {
	[ACTION_EXECUTE] = "execute",
	[ACTION_REPLAY] = "replay",
	[ACTION_BUSY] = "busy",
	[ACTION_WAIT] = "wait",
	[ACTION_DEAD] = "dead",
};

#define IDEM_EFFECT_COLS 8

/* GUCs: the retry policy of consumers without one of their own */
static int	effect_max_attempts = 5;
static int	effect_base_delay_ms = 1000;
static int	effect_max_delay_ms = 5 * 60 * 1000;

PG_FUNCTION_INFO_V1(idem_effect_begin);
PG_FUNCTION_INFO_V1(idem_effect_complete);
PG_FUNCTION_INFO_V1(idem_effect_fail);
PG_FUNCTION_INFO_V1(idem_effect_heartbeat);
PG_FUNCTION_INFO_V1(idem_effect_enqueue);
PG_FUNCTION_INFO_V1(idem_effect_claim);
PG_FUNCTION_INFO_V1(idem_set_effect_policy);

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
 * Refuses to run inside a transaction block: the lease must commit before
 * the caller acts on it.
 */
static void
require_own_transaction(const char *funcname)
{
	if (IsTransactionBlock())
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("%s cannot run inside a transaction block", funcname),
				 errdetail("The lease must be committed before the provider is called, or other workers cannot see it."),
				 errhint("Call %s as a statement of its own, in autocommit mode, and the business transaction after it.",
						 funcname)));
}

/*
 * Returns a duration argument (a lease, an extension, a delay) in
 * microseconds: not null, positive, at most max_us (MAX_LEASE_US or
 * MAX_DELAY_US), however far beyond it the interval goes.
 */
static int64
get_duration_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
				 int64 max_us)
{
	Interval   *value;
	int64		us;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	value = PG_GETARG_INTERVAL_P(argno);
	us = interval_to_us(value);
	if (us > max_us)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", argname),
				 errdetail("The limit is %s.", max_us == MAX_LEASE_US ? "1 day" : "30 days")));
	if (us <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", argname),
				 errdetail("The value given is %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   PointerGetDatum(value))))));
	return us;
}

/*
 * Returns a microsecond count as an interval datum.
 */
static Datum
us_interval(int64 us)
{
	Interval   *interval = palloc0(sizeof(Interval));

	interval->time = us;
	return IntervalPGetDatum(interval);
}

/*
 * Returns the fence argument: not null, at least 1.
 */
static int64
get_fence_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		fence;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fence must not be null")));
	fence = PG_GETARG_INT64(argno);
	if (fence < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fence must be at least 1"),
				 errdetail("The value given is %lld; fences come from idem_effect_begin or idem_effect_claim.",
						   (long long) fence)));
	return fence;
}

/*
 * Returns a boolean argument that must not be null.
 */
static bool
get_bool_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	return PG_GETARG_BOOL(argno);
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
static void
check_request(const char *consumer, text *key, const EffectRow *row, Jsonb *request)
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
static void
check_fence(const char *consumer, text *key, const EffectRow *row, int64 fence)
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
 * Returns the id of an existing consumer, or raises the error of an
 * effect that does not exist.
 */
static int32
effect_consumer_id(const char *consumer, text *key)
{
	int32		consumer_id = keystore_consumer_id(consumer, false);

	if (consumer_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("effect \"%s\" of consumer \"%s\" does not exist",
						text_to_cstring(key), consumer),
				 errdetail("Consumer \"%s\" has no effects.", consumer),
				 errhint("Call idem_effect_begin first.")));
	return consumer_id;
}

/*
 * Locks an effect row and reads it, or raises the error of an effect that
 * does not exist.
 */
static void
lock_effect(const char *consumer, int32 consumer_id, text *key, EffectRow *row)
{
	if (!effects_fetch(EF_LOCK, consumer_id, key, NULL, NULL, 0, row))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("effect \"%s\" of consumer \"%s\" does not exist",
						text_to_cstring(key), consumer),
				 errhint("Call idem_effect_begin first.")));
}

/*
 * Returns a consumer's retry policy: its own, or the GUCs'.
 */
static EffectPolicy
policy_of(int32 consumer_id)
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
static int64
backoff_us(const EffectPolicy *policy, int32 attempts)
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
static void
kill_effect(const char *consumer, int32 consumer_id, text *key,
			const char *message, const char *detail, bool unknown)
{
	int64		entry_id = effects_park(consumer_id, key, message, detail);
	Datum		args[3];

	if (entry_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("cannot dead-letter effect \"%s\" of consumer \"%s\"",
						text_to_cstring(key), consumer),
				 errdetail("A dead-lettered message of the consumer has the same key."),
				 errhint("Give effects keys of their own, for example with a prefix such as \"charge:\".")));
	args[0] = CStringGetTextDatum(message);
	args[1] = Int64GetDatum(entry_id);
	args[2] = BoolGetDatum(unknown);
	effects_fetch(EF_DEAD, consumer_id, key, args, NULL, 3, NULL);
	stats_count_effect(consumer, EFFECT_DEAD);
}

/*
 * Hands a new lease on a locked effect that is due (pending, waiting and
 * due, or in flight under an expired lease) to the caller, and rereads the
 * row.  A lease that expired in flight is an unknown outcome; if it was
 * the last attempt allowed, the effect dies instead.  Returns
 * ACTION_EXECUTE or ACTION_DEAD.
 */
static EffectAction
take_lease(const char *consumer, int32 consumer_id, EffectRow *row, int64 lease_us)
{
	bool		unknown = row->state == ES_IN_FLIGHT;
	Datum		args[3];

	if (unknown)
	{
		EffectPolicy policy = policy_of(consumer_id);

		stats_count_effect(consumer, EFFECT_UNKNOWN_OUTCOME);
		if (row->attempts >= policy.max_attempts)
		{
			kill_effect(consumer, consumer_id, row->key,
						"lease expired with the outcome unknown",
						psprintf("Attempt %d of %d held fence %lld and neither completed nor failed before its lease expired.",
								 row->attempts, policy.max_attempts, (long long) row->fence),
						true);
			effects_fetch(EF_READ, consumer_id, row->key, NULL, NULL, 0, row);
			return ACTION_DEAD;
		}
	}

	args[0] = Int32GetDatum(row->attempts + 1);
	args[1] = BoolGetDatum(unknown);
	args[2] = us_interval(lease_us);
	effects_fetch(EF_LEASE, consumer_id, row->key, args, NULL, 3, row);
	stats_count_effect(consumer, EFFECT_EXECUTED);
	return ACTION_EXECUTE;
}

/*
 * Returns the enum datum of an action, for an enum type known by OID.
 */
static Datum
action_datum(EffectAction action, Oid enumtypoid)
{
	return DirectFunctionCall2(enum_in, CStringGetDatum(action_labels[action]),
							   ObjectIdGetDatum(enumtypoid));
}

/*
 * idem_effect_begin(consumer, key, request, lease): what the caller is to
 * do about an effect, in its own transaction; see the file header.
 */
Datum
idem_effect_begin(PG_FUNCTION_ARGS)
{
	char	   *consumer;
	text	   *key;
	Jsonb	   *request;
	int64		lease_us;
	TupleDesc	tupdesc;
	EffectRow	row = {.cxt = CurrentMemoryContext};
	EffectAction action;
	int32		consumer_id;
	Datum		values[IDEM_EFFECT_COLS];
	bool		nulls[IDEM_EFFECT_COLS];

	require_own_transaction("idem_effect_begin");
	consumer = get_consumer_arg(fcinfo, 0);
	key = get_key_arg(fcinfo, 1);
	request = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	lease_us = get_duration_arg(fcinfo, 3, "lease", MAX_LEASE_US);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, true);
	for (;;)
	{
		if (effects_insert_leased(consumer_id, key, request,
								  DatumGetIntervalP(us_interval(lease_us)), &row))
		{
			stats_count_effect(consumer, EFFECT_EXECUTED);
			action = ACTION_EXECUTE;
			break;
		}
		/* none if a concurrent purge removed it since the insert looked */
		if (!effects_fetch(EF_LOCK, consumer_id, key, NULL, NULL, 0, &row))
			continue;

		check_request(consumer, key, &row, request);
		switch (row.state)
		{
			case ES_COMPLETED:
				action = ACTION_REPLAY;
				stats_count_effect(consumer, EFFECT_REPLAYED);
				break;
			case ES_DEAD:
				action = ACTION_DEAD;
				break;
			case ES_IN_FLIGHT:
				if (row.lease_live)
				{
					action = ACTION_BUSY;
					stats_count_effect(consumer, EFFECT_BUSY);
				}
				else
					action = take_lease(consumer, consumer_id, &row, lease_us);
				break;
			case ES_WAITING:
				if (!row.due)
				{
					action = ACTION_WAIT;
					break;
				}
				/* FALLTHROUGH */
			default:
				action = take_lease(consumer, consumer_id, &row, lease_us);
				break;
		}
		break;
	}
	SPI_finish();

	/* the fence goes to the lease holder only: it is what lets one complete */
	memset(nulls, true, sizeof(nulls));
	values[0] = action_datum(action, TupleDescAttr(tupdesc, 0)->atttypid);
	nulls[0] = false;
	values[1] = Int64GetDatum(row.fence);
	nulls[1] = action != ACTION_EXECUTE;
	values[2] = PointerGetDatum(row.provider_key);
	nulls[2] = false;
	values[3] = Int32GetDatum(row.attempts);
	nulls[3] = false;
	values[4] = BoolGetDatum(action == ACTION_EXECUTE && row.outcome_unknown);
	nulls[4] = false;
	values[5] = PointerGetDatum(row.result);
	nulls[5] = action != ACTION_REPLAY || row.result == NULL;
	if (action == ACTION_WAIT)
	{
		values[6] = TimestampTzGetDatum(row.retry_at);
		nulls[6] = false;
	}
	else if (action == ACTION_BUSY)
	{
		values[6] = TimestampTzGetDatum(row.lease_until);
		nulls[6] = false;
	}
	values[7] = PointerGetDatum(row.last_error);
	nulls[7] = (action != ACTION_WAIT && action != ACTION_DEAD) || row.last_error == NULL;

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * idem_effect_complete(consumer, key, fence, result, sql, params): stores
 * the result of the lease holder's call in the caller's (business)
 * transaction, and runs the business SQL if given, as idem_apply() does,
 * so that the business transaction can be one statement.
 */
Datum
idem_effect_complete(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	text	   *key = get_key_arg(fcinfo, 1);
	int64		fence = get_fence_arg(fcinfo, 2);
	Jsonb	   *result = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	EffectRow	row = {.cxt = CurrentMemoryContext};
	BusinessPlan *bplan = NULL;
	ParamListInfo bound_params = NULL;
	int32		consumer_id;
	Datum		args[2] = {PointerGetDatum(result), Int64GetDatum(fence)};
	char		argnulls[2] = {result == NULL ? 'n' : ' ', ' '};

	SPI_connect();
	/* like idem_apply, everything about the SQL is checked before any write */
	if (!PG_ARGISNULL(4))
	{
		bplan = business_plan_get(get_sql_arg(fcinfo, 4));
		bound_params = business_plan_bind(bplan, PG_ARGISNULL(5) ? NULL : PG_GETARG_ARRAYTYPE_P(5));
	}
	else if (!PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("params given without sql")));

	consumer_id = effect_consumer_id(consumer, key);
	/* the plain case without the executor; EF_COMPLETE decides the rest */
	if (!effects_fast_complete(effects_table_oid(), consumer_id, key, fence, result))
	{
		effects_fetch(EF_COMPLETE, consumer_id, key, args, argnulls, 2, NULL);
		if (SPI_processed == 0)
		{
			/* not the current lease: find out why, and say so */
			lock_effect(consumer, consumer_id, key, &row);
			check_fence(consumer, key, &row, fence);
			elog(ERROR, "effect was in flight under fence %lld but could not be completed",
				 (long long) fence);
		}
	}
	if (bplan != NULL)
		inflight_execute(consumer_id, consumer, key, bplan, bound_params);
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * idem_effect_fail(consumer, key, fence, error, retryable): records a
 * failed attempt of the lease holder; returns wait (retried later) or dead
 * (parked in the dead-letter queue).
 */
Datum
idem_effect_fail(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	text	   *key = get_key_arg(fcinfo, 1);
	int64		fence = get_fence_arg(fcinfo, 2);
	char	   *error = text_to_cstring(get_name_arg(fcinfo, 3, "error", MAX_ERROR_BYTES));
	bool		retryable = get_bool_arg(fcinfo, 4, "retryable");
	EffectRow	row = {.cxt = CurrentMemoryContext};
	EffectPolicy policy;
	EffectAction action;
	int32		consumer_id;

	SPI_connect();
	consumer_id = effect_consumer_id(consumer, key);
	lock_effect(consumer, consumer_id, key, &row);
	check_fence(consumer, key, &row, fence);
	policy = policy_of(consumer_id);

	if (retryable && row.attempts < policy.max_attempts)
	{
		Datum		args[2];

		args[0] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp() +
									  backoff_us(&policy, row.attempts));
		args[1] = CStringGetTextDatum(error);
		effects_fetch(EF_WAIT, consumer_id, key, args, NULL, 2, NULL);
		action = ACTION_WAIT;
	}
	else
	{
		kill_effect(consumer, consumer_id, key, error,
					retryable ?
					psprintf("Attempt %d of %d failed; no attempts are left.",
							 row.attempts, policy.max_attempts) :
					psprintf("Attempt %d failed permanently.", row.attempts),
					false);
		action = ACTION_DEAD;
	}
	SPI_finish();

	PG_RETURN_DATUM(action_datum(action, get_fn_expr_rettype(fcinfo->flinfo)));
}

/*
 * idem_effect_heartbeat(consumer, key, fence, extend): extends the lease
 * of its holder to now() + extend; false if fence is no longer current.
 */
Datum
idem_effect_heartbeat(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	text	   *key = get_key_arg(fcinfo, 1);
	int64		fence = get_fence_arg(fcinfo, 2);
	int64		extend_us = get_duration_arg(fcinfo, 3, "extend", MAX_LEASE_US);
	EffectRow	row = {.cxt = CurrentMemoryContext};
	int32		consumer_id;
	bool		extended = false;

	SPI_connect();
	consumer_id = effect_consumer_id(consumer, key);
	lock_effect(consumer, consumer_id, key, &row);
	if (fence > row.fence)
		check_fence(consumer, key, &row, fence);	/* raises */
	if (fence == row.fence && row.state == ES_IN_FLIGHT)
	{
		Datum		arg = us_interval(extend_us);

		effects_fetch(EF_HEARTBEAT, consumer_id, key, &arg, NULL, 1, NULL);
		extended = true;
	}
	SPI_finish();

	PG_RETURN_BOOL(extended);
}

/*
 * idem_effect_enqueue(consumer, key, request): adds an effect to the
 * outbox in the caller's transaction; false if the key exists already.
 */
Datum
idem_effect_enqueue(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	text	   *key = get_key_arg(fcinfo, 1);
	Jsonb	   *request;
	EffectRow	row = {.cxt = CurrentMemoryContext};
	int32		consumer_id;
	Datum		arg;
	bool		enqueued;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("request must not be null"),
				 errdetail("The request is what the dispatcher sends to the provider.")));
	request = PG_GETARG_JSONB_P(2);
	arg = JsonbPGetDatum(request);

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, true);
	effects_fetch(EF_ENQUEUE, consumer_id, key, &arg, NULL, 1, NULL);
	enqueued = SPI_processed > 0;
	/* a duplicate's request must match too; a row still invisible cannot be read */
	if (!enqueued && effects_fetch(EF_READ, consumer_id, key, NULL, NULL, 0, &row))
		check_request(consumer, key, &row, request);
	SPI_finish();

	PG_RETURN_BOOL(enqueued);
}

/*
 * idem_effect_claim(consumer, max_count, lease): leases up to max_count
 * due outbox effects of a consumer, oldest first, skipping the rows other
 * dispatchers hold, each with a new fence.
 */
Datum
idem_effect_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *consumer;
	int32		max_count;
	int64		lease_us;
	int32		consumer_id;
	EffectRow  *rows;
	uint64		nrows;

	require_own_transaction("idem_effect_claim");
	consumer = get_consumer_arg(fcinfo, 0);
	max_count = get_count_arg(fcinfo, 1, "max_count");
	lease_us = get_duration_arg(fcinfo, 2, "lease", MAX_LEASE_US);
	InitMaterializedSRF(fcinfo, 0);

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	if (consumer_id != 0)
	{
		Datum		values[2] = {Int32GetDatum(consumer_id), Int32GetDatum(max_count)};

		/* every row is read before the leases overwrite SPI's result */
		effects_execute(EF_LOCK_DUE, values, NULL, 0);
		nrows = SPI_processed;
		rows = palloc0(Max(nrows, 1) * sizeof(EffectRow));
		for (uint64 i = 0; i < nrows; i++)
		{
			rows[i].cxt = rsinfo->econtext->ecxt_per_query_memory;
			effect_row_read(i, &rows[i]);
		}

		for (uint64 i = 0; i < nrows; i++)
		{
			EffectRow  *row = &rows[i];
			Datum		out[6];
			bool		outnulls[6] = {false, false, false, false, false, false};

			if (take_lease(consumer, consumer_id, row, lease_us) != ACTION_EXECUTE)
				continue;
			out[0] = PointerGetDatum(row->key);
			out[1] = PointerGetDatum(row->request);
			outnulls[1] = row->request == NULL;
			out[2] = Int64GetDatum(row->fence);
			out[3] = PointerGetDatum(row->provider_key);
			out[4] = Int32GetDatum(row->attempts);
			out[5] = BoolGetDatum(row->outcome_unknown);
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, outnulls);
		}
	}
	SPI_finish();

	return (Datum) 0;
}

/*
 * idem_set_effect_policy(consumer, max_attempts, base_delay, max_delay):
 * sets a consumer's retry policy for failed effects.
 */
Datum
idem_set_effect_policy(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	int32		max_attempts = get_count_arg(fcinfo, 1, "max_attempts");
	int64		base_us = get_duration_arg(fcinfo, 2, "base_delay", MAX_DELAY_US);
	int64		max_us = get_duration_arg(fcinfo, 3, "max_delay", MAX_DELAY_US);
	Datum		values[4];

	if (max_us < base_us)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_delay must not be shorter than base_delay")));

	SPI_connect();
	values[0] = Int32GetDatum(keystore_consumer_id(consumer, true));
	values[1] = Int32GetDatum(max_attempts);
	values[2] = PG_GETARG_DATUM(2);
	values[3] = PG_GETARG_DATUM(3);
	effects_execute(EF_SET_POLICY, values, NULL, 0);
	SPI_finish();

	PG_RETURN_VOID();
}
