/*-------------------------------------------------------------------------
 *
 * inflight.c
 *	  The keys whose business SQL is running in this backend: the
 *	  (consumer, key) of each unfinished idem_apply(), idem_try_apply() and
 *	  dead-letter replay, innermost last.
 *
 * Business SQL may call the API again.  It must not undo or redo the key
 * that the call running it holds: idem_forget() of that key would leave
 * the message applied but unrecorded, so that its next redelivery applies
 * it again; recording it again, or purging while keys are held, could do
 * the same by other roads.  Those functions ask here first and raise
 * object_in_use.
 *
 * The list lives in TopMemoryContext.  Whoever pushes an entry pops it
 * again on every exit, error included (PG_FINALLY), so the list is empty
 * whenever no business SQL runs; a transaction's end clears it as well,
 * in case an error escaped some caller's cleanup.
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
	text	   *key;			/* copied into TopMemoryContext */
} InflightKey;

static InflightKey *inflight = NULL;
static int	ninflight = 0;
static int	maxinflight = 0;
static bool callback_registered = false;

/*
 * Forgets every held key when a transaction ends: no business SQL can be
 * running then.
 */
static void
inflight_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			inflight_pop(0);
			break;
		default:
			break;
	}
}

/*
 * Notes that business SQL holding (consumer_id, key) starts; returns the
 * depth to give inflight_pop() when it ends.
 */
int
inflight_push(int32 consumer_id, text *key)
{
	if (!callback_registered)
	{
		RegisterXactCallback(inflight_xact_callback, NULL);
		callback_registered = true;
	}
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
		pfree(inflight[--ninflight].key);
}

/*
 * Tells whether an unfinished call of this backend holds (consumer_id, key).
 */
static bool
inflight_holds(int32 consumer_id, text *key)
{
	for (int i = 0; i < ninflight; i++)
	{
		if (inflight[i].consumer_id == consumer_id &&
			VARSIZE_ANY_EXHDR(inflight[i].key) == VARSIZE_ANY_EXHDR(key) &&
			memcmp(VARDATA_ANY(inflight[i].key), VARDATA_ANY(key),
				   VARSIZE_ANY_EXHDR(key)) == 0)
			return true;
	}
	return false;
}

/*
 * Raises object_in_use if business SQL running in this backend holds
 * (consumer_id, key); action says what was refused ("forget", "record").
 */
void
inflight_check_key(int32 consumer_id, const char *consumer, text *key,
				   const char *action)
{
	if (ninflight == 0 || !inflight_holds(consumer_id, key))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("cannot %s key \"%s\" of consumer \"%s\" while its message is being applied",
					action, text_to_cstring(key), consumer),
			 errdetail("The business SQL of this key's idem_apply, idem_try_apply or idem_dlq_replay call is still running."),
			 errhint("Business SQL must not change the record of its own key.")));
}

/*
 * Raises object_in_use if any business SQL runs in this backend: a purge
 * from inside business SQL could remove what the running calls rely on.
 */
void
inflight_check_none(const char *function_name)
{
	if (ninflight == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("%s cannot run inside the business SQL of a message", function_name),
			 errdetail("An idem_apply, idem_try_apply or idem_dlq_replay call of this session is still running its business SQL."),
			 errhint("Call %s in a transaction of its own.", function_name)));
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
