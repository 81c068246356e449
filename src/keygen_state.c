/*-------------------------------------------------------------------------
 *
 * keygen_state.c
 *	  The generations of the key store as this backend last read them from
 *	  idem_consumer.key_generations (KeyGenState): which one is current,
 *	  which are sealed and whether each has settled, and which filters are
 *	  usable (whether a filter's table is complete, which epochs the
 *	  filter of all sealed generations holds); read anew after an
 *	  invalidation of that table or of a filter's table, which every
 *	  switch, settle, build and drop brings.  keygen.c says what the
 *	  generations are and why a switch is exact; keygen_gate.c,
 *	  keygen_filter.c and keystore.c read what this file keeps.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_state.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "storage/bufmgr.h"
#include "utils/snapmgr.h"

#include "keygen_state.h"

/* the generations as last read, and the tables whose change makes it stale */
static struct
{
	bool		known;			/* state is key_generations as it is now */
	uint64		storage_generation; /* of the storage it was read from */
	Oid			relid;			/* key_generations it was read from */
	Oid			filter_relids[KEYGEN_NUM];	/* whose truncation changes state */
	Oid			filter_all_relids[FILTER_ALL_PLACES + 1];	/* its row's, then its tables' */
	KeyGenState state;
} cache;

/*
 * Whether each generation's filter was found usable, for the generation,
 * filter_chunks and row it was checked for: valid until an invalidation of the
 * filter's table (a build or a truncation), so that reading the
 * generations again (keygen_state_latest, on every idem_is_processed) does
 * not open every filter again.
 */
static struct
{
	bool		known;
	uint64		storage_generation; /* of the storage it was checked in */
	int64		epoch;
	int32		filter_chunks;	/* as key_generations says */
	TransactionId row_xmin;		/* of the generation's row there */
	int32		usable_chunks;	/* keygen_filter_usable()'s answer */
} filters_seen[KEYGEN_NUM];

/*
 * Forgets the cached state when key_generations is invalidated, as every
 * switch does when it commits.
 */
static void
keygen_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == cache.relid)
		cache.known = false;
	for (KeyGenSlot g = 1; g <= KEYGEN_RING; g++)
		if (relid == InvalidOid || relid == cache.filter_relids[g])
		{
			cache.known = false;
			filters_seen[g].known = false;
		}
	for (int i = 0; i < lengthof(cache.filter_all_relids); i++)
		if (relid == cache.filter_all_relids[i])
			cache.known = false;
}

/*
 * Registers the invalidation callback; called once from keygen_init().
 */
void
keygen_state_init(void)
{
	storage_relcache_subscribe(keygen_relcache_callback);
}

/*
 * Whether the first row of filter table rel, chunk 0, was written by
 * transaction built_by (a raw xmin, which freezing keeps).
 */
static bool
filter_built_by(Relation rel, TransactionId built_by)
{
	Buffer		buf;
	Page		page;
	bool		same = false;

	buf = ReadBuffer(rel, 0);
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	if (!PageIsNew(page) && PageGetMaxOffsetNumber(page) >= FirstOffsetNumber)
	{
		ItemId		itemid = PageGetItemId(page, FirstOffsetNumber);

		if (ItemIdIsNormal(itemid))
			same = TransactionIdEquals(HeapTupleHeaderGetRawXmin((HeapTupleHeader) PageGetItem(page, itemid)),
									   built_by);
	}
	UnlockReleaseBuffer(buf);
	return same;
}

/*
 * Returns nchunks if the filter table relid has that many blocks, and its
 * rows were written by transaction *built_by if given, so that a test may
 * read it, else 0.
 */
static int32
filter_table_usable(Oid relid, int32 nchunks, const TransactionId *built_by)
{
	Relation	rel;
	bool		usable;

	if (nchunks <= 0 || !OidIsValid(relid))
		return 0;
	rel = table_open(relid, AccessShareLock);
	usable = RelationGetNumberOfBlocks(rel) >= (BlockNumber) nchunks &&
		(built_by == NULL || filter_built_by(rel, *built_by));
	table_close(rel, NoLock);
	return usable ? nchunks : 0;
}

/*
 * Returns nchunks if generation slot's filter table has that many blocks
 * and was written by row_xmin, the raw xmin of the generation's row in
 * key_generations, so that a test may read it, else 0.  The build writes
 * both in one transaction; a row the subscription wrote, or one written
 * again since, is not the filter's (keygen_filter.c, step 3).
 */
int32
keygen_filter_usable(KeyGenSlot slot, int32 nchunks, TransactionId row_xmin)
{
	return filter_table_usable(storage_locate()->gens[slot].filter_relid, nchunks,
							   &row_xmin);
}

