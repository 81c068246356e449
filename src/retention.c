/*-------------------------------------------------------------------------
 *
 * retention.c
 *	  Retention of processed keys: the latest activity the windows
 *	  (retention_windows.c) are counted back from, and the purge runs that
 *	  remove expired keys.  The SQL functions are retention_api.c's.
 *
 * The rule: a key is purgeable when it is older than its consumer's
 * window counted back from that consumer's latest activity, the newest
 * processed_at among its stored keys; never from the wall clock.  A
 * consumer that stops applying messages stops its own clock, so however
 * long it is down it keeps every key it had, and the backlog the broker
 * redelivers when it comes back is still deduplicated.  A value below the
 * true latest activity only purges less, which this file relies on twice:
 * a run measures the latest activity in its first pass and uses it until
 * it ends, however many keys arrive meanwhile; and the value is capped at
 * the current time, so that a key stamped in the future by a wrong clock
 * cannot expire the keys before it.
 *
 * A run is two passes over the tables that hold keys, those of each
 * generation (KeystoreTable).  There is no index on processed_at (it would
 * add about a quarter to the bytes a key costs), so a run reads the heap
 * in chunks of blocks, by TID range:
 *	1. per consumer, the newest processed_at (a generation's collisions,
 *	   then its keys), and per chunk of this pass and consumer, the
 *	   oldest;
 *	2. per chunk, the rows older than their consumer's cutoff, which
 *	   keystore_remove_rows() removes while keeping the collision invariant
 *	   (key_collisions first, so that a purgeable collision is not moved
 *	   into processed_keys only to be removed there later).
 * Each chunk is a statement or two, so that the background worker can give
 * each its own short transaction.  Pass 2 skips the chunks of pass 1 in
 * which no row was old enough, so that a run reads the whole table once
 * and again only where keys expire: in steady state, a small share of it.
 * A chunk of pass 2 spans as many blocks as the previous one needed for
 * its share of batch_size purgeable rows: few where many rows expire, many
 * where few do.  Blocks added after a pass started hold keys newer than
 * the pass, and a row that a concurrent transaction updated (an occupant
 * claimed for a new collision) has moved; both are left to the next run.
 *
 * A run's state lives in the backend and carries over from one
 * idem_purge() call to the next, so that a caller looping until it returns
 * 0 makes one pass and never reads again the chunks it purged.  A run ends
 * when its second pass reaches the end; a rollback, a call for another
 * consumer and a re-created extension end it early (a rollback may have
 * undone removals the run counted as done).
 *
 * Cutoffs are computed anew, from the current settings, at every call (in
 * the worker, in every transaction), so that a longer window or NULL
 * (forever) takes effect at once, even in the middle of a run.  A call
 * removes at most batch_size keys per consumer: it stops after the chunk in
 * which a consumer reached that many, and if that chunk held more
 * purgeable rows than were taken, the run resumes at that same chunk.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/retention.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "duration.h"
#include "idem_consumer.h"

/*
 * Most blocks one statement reads: 16 MB, some 240,000 short keys, a few
 * tens of milliseconds.  Pass 1 reads chunks of this size; pass 2 reads
 * chunks expected to hold batch_size purgeable rows, up to this size.
 */
#define CHUNK_MAX_BLOCKS		2048
#define CHUNK_FILL				0.8

typedef enum PurgePhase
{
	PHASE_LATEST,				/* pass 1 on run.table */
	PHASE_PURGE,				/* pass 2 on run.table */
	PHASE_DONE
} PurgePhase;

/* A consumer the run saw keys of. */
typedef struct ConsumerWindow
{
	int32		consumer_id;	/* hash key */
	int32		latest;			/* newest processed_at the run saw */
	int32		cutoff;			/* this call: rows older go; <= 0 keeps all */
	int64		remaining;		/* this call: keys it may still remove */
} ConsumerWindow;

/*
 * What pass 1 saw of a consumer in one of its chunks: the oldest
 * processed_at.  Pass 2 skips a chunk in which no consumer it saw has a
 * row older than its cutoff.
 */
