/*-------------------------------------------------------------------------
 *
 * try_apply.c
 *	  idem_try_apply(), idem_try_apply_rows() and their routed forms:
 *	  idem_apply(), except that a message whose business SQL fails
 *	  permanently is parked in the dead-letter queue instead of raising.
 *
 * A message is dead-lettered inside the caller's transaction.  Its key is
 * recorded in processed_keys as idem_apply() records it, but outside the
 * subtransaction the business SQL runs in: rolling back the business SQL
 * keeps the key, and the key and the dead-letter row then commit or roll
 * back with the rest of the caller's transaction.  A redelivery finds the
 * key recorded like any duplicate; the dead-letter row, at most one per
 * (consumer, key), tells a parked message from an applied one.  Where keys
 * are routed (routed.c), the key and the row are both stored under the
 * message's route, in colocated shards of one node, so the same holds
 * there: they commit together and move together.
 *
 * What the call itself gets wrong is no failure of the message and is
 * raised before anything is recorded: bad arguments, and SQL text that does
 * not parse as one statement of an accepted kind.  Such text comes from the
 * consumer's code and could never be replayed, so stopping the consumer is
 * the useful outcome.  Whatever depends on the database (names, types,
 * parameter values, execution) is tried inside the subtransaction, where a
 * schema mismatch is a permanent failure like any other.
 *
 * Which errors are permanent is business_run.c's to say.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/try_apply.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/resowner.h"

#include "dead_letter.h"

PG_FUNCTION_INFO_V1(idem_try_apply);
PG_FUNCTION_INFO_V1(idem_try_apply_rows);
PG_FUNCTION_INFO_V1(idem_try_apply_routed);
PG_FUNCTION_INFO_V1(idem_try_apply_rows_routed);

/*
 * Returns the outcome of a redelivery of a recorded key whose dead-letter
 * entry has this status (NULL: none): dead_lettered while the entry is
 * pending or was discarded, duplicate otherwise.
 */
static Outcome
redelivery_outcome(const char *status)
{
	return status != NULL && strcmp(status, "replayed") != 0 ?
		OUTCOME_DEAD_LETTERED : OUTCOME_DUPLICATE;
}

/*
 * Returns the fingerprint of a call of idem_try_apply, the one idem_apply
 * computes for the same call.  The typed values need the plan and the
 * parameters' input conversion, either of which can fail where
 * idem_try_apply parks the message instead of raising; so they run in a
 * subtransaction, and a message that cannot be bound is fingerprinted by
 * its parameters' text, as 1.1 did: every delivery of it fails the same
 * way until the cause is fixed, and fingerprint_admits() accepts the text
 * fingerprint of a redelivery after that.
 */
static int32
fingerprint_of_try_call(text *explicit_fingerprint, const char *sql,
						ArrayType *params)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile int32 fingerprint = 0;

	if (explicit_fingerprint != NULL)
		return fingerprint_of_text(explicit_fingerprint);

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		BusinessPlan *bplan = business_plan_get(sql);

		fingerprint = fingerprint_of_bound(business_plan_hashers(bplan),
										   business_plan_bind(bplan, params));
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		if (business_run_error_is_transient(edata->sqlerrcode))
			ReThrowError(edata);
		FreeErrorData(edata);
		fingerprint = fingerprint_of_message(sql, params);
	}
	PG_END_TRY();
	return fingerprint;
}

/*
 * Parks a message whose key is recorded for another message, unless the
 * key has an entry already; returns its outcome, and clears *redelivered
 * when it made the entry.
 */
static Outcome
park_key_reuse(const DeadLetterPlace *place, text *key,
			   const char *sql, ArrayType *params, NullableDatum event_time,
			   int64 expect_rows, int32 fingerprint,
			   const RecordedKey *recorded, bool *redelivered)
{
	char	   *status = dead_letter_status(place, key);
	ErrorData  *edata;

	/*
	 * One entry per key: the message's own redelivery finds the entry its
	 * first delivery made, and reports it like any parked message.
	 */
	if (status != NULL)
		return redelivery_outcome(status);

	edata = fingerprint_key_reuse_error(place->consumer, key, fingerprint, recorded);
	dead_letter_insert(place, key, sql, params, event_time, edata, expect_rows);
	*redelivered = false;
	return OUTCOME_DEAD_LETTERED;
}

/*
 * Like idem_apply, but a permanent failure of the business SQL parks the
 * message in the dead-letter queue instead of raising; returns applied,
 * duplicate or dead_lettered.  key, consumer, sql and params are the
 * first four arguments of the call, event_time, the fingerprint and the
 * route those at the positions given (a fingerprint position past the last
 * argument: none; a route position of -1: none).  Where keys are routed
 * (routed.c), the key and the entry are stored under the route.  The SQL
 * must affect at least expect_rows rows (0: any number); *rows is set to
 * the rows it affected when applied.
 */
