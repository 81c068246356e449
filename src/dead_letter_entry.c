/*-------------------------------------------------------------------------
 *
 * dead_letter_entry.c
 *	  The dead-letter entries that replays and discards act on, in the
 *	  node's queue (dead_letters, by id) and beside routed keys
 *	  (routed_dead_letters, by route, consumer and key): locking and
 *	  reading an entry, re-arming its dead effect, the role its SQL runs
 *	  as, recording its key again, and marking it replayed, failed again
 *	  or discarded.  Each is the local or the routed place's operation
 *	  (key_place.h); dead_letter_resolve.c calls them through the place.
 *
 * An entry of another team's consumer is, to the caller, one that does
 * not exist: it is read unlocked first, so that a role never waits for
 * another team's transaction, and its consumer is checked again under
 * the lock.  A routed entry keeps the role its SQL runs as by name, which
 * Citus gives the same role on every node.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/dead_letter_entry.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"

#include "dead_letter.h"

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
 * Reads the entry a locking read of the node's queue returned, in
 * DEAD_LETTER_COLUMNS order; its place is local, its consumer's name not
 * read yet.
 */
void
dead_letter_entry_from_result(DeadLetterEntry *entry)
{
	bool		isnull;

	memset(entry, 0, sizeof(*entry));
	entry->id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	entry->name = psprintf("entry " INT64_FORMAT, entry->id);
	key_place_local(DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 2,
												&isnull)),
					NULL, &entry->place);
	entry->key = (text *) result_copy(3);
	entry->sql = result_string(4);
	entry->params = (ArrayType *) result_copy(5);
	entry->settings = (ArrayType *) result_copy(6);
	entry->status = result_string(7);
	entry->resolved_by = result_string(8);
	entry->discard_reason = result_string(9);
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
 * Locks an entry of the node's queue by id and reads it, or raises an
 * error if there is none.  An entry of another team's consumer is, to the
 * caller, one that does not exist: the same error tells it nothing.
 */
