/*-------------------------------------------------------------------------
 *
 * stats_slots.c
 *	  Which consumers have a slot of counters in shared memory: finding,
 *	  making and reclaiming slots, and this backend's cache of them.
 *
 * Slots.  idem_consumer.max_consumers entries exist at most, and only a
 * consumer that exists in the catalog, committed, takes one: a call whose
 * consumer is unknown (not created yet, created by its own transaction,
 * refused creation) is noted without a slot, and its counts reach shared
 * memory only when its transaction commits, which proves the consumer
 * exists; if the transaction rolls back, they are forgotten with the
 * consumer.  A call refused by the access check never reaches here.  When
 * the table is full, a reclaim pass (at most one a second per backend)
 * removes the entries of databases that were dropped, of consumers of this
 * database that no longer exist, and of counters that are all zero.
 *
 * Shares.  With idem_consumer.max_consumers_per_database set, a database
 * that holds that many slots gets no new one, whatever room is left, so
 * that the roles allowed to create consumers in one database cannot take
 * the slots of every other: a consumer refused one is counted as one
 * refused for a full table is, in its database's untracked calls, and its
 * warning names the database and its share.  A database at its share runs
 * reclaim passes as a full table does.  Slots a database already holds
 * stay when the share is lowered; it takes no new one until it is below.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/stats_slots.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "access/xact.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/syscache.h"

#include "stats_internal.h"

/* Least time between two reclaim passes of one backend. */
#define RECLAIM_INTERVAL_MS		1000

/* A consumer of this database known to be committed, and its slot. */
typedef struct SlotRef
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	ConsumerStatsEntry *entry;	/* NULL: no room for it */
} SlotRef;

/*
 * Backend-local.  slot_refs holds at most 2 * max_consumers names (the
 * slots of this database, and consumers that found no room), warned at
 * most max_consumers.
 */
static HTAB *slot_refs = NULL;
static uint64 slot_refs_generation = 0;
static HTAB *warned = NULL;
static TimestampTz next_reclaim = 0;

/*
 * Returns this backend's cache of slots, emptied if entries were removed
 * since it was filled.
 */
