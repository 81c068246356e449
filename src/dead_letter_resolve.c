/*-------------------------------------------------------------------------
 *
 * dead_letter_resolve.c
 *	  Resolving dead-letter entries: the operator functions
 *	  idem_dlq_replay() and idem_dlq_discard(), by id, and by key and route
 *	  for the entries stored beside routed keys (routed.c): ids would be
 *	  each node's own.  Parking the entries is dead_letter.c's business.
 *
 * Replays lock their entry FOR NO KEY UPDATE before running it, so no two
 * sessions replay one entry; a batch replay skips the entries others hold.
 * A first run's business SQL runs as the current user; a replay's runs as
 * the role that dead-lettered the entry, and only for a caller who is a
 * member of that role (replay_role.c), through business_run.c.  Only the
 * statements on the storage run as its owner (keystore.c).  A routed
 * entry keeps that role by name, which Citus gives the same role on every
 * node; on the Citus coordinator its replay runs only as the owner of the
 * storage, for the reason routed_refuse_two_roles() gives.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/dead_letter_resolve.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "dead_letter.h"

/* Longest discard reason accepted, in bytes. */
#define IDEM_MAX_REASON_BYTES 1024

/*
 * One entry of idem_consumer.dead_letters, or of routed_dead_letters, as a
 * replay or discard needs it.
 */
typedef struct DeadLetterEntry
{
	const char *name;			/* for messages: "entry 12" */
	DeadLetterPlace place;
	int64		id;				/* unless routed */
	text	   *key;
	char	   *sql;
	ArrayType  *params;			/* NULL if none */
	ArrayType  *settings;
	char	   *status;
	char	   *resolved_by;	/* NULL while pending */
	char	   *discard_reason; /* NULL unless discarded */
	char	   *dead_lettered_by;	/* if routed: the role its SQL runs as */
	bool		is_effect;		/* if routed: a dead external effect's */
	int64		expect_rows;	/* if routed: the rows its SQL demands, or 0 */
} DeadLetterEntry;

PG_FUNCTION_INFO_V1(idem_dlq_replay);
PG_FUNCTION_INFO_V1(idem_dlq_replay_consumer);
PG_FUNCTION_INFO_V1(idem_dlq_discard);
PG_FUNCTION_INFO_V1(idem_dlq_replay_key);
PG_FUNCTION_INFO_V1(idem_dlq_discard_key);

/*
 * Returns the rows a dead-letter entry's SQL must affect (0: any number).
 */
static int64
dead_letter_expect_rows(int64 id)
{
	Datum		arg = Int64GetDatum(id);
	bool		isnull;
	Datum		value;

	if (!expect_rows_stored())
		return 0;
	dead_letter_execute(DL_EXPECT_ROWS, &arg, NULL, 1);
	if (SPI_processed == 0)
		return 0;
	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt64(value);
}

/*
 * Copies a column of the first row of the last storage statement's result;
 * returns NULL for an SQL NULL.
 */
static Pointer
result_copy(int colno)
{
	bool		isnull;
	Datum		value;

	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
						  colno, &isnull);
	return isnull ? NULL : (Pointer) PG_DETOAST_DATUM_COPY(value);
}

/*
 * Returns a text column of the first row of the last storage statement's
 * result as a string, NULL for an SQL NULL.
 */
static char *
result_string(int colno)
{
	text	   *t = (text *) result_copy(colno);

	return t != NULL ? text_to_cstring(t) : NULL;
}

/*
 * Reads the entry a locking read returned, in DEAD_LETTER_COLUMNS order.
 */
static void
entry_from_result(DeadLetterEntry *entry)
{
	bool		isnull;

	memset(entry, 0, sizeof(*entry));
	entry->id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	entry->name = psprintf("entry " INT64_FORMAT, entry->id);
	entry->place.consumer_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
														   SPI_tuptable->tupdesc, 2,
														   &isnull));
	entry->key = (text *) result_copy(3);
	entry->sql = result_string(4);
	entry->params = (ArrayType *) result_copy(5);
	entry->settings = (ArrayType *) result_copy(6);
	entry->status = result_string(7);
	entry->resolved_by = result_string(8);
	entry->discard_reason = result_string(9);
}

