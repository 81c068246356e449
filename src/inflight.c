/*-------------------------------------------------------------------------
 *
 * inflight.c
 *	  The messages whose business SQL is running in this backend: the
 *	  consumer and key of each unfinished idem_apply(), idem_try_apply(),
 *	  dead-letter replay and idem_effect_complete() with SQL, innermost
 *	  last.
 *
 * Business SQL runs with the caller's rights, and so do the triggers it
 * fires, including other teams' triggers on tables it touches; it may call
 * the API again.  It must not change the record of messages while one is
 * being applied: idem_forget() of the running key would leave the message
 * applied but unrecorded, so that its next redelivery applies it again; a
 * replay of the running message's own dead-letter entry applies it again
 * inside itself, and a replay of its consumer's entries picks that entry
 * too; a discard of it leaves the running replay an entry it can no longer
 * resolve.  Recording the running key again, purging, and the operator
 * functions that change what is recorded or how (owners, fingerprints,
 * retention) are refused for the same reason.  Those functions ask here
 * first and raise object_in_use.  The messages name no running key: a
 * trigger of another role may be the one that reads them.
 *
 * The list lives in TopMemoryContext.  Whoever pushes an entry pops it
 * again on every exit, error included (PG_FINALLY), so the list is empty
 * whenever no business SQL runs; a transaction's end clears it as well,
 * in case an error escaped some caller's cleanup.  Deferred triggers run
 * at commit, after the list is empty: keystore.c refuses to forget a key
 * in the transaction that recorded it, whoever asks, and a purge is
 * refused in a transaction that has recorded keys (noted here, and cleared
 * by the same transaction-end callback).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/inflight.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "idem_consumer.h"

typedef struct InflightKey
{
	int32		consumer_id;
	char	   *consumer;		/* copied into TopMemoryContext */
	text	   *key;			/* the same */
} InflightKey;

static InflightKey *inflight = NULL;
static int	ninflight = 0;
static int	maxinflight = 0;
static bool callback_registered = false;

/*
 * Whether the current transaction has recorded keys, or tried to.  A purge
 * in the same transaction, from a deferred trigger at commit say, could
 * remove a key this transaction recorded whose window is shorter than the
 * transaction's age: the message's changes would commit without its
 * record, as a forget would leave them (keystore.c refuses that forget).
 */
static bool recording_in_xact = false;

/*
 * Forgets every held key when a transaction ends: no business SQL can be
 * running then, and the next transaction has recorded nothing yet.
 */
static void
inflight_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			inflight_pop(0);
			recording_in_xact = false;
			break;
		default:
			break;
	}
}

/*
 * Registers the transaction-end callback once per backend.
 */
static void
inflight_register_callback(void)
{
	if (callback_registered)
		return;
	RegisterXactCallback(inflight_xact_callback, NULL);
	callback_registered = true;
}

/*
 * Notes that business SQL of (consumer_id, key) starts; returns the depth
 * to give inflight_pop() when it ends.  consumer is the consumer's name.
 */
int
inflight_push(int32 consumer_id, const char *consumer, text *key)
{
	inflight_register_callback();
	if (ninflight == maxinflight)
	{
		int			newmax = Max(4, maxinflight * 2);

		if (inflight == NULL)
			inflight = MemoryContextAlloc(TopMemoryContext, newmax * sizeof(InflightKey));
		else
			inflight = repalloc(inflight, newmax * sizeof(InflightKey));
		maxinflight = newmax;
	}
	inflight[ninflight].consumer_id = consumer_id;
	inflight[ninflight].consumer = MemoryContextStrdup(TopMemoryContext, consumer);
	inflight[ninflight].key = (text *) MemoryContextAlloc(TopMemoryContext,
														   VARSIZE_ANY(key));
	memcpy(inflight[ninflight].key, key, VARSIZE_ANY(key));
	return ninflight++;
}

/*
 * Forgets the held keys from depth on.
 */
void
inflight_pop(int depth)
{
	while (ninflight > depth)
	{
		ninflight--;
		pfree(inflight[ninflight].consumer);
		pfree(inflight[ninflight].key);
	}
}

/*
 * Runs business SQL of (consumer_id, key), holding the key for as long as
 * it runs; returns the rows it affected.
 */
uint64
inflight_execute(int32 consumer_id, const char *consumer, text *key,
				 BusinessPlan *bplan, ParamListInfo params)
{
	int			depth = inflight_push(consumer_id, consumer, key);
	uint64		rows = 0;

	PG_TRY();
	{
		rows = business_plan_execute(bplan, params);
	}
	PG_FINALLY();
	{
		inflight_pop(depth);
	}
	PG_END_TRY();
	return rows;
}

