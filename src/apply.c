/*-------------------------------------------------------------------------
 *
 * apply.c
 *	  The SQL-callable API: idem_apply(), idem_apply_rows(),
 *	  idem_apply_routed(), idem_apply_rows_routed(), idem_is_processed(),
 *	  idem_forget() and their routed forms.  Puts the
 *	  argument validators (args.c), the key store (or routed.c's keys, for
 *	  a call with a route) and business plans together.
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
PG_FUNCTION_INFO_V1(idem_apply_rows);
PG_FUNCTION_INFO_V1(idem_apply_routed);
PG_FUNCTION_INFO_V1(idem_apply_rows_routed);
PG_FUNCTION_INFO_V1(idem_is_processed);
PG_FUNCTION_INFO_V1(idem_forget);
PG_FUNCTION_INFO_V1(idem_is_processed_routed);
PG_FUNCTION_INFO_V1(idem_forget_routed);

/*
 * Records (consumer, key) and runs sql with params, the first four
 * arguments of the call, demanding that it affect at least expect_rows
 * rows (0: any number); sets *rows to the rows it affected.  Returns false,
 * running nothing, if the key was already recorded for the same message,
 * and raises IK001 if it was recorded for another one.  event_time and the
 * fingerprint are the arguments at the positions given; a fingerprint
 * position past the last argument means none (the idem_apply of 1.0).  So
 * does a route position of -1; a route is used where keys are routed
 * (routed.c).
 */
static bool
apply_message(FunctionCallInfo fcinfo, int event_time_argno,
			  int fingerprint_argno, int route_argno, int64 expect_rows,
			  uint64 *rows)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	char	   *sql = get_sql_arg(fcinfo, 2);
	ArrayType  *params = PG_ARGISNULL(3) ? NULL : PG_GETARG_ARRAYTYPE_P(3);
	BusinessPlan *bplan;
	ParamListInfo bound_params;
	TimestampTz event_time = PG_ARGISNULL(event_time_argno) ? DT_NOBEGIN :
		PG_GETARG_TIMESTAMPTZ(event_time_argno);
	text	   *explicit_fingerprint = get_fingerprint_arg(fcinfo, fingerprint_argno);
	int32		consumer_id;
	bool		check_fingerprint;
	int32		fingerprint;
	RecordedKey recorded = {0};
	bool		applied;
	int			call;
	Datum		route = (Datum) 0;
	Oid			route_type = InvalidOid;
	bool		routed;

	check_event_time_arg(fcinfo, event_time_argno);
	routed = route_argno >= 0 &&
		routed_get_route_arg(fcinfo, route_argno, &route, &route_type);

	/* a role refused for the consumer must not show in its counters */
	SPI_connect();
	consumer_id = keystore_consumer_id_and_fp_check(consumer, false,
														&check_fingerprint);
	call = stats_call_begin(consumer);

	bplan = business_plan_get(sql);
	bound_params = business_plan_bind(bplan, params);
	expect_rows_check_sql(expect_rows, sql);

	if (consumer_id == 0)
		consumer_id = keystore_consumer_id_and_fp_check(consumer, true,
														&check_fingerprint);
	if (check_fingerprint)
		fingerprint = fingerprint_of_bound_call(explicit_fingerprint,
												business_plan_hashers(bplan),
												bound_params);
	inflight_check_key(consumer_id, consumer, key, "record");
	inflight_check_call(fcinfo);
	if (routed)
	{
		routed_refuse_two_roles("idem_apply_routed", consumer, GetUserId());
		applied = routed_record_key(route, route_type, consumer, key,
									check_fingerprint ? &fingerprint : NULL,
									&recorded);
	}
	else
		applied = keystore_record_key_fp(consumer_id, key,
										 check_fingerprint ? &fingerprint : NULL,
										 &recorded);
	if (applied)
	{
		*rows = inflight_execute(consumer_id, consumer, key, bplan, bound_params);
		expect_rows_demand(expect_rows, *rows, consumer, key);
	}
	else if (check_fingerprint &&
			 !fingerprint_admits(explicit_fingerprint, fingerprint, &recorded,
								 sql, params))
	{
		stats_call_key_reuse(call);
		fingerprint_raise_key_reuse(consumer, key, fingerprint, &recorded);
	}

	SPI_finish();
	stats_call_end(call, applied ? 1 : 0, applied ? 0 : 1, 0, event_time);

	return applied;
}

/*
 * idem_apply(key, consumer, sql, params, event_time, fingerprint): records
 * (consumer, key) and runs sql with params; returns whether it ran.  The
 * fingerprint argument exists from version 1.1 of the SQL on.
 */
Datum
idem_apply(PG_FUNCTION_ARGS)
{
	uint64		rows;

	PG_RETURN_BOOL(apply_message(fcinfo, 4, 5, -1, 0, &rows));
}