static HTAB *
slot_ref_cache(void)
{
	uint64		generation = pg_atomic_read_u64(&stats_state->generation);

	if (slot_refs != NULL && slot_refs_generation != generation)
	{
		hash_destroy(slot_refs);
		slot_refs = NULL;
	}
	if (slot_refs == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.entrysize = sizeof(SlotRef);
		ctl.hcxt = TopMemoryContext;
		slot_refs = hash_create("idem_consumer slots", 16, &ctl,
								HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		slot_refs_generation = generation;
	}
	return slot_refs;
}

/*
 * Remembers a consumer known to be committed and its slot (NULL: none),
 * as of generation, unless the cache is at its bound.
 */
void
stats_remember_slot(const char *consumer, ConsumerStatsEntry *entry, uint64 generation)
{
	HTAB	   *cache = slot_ref_cache();
	SlotRef    *ref;

	if (generation != slot_refs_generation ||
		hash_get_num_entries(cache) >= 2 * (long) idem_max_consumers)
		return;
	ref = hash_search(cache, consumer, HASH_ENTER, NULL);
	ref->entry = entry;
}

/*
 * Adds delta to the slots database dbid holds; the caller holds the
 * exclusive lock (or is the postmaster, filling the table at start-up).
 * The table has room for a count per slot, so the entry is always made.
 */
void
stats_count_slot(Oid dbid, int delta)
{
	DatabaseSlots *db;
	bool		found;

	db = hash_search(db_slots_hash, &dbid, delta > 0 ? HASH_ENTER : HASH_FIND, &found);
	if (db == NULL)
		return;
	if (!found)
		db->slots = 0;
	db->slots += delta;
	if (db->slots <= 0)
		(void) hash_search(db_slots_hash, &dbid, HASH_REMOVE, NULL);
}

/*
 * Tells whether this database holds its share of slots; the caller holds
 * the lock, shared or exclusive.
 */
static bool
database_at_share(void)
{
	DatabaseSlots *db;

	if (idem_max_consumers_per_database <= 0)
		return false;
	db = hash_search(db_slots_hash, &MyDatabaseId, HASH_FIND, NULL);
	return db != NULL && db->slots >= idem_max_consumers_per_database;
}

/*
 * Warns, once per consumer and session (for at most max_consumers
 * consumers), that a consumer's calls are not counted per consumer: its
 * transaction has too many consumers, or this database holds its share
 * of slots, or the table is full.
 */
void
stats_warn_untracked(const char *consumer, bool transaction_full)
{
	bool		found;
	bool		at_share;

	if (warned == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.entrysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.hcxt = TopMemoryContext;
		warned = hash_create("idem_consumer untracked consumers", 16, &ctl,
							 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	if (hash_get_num_entries(warned) >= idem_max_consumers)
		return;
	(void) hash_search(warned, consumer, HASH_ENTER, &found);
	if (found)
		return;
	LWLockAcquire(stats_state->lock, LW_SHARED);
	at_share = database_at_share();
	LWLockRelease(stats_state->lock);

	if (transaction_full)
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("counters of consumer \"%s\" are not tracked", consumer),
				 errdetail("This transaction called idem_consumer.max_consumers consumers (%d) already; "
						   "the calls of further ones count in idem_stats_info.untracked_calls only.",
						   idem_max_consumers),
				 errhint("Call fewer consumers in one transaction, or raise idem_consumer.max_consumers (it takes a restart).")));
	else if (at_share)
	{
		char	   *dbname = get_database_name(MyDatabaseId);

		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("counters of consumer \"%s\" are not tracked", consumer),
				 errdetail("Database \"%s\" holds its share of idem_consumer.max_consumers_per_database consumers (%d) with counters; "
						   "the calls of this one count in idem_stats_info.untracked_calls only.",
						   dbname != NULL ? dbname : "?", idem_max_consumers_per_database),
				 errhint("Raise idem_consumer.max_consumers_per_database (a reload is enough), or reset the counters "
						 "of consumers this database no longer uses with idem_stats_reset(), which lets a reclaim pass free their slots.")));
	}
	else
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("counters of consumer \"%s\" are not tracked", consumer),
				 errdetail("idem_consumer.max_consumers consumers (%d) have counters already; "
						   "the calls of this one count in idem_stats_info.untracked_calls only.",
						   idem_max_consumers),
				 errhint("Raise idem_consumer.max_consumers (it takes a restart), and keep roles "
						 "from creating consumers with idem_consumer.create_consumers = off.")));
}

/*
 * Tells whether the consumer's row exists in this database's catalog,
 * committed by an earlier transaction.  Needs a transaction, not an SPI
 * connection of the caller's: it makes its own, which restores the
 * caller's SPI_tuptable when it ends.
 */
static bool
consumer_committed(const char *consumer)
{
	TransactionId xmin;
	bool		committed;

	SPI_connect();
	committed = consumer_row_visible(consumer, &xmin) &&
		!TransactionIdIsCurrentTransactionId(xmin);
	SPI_finish();
	return committed;
}

/*
 * Tells whether a consumer's row is visible in this database's catalog;
 * for the reclaim pass, which must not remove a slot its creator just
 * committed.
 */
static bool
consumer_visible(const char *consumer)
{
	bool		visible;

	SPI_connect();
	visible = consumer_row_visible(consumer, NULL);
	SPI_finish();
	return visible;
}

/*
 * Tells whether the table of slots is full, or this database holds its
 * share of it.
 */
static bool
slots_full(void)
{
	bool		full;

	LWLockAcquire(stats_state->lock, LW_SHARED);
	full = hash_get_num_entries(stats_hash) >= idem_max_consumers ||
		database_at_share();
	LWLockRelease(stats_state->lock);
	return full;
}

