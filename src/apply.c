/*-------------------------------------------------------------------------
 *
 * apply.c
 *	  The SQL-callable API: idem_apply(), idem_is_processed() and
 *	  idem_forget(), and the reader of the arguments of a message that
 *	  idem_apply() and idem_try_apply() share.  Puts the argument
 *	  validators (args.c), the key store, at the place a call's key lives
 *	  (key_place.h: the node's keys, or routed.c's for a call with a
 *	  route), and business plans together.
 *
 * idem_apply() checks everything that can be checked before it records the
 * key (arguments, the SQL text, the parameter values), so that a bad call
 * records nothing even when the caller catches the error.  It then records
 * the key and runs the business SQL in the caller's transaction: if the
 * business SQL raises, the error propagates as it is and the transaction's
 * rollback removes the key with everything else.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/apply.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

PG_FUNCTION_INFO_V1(idem_apply);
PG_FUNCTION_INFO_V1(idem_is_processed);
PG_FUNCTION_INFO_V1(idem_forget);

/*
 * Reads and checks the arguments of idem_apply or idem_try_apply: key,
 * consumer, sql and params; event_time, finite if given; the caller's
 * fingerprint, where the function has one (1.1 on); expect_rows, a
 * number of rows of at least 0 (NULL and 0 demand nothing), and the
 * route, where the function has them (1.2 on).  The SQL text and the
 * parameters' values are checked later, by their plan.
 */
void
get_message_args(FunctionCallInfo fcinfo, MessageArgs *args)
{
	int			nargs = PG_NARGS();

	args->key = get_key_arg(fcinfo, 0);
	args->consumer = get_consumer_arg(fcinfo, 1);
	args->sql = get_sql_arg(fcinfo, 2);
	args->params = PG_ARGISNULL(3) ? NULL : PG_GETARG_ARRAYTYPE_P(3);
	args->event_time.isnull = PG_ARGISNULL(4);
	args->event_time.value = PG_GETARG_DATUM(4);
	if (!args->event_time.isnull &&
		TIMESTAMP_NOT_FINITE(DatumGetTimestampTz(args->event_time.value)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event_time must be a finite timestamp"),
				 errhint("Pass the time the message was produced, or NULL if it is unknown.")));
	args->fingerprint = nargs <= 5 || PG_ARGISNULL(5) ? NULL :
		get_name_arg(fcinfo, 5, "fingerprint", IDEM_MAX_KEY_BYTES);
	args->expect_rows = nargs <= 6 || PG_ARGISNULL(6) ? 0 : PG_GETARG_INT64(6);
	if (args->expect_rows < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("expect_rows must not be negative"),
				 errdetail("The value given is " INT64_FORMAT ".", args->expect_rows),
				 errhint("Pass NULL to demand no rows.")));
	key_place_resolve(fcinfo, 7, args->consumer, UNROUTED_REFUSED, &args->place);
}

/*
 * idem_apply(key, consumer, sql, params, event_time, fingerprint,
 * expect_rows, route): records (consumer, key) and runs sql with params,
 * demanding that it affect at least expect_rows rows; returns whether it
 * ran: false, running nothing, if the key was already recorded for the
 * same message, and IK001 if it was recorded for another one.  A route is
 * used where keys are routed (routed.c).  The 1.0 function has the first
 * five arguments, the 1.1 one six (get_message_args).
 */
Datum
idem_apply(PG_FUNCTION_ARGS)
{
	MessageArgs args;
	BusinessPlan *bplan;
	ParamListInfo bound_params;
	int32		consumer_id;
	bool		check_fingerprint;
	int32		fingerprint;
	RecordedKey recorded = {0};
	bool		applied;
	int			call;

	get_message_args(fcinfo, &args);

	/* a role refused for the consumer must not show in its counters */
	SPI_connect();
	consumer_id = keystore_consumer_id_and_fp_check(args.consumer, false,
													&check_fingerprint);
	call = stats_call_begin(args.consumer);

	bplan = business_plan_get(args.sql);
	bound_params = business_plan_bind(bplan, args.params);
	expect_rows_check_sql(args.expect_rows, args.sql);

	if (consumer_id == 0)
		consumer_id = keystore_consumer_id_and_fp_check(args.consumer, true,
														&check_fingerprint);
	if (check_fingerprint)
		fingerprint = fingerprint_of_bound_call(args.fingerprint,
												business_plan_hashers(bplan),
												bound_params);
	inflight_check_key(consumer_id, args.consumer, args.key, "record");
	inflight_check_call(fcinfo);
	args.place.consumer_id = consumer_id;
	key_place_admit_role(&args.place, "idem_apply", GetUserId());
	applied = key_place_record(&args.place, args.key,
							   check_fingerprint ? &fingerprint : NULL, &recorded);
	if (applied)
	{
		uint64		rows = inflight_execute(consumer_id, args.consumer, args.key,
											bplan, bound_params);

		expect_rows_demand(args.expect_rows, rows, args.consumer, args.key);
	}
	else if (check_fingerprint &&
			 !fingerprint_admits(args.fingerprint, fingerprint, &recorded,
								 args.sql, args.params))
	{
		stats_call_key_reuse(call);
		fingerprint_raise_key_reuse(args.consumer, args.key, fingerprint, &recorded);
	}

	SPI_finish();
	stats_call_end(call, applied ? 1 : 0, applied ? 0 : 1, 0,
				   args.event_time.isnull ? DT_NOBEGIN :
				   DatumGetTimestampTz(args.event_time.value));

	PG_RETURN_BOOL(applied);
}

/*
 * Reads the key, consumer and route of idem_is_processed or idem_forget,
 * the route last where the function has one (1.2 on), and resolves where
 * the key lives, refusing a key without its route where keys are routed.
 */
static text *
key_args(FunctionCallInfo fcinfo, KeyPlace *place)
{
	text	   *key = get_key_arg(fcinfo, 0);

	key_place_resolve(fcinfo, 2, get_consumer_arg(fcinfo, 1), UNROUTED_REFUSED,
					  place);
	return key;
}

/*
 * idem_is_processed(key, consumer, route): whether (consumer, key) is
 * recorded and visible to the current transaction.
 */
Datum
idem_is_processed(PG_FUNCTION_ARGS)
{
	KeyPlace	place;
	text	   *key = key_args(fcinfo, &place);
	bool		exists = false;

	SPI_connect();
	place.consumer_id = keystore_consumer_id(place.consumer, false);
	if (place.consumer_id != 0)
		exists = key_place_exists(&place, key);
	SPI_finish();
	PG_RETURN_BOOL(exists);
}

/*
 * idem_forget(key, consumer, route): removes (consumer, key) so that a
 * redelivery is processed again; returns whether the key was recorded.  A
 * resolved dead-letter entry of the key goes with it; a pending one makes
 * it fail, and so does a key recorded by the current transaction (see
 * keystore_forget_key).  Business SQL may not forget keys at all.
 */
Datum
idem_forget(PG_FUNCTION_ARGS)
{
	KeyPlace	place;
	text	   *key = key_args(fcinfo, &place);
	bool		removed = false;

	SPI_connect();
	place.consumer_id = keystore_consumer_id(place.consumer, false);
	if (place.consumer_id != 0)
		inflight_check_key(place.consumer_id, place.consumer, key, "forget");
	inflight_check_none("idem_forget");
	if (place.consumer_id != 0)
		removed = key_place_forget(&place, key);
	SPI_finish();
	PG_RETURN_BOOL(removed);
}