/*
 * Reads the routed entry RK_DL_LOCK returned, of the key and the place
 * given.
 */
static void
routed_entry_from_result(DeadLetterEntry *entry, const DeadLetterPlace *place,
						 text *key)
{
	bool		isnull;

	memset(entry, 0, sizeof(*entry));
	entry->name = psprintf("entry of key \"%s\"", text_to_cstring(key));
	entry->place = *place;
	entry->key = key;
	entry->sql = result_string(1);
	entry->params = (ArrayType *) result_copy(2);
	entry->settings = (ArrayType *) result_copy(3);
	entry->status = result_string(4);
	entry->resolved_by = result_string(5);
	entry->discard_reason = result_string(6);
	entry->dead_lettered_by = result_string(7);
	entry->is_effect = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 8, &isnull));
	entry->expect_rows = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc, 9, &isnull));
	if (isnull)
		entry->expect_rows = 0;
}

/*
 * Tells whether an entry exists and belongs to a consumer the current role
 * may act on.  Read without a lock, so that a role never waits for
 * another team's transaction.
 */
static bool
entry_visible(int64 id)
{
	Datum		arg = Int64GetDatum(id);
	bool		isnull;

	dead_letter_execute(DL_ENTRY_KEY, &arg, NULL, 1);
	return SPI_processed > 0 &&
		keystore_may_act_on_consumer_id(DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
																	 SPI_tuptable->tupdesc,
																	 1, &isnull)));
}

/*
 * Locks an entry by id and reads it, or raises an error if there is none.
 * An entry of another team's consumer is, to the caller, one that does not
 * exist: the same error tells it nothing.
 */
static void
lock_entry(int64 id, DeadLetterEntry *entry)
{
	Datum		arg = Int64GetDatum(id);

	if (entry_visible(id))
	{
		dead_letter_execute(DL_LOCK, &arg, NULL, 1);
		if (SPI_processed > 0)
		{
			entry_from_result(entry);
			/* its consumer may have changed owner meanwhile */
			if (keystore_may_act_on_consumer_id(entry->place.consumer_id))
				return;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("dead-letter entry %lld does not exist", (long long) id),
			 errhint("The view idem_dead_letters lists the entries.")));
}

/*
 * Raises an error unless an entry is pending.
 */
static void
check_pending(const DeadLetterEntry *entry)
{
	if (strcmp(entry->status, "pending") == 0)
		return;
	if (strcmp(entry->status, "replayed") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dead-letter %s is not pending", entry->name),
				 errdetail("It was replayed successfully by role \"%s\".",
						   entry->resolved_by)));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("dead-letter %s is not pending", entry->name),
			 errdetail("It was discarded by role \"%s\" with the reason \"%s\".",
					   entry->resolved_by, entry->discard_reason)));
}

/*
 * Returns the role a locked entry's SQL runs as, after checking that the
 * caller may act for it, and sets *consumer to the entry's consumer.
 */
static Oid
replay_run_as(const DeadLetterEntry *entry, char **consumer_name)
{
	Datum		arg = Int64GetDatum(entry->id);
	bool		isnull;
	Datum		roleid;
	char	   *consumer;
	char	   *parked_by;

	if (entry->place.routed)
	{
		Oid			run_as;

		*consumer_name = unconstify(char *, entry->place.consumer);
		run_as = replay_role_check(entry->name, entry->place.consumer,
								   get_role_oid(entry->dead_lettered_by, true),
								   entry->dead_lettered_by);
		routed_refuse_two_roles("idem_dlq_replay", entry->place.consumer,
								run_as);
		return run_as;
	}

	dead_letter_execute(DL_ROLE, &arg, NULL, 1);
	roleid = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	consumer = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	parked_by = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3);
	*consumer_name = consumer;
	return replay_role_check(entry->name, consumer,
							 isnull ? InvalidOid : DatumGetObjectId(roleid),
							 parked_by);
}

