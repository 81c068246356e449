/*-------------------------------------------------------------------------
 *
 * effects_api.c
 *	  The SQL functions of external effects: idem_effect_begin, _complete,
 *	  _fail, _heartbeat, the outbox's idem_effect_enqueue and
 *	  idem_effect_claim, each with the route of an effect stored with one
 *	  (Citus) last, and idem_set_effect_policy.
 *
 * Each checks its arguments, then moves an effect through the state
 * machine of effects.c; begin and claim refuse to run inside a
 * transaction block, so that their lease commits before the caller calls
 * the provider.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects_api.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "duration.h"
#include "effects.h"
#include "effects_store.h"
#include "effects_fastpath.h"

/* Longest error text idem_effect_fail accepts, in bytes. */
#define MAX_ERROR_BYTES			8192

#define IDEM_EFFECT_COLS 8

PG_FUNCTION_INFO_V1(idem_effect_begin);
PG_FUNCTION_INFO_V1(idem_effect_complete);
PG_FUNCTION_INFO_V1(idem_effect_fail);
PG_FUNCTION_INFO_V1(idem_effect_heartbeat);
PG_FUNCTION_INFO_V1(idem_effect_enqueue);
PG_FUNCTION_INFO_V1(idem_effect_claim);
PG_FUNCTION_INFO_V1(idem_set_effect_policy);

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
 * Reads the consumer and key, the first two arguments, and the route at
 * route_argno, the last of the 1.2 function (the 1.1 one has none), into
 * place; where keys are not routed the route is not needed, and the place
 * is the effect's in idem_consumer.effects.  An effect without its route
 * is refused where keys are routed.
 */
static void
effect_place_args(FunctionCallInfo fcinfo, int route_argno, const char *funcname,
				  EffectPlace *place)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);

	place->key = get_key_arg(fcinfo, 1);
	key_place_resolve_effect(fcinfo, route_argno, consumer, funcname, &place->at);
}

/*
 * Decides what the caller of idem_effect_begin is to do about an effect,
 * leasing it when it is the caller's to execute; row is set to the effect
 * as it stands.
 */
static EffectAction
begin_action(const EffectPlace *place, Jsonb *request, int64 lease_us, EffectRow *row)
{
	EffectAction action;

	for (;;)
	{
		if (effects_insert_leased(place, request,
								  DatumGetIntervalP(effect_interval(lease_us)), row))
		{
			stats_count_effect(place->at.consumer, EFFECT_EXECUTED);
			action = ACTION_EXECUTE;
			break;
		}
		/* none if a concurrent purge removed it since the insert looked */
		if (!effects_fetch(EF_LOCK, place, NULL, NULL, 0, row))
			continue;

		effect_check_request(place->at.consumer, place->key, row, request);
		switch (row->state)
		{
			case ES_COMPLETED:
				action = ACTION_REPLAY;
				stats_count_effect(place->at.consumer, EFFECT_REPLAYED);
				break;
			case ES_DEAD:
				action = ACTION_DEAD;
				break;
			case ES_IN_FLIGHT:
				if (row->lease_live)
				{
					action = ACTION_BUSY;
					stats_count_effect(place->at.consumer, EFFECT_BUSY);
				}
				else
					action = effect_take_lease(place, row, lease_us);
				break;
			case ES_WAITING:
				if (!row->due)
				{
					action = ACTION_WAIT;
					break;
				}
				/* FALLTHROUGH */
			default:
				action = effect_take_lease(place, row, lease_us);
				break;
		}
		break;
	}
	return action;
}

/*
 * Returns idem_effect_begin's result row for an action on an effect.
 */
static Datum
begin_result(TupleDesc tupdesc, EffectAction action, const EffectRow *row)
{
	Datum		values[IDEM_EFFECT_COLS];
	bool		nulls[IDEM_EFFECT_COLS];

	/* the fence goes to the lease holder only: it is what lets one complete */
	memset(nulls, true, sizeof(nulls));
	values[0] = effect_action_datum(action, TupleDescAttr(tupdesc, 0)->atttypid);
	nulls[0] = false;
	values[1] = Int64GetDatum(row->fence);
	nulls[1] = action != ACTION_EXECUTE;
	values[2] = PointerGetDatum(row->provider_key);
	nulls[2] = false;
	values[3] = Int32GetDatum(row->attempts);
	nulls[3] = false;
	values[4] = BoolGetDatum(action == ACTION_EXECUTE && row->outcome_unknown);
	nulls[4] = false;
	values[5] = PointerGetDatum(row->result);
	nulls[5] = action != ACTION_REPLAY || row->result == NULL;
	if (action == ACTION_WAIT)
	{
		values[6] = TimestampTzGetDatum(row->retry_at);
		nulls[6] = false;
	}
	else if (action == ACTION_BUSY)
	{
		values[6] = TimestampTzGetDatum(row->lease_until);
		nulls[6] = false;
	}
	values[7] = PointerGetDatum(row->last_error);
	nulls[7] = (action != ACTION_WAIT && action != ACTION_DEAD) || row->last_error == NULL;

	return HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls));
}