/*
 * The same for the filter of all sealed generations in table place, but
 * for its writer: key_filter_all, which names it, is this database's own,
 * never published, and names the generations it holds by epoch.
 */
int32
keygen_filter_all_usable(int place, int32 nchunks)
{
	return filter_table_usable(storage_locate()->filter_all_places[place], nchunks,
							   NULL);
}

/*
 * Whether the epochs of a row of key_filter_all hold epoch.
 */
bool
keygen_filter_all_holds(ArrayType *epochs, int64 epoch)
{
	Datum	   *held;
	bool	   *nulls;
	int			nheld;

	deconstruct_array(epochs, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
					  TYPALIGN_DOUBLE, &held, &nulls, &nheld);
	for (int i = 0; i < nheld; i++)
		if (!nulls[i] && DatumGetInt64(held[i]) == epoch)
			return true;
	return false;
}

/* a generation opened: its epoch, its place, and its row's xmin */
typedef struct OpenedGeneration
{
	int64		epoch;
	KeyGenSlot	slot;
	TransactionId xmin;
	TransactionId raw_xmin;		/* the same, frozen or not */
	int32		filter_chunks;	/* 0: none built */
	bool		settled;		/* settled_at is set */
} OpenedGeneration;

/* qsort comparator: epochs, largest first */
static int
epoch_cmp_desc(const void *a, const void *b)
{
	int64		ea = ((const OpenedGeneration *) a)->epoch;
	int64		eb = ((const OpenedGeneration *) b)->epoch;

	return ea == eb ? 0 : (ea > eb ? -1 : 1);
}

/*
 * Reads which sealed generations the filter of all sealed generations
 * holds, if it is usable here, into the cache; opened[1 ..] are the sealed
 * generations.  A generation it lists by epoch was sealed when the filter
 * was built from its keys; the epoch of a generation opened later in the
 * same place differs, and is not held.
 */
