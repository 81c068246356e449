/*-------------------------------------------------------------------------
 *
 * stats_internal.h
 *	  What the files of the per-consumer counters share: the layout of
 *	  shared memory and the functions they call of each other.
 *
 * Only stats*.c include it; other modules see stats.c's functions in
 * idem_consumer.h.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/stats_internal.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATS_INTERNAL_H
#define IDEM_STATS_INTERNAL_H

#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

/* The key of a consumer's counters; zero-padded, hashed as bytes. */
typedef struct StatsKey
{
	Oid			dbid;
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];
} StatsKey;

typedef struct ConsumerStatsEntry
{
	StatsKey	key;			/* hash key */
	LWLock		lock;			/* protects counters; see stats.c */
	ConsumerCounters counters;
} ConsumerStatsEntry;

/* What is counted per database rather than per consumer. */
typedef struct DatabaseStatsEntry
{
	Oid			dbid;			/* hash key */
	int64		untracked_calls;	/* calls not counted per consumer */
	TimestampTz stats_reset;	/* of untracked_calls */
} DatabaseStatsEntry;

/*
 * How many slots a database holds, for its share
 * (idem_consumer.max_consumers_per_database); an entry exists while the
 * count is positive.  Changed with the slots, under the exclusive lock.
 */
typedef struct DatabaseSlots
{
	Oid			dbid;			/* hash key */
	int32		slots;
} DatabaseSlots;

typedef struct StatsSharedState
{
	LWLock	   *lock;
	slock_t		mutex;			/* protects the DatabaseStatsEntry fields */
	pg_atomic_uint64 generation;	/* bumped whenever entries are removed */
	TimestampTz started;		/* when counting began: the default reset time */
} StatsSharedState;

/* stats.c: the shared state and the GUCs */
extern StatsSharedState *stats_state;
extern HTAB *stats_hash;
extern HTAB *db_hash;
extern HTAB *db_slots_hash;
extern int	idem_max_consumers;
extern int	idem_max_consumers_per_database;
extern bool idem_track;
extern bool idem_save;

extern void stats_make_key(StatsKey *key, Oid dbid, const char *consumer);
extern bool stats_counters_empty(const ConsumerCounters *counters);
extern void stats_require_shmem(void);
extern void stats_count_untracked(int64 calls);

/* stats_slots.c */
extern ConsumerStatsEntry *stats_find_or_make_slot(const char *consumer,
												   uint64 *generation);
extern bool stats_resolve_slot(const char *consumer, ConsumerStatsEntry **entry,
							   uint64 *generation, bool *exists);
extern void stats_remember_slot(const char *consumer, ConsumerStatsEntry *entry,
								uint64 generation);
extern void stats_count_slot(Oid dbid, int delta);
extern void stats_warn_untracked(const char *consumer, bool transaction_full);

#endif							/* IDEM_STATS_INTERNAL_H */
