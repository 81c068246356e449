/*-------------------------------------------------------------------------
 *
 * effects_api.c
 *	  The SQL functions of external effects: idem_effect_begin, _complete,
 *	  _fail, _heartbeat, the outbox's idem_effect_enqueue and
 *	  idem_effect_claim, and idem_set_effect_policy.
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
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

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
 * Decides what the caller of idem_effect_begin is to do about an effect,
 * leasing it when it is the caller's to execute; row is set to the effect
 * as it stands.
 */
static EffectAction
begin_action(const char *consumer, int32 consumer_id, text *key,
			 Jsonb *request, int64 lease_us, EffectRow *row)
{
	EffectAction action;

	for (;;)
	{
		if (effects_insert_leased(consumer_id, key, request,
								  DatumGetIntervalP(effect_interval(lease_us)), row))
		{
			stats_count_effect(consumer, EFFECT_EXECUTED);
			action = ACTION_EXECUTE;
			break;
		}
		/* none if a concurrent purge removed it since the insert looked */
		if (!effects_fetch(EF_LOCK, consumer_id, key, NULL, NULL, 0, row))
			continue;

		effect_check_request(consumer, key, row, request);
		switch (row->state)
		{
			case ES_COMPLETED:
				action = ACTION_REPLAY;
				stats_count_effect(consumer, EFFECT_REPLAYED);
				break;
			case ES_DEAD:
				action = ACTION_DEAD;
				break;
			case ES_IN_FLIGHT:
				if (row->lease_live)
				{
					action = ACTION_BUSY;
					stats_count_effect(consumer, EFFECT_BUSY);
				}
				else
					action = effect_take_lease(consumer, consumer_id, row, lease_us);
				break;
			case ES_WAITING:
				if (!row->due)
				{
					action = ACTION_WAIT;
					break;
				}
				/* FALLTHROUGH */
			default:
				action = effect_take_lease(consumer, consumer_id, row, lease_us);
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

	require_own_transaction("idem_effect_begin");
	consumer = get_consumer_arg(fcinfo, 0);
	key = get_key_arg(fcinfo, 1);
	request = PG_ARGISNULL(2) ? NULL : PG_GETARG_JSONB_P(2);
	lease_us = get_duration_arg(fcinfo, 3, "lease", MAX_LEASE_US);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	SPI_connect();
	action = begin_action(consumer, keystore_consumer_id(consumer, true), key,
						  request, lease_us, &row);
	SPI_finish();

	PG_RETURN_DATUM(begin_result(tupdesc, action, &row));
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
			effect_lock(consumer, consumer_id, key, &row);
			effect_check_fence(consumer, key, &row, fence);
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
	effect_lock(consumer, consumer_id, key, &row);
	effect_check_fence(consumer, key, &row, fence);
	policy = effect_policy(consumer_id);

	if (retryable && row.attempts < policy.max_attempts)
	{
		Datum		args[2];

		args[0] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp() +
									  effect_backoff_us(&policy, row.attempts));
		args[1] = CStringGetTextDatum(error);
		effects_fetch(EF_WAIT, consumer_id, key, args, NULL, 2, NULL);
		action = ACTION_WAIT;
	}
	else
	{
		effect_kill(consumer, consumer_id, key, error,
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
	effect_lock(consumer, consumer_id, key, &row);
	if (fence > row.fence)
		effect_check_fence(consumer, key, &row, fence);	/* raises */
	if (fence == row.fence && row.state == ES_IN_FLIGHT)
	{
		Datum		arg = effect_interval(extend_us);

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
		effect_check_request(consumer, key, &row, request);
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

			if (effect_take_lease(consumer, consumer_id, row, lease_us) != ACTION_EXECUTE)
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