static void
read_filter_all(const StorageInfo *si, const OpenedGeneration *opened, int nopened)
{
	KeyGenState *st = &cache.state;
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;

	cache.filter_all_relids[0] = si->filter_all_relid;
	for (int place = 1; place <= FILTER_ALL_PLACES; place++)
		cache.filter_all_relids[place] = si->filter_all_places[place];
	if (!OidIsValid(si->filter_all_relid) || nopened < 2)
		return;

	rel = table_open(si->filter_all_relid, AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
		tuple = heap_copytuple(tuple);
	/* the build keeps one row; with any other number, none is used */
	if (HeapTupleIsValid(tuple) && !HeapTupleIsValid(systable_getnext(scan)))
	{
		bool		isnull[3];
		Datum		place = heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull[0]);
		Datum		epochs = heap_getattr(tuple, 2, RelationGetDescr(rel), &isnull[1]);
		Datum		chunks = heap_getattr(tuple, 3, RelationGetDescr(rel), &isnull[2]);

		if (!isnull[0] && !isnull[1] && !isnull[2] &&
			DatumGetInt32(place) >= 1 && DatumGetInt32(place) <= FILTER_ALL_PLACES)
		{
			ArrayType  *held = DatumGetArrayTypeP(epochs);

			st->filter_all_place = DatumGetInt32(place);
			st->filter_all_chunks = keygen_filter_all_usable(st->filter_all_place,
															 DatumGetInt32(chunks));
			for (int i = 1; i < nopened && st->filter_all_chunks > 0; i++)
				st->in_filter_all[opened[i].slot] = opened[i].settled &&
					keygen_filter_all_holds(held, opened[i].epoch);
		}
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	if (HeapTupleIsValid(tuple))
		heap_freetuple(tuple);
}

/*
 * Reads key_generations into the cache.  Opening the table processes the
 * invalidations that arrived, and the scan takes a snapshot after that:
 * the state read is at least as new as every invalidation processed.
 */
static void
read_state(const StorageInfo *si)
{
	KeyGenState *st = &cache.state;
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;
	OpenedGeneration opened[KEYGEN_RING];
	int			nopened = 0;

	memset(st, 0, sizeof(KeyGenState));
	cache.relid = si->generations_relid;
	cache.storage_generation = si->generation;
	cache.known = true;
	if (!si->has_ring)
	{
		st->current = KEYGEN_LEGACY;
		return;
	}
	st->current_epoch = 1;

	rel = table_open(si->generations_relid, AccessShareLock);
	cache.known = true;
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull[4];
		Datum		epoch = heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull[0]);
		Datum		generation = heap_getattr(tuple, 2, RelationGetDescr(rel), &isnull[1]);
		Datum		chunks = heap_getattr(tuple, 4, RelationGetDescr(rel), &isnull[2]);

		(void) heap_getattr(tuple, 5, RelationGetDescr(rel), &isnull[3]);

		if (isnull[0] || isnull[1] || nopened == KEYGEN_RING ||
			DatumGetInt32(generation) < 1 || DatumGetInt32(generation) > KEYGEN_RING)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("table %s.key_generations holds a row that is not a generation",
							STORAGE_SCHEMA)));
		opened[nopened].epoch = DatumGetInt64(epoch);
		opened[nopened].slot = DatumGetInt32(generation);
		opened[nopened].xmin = HeapTupleHeaderGetXmin(tuple->t_data);
		opened[nopened].raw_xmin = HeapTupleHeaderGetRawXmin(tuple->t_data);
		opened[nopened].filter_chunks = isnull[2] ? 0 : DatumGetInt32(chunks);
		opened[nopened].settled = !isnull[3];
		nopened++;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);

	/* before the first switch: the first generation, never sealed */
	if (nopened == 0)
	{
		st->current = 1;
		return;
	}

	for (KeyGenSlot g = 1; g <= KEYGEN_RING; g++)
		cache.filter_relids[g] = si->gens[g].filter_relid;

	/*
	 * Each generation was sealed by the switch that opened the next one,
	 * and holds every key recorded there once settled, by the transaction
	 * that set settled_at, or a later one: the xmin of its row.
	 */
	qsort(opened, nopened, sizeof(OpenedGeneration), epoch_cmp_desc);
	st->current = opened[0].slot;
	st->current_epoch = opened[0].epoch;
	for (int i = 1; i < nopened; i++)
	{
		KeyGenSlot	slot = opened[i].slot;

		st->sealed[st->nsealed++] = slot;
		st->unsettled[slot] = !opened[i].settled;
		st->sealed_by[slot] = opened[i].settled ? opened[i].xmin : InvalidTransactionId;
		if (!filters_seen[slot].known ||
			filters_seen[slot].storage_generation != si->generation ||
			filters_seen[slot].epoch != opened[i].epoch ||
			filters_seen[slot].filter_chunks != opened[i].filter_chunks ||
			filters_seen[slot].row_xmin != opened[i].raw_xmin)
		{
			/* known first: an invalidation while checking clears it */
			filters_seen[slot].known = true;
			filters_seen[slot].storage_generation = si->generation;
			filters_seen[slot].epoch = opened[i].epoch;
			filters_seen[slot].filter_chunks = opened[i].filter_chunks;
			filters_seen[slot].row_xmin = opened[i].raw_xmin;
			filters_seen[slot].usable_chunks =
				keygen_filter_usable(slot, opened[i].filter_chunks, opened[i].raw_xmin);
		}
		/* a filter is built only once settled: a later key would miss it */
		st->filter_chunks[slot] = opened[i].settled ? filters_seen[slot].usable_chunks : 0;
	}
	read_filter_all(si, opened, nopened);
}

/*
 * Returns the generations as this backend last read them, reading them
 * anew after an invalidation.
 */
const KeyGenState *
keygen_state(void)
{
	const StorageInfo *si = storage_locate();

	if (!cache.known || cache.storage_generation != si->generation)
		read_state(si);
	return &cache.state;
}

/*
 * Whether the generations this backend read are still those of
 * key_generations and of the filters' tables: no invalidation came since.
 */
bool
keygen_state_is_current(void)
{
	return cache.known;
}

/*
 * Returns the generations as key_generations holds them now, for those
 * that only read keys and do not pass the gate: the invalidation of a
 * switch reaches other backends only after its commit.
 */
const KeyGenState *
keygen_state_latest(void)
{
	read_state(storage_locate());
	return &cache.state;
}

/*
 * Forgets the cached state, so that it is read again: for a settle
 * (keygen_gate.c), whose change of key_generations this backend would
 * otherwise see only at its next invalidation.
 */
void
keygen_state_forget(void)
{
	cache.known = false;
}

/*
 * Whether a snapshot sees the commit of the switch that sealed a
 * generation, and with it every key recorded there.  The legacy generation
 * has no such switch: never.
 */
bool
keygen_seal_visible(KeyGenSlot slot, Snapshot snapshot)
{
	TransactionId sealed_by = cache.state.sealed_by[slot];

	if (slot == KEYGEN_LEGACY || !TransactionIdIsValid(sealed_by))
		return false;
	return !XidInMVCCSnapshot(sealed_by, snapshot);
}