/*
 * Copies the keys of up to max_consumers slots into keys, and adds every
 * other database that has a slot or untracked calls to *other_dbs, under
 * the shared lock; returns the number of keys.
 */
static int
copy_slot_keys(StatsKey *keys, List **other_dbs)
{
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	DatabaseStatsEntry *db;
	int			nkeys = 0;

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (nkeys >= idem_max_consumers)
		{
			hash_seq_term(&hash_seq);
			break;
		}
		keys[nkeys++] = entry->key;
		if (entry->key.dbid != MyDatabaseId)
			*other_dbs = list_append_unique_oid(*other_dbs, entry->key.dbid);
	}
	hash_seq_init(&hash_seq, db_hash);
	while ((db = hash_seq_search(&hash_seq)) != NULL)
	{
		if (db->dbid != MyDatabaseId)
			*other_dbs = list_append_unique_oid(*other_dbs, db->dbid);
	}
	LWLockRelease(stats_state->lock);
	return nkeys;
}

/*
 * Removes, under the exclusive lock, the slots of keys judged dead and
 * those whose counters are all zero, and the entries of dead_dbs; bumps
 * the generation if any slot went.
 */
static void
remove_slots(const StatsKey *keys, int nkeys, const bool *dead, List *dead_dbs)
{
	ListCell   *lc;
	int			removed = 0;

	LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
	for (int i = 0; i < nkeys; i++)
	{
		ConsumerStatsEntry *entry = hash_search(stats_hash, &keys[i], HASH_FIND, NULL);

		if (entry == NULL)
			continue;
		/* no backend adds to an entry without the shared lock */
		if (dead[i] || stats_counters_empty(&entry->counters))
		{
			hash_search(stats_hash, &keys[i], HASH_REMOVE, NULL);
			stats_count_slot(keys[i].dbid, -1);
			removed++;
		}
	}
	foreach(lc, dead_dbs)
	{
		Oid			dbid = lfirst_oid(lc);

		hash_search(db_hash, &dbid, HASH_REMOVE, NULL);
	}
	if (removed > 0)
		pg_atomic_fetch_add_u64(&stats_state->generation, 1);
	LWLockRelease(stats_state->lock);
}

/*
 * When the table of slots is full or this database holds its share,
 * removes the entries of databases that
 * were dropped, of this database's consumers that no longer exist, and of
 * counters that are all zero.  At most once a second per backend (less
 * often when a pass takes more than a tenth of that), and only
 * where a fresh snapshot sees every consumer committed before the pass: a
 * transaction-snapshot isolation level could miss a consumer created since
 * and remove a slot its creator has just taken.
 */
static void
reclaim_slots(void)
{
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext cxt;
	MemoryContext old;
	StatsKey   *keys;
	int			nkeys;
	bool	   *dead;
	List	   *other_dbs = NIL;
	List	   *dead_dbs = NIL;
	ListCell   *lc;

	if (!IsTransactionState() || IsolationUsesXactSnapshot() ||
		now < next_reclaim || !slots_full())
		return;

	cxt = AllocSetContextCreate(CurrentMemoryContext, "idem_consumer reclaim",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);

	/* the keys to judge, and the other databases, copied under the lock */
	keys = palloc(sizeof(StatsKey) * idem_max_consumers);
	nkeys = copy_slot_keys(keys, &other_dbs);

	/* pg_database is shared: any database can tell which ones are gone */
	foreach(lc, other_dbs)
	{
		Oid			dbid = lfirst_oid(lc);

		if (!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbid)))
			dead_dbs = lappend_oid(dead_dbs, dbid);
	}

	/* this database's consumers are judged by its own catalog */
	dead = palloc0(sizeof(bool) * Max(nkeys, 1));
	for (int i = 0; i < nkeys; i++)
	{
		if (keys[i].dbid == MyDatabaseId)
			dead[i] = !consumer_visible(keys[i].consumer);
		else
			dead[i] = list_member_oid(dead_dbs, keys[i].dbid);
	}

	remove_slots(keys, nkeys, dead, dead_dbs);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);

	/* a pass costs a lookup per slot of this database: keep it under 10% */
	{
		TimestampTz end = GetCurrentTimestamp();

		next_reclaim = end + Max((int64) RECLAIM_INTERVAL_MS * 1000, 10 * (end - now));
	}
}