/*
 * idem_effect_begin(consumer, key, request, lease, route): what the caller
 * is to do about an effect, in its own transaction; see the file header.
 */
Datum
idem_effect_begin(PG_FUNCTION_ARGS)
{
	EffectPlace place;
	Jsonb	   *request;
	int64		lease_us;
	TupleDesc	tupdesc;
	EffectRow	row = {.cxt = CurrentMemoryContext};
	EffectAction action;

	/* a call without its route is refused first, as the mistake it is */
	effect_place_args(fcinfo, 4, "idem_effect_begin", &place);
	require_own_transaction("idem_effect_begin");
	inflight_check_call(fcinfo);
	request = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	lease_us = get_duration_arg(fcinfo, 3, "lease", MAX_LEASE_US);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	SPI_connect();
	place.at.consumer_id = keystore_consumer_id(place.at.consumer, true);
	action = begin_action(&place, request, lease_us, &row);
	SPI_finish();

	PG_RETURN_DATUM(begin_result(tupdesc, action, &row));
}

/*
 * idem_effect_complete(consumer, key, fence, result, sql, params, route):
 * stores the result of the lease holder's call in the caller's (business)
 * transaction, and runs the business SQL if given, as idem_apply() does,
 * so that the business transaction can be one statement.
 */
Datum
idem_effect_complete(PG_FUNCTION_ARGS)
{
	const int	sql_argno = 4;
	EffectPlace place;
	int64		fence = get_fence_arg(fcinfo, 2);
	Jsonb	   *result = PG_ARGISNULL(3) ? NULL : PG_GETARG_JSONB_P(3);
	EffectRow	row = {.cxt = CurrentMemoryContext};
	BusinessPlan *bplan = NULL;
	ParamListInfo bound_params = NULL;

	inflight_check_call(fcinfo);
	effect_place_args(fcinfo, 6, "idem_effect_complete", &place);
	SPI_connect();
	/* like idem_apply, everything about the SQL is checked before any write */
	if (!PG_ARGISNULL(sql_argno))
	{
		bplan = business_plan_get(get_sql_arg(fcinfo, sql_argno));
		bound_params = business_plan_bind(bplan, PG_ARGISNULL(sql_argno + 1) ? NULL :
										  PG_GETARG_ARRAYTYPE_P(sql_argno + 1));
		key_place_admit_role(&place.at, "idem_effect_complete", GetUserId());
	}
	else if (!PG_ARGISNULL(sql_argno + 1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("params given without sql")));

	effect_consumer_id(&place);
	if (!effects_complete(&place, fence, result))
	{
		/* not the current lease: find out why, and say so */
		effect_lock(&place, &row);
		effect_check_fence(place.at.consumer, place.key, &row, fence);
		elog(ERROR, "effect was in flight under fence %lld but could not be completed",
			 (long long) fence);
	}
	if (bplan != NULL)
		inflight_execute(place.at.consumer_id, place.at.consumer, place.key, bplan, bound_params);
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * idem_effect_fail(consumer, key, fence, error, retryable, route): records
 * a failed attempt of the lease holder; returns wait (retried later) or
 * dead (parked in the dead-letter queue).
 */
Datum
idem_effect_fail(PG_FUNCTION_ARGS)
{
	EffectPlace place;
	int64		fence = get_fence_arg(fcinfo, 2);
	char	   *error = text_to_cstring(get_name_arg(fcinfo, 3, "error", MAX_ERROR_BYTES));
	bool		retryable = get_bool_arg(fcinfo, 4, "retryable");
	EffectRow	row = {.cxt = CurrentMemoryContext};
	EffectPolicy policy;
	EffectAction action;

	inflight_check_call(fcinfo);
	effect_place_args(fcinfo, 5, "idem_effect_fail", &place);
	SPI_connect();
	effect_consumer_id(&place);
	effect_lock(&place, &row);
	effect_check_fence(place.at.consumer, place.key, &row, fence);
	policy = effect_policy(place.at.consumer_id);

	if (retryable && row.attempts < policy.max_attempts)
	{
		Datum		args[2];

		args[0] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp() +
									  effect_backoff_us(&policy, row.attempts));
		args[1] = CStringGetTextDatum(error);
		effects_fetch(EF_WAIT, &place, args, NULL, 2, NULL);
		action = ACTION_WAIT;
	}
	else
	{
		effect_kill(&place, error,
					retryable ?
					psprintf("Attempt %d of %d failed; no attempts are left.",
							 row.attempts, policy.max_attempts) :
					psprintf("Attempt %d failed permanently.", row.attempts),
					false);
		action = ACTION_DEAD;
	}
	SPI_finish();

	PG_RETURN_DATUM(effect_action_datum(action, get_fn_expr_rettype(fcinfo->flinfo)));
}