static Outcome
try_apply_message(FunctionCallInfo fcinfo, int event_time_argno,
				  int fingerprint_argno, int route_argno, int64 expect_rows,
				  uint64 *rows)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	char	   *sql = get_sql_arg(fcinfo, 2);
	ArrayType  *params = PG_ARGISNULL(3) ? NULL : PG_GETARG_ARRAYTYPE_P(3);
	NullableDatum event_time;
	text	   *explicit_fingerprint = get_fingerprint_arg(fcinfo, fingerprint_argno);
	DeadLetterPlace place = {0};
	bool		check_fingerprint;
	int32		fingerprint;
	RecordedKey recorded = {0};
	Outcome		outcome;
	bool		redelivered;
	int			call;

	check_event_time_arg(fcinfo, event_time_argno);
	place.consumer = consumer;
	place.routed = route_argno >= 0 &&
		routed_get_route_arg(fcinfo, route_argno, &place.route, &place.route_type);
	event_time.isnull = PG_ARGISNULL(event_time_argno);
	event_time.value = event_time.isnull ? (Datum) 0 : PG_GETARG_DATUM(event_time_argno);
	if (params != NULL)
		business_params_check(params);
	business_sql_check(sql);
	expect_rows_check_sql(expect_rows, sql);

	SPI_connect();
	place.consumer_id = keystore_consumer_id_and_fp_check(consumer, true,
														  &check_fingerprint);
	call = stats_call_begin(consumer);

	if (check_fingerprint)
		fingerprint = fingerprint_of_try_call(explicit_fingerprint, sql, params);
	inflight_check_key(place.consumer_id, consumer, key, "record");
	inflight_check_call(fcinfo);
	if (place.routed)
	{
		routed_refuse_two_roles("idem_try_apply_routed", consumer, GetUserId());
		redelivered = !routed_record_key(place.route, place.route_type, consumer,
										 key, check_fingerprint ? &fingerprint : NULL,
										 &recorded);
	}
	else
		redelivered = !keystore_record_key_fp(place.consumer_id, key,
											  check_fingerprint ? &fingerprint : NULL,
											  &recorded);
	if (redelivered && check_fingerprint &&
		!fingerprint_admits(explicit_fingerprint, fingerprint, &recorded,
							sql, params))
	{
		/* another message under the key: a permanent failure of its own */
		stats_call_key_reuse(call);
		outcome = park_key_reuse(&place, key, sql, params, event_time,
								 expect_rows, fingerprint, &recorded,
								 &redelivered);
	}
	else if (redelivered)
		outcome = redelivery_outcome(dead_letter_status(&place, key));
	else
	{
		ErrorData  *edata = business_run(place.consumer_id, consumer, key, sql,
										 params, NULL, InvalidOid,
										 expect_rows, rows);

		if (edata == NULL)
			outcome = OUTCOME_APPLIED;
		else
		{
			dead_letter_insert(&place, key, sql, params, event_time, edata,
							   expect_rows);
			outcome = OUTCOME_DEAD_LETTERED;
		}
	}

	SPI_finish();

	/* a redelivery of a parked message is a duplicate, like any other */
	stats_call_end(call,
				   outcome == OUTCOME_APPLIED ? 1 : 0,
				   redelivered ? 1 : 0,
				   outcome == OUTCOME_DEAD_LETTERED && !redelivered ? 1 : 0,
				   event_time.isnull ? DT_NOBEGIN : DatumGetTimestampTz(event_time.value));

	return outcome;
}

/*
 * idem_try_apply(key, consumer, sql, params, event_time, fingerprint):
 * returns applied, duplicate or dead_lettered.  The fingerprint argument
 * exists from version 1.1 of the SQL on.
 */
Datum
idem_try_apply(PG_FUNCTION_ARGS)
{
	uint64		rows;
	Outcome		outcome = try_apply_message(fcinfo, 4, 5, -1, 0, &rows);

	PG_RETURN_DATUM(dead_letter_outcome_result(fcinfo, outcome));
}

/*
 * The outcome and rows of idem_try_apply_rows and its routed form, whose
 * expect_rows is at argument expect_rows_argno, followed by event_time
 * and the fingerprint; the route at route_argno (-1: none).
 */
static Datum
try_apply_rows(FunctionCallInfo fcinfo, int expect_rows_argno, int route_argno)
{
	int64		expect_rows = get_expect_rows_arg(fcinfo, expect_rows_argno);
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	uint64		rows = 0;
	Outcome		outcome;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	outcome = try_apply_message(fcinfo, expect_rows_argno + 1, expect_rows_argno + 2,
								route_argno, expect_rows, &rows);

	values[0] = ObjectIdGetDatum(dead_letter_outcome_oids(fcinfo->flinfo,
													TupleDescAttr(tupdesc, 0)->atttypid)[outcome]);
	values[1] = Int64GetDatum((int64) rows);
	nulls[1] = outcome != OUTCOME_APPLIED;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}

/*
 * idem_try_apply_rows(key, consumer, sql, params, expect_rows, event_time,
 * fingerprint): idem_try_apply, where affecting fewer than expect_rows
 * rows is an error of the SQL (IK002, transient unless
 * idem_consumer.transient_sqlstates leaves it out); returns the outcome and
 * the rows the SQL affected, NULL unless applied.
 */
Datum
idem_try_apply_rows(PG_FUNCTION_ARGS)
{
	return try_apply_rows(fcinfo, 4, -1);
}

/*
 * idem_try_apply_rows_routed(key, consumer, sql, params, route,
 * expect_rows, event_time, fingerprint): idem_try_apply_rows with the key
 * and any dead-letter entry stored under the route, where keys are routed;
 * a replay of the entry demands the rows again.
 */
Datum
idem_try_apply_rows_routed(PG_FUNCTION_ARGS)
{
	return try_apply_rows(fcinfo, 5, 4);
}

/*
 * idem_try_apply_routed(key, consumer, sql, params, route, event_time,
 * fingerprint): idem_try_apply with the key and any dead-letter entry
 * stored under the route, where keys are routed (Citus); elsewhere the
 * route is not needed, and idem_try_apply_routed is idem_try_apply.
 */
Datum
idem_try_apply_routed(PG_FUNCTION_ARGS)
{
	uint64		rows;
	Outcome		outcome = try_apply_message(fcinfo, 5, 6, 4, 0, &rows);

	PG_RETURN_DATUM(dead_letter_outcome_result(fcinfo, outcome));
}
