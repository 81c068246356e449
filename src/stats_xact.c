/*-------------------------------------------------------------------------
 *
 * stats_xact.c
 *	  What a transaction counts: the calls' aggregates of this backend,
 *	  added to shared memory when the transaction ends.
 *
 * Outcomes count only once their transaction is over: each call is added
 * to a backend-local aggregate of its consumer and subtransaction level
 * when it starts, and a transaction callback adds the aggregates to shared
 * memory at commit (applied, duplicates, dead-lettered, latency and lag)
 * or counts every call as failed at abort.  A subtransaction abort counts
 * the calls made inside it as failed at once; a subtransaction commit
 * merges its aggregates into its parent's.  An aggregate keeps the latency
 * and lag of its first few applied calls, then a histogram of each, so a
 * transaction's memory grows with the consumers it calls (at most
 * max_consumers of them), not with its calls.
 * The calls of a transaction prepared for two-phase commit count as
 * untracked: its outcome is not known at PREPARE TRANSACTION.
 * The events of external effects (effects.c) are counted with the calls,
 * at the end of the transaction; those of a transaction that rolls back
 * count too, for a consumer that existed before it, since the events that
 * matter most raise an error.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/stats_xact.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "portability/instr_time.h"
#include "utils/memutils.h"

#include "stats_internal.h"

/* Applied calls of an aggregate kept one by one before a histogram. */
#define PENDING_SAMPLES			8

/* One applied call kept as it was, until a histogram replaces them. */
typedef struct PendingSample
{
	int64		latency_us;		/* per message */
	int			messages;
	TimestampTz event_time;		/* DT_NOBEGIN if not given */
} PendingSample;

/*
 * The calls of one consumer at one subtransaction level of this backend's
 * transaction, not counted yet.
 */
typedef struct PendingCounts
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];
	int			nest_level;
	struct PendingCounts *outer;	/* the same consumer, a shallower level */

	/* the consumer's slot as found when the aggregate was made */
	ConsumerStatsEntry *entry;	/* NULL: no slot then */
	uint64		generation;		/* of entry */
	bool		exists;			/* committed in the catalog before the call */
	bool		resolved;		/* a call reached the consumer's row */

	int64		calls;
	int64		unfinished;		/* calls that never returned */
	int64		applied;
	int64		duplicates;
	int64		dead_lettered;
	int64		key_reuse;		/* counted whether it commits or not */
	int64		effects[EFFECT_NUM_EVENTS];
	TimestampTz last_event_time;	/* of the last applied call with one */
	int			nsamples;
	PendingSample samples[PENDING_SAMPLES];
	IdemHistogram *latency;		/* once the samples overflow */
	IdemHistogram *lag;			/* the same; measured at the call's end */
} PendingCounts;

/* A call between stats_call_begin() and stats_call_end(). */
typedef struct OpenCall
{
	PendingCounts *counts;
	int			nest_level;
	bool		open;
	instr_time	start;
} OpenCall;

/* The deepest aggregate of a consumer in this transaction. */
typedef struct PendingIndexEntry
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	PendingCounts *deepest;
} PendingIndexEntry;

/*
 * Backend-local.  The pending aggregates live in pending_cxt, emptied
 * when each transaction ends, at most max_consumers of them.
 */
static MemoryContext pending_cxt = NULL;
static HTAB *pending_index = NULL;
static PendingCounts **pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static OpenCall *open_calls = NULL;
static int	nopen = 0;
static int	maxopen = 0;
static bool callbacks_registered = false;

static void stats_xact_callback(XactEvent event, void *arg);
static void stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								   SubTransactionId parentSubid, void *arg);

/*
 * Returns the index of aggregates by consumer.
 */
