/*-------------------------------------------------------------------------
 *
 * dead_letter.c
 *	  Parking messages in the dead-letter queue: the entry of a message
 *	  whose business SQL failed permanently, in the node's queue,
 *	  dead_letters, or, where keys are routed (routed.c), beside its key in
 *	  routed_dead_letters, and the status of a key's entry, each the local
 *	  or the routed place's operation (key_place.h); and the labels of
 *	  idem_outcome, which the apply functions and the replays return.
 *
 * An entry keeps what a replay needs to run the message again as it first
 * ran: its SQL, parameters and settings, the error, and the role whose
 * business SQL failed, by id in the node's queue and by name beside a
 * routed key, which Citus gives the same role on every node.  Replaying
 * and discarding entries is dead_letter_resolve.c's business, and the
 * entries they act on dead_letter_entry.c's.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/dead_letter.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_enum.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "dead_letter.h"

static const char *const outcome_labels[] = {
	[OUTCOME_APPLIED] = "applied",
	[OUTCOME_DUPLICATE] = "duplicate",
	[OUTCOME_DEAD_LETTERED] = "dead_lettered",
};

/*
 * Returns the OIDs of the labels of idem_outcome, cached for the call site.
 */
Oid *
dead_letter_outcome_oids(FmgrInfo *flinfo, Oid enumtypoid)
{
	Oid		   *oids = (Oid *) flinfo->fn_extra;

	if (oids != NULL)
		return oids;

	oids = MemoryContextAlloc(flinfo->fn_mcxt, sizeof(Oid) * lengthof(outcome_labels));
	for (int i = 0; i < lengthof(outcome_labels); i++)
	{
		HeapTuple	tuple;

		tuple = SearchSysCache2(ENUMTYPOIDNAME, ObjectIdGetDatum(enumtypoid),
								CStringGetDatum(outcome_labels[i]));
		if (!HeapTupleIsValid(tuple))
			elog(ERROR, "type %s has no label \"%s\"",
				 format_type_be(enumtypoid), outcome_labels[i]);
		oids[i] = ((Form_pg_enum) GETSTRUCT(tuple))->oid;
		ReleaseSysCache(tuple);
	}
	flinfo->fn_extra = oids;
	return oids;
}

/*
 * Returns an outcome as a value of the function's result type idem_outcome.
 */
Datum
dead_letter_outcome_result(FunctionCallInfo fcinfo, Outcome outcome)
{
	Oid		   *oids = (Oid *) fcinfo->flinfo->fn_extra;

	if (oids == NULL)
		oids = dead_letter_outcome_oids(fcinfo->flinfo,
								  get_func_rettype(fcinfo->flinfo->fn_oid));
	return ObjectIdGetDatum(oids[outcome]);
}

/*
 * Returns the name of the current user as text.
 */
Datum
dead_letter_current_user(void)
{
	return CStringGetTextDatum(GetUserNameFromId(GetUserId(), false));
}

/*
 * Fills values and nulls with an error's SQLSTATE, message, detail, hint
 * and context, the order of the dead-letter statements (of a new entry's,
 * and of a replay's that fails again).
 */
void
dead_letter_error_values(ErrorData *edata, Datum *values, char *nulls)
{
	const char *fields[3] = {edata->detail, edata->hint, edata->context};

	values[0] = CStringGetTextDatum(unpack_sql_state(edata->sqlerrcode));
	nulls[0] = ' ';
	values[1] = CStringGetTextDatum(edata->message != NULL ? edata->message : "");
	nulls[1] = ' ';
	for (int i = 0; i < lengthof(fields); i++)
	{
		values[2 + i] = fields[i] != NULL ? CStringGetTextDatum(fields[i]) : (Datum) 0;
		nulls[2 + i] = fields[i] != NULL ? ' ' : 'n';
	}
}

/*
 * Fills values and nulls, whose nulls are ' ', with what both queues keep
 * of a parked message, in the order of their statements: its SQL,
 * parameters, event time and settings, the error (five columns), and the
 * name of the current user.
 */