typedef struct ChunkOldest
{
	int32		consumer_id;
	int32		oldest;
} ChunkOldest;

/* One chunk of pass 1: an entry per consumer that has rows in it. */
typedef struct ChunkSummary
{
	int			nconsumers;
	ChunkOldest *consumers;
} ChunkSummary;

/* The run in progress in this backend, if any. */
static struct
{
	bool		active;
	uint64		storage_version;	/* of the storage the run belongs to */
	int32		only_consumer;	/* 0 for every consumer */
	int64		batch_size;		/* this call's */
	bool		windows_set;	/* cutoffs computed for this call */
	PurgePhase	phase;
	KeystoreTable table;
	BlockNumber next_block;
	BlockNumber end_block;
	uint64		rows_seen[KS_NUM_TABLES];	/* by pass 1 */
	BlockNumber blocks_seen[KS_NUM_TABLES];
	double		purgeable_per_block;	/* pass 2: in the last chunk */
	BlockNumber last_chunk_blocks;	/* pass 2: 0 before the first chunk */
	ChunkSummary *chunks[KS_NUM_TABLES];	/* by pass 1, one per chunk */
	BlockNumber nchunks[KS_NUM_TABLES];
	MemoryContext cxt;
	HTAB	   *windows;
} run;

static MemoryContext step_cxt = NULL;
static bool callbacks_registered = false;

/*
 * Forgets the run in progress.
 */
static void
run_end(void)
{
	if (run.cxt != NULL)
		MemoryContextDelete(run.cxt);
	memset(&run, 0, sizeof(run));
}

/*
 * Ends the run when its transaction rolls back.
 */
static void
retention_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_ABORT && run.active)
		run_end();
}

/*
 * Ends the run when a subtransaction rolls back.
 */
static void
retention_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						   SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB && run.active)
		run_end();
}

/*
 * Makes a TID that bounds a range of blocks.
 */
static inline Datum
block_bound(ItemPointerData *tid, BlockNumber block)
{
	ItemPointerSet(tid, block, 0);
	return PointerGetDatum(tid);
}

/*
 * Starts the pass of phase over table at its first block.
 */
static void
enter_pass(PurgePhase phase, KeystoreTable table)
{
	BlockNumber blocks[KS_NUM_TABLES];

	keystore_table_blocks(blocks);
	run.phase = phase;
	run.table = table;
	run.next_block = 0;
	run.end_block = blocks[table];
	if (phase == PHASE_LATEST)
	{
		run.nchunks[table] = (run.end_block + CHUNK_MAX_BLOCKS - 1) / CHUNK_MAX_BLOCKS;
		run.chunks[table] = MemoryContextAllocZero(run.cxt,
												   sizeof(ChunkSummary) * Max(run.nchunks[table], 1));
	}

	/* until a chunk tells, assume every row is purgeable */
	if (phase == PHASE_PURGE && run.blocks_seen[table] > 0)
		run.purgeable_per_block = (double) run.rows_seen[table] / run.blocks_seen[table];
	else
		run.purgeable_per_block = 0;
	run.last_chunk_blocks = 0;
}

/*
 * Moves on to the next pass, or to the end of the run.
 */
static void
next_pass(void)
{
	if (run.table + 1 < KS_NUM_TABLES)
		enter_pass(run.phase, (KeystoreTable) (run.table + 1));
	else if (run.phase == PHASE_LATEST)
		enter_pass(PHASE_PURGE, (KeystoreTable) 0);
	else
		run.phase = PHASE_DONE;
}

/*
 * Starts a run.
 */