/*
 * Records the outcome of a run of an entry: replayed (edata NULL), or the
 * new error and one more attempt.
 */
static void
entry_mark_run(const DeadLetterEntry *entry, ErrorData *edata)
{
	Datum		values[STORAGE_MAX_ARGS];
	char		nulls[STORAGE_MAX_ARGS];
	int			first = entry->place.routed ? 3 : 1;

	memset(nulls, ' ', sizeof(nulls));
	if (entry->place.routed)
	{
		values[0] = entry->place.route;
		values[1] = CStringGetTextDatum(entry->place.consumer);
		values[2] = PointerGetDatum(entry->key);
	}
	else
		values[0] = Int64GetDatum(entry->id);

	if (edata == NULL)
		values[first] = dead_letter_current_user();
	else
		dead_letter_error_values(edata, &values[first], &nulls[first]);

	if (entry->place.routed)
		routed_execute(edata == NULL ? RK_DL_REPLAYED : RK_DL_FAILED_AGAIN,
					   entry->place.route_type, values, nulls);
	else
		dead_letter_execute(edata == NULL ? DL_REPLAYED : DL_FAILED_AGAIN,
							values, nulls, 0);
}

/*
 * Runs a locked pending entry again under its key, as the role that
 * dead-lettered it, and records the result: replayed on success, the new
 * error and one more attempt on a permanent failure.  A transient error is
 * raised and changes nothing.
 */
static Outcome
replay_entry(const DeadLetterEntry *entry)
{
	ErrorData  *edata;
	Oid			run_as;
	char	   *consumer;
	uint64		rows;
	int64		expect_rows;

	/* the entry of a dead external effect: replaying it re-arms the effect */
	if (entry->place.routed ?
		entry->is_effect && effects_rearm_routed(entry->place.route,
												 entry->place.route_type,
												 entry->place.consumer, entry->key) :
		effects_rearm(entry->id))
	{
		entry_mark_run(entry, NULL);
		return OUTCOME_APPLIED;
	}
	if (entry->is_effect)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the effect of dead-letter %s is not dead", entry->name),
				 errdetail("Its effect of consumer \"%s\" was removed or re-armed by hand.",
						   entry->place.consumer),
				 errhint("Discard the entry with idem_dlq_discard(key, consumer, reason, route).")));

	/* a message's SQL runs as the role that parked it, for its members */
	run_as = replay_run_as(entry, &consumer);

	/*
	 * The key was recorded when the entry was made and idem_forget() leaves
	 * keys of pending entries alone; should it have been removed from the
	 * storage by hand all the same, record it again, so that a success
	 * leaves the key applied.
	 */
	if (entry->place.routed)
	{
		RecordedKey recorded;

		(void) routed_record_key(entry->place.route, entry->place.route_type,
								 consumer, entry->key, NULL, &recorded);
		expect_rows = entry->expect_rows;
	}
	else
	{
		(void) keystore_record_key(entry->place.consumer_id, entry->key);
		expect_rows = dead_letter_expect_rows(entry->id);
	}

	/*
	 * A message parked with expect_rows demands its rows again; the
	 * operator's session advisory locks are left as they were.
	 */
	edata = replay_locks_business_run(entry->place.consumer_id, consumer, entry->key,
									  entry->sql, entry->params, entry->settings,
									  run_as, expect_rows, &rows);
	entry_mark_run(entry, edata);
	return edata == NULL ? OUTCOME_APPLIED : OUTCOME_DEAD_LETTERED;
}

/*
 * Resolves a locked pending entry as discarded, for the reason given.
 */
