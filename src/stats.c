/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Per-consumer counters in shared memory: what idem_apply() absorbed
 *	  and how fast, read through the idem_stats view and idem_metrics().
 *
 * A consumer is a name in one database, so its counters are keyed by the
 * database's OID and the name: "payments" in two databases has two sets.
 * The views show the counters of the database they are read in.
 *
 * Who reads which counters, pg_stat_statements' rule for other users'
 * queries: a role with the privileges of pg_read_all_stats (pg_monitor,
 * superusers) reads every consumer's; any other role reads those of the
 * consumers of its database whose owner's privileges it has (the test of
 * the other views, pg_has_role(owner, 'USAGE')) and those without an
 * owner.  A consumer of another database, whose owner only that
 * database's catalog knows, or one that no longer exists, is read by
 * pg_read_all_stats only.  The functions that read counters filter the
 * rows themselves (stats_foreach_readable), so that no row they hide ever
 * reaches a plan node, a WHERE clause or EXPLAIN ANALYZE's row counts.
 *
 * Locking protocol, in the manner of pg_stat_statements:
 *	- the hash tables' shape is protected by stats_state->lock: exclusive to
 *	  add or remove an entry, shared to look one up, to iterate, or to touch
 *	  an entry's counters;
 *	- an entry's counters are protected by its own LWLock (in the tranche
 *	  of stats_state->lock), taken after the shared lock on the table:
 *	  exclusive to add a transaction's counts or to zero them, shared to
 *	  copy them out.  Not a spinlock: the counters hold two histograms of
 *	  some 290 buckets each, which a reader copies whole (4.7 kB) and a
 *	  writer may merge bucket by bucket.  A writer finds the buckets of
 *	  its samples (the log10) before it takes the lock, so that the lock
 *	  covers the additions only;
 *	- a database's own fields (untracked calls, reset time) are protected by
 *	  stats_state->mutex.
 * Every removal of entries bumps stats_state->generation, so that a
 * backend can keep the address of an entry it found for as long as the
 * generation it found it in lasts, and checks that under the shared lock
 * before it writes there.
 *
 * The other files of the counters: stats_slots.c (which consumers have a
 * slot), stats_xact.c (what a transaction counts), stats_file.c (shared
 * memory made at start-up, and the counters across a restart), stats_views.c (the SQL functions that read
 * and reset them).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "stats_internal.h"

/* GUCs */
int			idem_max_consumers = 1000;
int			idem_max_consumers_per_database = 0;
bool		idem_track = true;
bool		idem_save = true;

StatsSharedState *stats_state = NULL;
HTAB	   *stats_hash = NULL;
HTAB	   *db_hash = NULL;
HTAB	   *db_slots_hash = NULL;

/*
 * Fills a key: the name zero-padded, since keys are hashed as bytes.
 */
void
stats_make_key(StatsKey *key, Oid dbid, const char *consumer)
{
	memset(key, 0, sizeof(StatsKey));
	key->dbid = dbid;
	strlcpy(key->consumer, consumer, sizeof(key->consumer));
}

/*
 * Tells whether counters hold anything worth keeping across a restart.
 */
bool
stats_counters_empty(const ConsumerCounters *counters)
{
	for (int i = 0; i < EFFECT_NUM_EVENTS; i++)
		if (counters->effects[i] != 0)
			return false;
	return counters->applied == 0 && counters->duplicates == 0 &&
		counters->failed == 0 && counters->dead_lettered == 0 &&
		counters->key_reuse == 0;
}

/*
 * When preloaded, defines the counters' GUCs; stats_file_init() hooks
 * shared memory.
 */