/*
 * idem_effect_heartbeat(consumer, key, fence, extend, route): extends the
 * lease of its holder to now() + extend; false if fence is no longer
 * current.
 */
Datum
idem_effect_heartbeat(PG_FUNCTION_ARGS)
{
	EffectPlace place;
	int64		fence = get_fence_arg(fcinfo, 2);
	int64		extend_us = get_duration_arg(fcinfo, 3, "extend", MAX_LEASE_US);
	EffectRow	row = {.cxt = CurrentMemoryContext};
	bool		extended = false;

	inflight_check_call(fcinfo);
	effect_place_args(fcinfo, 4, "idem_effect_heartbeat", &place);
	SPI_connect();
	effect_consumer_id(&place);
	effect_lock(&place, &row);
	if (fence > row.fence)
		effect_check_fence(place.at.consumer, place.key, &row, fence);	/* raises */
	if (fence == row.fence && row.state == ES_IN_FLIGHT)
	{
		Datum		arg = effect_interval(extend_us);

		effects_fetch(EF_HEARTBEAT, &place, &arg, NULL, 1, NULL);
		extended = true;
	}
	SPI_finish();
	PG_RETURN_BOOL(extended);
}

/*
 * idem_effect_enqueue(consumer, key, request, route): adds an effect to
 * the outbox in the caller's transaction; false if the key exists already.
 */
Datum
idem_effect_enqueue(PG_FUNCTION_ARGS)
{
	EffectPlace place;
	Jsonb	   *request;
	EffectRow	row = {.cxt = CurrentMemoryContext};
	Datum		arg;
	bool		enqueued;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("request must not be null"),
				 errdetail("The request is what the dispatcher sends to the provider.")));
	request = PG_GETARG_JSONB_P(2);
	arg = JsonbPGetDatum(request);
	inflight_check_call(fcinfo);
	effect_place_args(fcinfo, 3, "idem_effect_enqueue", &place);

	SPI_connect();
	place.at.consumer_id = keystore_consumer_id(place.at.consumer, true);
	enqueued = effects_fetch(EF_ENQUEUE, &place, &arg, NULL, 1, NULL);
	/* a duplicate's request must match too; a row still invisible cannot be read */
	if (!enqueued && effects_fetch(EF_READ, &place, NULL, NULL, 0, &row))
		effect_check_request(place.at.consumer, place.key, &row, request);
	SPI_finish();
	PG_RETURN_BOOL(enqueued);
}

/*
 * Leases a locked due effect to the claimer and adds it to the result,
 * with its route, under place, as text where the result has a column for
 * it (1.2 on): NULL where keys are not routed.
 */
static void
claim_one(ReturnSetInfo *rsinfo, const EffectPlace *place, EffectRow *row,
		  int64 lease_us)
{
	Datum		out[7];
	bool		outnulls[7] = {false, false, false, false, false, false, !key_place_routed(&place->at)};

	if (effect_take_lease(place, row, lease_us) != ACTION_EXECUTE)
		return;
	out[0] = PointerGetDatum(row->key);
	outnulls[1] = row->request == NULL;
	out[1] = PointerGetDatum(row->request);
	out[2] = Int64GetDatum(row->fence);
	out[3] = PointerGetDatum(row->provider_key);
	out[4] = Int32GetDatum(row->attempts);
	out[5] = BoolGetDatum(row->outcome_unknown);
	if (key_place_routed(&place->at) && rsinfo->setDesc->natts > 6)
	{
		Oid			output;
		bool		isvarlena;

		getTypeOutputInfo(place->at.route_type, &output, &isvarlena);
		out[6] = CStringGetTextDatum(OidOutputFunctionCall(output, place->at.route));
	}
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, outnulls);
}

/*
 * Locks the due effects a statement on the outbox returned and leases
 * each to the claimer; every row is read before the leases overwrite
 * SPI's result.
 */
