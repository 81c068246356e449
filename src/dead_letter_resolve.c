/*-------------------------------------------------------------------------
 *
 * dead_letter_resolve.c
 *	  Resolving dead-letter entries: the operator functions
 *	  idem_dlq_replay() and idem_dlq_discard(), by id, and by key and route
 *	  for the entries stored beside routed keys (routed.c): ids would be
 *	  each node's own.  Parking the entries is dead_letter.c's business;
 *	  locking, reading and marking them, in the node's queue or beside
 *	  routed keys, is dead_letter_entry.c's, through the entry's place
 *	  (key_place.h).
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

PG_FUNCTION_INFO_V1(idem_dlq_replay);
PG_FUNCTION_INFO_V1(idem_dlq_replay_consumer);
PG_FUNCTION_INFO_V1(idem_dlq_discard);
PG_FUNCTION_INFO_V1(idem_dlq_replay_key);
PG_FUNCTION_INFO_V1(idem_dlq_discard_key);

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
 * Runs a locked pending entry again under its key, as the role that
 * dead-lettered it, and records the result: replayed on success, the new
 * error and one more attempt on a permanent failure.  A transient error is
 * raised and changes nothing.
 */
static Outcome
replay_entry(const DeadLetterEntry *entry)
{
	const KeyPlaceOps *ops = entry->place.ops;
	ErrorData  *edata;
	Oid			run_as;
	char	   *consumer;
	uint64		rows;
	int64		expect_rows;

	/* the entry of a dead external effect: replaying it re-arms the effect */
	if (ops->entry_rearm(entry))
	{
		ops->entry_mark_run(entry, NULL);
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
	run_as = ops->entry_run_as(entry, &consumer);

	/*
	 * The key was recorded when the entry was made and idem_forget() leaves
	 * keys of pending entries alone; should it have been removed from the
	 * storage by hand all the same, record it again, so that a success
	 * leaves the key applied.
	 */
	expect_rows = ops->entry_record_key(entry, consumer);

	/*
	 * A message parked with expect_rows demands its rows again; the
	 * operator's session advisory locks are left as they were.
	 */
	edata = replay_locks_business_run(entry->place.consumer_id, consumer, entry->key,
									  entry->sql, entry->params, entry->settings,
									  run_as, expect_rows, &rows);
	ops->entry_mark_run(entry, edata);
	return edata == NULL ? OUTCOME_APPLIED : OUTCOME_DEAD_LETTERED;
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
	dead_letter_refuse_inside_business_sql("idem_dlq_replay", "replay", id);
	dead_letter_lock_id(id, &entry);
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
		dead_letter_entry_from_result(&entry);
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
	dead_letter_refuse_inside_business_sql("idem_dlq_discard", "discard", id);
	dead_letter_lock_id(id, &entry);
	check_pending(&entry);
	entry.place.ops->entry_discard(&entry, reason);
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * Locks and reads the entry of the key and consumer, the call's first
 * two arguments, and of the route at route_argno, for function_name's
 * action, or raises an error if there is none.  Where keys are not routed,
 * or for a NULL route, the entry is the node's entry of the key in
 * idem_dead_letters (key_place_resolve).
 */
static void
lock_entry_of_key(FunctionCallInfo fcinfo, int route_argno,
				  const char *function_name, const char *action,
				  DeadLetterEntry *entry)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	KeyPlace	place;

	key_place_resolve(fcinfo, route_argno, consumer, UNROUTED_LOCAL, &place);
	if (!place.ops->lock_entry(&place, key, function_name, action, entry))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" has no dead-letter entry of key \"%s\"",
						consumer, text_to_cstring(key)),
				 errhint("The view %s lists the entries.", place.ops->dead_letters_view)));
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
	entry.place.ops->entry_discard(&entry, reason);
	SPI_finish();

	PG_RETURN_VOID();
}