static void
run_start(int32 only_consumer)
{
	HASHCTL		ctl;

	run_end();
	run.cxt = AllocSetContextCreate(TopMemoryContext, "idem_consumer purge run",
									ALLOCSET_DEFAULT_SIZES);
	ctl.keysize = sizeof(int32);
	ctl.entrysize = sizeof(ConsumerWindow);
	ctl.hcxt = run.cxt;
	run.windows = hash_create("idem_consumer consumer windows", 64, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	run.active = true;
	run.storage_version = keystore_storage_version();
	run.only_consumer = only_consumer;
	/* completed external effects go in one statement of their own */
	(void) effects_purge(only_consumer, retention_default_secs());
	enter_pass(PHASE_LATEST, (KeystoreTable) 0);
}

/*
 * Prepares a call (in the worker, a transaction) that removes at most
 * batch_size keys per consumer, continuing the run in progress if it
 * purges the same consumers of the same storage, else starting one.
 */
void
purge_begin_batch(int32 only_consumer, int64 batch_size)
{
	if (!callbacks_registered)
	{
		RegisterXactCallback(retention_xact_callback, NULL);
		RegisterSubXactCallback(retention_subxact_callback, NULL);
		step_cxt = AllocSetContextCreate(TopMemoryContext,
										 "idem_consumer purge step",
										 ALLOCSET_DEFAULT_SIZES);
		callbacks_registered = true;
	}

	if (!run.active ||
		run.only_consumer != only_consumer ||
		run.storage_version != keystore_storage_version())
		run_start(only_consumer);
	run.batch_size = batch_size;
	run.windows_set = false;
}

/*
 * Raises a consumer's latest activity, if the run saw its keys, to a newer
 * lower bound of it.
 */
static void
raise_latest(int32 consumer_id, int32 latest, void *arg)
{
	ConsumerWindow *w = hash_search((HTAB *) arg, &consumer_id, HASH_FIND, NULL);

	if (w != NULL && latest > w->latest)
		w->latest = latest;
}

/*
 * Sets every consumer's cutoff for this call from its latest activity and
 * the current settings; returns how many consumers have keys to purge.
 * Where the ring's generations expire whole, the run reads only the
 * legacy tables, whose keys alone would put a consumer's latest activity
 * in the past: its registrations in the ring say how recent it is.
 */
static int
set_windows(void)
{
	RetentionWindows *windows = retention_windows_load();
	HASH_SEQ_STATUS seq;
	ConsumerWindow *w;
	int			npurgeable = 0;

	if (keygen_retention_by_generation())
		keygen_registered_activity(raise_latest, run.windows);

	hash_seq_init(&seq, run.windows);
	while ((w = hash_seq_search(&seq)) != NULL)
	{
		w->remaining = run.batch_size;
		w->cutoff = 0;
		if (run.only_consumer == 0 || w->consumer_id == run.only_consumer)
			w->cutoff = retention_cutoff(windows, w->consumer_id, w->latest);
		if (w->cutoff > 0)
			npurgeable++;
	}

	run.windows_set = true;
	return npurgeable;
}

/*
 * Whether pass 1 saw, in chunk c of the table of the current pass, no row
 * older than its consumer's cutoff.  Rows written into the chunk since
 * pass 1 read it are not looked at: keys recorded since then are newer
 * than the latest activity the run uses, and any other row the chunk
 * gained (a collision moved into processed_keys) is left to the next run,
 * which only purges it later.
 */
static bool
chunk_has_nothing_to_purge(BlockNumber c)
{
	ChunkSummary *chunk;

	if (c >= run.nchunks[run.table])
		return false;
	chunk = &run.chunks[run.table][c];
	for (int i = 0; i < chunk->nconsumers; i++)
	{
		ConsumerWindow *w = hash_search(run.windows, &chunk->consumers[i].consumer_id,
										HASH_FIND, NULL);

		if (w == NULL)
			return false;
		if (w->cutoff > 0 && chunk->consumers[i].oldest < w->cutoff)
			return false;
	}
	return true;
}

/*
 * Pass 2: moves the run past the chunks of pass 1 that have nothing to
 * purge, so that a run reads again only where keys expire.
 */
static void
skip_chunks_with_nothing_to_purge(void)
{
	while (run.next_block < run.end_block &&
		   chunk_has_nothing_to_purge(run.next_block / CHUNK_MAX_BLOCKS))
		run.next_block = Min(run.end_block,
							 (run.next_block / CHUNK_MAX_BLOCKS + 1) * CHUNK_MAX_BLOCKS);
}

/*
 * Pass 1: reads the newest and oldest processed_at per consumer in the
 * next chunk.
 */
static void
read_latest_chunk(void)
{
	BlockNumber nblocks = Min(CHUNK_MAX_BLOCKS, run.end_block - run.next_block);
	ItemPointerData lo,
				hi;
	ChunkSummary *chunk;

	keystore_read_latest(run.table, block_bound(&lo, run.next_block),
						 block_bound(&hi, run.next_block + nblocks));

	chunk = &run.chunks[run.table][run.next_block / CHUNK_MAX_BLOCKS];
	chunk->nconsumers = (int) SPI_processed;
	chunk->consumers = MemoryContextAlloc(run.cxt,
										  sizeof(ChunkOldest) * Max(SPI_processed, 1));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		bool		isnull;
		int32		consumer_id;
		int32		latest;
		bool		found;
		ConsumerWindow *w;

		consumer_id = DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &isnull));
		latest = DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2, &isnull));
		w = hash_search(run.windows, &consumer_id, HASH_ENTER, &found);
		if (!found || latest > w->latest)
			w->latest = latest;
		run.rows_seen[run.table] +=
			DatumGetInt64(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 3, &isnull));
		chunk->consumers[i].consumer_id = consumer_id;
		chunk->consumers[i].oldest =
			DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 4, &isnull));
	}
	SPI_freetuptable(SPI_tuptable);

	run.blocks_seen[run.table] += nblocks;
	run.next_block += nblocks;
}