static HTAB *
pending_index_table(void)
{
	if (pending_index == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.entrysize = sizeof(PendingIndexEntry);
		ctl.hcxt = TopMemoryContext;
		pending_index = hash_create("idem_consumer pending counts", 16, &ctl,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	return pending_index;
}

/*
 * Returns the aggregate of a consumer at the current subtransaction level,
 * making it if needed; NULL when the call cannot be counted per consumer:
 * the consumer exists but has no slot, or the transaction has calls of
 * max_consumers consumers already.
 */
static PendingCounts *
pending_counts(const char *consumer)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingIndexEntry *index;
	PendingCounts *counts;
	PendingCounts *outer;
	bool		found;

	/*
	 * The aggregate made last, if it is of this consumer and level, is the
	 * one the index would give (levels only deepen along the list, and a
	 * consumer has one aggregate per level): a session mostly counts one
	 * consumer call after call, and this spares hashing its name.
	 */
	if (npending > 0 && pending[npending - 1]->nest_level == level &&
		strcmp(pending[npending - 1]->consumer, consumer) == 0)
		return pending[npending - 1];

	index = hash_search(pending_index_table(), consumer, HASH_FIND, NULL);
	outer = index != NULL ? index->deepest : NULL;
	if (outer != NULL && outer->nest_level == level)
		return outer;
	if (npending >= idem_max_consumers)
	{
		stats_warn_untracked(consumer, true);
		return NULL;
	}

	if (!callbacks_registered)
	{
		RegisterXactCallback(stats_xact_callback, NULL);
		RegisterSubXactCallback(stats_subxact_callback, NULL);
		callbacks_registered = true;
	}
	if (pending_cxt == NULL)
		pending_cxt = AllocSetContextCreate(TopMemoryContext,
											"idem_consumer pending counts",
											ALLOCSET_DEFAULT_SIZES);

	counts = MemoryContextAllocZero(pending_cxt, sizeof(PendingCounts));
	strlcpy(counts->consumer, consumer, sizeof(counts->consumer));
	counts->nest_level = level;
	counts->outer = outer;
	counts->last_event_time = DT_NOBEGIN;
	if (outer != NULL)
	{
		counts->entry = outer->entry;
		counts->generation = outer->generation;
		counts->exists = outer->exists;
	}
	else if (!stats_resolve_slot(counts->consumer, &counts->entry,
								 &counts->generation, &counts->exists))
	{
		pfree(counts);
		stats_warn_untracked(consumer, false);
		return NULL;
	}

	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(pending_cxt, newmax * sizeof(PendingCounts *));
		else
			pending = repalloc(pending, newmax * sizeof(PendingCounts *));
		maxpending = newmax;
	}
	pending[npending++] = counts;
	index = hash_search(pending_index, consumer, HASH_ENTER, &found);
	index->deepest = counts;
	return counts;
}

/*
 * Folds an aggregate's applied calls kept one by one into its histograms,
 * measuring their lag now.
 */
static void
fold_samples(PendingCounts *counts)
{
	TimestampTz now = GetCurrentTimestamp();

	if (counts->latency == NULL)
	{
		counts->latency = MemoryContextAllocZero(pending_cxt, sizeof(IdemHistogram));
		counts->lag = MemoryContextAllocZero(pending_cxt, sizeof(IdemHistogram));
	}
	for (int i = 0; i < counts->nsamples; i++)
	{
		PendingSample *sample = &counts->samples[i];

		histogram_add_n(counts->latency, sample->latency_us, sample->messages);
		if (!TIMESTAMP_IS_NOBEGIN(sample->event_time))
			histogram_add(counts->lag, now - sample->event_time);
	}
	counts->nsamples = 0;
}

/*
 * Adds one aggregate to another of the same consumer (a committed
 * subtransaction's to its parent's).
 */