void
stats_init(void)
{
	/* a PGC_POSTMASTER variable can only be defined while preloading */
	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomIntVariable("idem_consumer.max_consumers",
							"Sets how many consumers have counters in shared memory.",
							"Calls of further consumers are counted in idem_stats_info.untracked_calls only.",
							&idem_max_consumers,
							1000,
							16,
							100000,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("idem_consumer.max_consumers_per_database",
							"Sets how many consumers of one database have counters in shared memory.",
							"0 leaves every database the whole of idem_consumer.max_consumers. "
							"Calls of further consumers of a database at its share are counted in its "
							"idem_stats_info.untracked_calls only.",
							&idem_max_consumers_per_database,
							0,
							0,
							100000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);
	DefineCustomBoolVariable("idem_consumer.track",
							 "Counts idem_apply() outcomes in idem_stats.",
							 NULL,
							 &idem_track,
							 true,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomBoolVariable("idem_consumer.save",
							 "Saves the counters across server shutdowns.",
							 NULL,
							 &idem_save,
							 true,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);
}

/*
 * Raises an error unless the counters are in shared memory.
 */
void
stats_require_shmem(void)
{
	if (stats_state == NULL || stats_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem_consumer must be loaded via shared_preload_libraries"),
				 errdetail("The counters of idem_consumer live in shared memory; deduplication works without them."),
				 errhint("Add idem_consumer to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * Adds calls to the untracked calls of this database.  The entry is made
 * if there is room; the caller holds no lock.
 */
void
stats_count_untracked(int64 calls)
{
	DatabaseStatsEntry *db;

	if (calls == 0)
		return;
	LWLockAcquire(stats_state->lock, LW_SHARED);
	db = hash_search(db_hash, &MyDatabaseId, HASH_FIND, NULL);
	if (db == NULL)
	{
		bool		found;

		LWLockRelease(stats_state->lock);
		LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
		db = NULL;
		if (hash_get_num_entries(db_hash) < idem_max_consumers)
			db = hash_search(db_hash, &MyDatabaseId, HASH_ENTER_NULL, &found);
		else
			db = hash_search(db_hash, &MyDatabaseId, HASH_FIND, &found);
		if (db != NULL && !found)
		{
			db->untracked_calls = 0;
			db->stats_reset = GetCurrentTimestamp();
		}
	}
	if (db != NULL)
	{
		SpinLockAcquire(&stats_state->mutex);
		db->untracked_calls += calls;
		SpinLockRelease(&stats_state->mutex);
	}
	LWLockRelease(stats_state->lock);
}

/* What filter_readable() passes on, and to whom. */
typedef struct ReadableFilter
{
	HTAB	   *readable;		/* names of this database's readable consumers */
	void		(*fn) (const ConsumerStatsCopy *copy, void *arg);
	void	   *arg;
} ReadableFilter;

/*
 * Tells whether the current role reads every consumer's counters, of
 * every database: it has the privileges of pg_read_all_stats.
 */
bool
stats_read_all(void)
{
	return has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS);
}

/*
 * Returns the names of this database's consumers with a slot whose
 * counters the current role may read.  The names are copied under the
 * shared lock, then judged without it: judging reads the catalog.
 */
static HTAB *
readable_consumers(void)
{
	HASHCTL		ctl;
	HTAB	   *readable;
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	List	   *names = NIL;
	ListCell   *lc;

	ctl.keysize = IDEM_MAX_CONSUMER_BYTES + 1;
	ctl.entrysize = IDEM_MAX_CONSUMER_BYTES + 1;
	ctl.hcxt = CurrentMemoryContext;
	readable = hash_create("idem_consumer readable consumers", 16, &ctl,
						   HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
		if (entry->key.dbid == MyDatabaseId)
			names = lappend(names, pstrdup(entry->key.consumer));
	LWLockRelease(stats_state->lock);

	SPI_connect();
	foreach(lc, names)
	{
		const char *name = lfirst(lc);

		if (keystore_may_read_consumer(name))
			(void) hash_search(readable, name, HASH_ENTER, NULL);
	}
	SPI_finish();
	list_free_deep(names);
	return readable;
}

/*
 * Passes a copy on to the filter's function if its consumer is readable.
 */
static void
filter_readable(const ConsumerStatsCopy *copy, void *arg)
{
	ReadableFilter *filter = (ReadableFilter *) arg;

	if (hash_search(filter->readable, copy->consumer, HASH_FIND, NULL) != NULL)
		filter->fn(copy, filter->arg);
}

/*
 * stats_foreach(), for the consumers whose counters the current role may
 * read only (see the top of this file).
 */
void
stats_foreach_readable(Oid dbid, void (*fn) (const ConsumerStatsCopy *copy, void *arg),
					   void *arg)
{
	ReadableFilter filter;

	stats_require_shmem();
	if (stats_read_all())
	{
		stats_foreach(dbid, fn, arg);
		return;
	}
	/* other databases' consumers are pg_read_all_stats's only */
	if (OidIsValid(dbid) && dbid != MyDatabaseId)
		return;

	filter.readable = readable_consumers();
	filter.fn = fn;
	filter.arg = arg;
	stats_foreach(MyDatabaseId, filter_readable, &filter);
	hash_destroy(filter.readable);
}

/*
 * Calls fn with a copy of the counters of each consumer of one database
 * (of every database if dbid is InvalidOid) in turn, copied under that
 * consumer's LWLock into one buffer: the memory a pass takes does not
 * grow with the number of consumers.  The shared lock on the table is
 * held throughout, so fn should be quick and must not call back here.
 */
void
stats_foreach(Oid dbid, void (*fn) (const ConsumerStatsCopy *copy, void *arg), void *arg)
{
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	ConsumerStatsCopy *copy = palloc(sizeof(ConsumerStatsCopy));

	stats_require_shmem();

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (OidIsValid(dbid) && entry->key.dbid != dbid)
			continue;
		copy->dbid = entry->key.dbid;
		strlcpy(copy->consumer, entry->key.consumer, sizeof(copy->consumer));
		LWLockAcquire(&entry->lock, LW_SHARED);
		copy->counters = entry->counters;
		LWLockRelease(&entry->lock);
		fn(copy, arg);
	}
	LWLockRelease(stats_state->lock);

	pfree(copy);
}