/*
 * Returns how many blocks a second-pass chunk reads: as many as should
 * hold CHUNK_FILL of batch_size purgeable rows, by the last chunk's share
 * of them, so that a transaction of the worker removes nearly batch_size
 * keys where many expire, and reads far where few do.  The margin keeps a
 * chunk from overflowing the quota by a few rows; a chunk grows at most
 * fourfold over the last, so that leaving a stretch of live keys does not
 * read a maximal chunk full of expired ones to take a few.
 */
static BlockNumber
purge_chunk_blocks(void)
{
	double		nblocks = CHUNK_MAX_BLOCKS;

	if (run.purgeable_per_block > 0)
		nblocks = floor(CHUNK_FILL * run.batch_size / run.purgeable_per_block);
	if (run.last_chunk_blocks > 0)
		nblocks = Min(nblocks, 4.0 * run.last_chunk_blocks);
	nblocks = Max(1, Min(nblocks, CHUNK_MAX_BLOCKS));
	return Min((BlockNumber) nblocks, run.end_block - run.next_block);
}

static int
tid_cmp(const void *a, const void *b)
{
	return ItemPointerCompare((ItemPointer) a, (ItemPointer) b);
}

/*
 * Sets args[0] and args[1] to the int4 arrays of the ids and cutoffs of the
 * consumers that may still lose keys in this call.
 */
static void
window_arrays(Datum *args)
{
	HASH_SEQ_STATUS seq;
	ConsumerWindow *w;
	Datum	   *ids = palloc(sizeof(Datum) * hash_get_num_entries(run.windows));
	Datum	   *cutoffs = palloc(sizeof(Datum) * hash_get_num_entries(run.windows));
	int			nwindows = 0;

	hash_seq_init(&seq, run.windows);
	while ((w = hash_seq_search(&seq)) != NULL)
	{
		if (w->cutoff <= 0 || w->remaining <= 0)
			continue;
		ids[nwindows] = Int32GetDatum(w->consumer_id);
		cutoffs[nwindows] = Int32GetDatum(w->cutoff);
		nwindows++;
	}

	args[0] = PointerGetDatum(construct_array(ids, nwindows, INT4OID,
											  sizeof(int32), true, TYPALIGN_INT));
	args[1] = PointerGetDatum(construct_array(cutoffs, nwindows, INT4OID,
											  sizeof(int32), true, TYPALIGN_INT));
}