static void
entry_discard(const DeadLetterEntry *entry, text *reason)
{
	Datum		values[5];

	if (entry->place.routed)
	{
		values[0] = entry->place.route;
		values[1] = CStringGetTextDatum(entry->place.consumer);
		values[2] = PointerGetDatum(entry->key);
		values[3] = dead_letter_current_user();
		values[4] = PointerGetDatum(reason);
		routed_execute(RK_DL_DISCARDED, entry->place.route_type, values, NULL);
		return;
	}
	values[0] = Int64GetDatum(entry->id);
	values[1] = dead_letter_current_user();
	values[2] = PointerGetDatum(reason);
	dead_letter_execute(DL_DISCARDED, values, NULL, 0);
}

/*
 * Raises object_in_use if business SQL runs in this backend, before
 * entry id is locked or changed: saying so precisely if the entry holds
 * the running message or, for a replay, a message of its consumer.  The
 * entry is read without a lock, so that a replay held elsewhere does not
 * make the refusal wait.
 */
static void
refuse_inside_business_sql(const char *function_name, const char *action,
						   int64 id)
{
	Datum		arg = Int64GetDatum(id);
	bool		isnull;

	if (!inflight_any())
	{
		inflight_check_none(function_name);
		return;
	}
	dead_letter_execute(DL_ENTRY_KEY, &arg, NULL, 1);
	if (SPI_processed > 0)
		inflight_check_dead_letter(function_name, action,
								   psprintf("entry " INT64_FORMAT, id),
								   DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
															   SPI_tuptable->tupdesc,
															   1, &isnull)),
								   (text *) result_copy(2));
	inflight_check_none(function_name);
}

/*
 * idem_dlq_replay(id): runs a pending dead-letter entry again in the
 * caller's transaction; returns applied or dead_lettered.
 */
Datum
idem_dlq_replay(PG_FUNCTION_ARGS)
{
	int64		id = get_id_arg(fcinfo, 0);
	DeadLetterEntry entry;
	Outcome		outcome;

	replay_role_require_supported();
	SPI_connect();
	refuse_inside_business_sql("idem_dlq_replay", "replay", id);
	lock_entry(id, &entry);
	check_pending(&entry);
	outcome = replay_entry(&entry);
	SPI_finish();

	PG_RETURN_DATUM(dead_letter_outcome_result(fcinfo, outcome));
}

/*
 * idem_dlq_replay(consumer, max_count): replays up to max_count pending
 * entries of a consumer, oldest first, skipping those another transaction
 * holds; returns each id with its outcome.
 */
Datum
idem_dlq_replay_consumer(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		max_count;
	int32		consumer_id;
	int64		last_id = 0;
	Oid		   *oids;

	max_count = get_count_arg(fcinfo, 1, "max_count");
	replay_role_require_supported();

	InitMaterializedSRF(fcinfo, 0);
	oids = dead_letter_outcome_oids(fcinfo->flinfo,
							  TupleDescAttr(rsinfo->setDesc, 1)->atttypid);

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	SPI_finish();
	if (consumer_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" does not exist", consumer),
				 errhint("The view idem_dead_letters lists the consumers with entries.")));
	inflight_check_dead_letter("idem_dlq_replay", "replay", NULL, consumer_id, NULL);

	/* one SPI connection per entry, so that each entry's memory goes with it */
	for (int n = 0; n < max_count; n++)
	{
		Datum		args[2];
		DeadLetterEntry entry;
		Outcome		outcome;
		Datum		values[2];
		bool		nulls[2] = {false, false};

		CHECK_FOR_INTERRUPTS();

		SPI_connect();
		args[0] = Int32GetDatum(consumer_id);
		args[1] = Int64GetDatum(last_id);
		dead_letter_execute(DL_LOCK_NEXT_PENDING, args, NULL, 1);
		if (SPI_processed == 0)
		{
			SPI_finish();
			break;
		}
		entry_from_result(&entry);
		outcome = replay_entry(&entry);
		last_id = entry.id;
		SPI_finish();

		values[0] = Int64GetDatum(last_id);
		values[1] = ObjectIdGetDatum(oids[outcome]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}

	return (Datum) 0;
}

/*
 * idem_dlq_discard(id, reason): resolves a pending entry without running
 * it.  Its key stays recorded, so redeliveries are still not applied.
 */