/*
 * Tells whether any business SQL runs in this backend.
 */
bool
inflight_any(void)
{
	return ninflight > 0;
}

/*
 * Returns the innermost running call of consumer_id whose key is key, or
 * of any key when key is NULL; NULL if there is none.
 */
static const InflightKey *
inflight_find(int32 consumer_id, text *key)
{
	for (int i = ninflight - 1; i >= 0; i--)
	{
		if (inflight[i].consumer_id != consumer_id)
			continue;
		if (key == NULL ||
			(VARSIZE_ANY_EXHDR(inflight[i].key) == VARSIZE_ANY_EXHDR(key) &&
			 memcmp(VARDATA_ANY(inflight[i].key), VARDATA_ANY(key),
					VARSIZE_ANY_EXHDR(key)) == 0))
			return &inflight[i];
	}
	return NULL;
}

/*
 * Raises object_in_use if business SQL running in this backend holds
 * (consumer_id, key); action says what was refused ("forget", "record").
 */
void
inflight_check_key(int32 consumer_id, const char *consumer, text *key,
				   const char *action)
{
	if (ninflight == 0 || inflight_find(consumer_id, key) == NULL)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("cannot %s key \"%s\" of consumer \"%s\" while its message is being applied",
					action, text_to_cstring(key), consumer),
			 errdetail("The business SQL of this key is still running in this session."),
			 errhint("Business SQL must not change the record of its own key.")));
}

/*
 * inflight_check_key() for each key of a batch, given as text Datums.
 */
void
inflight_check_keys(int32 consumer_id, const char *consumer, Datum *keys,
					int nkeys, const char *action)
{
	if (ninflight == 0)
		return;
	for (int i = 0; i < nkeys; i++)
		inflight_check_key(consumer_id, consumer, DatumGetTextPP(keys[i]), action);
}

/*
 * Raises object_in_use if a dead-letter entry may not be replayed or
 * discarded (action) because business SQL runs in this backend: the
 * entry's own message, or for a replay any message of its consumer, or
 * any business SQL at all.  entry_name names the entry ("entry 12");
 * it is NULL and key NULL for a replay of a consumer's entries;
 * consumer_id is 0 for an entry that does not exist.
 */
void
inflight_check_dead_letter(const char *function_name, const char *action,
						   const char *entry_name, int32 consumer_id, text *key)
{
	const InflightKey *running;

	if (ninflight == 0)
		return;

	if (key != NULL && inflight_find(consumer_id, key) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("cannot %s dead-letter %s while its message is being applied",
						action, entry_name),
				 errdetail("The business SQL of the entry's message is running in this session and called %s.",
						   function_name),
				 errhint("Replay or discard dead-letter entries in a transaction of their own, not from business SQL.")));

	if (strcmp(action, "replay") == 0 &&
		(running = inflight_find(consumer_id, NULL)) != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("cannot replay dead-letter entries of consumer \"%s\" while a message of that consumer is being applied",
						running->consumer),
				 errdetail("Business SQL of a message of the consumer is running in this session; a replay from inside it could apply that message, or the entries it replays, again."),
				 errhint("Replay dead-letter entries in a transaction of their own, not from business SQL.")));

	inflight_check_none(function_name);
}

/*
 * Raises object_in_use if any business SQL runs in this backend: function
 * changes the record of keys, which business SQL, and whatever triggers it
 * fires, must not do while a message is being applied.
 */
void
inflight_check_none(const char *function_name)
{
	if (ninflight == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("%s cannot run inside the business SQL of a message", function_name),
			 errdetail("An idem_apply, idem_try_apply, idem_dlq_replay or idem_effect_complete call of this session "
					   "is running its business SQL, which must not change the record of messages, "
					   "nor may the triggers it fires."),
			 errhint("Call %s in a transaction of its own.", function_name)));
}

/*
 * Notes that the current transaction records keys.
 */
void
inflight_note_recording(void)
{
	inflight_register_callback();
	recording_in_xact = true;
}

/*
 * Raises object_in_use if the current transaction has recorded keys:
 * function_name, a purge, may not run in it.
 */
void
inflight_check_not_recording(const char *function_name)
{
	if (!recording_in_xact)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("%s cannot run in a transaction that records keys", function_name),
			 errdetail("A purge could remove a key this transaction recorded before it commits, "
					   "and the next delivery of its message would be applied again."),
			 errhint("Call %s in a transaction of its own.", function_name)));
}