/*
 * Pass 2: removes the purgeable rows of the next chunk, within each
 * consumer's remaining quota.  Sets *batch_full when a consumer used up its
 * quota.  The run moves past the chunk, or, if the quota left rows behind,
 * to the block of the first of them (a consumer whose quota is short of
 * its rows takes the first ones in TID order).
 */
static uint64
purge_chunk(bool *batch_full)
{
	BlockNumber nblocks = purge_chunk_blocks();
	ConsumerWindow *w;
	ItemPointerData lo,
				hi;
	Datum		args[2];		/* the consumers' ids and cutoffs */
	ItemPointerData *tids;
	int			ntids = 0;
	uint64		capacity = 0;
	BlockNumber resume_block = InvalidBlockNumber;
	uint64		removed;

	window_arrays(args);
	keystore_read_purgeable(run.table, args[0], args[1],
							block_bound(&lo, run.next_block),
							block_bound(&hi, run.next_block + nblocks));

	/* one row per consumer: its id and the TIDs of its purgeable rows */
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		ArrayType  *arr = DatumGetArrayTypeP(SPI_getbinval(SPI_tuptable->vals[i],
													   SPI_tuptable->tupdesc, 2, &isnull));

		capacity += ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
	}
	tids = palloc(sizeof(ItemPointerData) * Max(capacity, 1));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		bool		isnull;
		int32		consumer_id;
		ArrayType  *arr;
		int			n;
		int			take;

		consumer_id = DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &isnull));
		arr = DatumGetArrayTypeP(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2, &isnull));
		n = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
		w = hash_search(run.windows, &consumer_id, HASH_FIND, NULL);
		Assert(w != NULL);

		/* tid is 6 bytes, aligned on 2: the elements are contiguous */
		memcpy(&tids[ntids], ARR_DATA_PTR(arr), sizeof(ItemPointerData) * n);
		take = (int) Min((int64) n, w->remaining);
		if (take < n)
		{
			qsort(&tids[ntids], n, sizeof(ItemPointerData), tid_cmp);
			resume_block = Min(resume_block,
							   ItemPointerGetBlockNumber(&tids[ntids + take]));
		}
		ntids += take;
		w->remaining -= take;
		if (w->remaining == 0)
			*batch_full = true;
	}
	SPI_freetuptable(SPI_tuptable);

	removed = keystore_remove_rows(run.table, tids, ntids, args[0], args[1]);

	run.purgeable_per_block = (double) capacity / nblocks;
	run.last_chunk_blocks = nblocks;
	if (resume_block == InvalidBlockNumber)
		run.next_block += nblocks;
	else
		run.next_block = resume_block;
	return removed;
}

/*
 * Does the next chunk of the run: reads latest activity, or removes
 * expired keys.  Sets *removed to the keys removed, and tells whether the
 * run goes on, this call's quota is used up, or the run is over.
 */
PurgeProgress
purge_step(uint64 *removed)
{
	MemoryContext oldcxt;
	bool		batch_full = false;

	*removed = 0;
	Assert(run.active);

	MemoryContextReset(step_cxt);
	oldcxt = MemoryContextSwitchTo(step_cxt);

	while (run.phase != PHASE_DONE && run.next_block >= run.end_block)
		next_pass();

	if (run.phase == PHASE_LATEST)
		read_latest_chunk();
	else if (run.phase == PHASE_PURGE)
	{
		if (!run.windows_set && set_windows() == 0)
			run.phase = PHASE_DONE;
		else
		{
			skip_chunks_with_nothing_to_purge();
			if (run.next_block < run.end_block)
				*removed = purge_chunk(&batch_full);
		}
	}

	/* so that the last chunk of a run says so */
	while (run.phase != PHASE_DONE && run.next_block >= run.end_block)
		next_pass();

	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(step_cxt);

	if (run.phase == PHASE_DONE)
	{
		run_end();
		return PURGE_RUN_DONE;
	}
	return batch_full ? PURGE_BATCH_FULL : PURGE_CONTINUES;
}