static void
message_values(const char *sql, ArrayType *params, NullableDatum event_time,
			   ErrorData *edata, Datum *values, char *nulls)
{
	values[0] = CStringGetTextDatum(sql);
	values[1] = PointerGetDatum(params);
	nulls[1] = params != NULL ? ' ' : 'n';
	values[2] = event_time.value;
	nulls[2] = event_time.isnull ? 'n' : ' ';
	values[3] = PointerGetDatum(business_run_capture_settings());
	dead_letter_error_values(edata, &values[4], &nulls[4]);
	values[9] = dead_letter_current_user();
}

/*
 * Stores a message whose business SQL failed permanently as a new pending
 * entry of the node's dead-letter queue, with the rows it demands (0:
 * none); the local place's park.
 */
void
dead_letter_park_local(const KeyPlace *place, text *key, const char *sql,
					   ArrayType *params, NullableDatum event_time,
					   ErrorData *edata, int64 expect_rows)
{
	Datum		values[STORAGE_MAX_ARGS];
	char		nulls[STORAGE_MAX_ARGS];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = Int32GetDatum(place->consumer_id);
	values[1] = PointerGetDatum(key);
	message_values(sql, params, event_time, edata, &values[2], &nulls[2]);
	values[12] = ObjectIdGetDatum(GetUserId());

	values[13] = Int64GetDatum(expect_rows);
	nulls[13] = expect_rows > 0 ? ' ' : 'n';

	/*
	 * On a subscriber that took over, the identity sequence may stand below
	 * the ids of replicated entries (docs/replication.md); entries are
	 * rare enough to check it each time.
	 */
	keystore_dead_letter_ids_past_rows();

	/*
	 * A database still at version 1.0 has no column for the role, one at
	 * 1.1 none for the demand, and cannot be given a demand: only the
	 * functions of 1.2 take one.
	 */
	if (expect_rows_stored())
		dead_letter_execute(DL_INSERT_ROWS, values, nulls, 0);
	else
		dead_letter_execute(replay_role_supported() ? DL_INSERT_ROLE : DL_INSERT,
						 values, nulls, 0);
}

/*
 * Stores a routed message whose business SQL failed permanently as a new
 * pending entry beside its key, with the rows it demands (0: none); the
 * routed place's park.  The role its SQL runs as on a replay is kept by
 * name, which Citus gives the same role on every node.
 */
void
dead_letter_park_routed(const KeyPlace *place, text *key, const char *sql,
						ArrayType *params, NullableDatum event_time,
						ErrorData *edata, int64 expect_rows)
{
	Datum		values[STORAGE_MAX_ARGS];
	char		nulls[STORAGE_MAX_ARGS];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = place->route;
	values[1] = CStringGetTextDatum(place->consumer);
	values[2] = PointerGetDatum(key);
	message_values(sql, params, event_time, edata, &values[3], &nulls[3]);
	values[13] = Int64GetDatum(expect_rows);
	nulls[13] = expect_rows > 0 ? ' ' : 'n';
	routed_execute(RK_DL_INSERT, place->route_type, values, nulls);
}

/*
 * Returns the status of the first row of the last statement's result, or
 * NULL if it returned none.
 */
static char *
status_of_result(void)
{
	bool		isnull;

	if (SPI_processed == 0)
		return NULL;
	return TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Returns the status of a key's entry in the node's queue, or NULL if it
 * has none.
 */
char *
dead_letter_status_local(const KeyPlace *place, text *key)
{
	Datum		args[2] = {Int32GetDatum(place->consumer_id), PointerGetDatum(key)};

	dead_letter_execute(DL_KEY_STATUS, args, NULL, 1);
	return status_of_result();
}

/*
 * Returns the status of a routed key's entry, or NULL if it has none.
 */
char *
dead_letter_status_routed(const KeyPlace *place, text *key)
{
	Datum		args[3] = {place->route, CStringGetTextDatum(place->consumer),
	PointerGetDatum(key)};

	routed_execute(RK_DL_STATUS, place->route_type, args, NULL);
	return status_of_result();
}