/*
 * Returns the slot of a consumer of this database, making one if there is
 * room; NULL if there is none.  The caller knows the consumer exists.
 * Sets *generation to the generation the address is valid for.
 */
ConsumerStatsEntry *
stats_find_or_make_slot(const char *consumer, uint64 *generation)
{
	StatsKey	key;
	ConsumerStatsEntry *entry;
	bool		found;

	stats_make_key(&key, MyDatabaseId, consumer);
	LWLockAcquire(stats_state->lock, LW_SHARED);
	entry = hash_search(stats_hash, &key, HASH_FIND, NULL);
	*generation = pg_atomic_read_u64(&stats_state->generation);
	LWLockRelease(stats_state->lock);
	if (entry != NULL)
		return entry;

	LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
	/* a shared hash table can outgrow its size: hold it to the GUC */
	if (hash_get_num_entries(stats_hash) < idem_max_consumers && !database_at_share())
		entry = hash_search(stats_hash, &key, HASH_ENTER_NULL, &found);
	else
		entry = hash_search(stats_hash, &key, HASH_FIND, &found);
	if (entry != NULL && !found)
	{
		LWLockInitialize(&entry->lock, stats_state->lock->tranche);
		memset(&entry->counters, 0, sizeof(ConsumerCounters));
		entry->counters.stats_reset = GetCurrentTimestamp();
		stats_count_slot(MyDatabaseId, 1);
	}
	*generation = pg_atomic_read_u64(&stats_state->generation);
	LWLockRelease(stats_state->lock);
	return entry;
}

/*
 * Finds what is known of a consumer's slot when its first aggregate of a
 * transaction is made: a slot this backend found before, one in shared
 * memory, or the catalog's word that the consumer exists.  A consumer that
 * exists gets a slot at once if there is room (after a reclaim pass if the
 * table is full); one that does not yet exist gets none here.  Returns
 * false when the consumer exists and there is no room for it.  Sets
 * *slot (left alone when there is none yet), *generation and *exists.
 */
bool
stats_resolve_slot(const char *consumer, ConsumerStatsEntry **slot,
				   uint64 *generation, bool *exists)
{
	HTAB	   *cache = slot_ref_cache();
	SlotRef    *ref;
	StatsKey	key;
	ConsumerStatsEntry *entry;

	*generation = slot_refs_generation;
	ref = hash_search(cache, consumer, HASH_FIND, NULL);
	if (ref != NULL)
	{
		*slot = ref->entry;
		*exists = true;
		return ref->entry != NULL;
	}

	stats_make_key(&key, MyDatabaseId, consumer);
	LWLockAcquire(stats_state->lock, LW_SHARED);
	entry = hash_search(stats_hash, &key, HASH_FIND, NULL);
	*generation = pg_atomic_read_u64(&stats_state->generation);
	LWLockRelease(stats_state->lock);
	if (entry != NULL)
	{
		*slot = entry;
		*exists = true;
		stats_remember_slot(consumer, entry, *generation);
		return true;
	}

	*exists = consumer_committed(consumer);
	if (!*exists)
	{
		/* its commit will want a slot: make room while a pass can run */
		reclaim_slots();
		return true;
	}
	entry = stats_find_or_make_slot(consumer, generation);
	if (entry == NULL)
	{
		reclaim_slots();
		entry = stats_find_or_make_slot(consumer, generation);
	}
	*slot = entry;
	stats_remember_slot(consumer, entry, *generation);
	return entry != NULL;
}
