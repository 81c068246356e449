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
 * resolve.  Nor may it change the record of other keys, of any consumer
 * the caller may act on: a trigger of another team that forgets an older
 * key of the caller's consumer makes that message's redelivery apply
 * again, and one that records a key the consumer has yet to receive makes
 * its real delivery a duplicate that changes nothing, a lost message.
 *
 * The rule, for every function that changes what is recorded (idem_apply,
 * idem_try_apply and their typed and routed forms, the batches,
 * idem_forget, the effect functions, dead-letter replay and discard,
 * idem_purge, and the operator functions that change how keys are
 * recorded: owners, fingerprints, retention):
 *
 *	 - while business SQL runs in this backend, the function is refused,
 *	   whatever key and consumer it names;
 *	 - once business SQL has run in the current top-level transaction, the
 *	   function is refused for the rest of that transaction whenever it is
 *	   called from a trigger (pg_trigger_depth() > 0).
 *
 * The first covers everything the business SQL's statements run: triggers,
 * rules, column defaults, check constraints, index expressions and views
 * all run inside them.  The second covers what they leave behind to run
 * later with the caller's rights: deferred constraint triggers fired at
 * commit or by SET CONSTRAINTS ... IMMEDIATE (both at trigger depth 1 or
 * more), which business SQL of another team's table queues.  The calls the
 * transaction makes itself, from its own statements at trigger depth 0,
 * are allowed; so is a trigger's call before any business SQL ran,
 * but not a second one after it: which trigger calls cannot be told, so
 * an inbox trigger that applies one message per row applies the first row
 * of a transaction and refuses the next (one message per transaction, or
 * the calls in the transaction's own statements).  Event triggers belong
 * to superusers, and run only for the DDL of the statement that fires
 * them.  Refusals raise object_in_use, as for a key held by business SQL:
 * the same call succeeds in a transaction of its own, so it is the state
 * of the transaction that refuses, not a privilege.  The messages name no
 * running key: a trigger of another role may be the one that reads them.
 *
 * The list lives in TopMemoryContext.  Whoever pushes an entry pops it
 * again on every exit, error included (PG_FINALLY), so the list is empty
 * whenever no business SQL runs; a transaction's end clears it as well,
 * in case an error escaped some caller's cleanup, and with it the note
 * that business SQL ran (a subtransaction's abort keeps the note: the
 * triggers the business SQL queued before may still be pending, and
 * erring on the side of refusal costs only a trigger's call).  keystore.c
 * refuses, besides, to forget a key in the transaction that recorded it,
 * whoever asks, and a purge is refused in a transaction that has recorded
 * keys (noted here, and cleared by the same transaction-end callback).
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
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "idem_consumer.h"
#include "text_bytes.h"

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
 * Whether business SQL has started in the current top-level transaction:
 * from then on, triggers may not change the record of keys.
 */
static bool business_ran_in_xact = false;

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
			business_ran_in_xact = false;
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
	business_ran_in_xact = true;
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
		if (key == NULL || text_bytes_equal(inflight[i].key, key))
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
	{
		inflight_check_none(function_name);
		return;
	}

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
 * pg_trigger_depth(): how many triggers are running in this backend, the
 * deferred ones fired at commit included.
 */
static int
trigger_depth(void)
{
	LOCAL_FCINFO(fcinfo, 0);

	InitFunctionCallInfoData(*fcinfo, NULL, 0, InvalidOid, NULL, NULL);
	return DatumGetInt32(pg_trigger_depth(fcinfo));
}

/*
 * Whether the header's rule refuses a change of the record of keys now.
 */
static bool
inflight_refuses(void)
{
	return ninflight > 0 || (business_ran_in_xact && trigger_depth() > 0);
}

/*
 * Raises object_in_use if function, which changes the record of keys, may
 * not run now: business SQL runs in this backend, or it ran earlier in
 * this transaction and function is called from a trigger.
 */
void
inflight_check_none(const char *function_name)
{
	if (!inflight_refuses())
		return;
	if (ninflight == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("%s cannot run from a trigger in a transaction that has run business SQL",
						function_name),
				 errdetail("A trigger, a deferred one at commit included, may belong to another role "
						   "whose table the business SQL changed; it must not change the record of messages."),
				 errhint("Call %s from the transaction's own statements, or in a transaction of its own.",
						 function_name)));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("%s cannot run inside the business SQL of a message", function_name),
			 errdetail("An idem_apply, idem_try_apply, idem_dlq_replay or idem_effect_complete call of this session "
					   "is running its business SQL, which must not change the record of messages, "
					   "nor may the triggers it fires."),
			 errhint("Call %s in a transaction of its own.", function_name)));
}

/*
 * inflight_check_none() for the SQL function that fcinfo calls, named only
 * when it is refused.
 */
void
inflight_check_call(FunctionCallInfo fcinfo)
{
	if (!inflight_refuses())
		return;
	inflight_check_none(get_func_name(fcinfo->flinfo->fn_oid));
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