static void
merge_counts(PendingCounts *into, PendingCounts *from)
{
	into->calls += from->calls;
	into->unfinished += from->unfinished;
	into->applied += from->applied;
	into->duplicates += from->duplicates;
	into->dead_lettered += from->dead_lettered;
	into->key_reuse += from->key_reuse;
	into->resolved |= from->resolved;
	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		into->effects[e] += from->effects[e];
	if (!TIMESTAMP_IS_NOBEGIN(from->last_event_time))
		into->last_event_time = from->last_event_time;
	if (from->latency != NULL || into->nsamples + from->nsamples > PENDING_SAMPLES)
	{
		fold_samples(into);
		fold_samples(from);
		histogram_merge(into->latency, from->latency);
		histogram_merge(into->lag, from->lag);
	}
	else
	{
		memcpy(&into->samples[into->nsamples], from->samples,
			   from->nsamples * sizeof(PendingSample));
		into->nsamples += from->nsamples;
	}
}

/*
 * Frees an aggregate that was counted or merged, so that a transaction
 * of many subtransactions keeps only the aggregates alive.
 */
static void
free_counts(PendingCounts *counts)
{
	if (counts->latency != NULL)
	{
		pfree(counts->latency);
		pfree(counts->lag);
	}
	pfree(counts);
}

/*
 * Returns the slot an aggregate's counts go to, with the shared lock held
 * (the caller releases it), or NULL without the lock.  A consumer without
 * a slot gets one if make is true and there is room.
 */
static ConsumerStatsEntry *
lock_slot(PendingCounts *counts, bool make)
{
	ConsumerStatsEntry *entry = NULL;
	uint64		generation;

	LWLockAcquire(stats_state->lock, LW_SHARED);
	if (counts->entry != NULL &&
		counts->generation == pg_atomic_read_u64(&stats_state->generation))
		return counts->entry;
	{
		StatsKey	key;

		stats_make_key(&key, MyDatabaseId, counts->consumer);
		entry = hash_search(stats_hash, &key, HASH_FIND, NULL);
	}
	if (entry != NULL)
		return entry;
	LWLockRelease(stats_state->lock);
	if (!make)
		return NULL;

	/* made under the exclusive lock, then written under the shared one */
	do
	{
		entry = stats_find_or_make_slot(counts->consumer, &generation);
		if (entry == NULL)
			return NULL;
		LWLockAcquire(stats_state->lock, LW_SHARED);
		if (generation == pg_atomic_read_u64(&stats_state->generation))
			return entry;
		LWLockRelease(stats_state->lock);
	} while (true);
}

/*
 * Adds an aggregate's counts to its consumer's slot; committed tells
 * whether its calls committed (else they failed).  Counts of a consumer
 * that is not known to exist are forgotten: its creation rolled back, or
 * was refused.
 */
static void
flush_counts(PendingCounts *counts, bool committed, TimestampTz now)
{
	ConsumerStatsEntry *entry;
	ConsumerCounters *c;
	bool		known;
	bool		any = counts->calls > 0 || counts->key_reuse > 0;
	HistogramSample latency[PENDING_SAMPLES];
	HistogramSample lag[PENDING_SAMPLES];
	int			nlatency = 0;
	int			nlag = 0;

	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		any |= counts->effects[e] > 0;
	if (!any)
		return;

	/* a call that returned, or an effect counted, found or made its row */
	known = counts->exists ||
		(committed && (counts->resolved || counts->calls > counts->unfinished));
	if (!known)
		return;

	/* the histograms' math, done before any lock is taken */
	if (committed && counts->applied > 0)
	{
		for (int i = 0; i < counts->nsamples; i++)
		{
			PendingSample *sample = &counts->samples[i];

			histogram_sample(&latency[nlatency++], sample->latency_us,
							 sample->messages);
			if (!TIMESTAMP_IS_NOBEGIN(sample->event_time))
				histogram_sample(&lag[nlag++], now - sample->event_time, 1);
		}
	}

	entry = lock_slot(counts, true);
	if (entry == NULL)
	{
		stats_count_untracked(counts->calls);
		if (committed)
		{
			/* the consumer exists now, and will find no room next time */
			stats_remember_slot(counts->consumer, NULL, counts->generation);
			stats_warn_untracked(counts->consumer, false);
		}
		return;
	}

	c = &entry->counters;
	LWLockAcquire(&entry->lock, LW_EXCLUSIVE);
	c->key_reuse += counts->key_reuse;
	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		c->effects[e] += counts->effects[e];
	if (!committed)
		c->failed += counts->calls;
	else
	{
		c->failed += counts->unfinished;
		c->applied += counts->applied;
		c->duplicates += counts->duplicates;
		c->dead_lettered += counts->dead_lettered;
		if (counts->applied > 0)
		{
			c->last_applied_at = now;
			for (int i = 0; i < nlatency; i++)
				histogram_add_sample(&c->latency, &latency[i]);
			for (int i = 0; i < nlag; i++)
				histogram_add_sample(&c->lag, &lag[i]);
			if (counts->latency != NULL)
			{
				histogram_merge(&c->latency, counts->latency);
				histogram_merge(&c->lag, counts->lag);
			}
			if (!TIMESTAMP_IS_NOBEGIN(counts->last_event_time))
			{
				c->lag_last_us = now - counts->last_event_time;
				c->has_lag = true;
			}
		}
		if (counts->duplicates > 0)
			c->last_duplicate_at = now;
	}
	LWLockRelease(&entry->lock);
	LWLockRelease(stats_state->lock);
}

