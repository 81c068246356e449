/*-------------------------------------------------------------------------
 *
 * try_apply.c
 *	  idem_try_apply(): idem_apply(), except that a message whose business
 *	  SQL fails permanently is parked in the dead-letter queue instead of
 *	  raising.
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

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/resowner.h"

#include "dead_letter.h"

PG_FUNCTION_INFO_V1(idem_try_apply);

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
park_key_reuse(const KeyPlace *place, text *key,
			   const char *sql, ArrayType *params, NullableDatum event_time,
			   int64 expect_rows, int32 fingerprint,
			   const RecordedKey *recorded, bool *redelivered)
{
	char	   *status = key_place_entry_status(place, key);
	ErrorData  *edata;

	/*
	 * One entry per key: the message's own redelivery finds the entry its
	 * first delivery made, and reports it like any parked message.
	 */
	if (status != NULL)
		return redelivery_outcome(status);

	edata = fingerprint_key_reuse_error(place->consumer, key, fingerprint, recorded);
	key_place_park(place, key, sql, params, event_time, edata, expect_rows);
	*redelivered = false;
	return OUTCOME_DEAD_LETTERED;
}

/*
 * idem_try_apply(key, consumer, sql, params, event_time, fingerprint,
 * expect_rows, route): like idem_apply, but a permanent failure of the
 * business SQL parks the message in the dead-letter queue instead of
 * raising; returns applied, duplicate or dead_lettered.  Where keys are
 * routed (routed.c), the key and the entry are stored under the route.
 * Affecting fewer than expect_rows rows is an error of the SQL (IK002,
 * transient unless idem_consumer.transient_sqlstates leaves it out).  The
 * 1.0 function has the first five arguments, the 1.1 one six.
 */
Datum
idem_try_apply(PG_FUNCTION_ARGS)
{
	MessageArgs args;
	KeyPlace   *place = &args.place;
	bool		check_fingerprint;
	int32		fingerprint;
	RecordedKey recorded = {0};
	Outcome		outcome;
	bool		redelivered;
	int			call;

	get_message_args(fcinfo, &args);
	if (args.params != NULL)
		business_params_check(args.params);
	business_sql_check(args.sql);
	expect_rows_check_sql(args.expect_rows, args.sql);

	SPI_connect();
	place->consumer_id = keystore_consumer_id_and_fp_check(args.consumer, true,
														  &check_fingerprint);
	call = stats_call_begin(args.consumer);

	if (check_fingerprint)
		fingerprint = fingerprint_of_try_call(args.fingerprint, args.sql, args.params);
	inflight_check_key(place->consumer_id, args.consumer, args.key, "record");
	inflight_check_call(fcinfo);
	key_place_admit_role(place, "idem_try_apply", GetUserId());
	redelivered = !key_place_record(place, args.key,
									check_fingerprint ? &fingerprint : NULL,
									&recorded);
	if (redelivered && check_fingerprint &&
		!fingerprint_admits(args.fingerprint, fingerprint, &recorded,
							args.sql, args.params))
	{
		/* another message under the key: a permanent failure of its own */
		stats_call_key_reuse(call);
		outcome = park_key_reuse(place, args.key, args.sql, args.params,
								 args.event_time, args.expect_rows, fingerprint,
								 &recorded, &redelivered);
	}
	else if (redelivered)
		outcome = redelivery_outcome(key_place_entry_status(place, args.key));
	else
	{
		uint64		rows;
		ErrorData  *edata = business_run(place->consumer_id, args.consumer, args.key,
										 args.sql, args.params, NULL, InvalidOid,
										 args.expect_rows, &rows);

		if (edata == NULL)
			outcome = OUTCOME_APPLIED;
		else
		{
			key_place_park(place, args.key, args.sql, args.params,
						   args.event_time, edata, args.expect_rows);
			outcome = OUTCOME_DEAD_LETTERED;
		}
	}

	SPI_finish();

	/* a redelivery of a parked message is a duplicate, like any other */
	stats_call_end(call,
				   outcome == OUTCOME_APPLIED ? 1 : 0,
				   redelivered ? 1 : 0,
				   outcome == OUTCOME_DEAD_LETTERED && !redelivered ? 1 : 0,
				   args.event_time.isnull ? DT_NOBEGIN :
				   DatumGetTimestampTz(args.event_time.value));

	PG_RETURN_DATUM(dead_letter_outcome_result(fcinfo, outcome));
}