static void
claim_locked(ReturnSetInfo *rsinfo, EffectPlace *place, int64 lease_us)
{
	uint64		nrows = SPI_processed;
	EffectRow  *rows = palloc0(Max(nrows, 1) * sizeof(EffectRow));

	for (uint64 i = 0; i < nrows; i++)
	{
		rows[i].cxt = rsinfo->econtext->ecxt_per_query_memory;
		effect_row_read(i, &rows[i]);
	}
	for (uint64 i = 0; i < nrows; i++)
	{
		place->key = rows[i].key;
		claim_one(rsinfo, place, &rows[i], lease_us);
	}
}

/*
 * Reads the route of a claim, at argno (the 1.1 function has none): a
 * claim of one route, where keys are routed, sets place to it; a NULL of
 * the routes' type (route => NULL::bigint) is a claim of every route,
 * which sets place to every route and returns true.  A claim without a
 * route (NULL, untyped: the default) is refused where keys are routed.
 */
static bool
claim_route_arg(FunctionCallInfo fcinfo, int argno, const char *consumer,
				EffectPlace *place)
{
	place->key = NULL;
	if (argno < PG_NARGS() && PG_ARGISNULL(argno) &&
		get_fn_expr_argtype(fcinfo->flinfo, argno) != UNKNOWNOID)
	{
		Oid			argtype = get_fn_expr_argtype(fcinfo->flinfo, argno);

		/* every route: the routes read are returned as they are stored */
		if (key_place_every_route(consumer, &place->at) &&
			argtype != place->at.route_type)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("a claim of every route takes a NULL route of the routes' type, %s",
							format_type_be(place->at.route_type)),
					 errhint("Pass route => NULL::%s.", format_type_be(place->at.route_type))));
		return key_place_routed(&place->at);
	}
	key_place_resolve_effect(fcinfo, argno, consumer, "idem_effect_claim", &place->at);
	return false;
}

/*
 * idem_effect_claim(consumer, max_count, lease, route): leases up to
 * max_count due outbox effects of a consumer, oldest first, skipping the
 * rows other dispatchers hold, each with a new fence; where keys are
 * routed, those under route, or under every route for a NULL of the
 * routes' type, and returns each with its route.
 *
 * A claim of one route locks and skips in one statement on the route's
 * shard.  Citus locks rows only in a statement on one shard, so a claim
 * of every route first reads the due effects of all shards, unlocked, then
 * locks each, skipping one another dispatcher holds, and checks again that
 * it is due: two claims lease an effect once, since its lease is handed
 * out only under its row lock.  Its leases on several nodes commit
 * together, with Citus's two-phase commit.
 */
Datum
idem_effect_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	EffectPlace place;
	char	   *consumer;
	int32		max_count;
	int64		lease_us;
	bool		every_route;

	consumer = get_consumer_arg(fcinfo, 0);
	max_count = get_count_arg(fcinfo, 1, "max_count");
	lease_us = get_duration_arg(fcinfo, 2, "lease", MAX_LEASE_US);
	/* a call without its route is refused first, as the mistake it is */
	every_route = claim_route_arg(fcinfo, 3, consumer, &place);
	require_own_transaction("idem_effect_claim");
	inflight_check_call(fcinfo);
	InitMaterializedSRF(fcinfo, 0);

	SPI_connect();

	/*
	 * Routed effects are in the shards whatever node registered their
	 * consumer: a claim on a node that has not seen the consumer yet
	 * registers it, as a begin does, instead of finding nothing.
	 */
	place.at.consumer_id = key_place_consumer_id(&place.at);
	if (place.at.consumer_id != 0 && !every_route)
	{
		/* the unrouted outbox, or one route's */
		effects_lock_due(&place, max_count);
		claim_locked(rsinfo, &place, lease_us);
	}
	else if (place.at.consumer_id != 0)
	{
		Datum	   *routes;
		text	  **keys;
		uint64		n = effects_routed_due(place.at.consumer, max_count, &routes, &keys);

		for (uint64 i = 0; i < n; i++)
		{
			EffectRow	row = {.cxt = rsinfo->econtext->ecxt_per_query_memory};

			place.at.route = routes[i];
			place.key = keys[i];
			if (!effects_fetch(EF_LOCK_DUE_ONE, &place, NULL, NULL, 0, &row))
				continue;
			claim_one(rsinfo, &place, &row, lease_us);
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

	inflight_check_call(fcinfo);
	SPI_connect();
	values[0] = Int32GetDatum(keystore_consumer_id(consumer, true));
	values[1] = Int32GetDatum(max_attempts);
	values[2] = PG_GETARG_DATUM(2);
	values[3] = PG_GETARG_DATUM(3);
	effects_execute(EF_SET_POLICY, values, NULL, 0);
	SPI_finish();

	PG_RETURN_VOID();
}