/*
 * Forgets every aggregate and call of the transaction.
 */
static void
pending_reset(void)
{
	for (int i = 0; i < npending; i++)
		(void) hash_search(pending_index, pending[i]->consumer, HASH_REMOVE, NULL);
	npending = 0;
	maxpending = 0;
	pending = NULL;
	nopen = 0;
	if (pending_cxt != NULL)
		MemoryContextReset(pending_cxt);
}

/*
 * Counts the calls of a transaction prepared for two-phase commit as
 * untracked.  Whether it commits is decided later, by COMMIT PREPARED or
 * ROLLBACK PREPARED, possibly in another session or after a restart, when
 * the calls noted here are gone; counting them as applied now would show
 * messages whose transaction is then rolled back.
 */
static void
count_prepared(void)
{
	int64		calls = 0;

	for (int i = 0; i < npending; i++)
		calls += pending[i]->calls;
	stats_count_untracked(calls);
}

/*
 * Counts the aggregates when the top-level transaction ends.
 */
static void
stats_xact_callback(XactEvent event, void *arg)
{
	TimestampTz now;

	if (npending == 0 && nopen == 0)
		return;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
			now = GetCurrentTimestamp();
			for (int i = 0; i < npending; i++)
				flush_counts(pending[i], true, now);
			pending_reset();
			break;
		case XACT_EVENT_PREPARE:
			count_prepared();
			pending_reset();
			break;
		case XACT_EVENT_ABORT:
			now = GetCurrentTimestamp();
			for (int i = 0; i < npending; i++)
				flush_counts(pending[i], false, now);
			pending_reset();
			break;
		default:
			break;
	}
}

/*
 * Merges the aggregates of a committed subtransaction into its parent's,
 * and counts those of an aborted one as failed.  The aggregates of a level
 * are a suffix of the list, since levels only deepen along it.
 */
static void
stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			level;
	int			first;
	int			kept;
	TimestampTz now;

	if (npending == 0 && nopen == 0)
		return;
	if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB)
		return;

	level = GetCurrentTransactionNestLevel();
	for (first = npending; first > 0 && pending[first - 1]->nest_level >= level; first--)
		;
	/* a call still open at the end of its level never returned */
	while (nopen > 0 && open_calls[nopen - 1].nest_level >= level)
		nopen--;

	now = GetCurrentTimestamp();
	kept = first;
	for (int i = first; i < npending; i++)
	{
		PendingCounts *counts = pending[i];
		PendingCounts *outer = counts->outer;
		PendingIndexEntry *index;

		index = hash_search(pending_index, counts->consumer, HASH_FIND, NULL);
		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			flush_counts(counts, false, now);
			if (outer != NULL)
				index->deepest = outer;
			else
				(void) hash_search(pending_index, counts->consumer, HASH_REMOVE, NULL);
			free_counts(counts);
			continue;
		}
		if (outer != NULL && outer->nest_level == level - 1)
		{
			merge_counts(outer, counts);
			index->deepest = outer;
			free_counts(counts);
			continue;
		}
		counts->nest_level = level - 1;
		pending[kept++] = counts;
	}
	npending = kept;
}