/*
 * idem_apply_routed(key, consumer, sql, params, route, event_time,
 * fingerprint): idem_apply with the key stored beside the business row of
 * route, where keys are routed (Citus); elsewhere the route is not needed,
 * and idem_apply_routed is idem_apply.
 */
Datum
idem_apply_routed(PG_FUNCTION_ARGS)
{
	uint64		rows;

	PG_RETURN_BOOL(apply_message(fcinfo, 5, 6, 4, 0, &rows));
}

/*
 * idem_apply_rows_routed(key, consumer, sql, params, route, expect_rows,
 * event_time, fingerprint): idem_apply_rows with the key stored beside the
 * business row of route, where keys are routed.
 */
Datum
idem_apply_rows_routed(PG_FUNCTION_ARGS)
{
	int64		expect_rows = get_expect_rows_arg(fcinfo, 5);
	uint64		rows;

	if (!apply_message(fcinfo, 6, 7, 4, expect_rows, &rows))
		PG_RETURN_NULL();
	PG_RETURN_INT64((int64) rows);
}

/*
 * idem_apply_rows(key, consumer, sql, params, expect_rows, event_time,
 * fingerprint): idem_apply, raising IK002 if sql affects fewer than
 * expect_rows rows; returns the rows it affected, NULL for a duplicate.
 */
Datum
idem_apply_rows(PG_FUNCTION_ARGS)
{
	int64		expect_rows = get_expect_rows_arg(fcinfo, 4);
	uint64		rows;

	if (!apply_message(fcinfo, 5, 6, -1, expect_rows, &rows))
		PG_RETURN_NULL();
	PG_RETURN_INT64((int64) rows);
}

/*
 * Whether (consumer, key), the first two arguments, is recorded and
 * visible to the current transaction; with the route at route_argno (-1:
 * none) where keys are routed.
 */
static bool
key_is_processed(FunctionCallInfo fcinfo, int route_argno)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	Datum		route = (Datum) 0;
	Oid			route_type = InvalidOid;
	bool		routed = route_argno >= 0 &&
		routed_get_route_arg(fcinfo, route_argno, &route, &route_type);
	int32		consumer_id;
	bool		exists = false;

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	if (consumer_id != 0)
		exists = routed ? routed_key_exists(route, route_type, consumer, key) :
			keystore_key_exists(consumer_id, key);
	SPI_finish();
	return exists;
}

/*
 * Removes (consumer, key), the first two arguments, with the route at
 * route_argno (-1: none) where keys are routed; returns whether the key
 * was recorded.  function_name is the SQL function's, which business SQL
 * may not call.
 */
static bool
forget_message(FunctionCallInfo fcinfo, int route_argno, const char *function_name)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	Datum		route = (Datum) 0;
	Oid			route_type = InvalidOid;
	bool		routed = route_argno >= 0 &&
		routed_get_route_arg(fcinfo, route_argno, &route, &route_type);
	int32		consumer_id;
	bool		removed = false;

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	if (consumer_id != 0)
		inflight_check_key(consumer_id, consumer, key, "forget");
	inflight_check_none(function_name);
	if (consumer_id != 0)
		removed = routed ? routed_forget_key(route, route_type, consumer, key) :
			keystore_forget_key(consumer_id, key);
	SPI_finish();
	return removed;
}

/*
 * idem_is_processed(key, consumer): whether (consumer, key) is recorded
 * and visible to the current transaction.
 */
Datum
idem_is_processed(PG_FUNCTION_ARGS)
{
	routed_refuse_unrouted();
	PG_RETURN_BOOL(key_is_processed(fcinfo, -1));
}

/*
 * idem_forget(key, consumer): removes (consumer, key) so that a redelivery
 * is processed again; returns whether the key was recorded.  A resolved
 * dead-letter entry of the key goes with it; a pending one makes it fail,
 * and so does a key recorded by the current transaction (see
 * keystore_forget_key).  Business SQL may not forget keys at all.
 */
Datum
idem_forget(PG_FUNCTION_ARGS)
{
	routed_refuse_unrouted();
	PG_RETURN_BOOL(forget_message(fcinfo, -1, "idem_forget"));
}

/*
 * idem_is_processed_routed(key, consumer, route): idem_is_processed for a
 * key stored with its route; where keys are not routed, the route is not
 * needed.
 */
Datum
idem_is_processed_routed(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(key_is_processed(fcinfo, 2));
}

/*
 * idem_forget_routed(key, consumer, route): idem_forget for a key stored
 * with its route; where keys are not routed, the route is not needed.
 */
Datum
idem_forget_routed(PG_FUNCTION_ARGS)
{
	PG_RETURN_BOOL(forget_message(fcinfo, 2, "idem_forget_routed"));
}