void
dead_letter_lock_id(int64 id, DeadLetterEntry *entry)
{
	Datum		arg = Int64GetDatum(id);

	if (entry_visible(id))
	{
		dead_letter_execute(DL_LOCK, &arg, NULL, 1);
		if (SPI_processed > 0)
		{
			dead_letter_entry_from_result(entry);
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
 * Raises object_in_use if business SQL runs in this backend, before
 * entry id is locked or changed: saying so precisely if the entry holds
 * the running message or, for a replay, a message of its consumer.  The
 * entry is read without a lock, so that a replay held elsewhere does not
 * make the refusal wait.
 */
void
dead_letter_refuse_inside_business_sql(const char *function_name,
									   const char *action, int64 id)
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
 * Locks and reads the node's entry of a key, checked and locked as by its
 * id, for function_name's action; returns false if the consumer has none.
 */
bool
dead_letter_lock_local(const KeyPlace *place, text *key, const char *function_name,
					   const char *action, DeadLetterEntry *entry)
{
	int32		consumer_id = keystore_consumer_id(place->consumer, false);
	Datum		args[2];
	bool		isnull;
	int64		id;

	if (consumer_id == 0)
		return false;
	args[0] = Int32GetDatum(consumer_id);
	args[1] = PointerGetDatum(key);
	dead_letter_execute(DL_KEY_STATUS, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
									 2, &isnull));
	dead_letter_refuse_inside_business_sql(function_name, action, id);
	dead_letter_lock_id(id, entry);
	return true;
}

/*
 * Locks and reads the entry of a routed key, for function_name's action;
 * returns false if there is none.  A routed entry is named by its
 * consumer, so a consumer the caller may not act on is refused as
 * idem_apply refuses it.
 */
bool
dead_letter_lock_routed(const KeyPlace *place, text *key, const char *function_name,
						const char *action, DeadLetterEntry *entry)
{
	int32		consumer_id = keystore_consumer_id(place->consumer, true);
	Datum		args[3];
	bool		isnull;

	inflight_check_dead_letter(function_name, action,
							   psprintf("entry of key \"%s\"", text_to_cstring(key)),
							   consumer_id, key);
	args[0] = place->route;
	args[1] = CStringGetTextDatum(place->consumer);
	args[2] = PointerGetDatum(key);
	routed_execute(RK_DL_LOCK, place->route_type, args, NULL);
	if (SPI_processed == 0)
		return false;

	/* in the order of RK_DL_LOCK's columns */
	memset(entry, 0, sizeof(*entry));
	entry->name = psprintf("entry of key \"%s\"", text_to_cstring(key));
	entry->place = *place;
	entry->place.consumer_id = consumer_id;
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
	return true;
}

/*
 * Re-arms the dead effect of an entry of the node's queue; returns false
 * if the entry is not an effect's.
 */
bool
dead_letter_rearm_local(const DeadLetterEntry *entry)
{
	return effects_rearm(entry->id);
}

/*
 * Re-arms the dead routed effect of a routed effect's entry; returns false
 * if the entry is a message's, or the effect is not dead.
 */
bool
dead_letter_rearm_routed(const DeadLetterEntry *entry)
{
	return entry->is_effect && effects_rearm_routed(&entry->place, entry->key);
}

/*
 * Returns the role the SQL of a locked entry of the node's queue runs as,
 * after checking that the caller may act for it, and sets *consumer_name
 * to the entry's consumer.
 */
Oid
dead_letter_run_as_local(const DeadLetterEntry *entry, char **consumer_name)
{
	Datum		arg = Int64GetDatum(entry->id);
	bool		isnull;
	Datum		roleid;
	char	   *consumer;
	char	   *parked_by;

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
 * The same for a routed entry, whose role is kept by name; refuses a
 * replay that Citus would refuse (routed_refuse_two_roles).
 */
Oid
dead_letter_run_as_routed(const DeadLetterEntry *entry, char **consumer_name)
{
	Oid			run_as;

	*consumer_name = unconstify(char *, entry->place.consumer);
	run_as = replay_role_check(entry->name, entry->place.consumer,
							   get_role_oid(entry->dead_lettered_by, true),
							   entry->dead_lettered_by);
	routed_refuse_two_roles("idem_dlq_replay", entry->place.consumer, run_as);
	return run_as;
}

/*
 * Records the key of an entry of the node's queue again, should it have
 * been removed by hand; returns the rows the entry's SQL demands.
 */
int64
dead_letter_record_key_local(const DeadLetterEntry *entry, const char *consumer)
{
	(void) keystore_record_key(entry->place.consumer_id, entry->key);
	return dead_letter_expect_rows(entry->id);
}

/*
 * The same for a routed entry.
 */
int64
dead_letter_record_key_routed(const DeadLetterEntry *entry, const char *consumer)
{
	RecordedKey recorded;

	(void) routed_record_key(entry->place.route, entry->place.route_type,
							 consumer, entry->key, NULL, &recorded);
	return entry->expect_rows;
}

/*
 * Fills values and nulls, from first on, with the outcome of a run of an
 * entry: the current user (replayed, edata NULL), or the new error.
 */
static void
run_values(ErrorData *edata, Datum *values, char *nulls, int first)
{
	if (edata == NULL)
		values[first] = dead_letter_current_user();
	else
		dead_letter_error_values(edata, &values[first], &nulls[first]);
}

/*
 * Records the outcome of a run of an entry of the node's queue: replayed
 * (edata NULL), or the new error and one more attempt.
 */
void
dead_letter_mark_run_local(const DeadLetterEntry *entry, ErrorData *edata)
{
	Datum		values[STORAGE_MAX_ARGS];
	char		nulls[STORAGE_MAX_ARGS];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = Int64GetDatum(entry->id);
	run_values(edata, values, nulls, 1);
	dead_letter_execute(edata == NULL ? DL_REPLAYED : DL_FAILED_AGAIN,
						values, nulls, 0);
}

/*
 * The same for a routed entry.
 */
void
dead_letter_mark_run_routed(const DeadLetterEntry *entry, ErrorData *edata)
{
	Datum		values[STORAGE_MAX_ARGS];
	char		nulls[STORAGE_MAX_ARGS];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = entry->place.route;
	values[1] = CStringGetTextDatum(entry->place.consumer);
	values[2] = PointerGetDatum(entry->key);
	run_values(edata, values, nulls, 3);
	routed_execute(edata == NULL ? RK_DL_REPLAYED : RK_DL_FAILED_AGAIN,
				   entry->place.route_type, values, nulls);
}

/*
 * Resolves a locked pending entry of the node's queue as discarded, for
 * the reason given.
 */
void
dead_letter_discard_local(const DeadLetterEntry *entry, text *reason)
{
	Datum		values[3];

	values[0] = Int64GetDatum(entry->id);
	values[1] = dead_letter_current_user();
	values[2] = PointerGetDatum(reason);
	dead_letter_execute(DL_DISCARDED, values, NULL, 0);
}

/*
 * The same for a routed entry.
 */
void
dead_letter_discard_routed(const DeadLetterEntry *entry, text *reason)
{
	Datum		values[5];

	values[0] = entry->place.route;
	values[1] = CStringGetTextDatum(entry->place.consumer);
	values[2] = PointerGetDatum(entry->key);
	values[3] = dead_letter_current_user();
	values[4] = PointerGetDatum(reason);
	routed_execute(RK_DL_DISCARDED, entry->place.route_type, values, NULL);
}