/*
 * Notes the start of a call; returns a handle for stats_call_end(), or -1
 * when the call is not counted.  The caller has resolved the consumer,
 * which checks that the current role may act on it, or found that it does
 * not exist yet.
 */
int
stats_call_begin(const char *consumer)
{
	PendingCounts *counts;
	OpenCall   *call;

	if (stats_state == NULL || !idem_track)
		return -1;

	counts = pending_counts(consumer);
	if (counts == NULL)
	{
		stats_count_untracked(1);
		return -1;
	}

	if (nopen == maxopen)
	{
		int			newmax = Max(8, maxopen * 2);

		if (open_calls == NULL)
			open_calls = MemoryContextAlloc(TopMemoryContext, newmax * sizeof(OpenCall));
		else
			open_calls = repalloc(open_calls, newmax * sizeof(OpenCall));
		maxopen = newmax;
	}
	counts->calls++;
	counts->unfinished++;
	call = &open_calls[nopen];
	call->counts = counts;
	call->nest_level = counts->nest_level;
	call->open = true;
	INSTR_TIME_SET_CURRENT(call->start);
	return nopen++;
}

/*
 * Notes the outcome of a call that returned normally; event_time is
 * DT_NOBEGIN when the caller passed none.
 */
void
stats_call_end(int call_id, int applied, int duplicates, int dead_lettered,
			   TimestampTz event_time)
{
	OpenCall   *call;
	PendingCounts *counts;
	instr_time	elapsed;

	if (call_id < 0 || call_id >= nopen || !open_calls[call_id].open)
		return;

	call = &open_calls[call_id];
	counts = call->counts;
	INSTR_TIME_SET_CURRENT(elapsed);
	INSTR_TIME_SUBTRACT(elapsed, call->start);
	counts->unfinished--;
	counts->resolved = true;
	counts->applied += applied;
	counts->duplicates += duplicates;
	counts->dead_lettered += dead_lettered;
	if (applied > 0)
	{
		PendingSample *sample;

		if (counts->latency != NULL || counts->nsamples == PENDING_SAMPLES)
			fold_samples(counts);
		sample = &counts->samples[counts->nsamples++];
		/* a batch's messages share its time equally */
		sample->latency_us = (int64) INSTR_TIME_GET_MICROSEC(elapsed) / applied;
		sample->messages = applied;
		sample->event_time = event_time;
		if (!TIMESTAMP_IS_NOBEGIN(event_time))
			counts->last_event_time = event_time;
	}

	call->open = false;
	while (nopen > 0 && !open_calls[nopen - 1].open)
		nopen--;
}

/*
 * Notes that a call found its key recorded for another message; counted
 * when the transaction ends, whether the call then fails or parks it.
 */
void
stats_call_key_reuse(int call_id)
{
	if (call_id >= 0 && call_id < nopen && open_calls[call_id].open)
		open_calls[call_id].counts->key_reuse++;
}

/*
 * Counts an event of an external effect, when the transaction ends.  The
 * events that matter most (a fenced-off completion, a request mismatch)
 * raise an error, so they count at abort too, for a consumer that existed
 * before the transaction.
 */
void
stats_count_effect(const char *consumer, EffectEvent event)
{
	PendingCounts *counts;

	if (stats_state == NULL || !idem_track)
		return;
	counts = pending_counts(consumer);
	if (counts == NULL)
	{
		stats_count_untracked(1);
		return;
	}
	counts->effects[event]++;
	counts->resolved = true;
}