Datum
idem_dlq_discard(PG_FUNCTION_ARGS)
{
	int64		id = get_id_arg(fcinfo, 0);
	text	   *reason = get_name_arg(fcinfo, 1, "reason", IDEM_MAX_REASON_BYTES);
	DeadLetterEntry entry;

	SPI_connect();
	refuse_inside_business_sql("idem_dlq_discard", "discard", id);
	lock_entry(id, &entry);
	check_pending(&entry);
	entry_discard(&entry, reason);
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * Locks and reads the entry of the key and consumer, the call's first
 * two arguments, and of the route at route_argno, for function_name's
 * action, or raises an error if there is none.  Where keys are not routed,
 * or for a NULL route, the entry is the node's entry of the key in
 * idem_dead_letters, checked and locked as by its id.  A routed entry is named by its consumer, so a consumer
 * the caller may not act on is refused as idem_apply refuses it.
 */
static void
lock_entry_of_key(FunctionCallInfo fcinfo, int route_argno,
				  const char *function_name, const char *action,
				  DeadLetterEntry *entry)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	DeadLetterPlace place = {0};
	Datum		args[3];

	place.consumer = consumer;
	place.routed = routed_get_route_arg(fcinfo, route_argno, &place.route,
									   &place.route_type);
	if (!place.routed)
	{
		place.consumer_id = keystore_consumer_id(consumer, false);
		if (place.consumer_id != 0)
		{
			args[0] = Int32GetDatum(place.consumer_id);
			args[1] = PointerGetDatum(key);
			dead_letter_execute(DL_KEY_STATUS, args, NULL, 1);
			if (SPI_processed > 0)
			{
				bool		isnull;
				int64		id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
															 SPI_tuptable->tupdesc,
															 2, &isnull));

				refuse_inside_business_sql(function_name, action, id);
				lock_entry(id, entry);
				return;
			}
		}
	}
	else
	{
		place.consumer_id = keystore_consumer_id(consumer, true);
		inflight_check_dead_letter(function_name, action,
								   psprintf("entry of key \"%s\"", text_to_cstring(key)),
								   place.consumer_id, key);
		args[0] = place.route;
		args[1] = CStringGetTextDatum(consumer);
		args[2] = PointerGetDatum(key);
		routed_execute(RK_DL_LOCK, place.route_type, args, NULL);
		if (SPI_processed > 0)
		{
			routed_entry_from_result(entry, &place, key);
			return;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("consumer \"%s\" has no dead-letter entry of key \"%s\"",
					consumer, text_to_cstring(key)),
			 errhint("The view %s lists the entries.",
					 place.routed ? "idem_routed_dead_letters" : "idem_dead_letters")));
}

/*
 * idem_dlq_replay(key, consumer, route): idem_dlq_replay for the entry of
 * a key, named by its key, consumer and route.
 */
Datum
idem_dlq_replay_key(PG_FUNCTION_ARGS)
{
	DeadLetterEntry entry;
	Outcome		outcome;

	SPI_connect();
	lock_entry_of_key(fcinfo, 2, "idem_dlq_replay", "replay", &entry);
	check_pending(&entry);
	outcome = replay_entry(&entry);
	SPI_finish();

	PG_RETURN_DATUM(dead_letter_outcome_result(fcinfo, outcome));
}

/*
 * idem_dlq_discard(key, consumer, reason, route): idem_dlq_discard for
 * the entry of a key, named by its key, consumer and route.
 */
Datum
idem_dlq_discard_key(PG_FUNCTION_ARGS)
{
	text	   *reason = get_name_arg(fcinfo, 2, "reason", IDEM_MAX_REASON_BYTES);
	DeadLetterEntry entry;

	SPI_connect();
	lock_entry_of_key(fcinfo, 3, "idem_dlq_discard", "discard", &entry);
	check_pending(&entry);
	entry_discard(&entry, reason);
	SPI_finish();

	PG_RETURN_VOID();
}
