/*-------------------------------------------------------------------------
 *
 * keygen_filter.c
 *	  The filters of the sealed generations of keys: a blocked Bloom filter
 *	  of each sealed generation's keys, and one of all of them together,
 *	  built once a generation is settled (idem_key_generation_build_filters,
 *	  and the purge worker after each switch), and the tests that spare a
 *	  delivery the probe of a generation that cannot hold its key.
 *
 * Layout.  The filter of generation g is the table
 * idem_consumer_local.key_filter_g, one row (chunk, bits) per page: chunk
 * n, FILTER_CHUNK_BYTES of bits, in block n.  A key's 64-bit hash (the
 * full key_hash64 under the database's seed, whatever width the index
 * keeps) chooses its chunk with its high 32 bits, and FILTER_PROBES bits
 * of one 64-byte line of the chunk with a mix of all 64, so a test reads
 * one page and touches one cache line of it.  At 10 bits per key a
 * filter costs 1.25 bytes per key and answers "may hold" for about 1% of
 * the keys a generation does not hold.
 *
 * Why a filter is exact (no key it holds is ever reported absent):
 *	1. it is built from every key of both tables of the generation, read
 *	   with a snapshot taken once it has settled: every transaction that
 *	   may have recorded a key there had ended before (keygen.c), and a
 *	   generation still settling is built no filter;
 *	2. nothing adds a key to a settled generation afterwards: a collision
 *	   moved into its occupant's place (forget, purge) was in the
 *	   generation already, and is in the filter;
 *	3. it is used only once key_generations says it was built
 *	   (filter_chunks), which commits with its rows, only if the table
 *	   has as many blocks, and only if its rows were written by the
 *	   transaction that last wrote the generation's row (their xmin): a
 *	   restored database, or a logical subscriber, gets key_generations
 *	   but not the filters (they are the database's own, like the seed
 *	   they are computed with) and probes without them until it has built
 *	   its own.  A subscriber that built one keeps it when the publisher's
 *	   retirement truncates the generation's tables (the filter is not
 *	   published), and the place may be opened again, sealed and given a
 *	   filter upstream of as many chunks: the row then comes from the
 *	   subscription, not from the build of the filter there;
 *	4. the build empties the table first, so chunk n is in block n, and
 *	   the test checks the chunk number it reads; anything else it finds
 *	   makes it answer "may hold";
 *	5. a dropped generation's filter is truncated with its tables, under
 *	   the same ACCESS EXCLUSIVE that no reader holds (keygen_retire.c).
 * A generation whose filter is being built is probed without one, so a
 * delivery during the build is decided as before it.
 *
 * The filter of all sealed generations.  A new key is in no sealed
 * generation, and with a filter each it would read a page of every one:
 * in a buffer pool of gigabytes each such page costs misses of the caches
 * and of the TLB, and the cost of a new key would grow with the number of
 * sealed generations.  So a second filter, of the same layout, holds the
 * keys of all the sealed generations at once, sized for all of them, and a
 * new key reads one page of it; only the keys it may hold (about 1%) go on to the
 * generations' own filters, which tell which generation to probe.  It is
 * built after theirs, from every key of each sealed generation, whenever
 * one is sealed that it does not hold, in whichever of its two tables
 * (key_filter_all_1 and _2) sessions do not read, and then named in
 * key_filter_all with the epochs of the generations it holds.  It is exact
 * for those generations, and only for them, by the same steps:
 *	1. and 2. as above, for each generation it holds;
 *	3. a session uses it only as key_filter_all names it, a row that
 *	   commits with its pages and whose trigger makes every session read
 *	   the generations again, only if its table has as many blocks, and
 *	   only for the generations whose epochs it lists: a generation sealed
 *	   since, or one opened later in the same place of the ring, has
 *	   another epoch and is probed as before;
 *	4. as above;
 *	5. the table it is built in, and the table a later build empties, are
 *	   locked in ACCESS EXCLUSIVE mode without waiting, so no session reads
 *	   them meanwhile, and one that read the generations before then finds,
 *	   as it opens the table, that they changed, and answers "may hold".
 * Dropping a generation leaves its keys in it, which only makes it answer
 * "may hold" more often until the next build: that builds it again without
 * them, or, when no sealed generation is left, empties it.
 * (test/isolation/specs/key_generation_filter.spec.)
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_filter.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "keygen_state.h"
#include "keygen_gate.h"
#include "keygen_filter.h"

/* one chunk per 8 kB page, with its tuple and page headers */
#define FILTER_CHUNK_BYTES 8000
#define FILTER_CHUNK_BITS (FILTER_CHUNK_BYTES * 8)
#define FILTER_LINE_BITS 512
#define FILTER_LINES (FILTER_CHUNK_BITS / FILTER_LINE_BITS)
#define FILTER_BITS_PER_KEY 10
#define FILTER_PROBES 7
/* the least length of a filter tuple: header, chunk, bits */
#define FILTER_TUPLE_MIN (SizeofHeapTupleHeader + 2 * sizeof(int32) + FILTER_CHUNK_BYTES)
/* keys a build reads per fetch */
#define FILTER_FETCH 10000

typedef enum FilterStmt
{
	KF_UNFILTERED,
	KF_RECORD,
	KF_ALL_READ,
	KF_ALL_FORGET,
	KF_ALL_RECORD,
	KF_NUM_STMTS
} FilterStmt;

static const StorageStmt filter_stmt_defs[KF_NUM_STMTS] = {
	/* the settled generations: epoch, place, filter_chunks, the row's writer */
	[KF_UNFILTERED] = {
		"SELECT g.epoch, g.generation, g.filter_chunks, g.xmin"
		" FROM " STORAGE_SCHEMA ".key_generations AS g"
		" WHERE g.settled_at IS NOT NULL AND g.epoch OPERATOR(pg_catalog.<>)"
		" (SELECT pg_catalog.max(epoch) FROM " STORAGE_SCHEMA ".key_generations)"
		" ORDER BY g.epoch DESC",
		0, {InvalidOid}
	},
	[KF_RECORD] = {
		"UPDATE " STORAGE_SCHEMA ".key_generations SET filter_chunks = $2"
		" WHERE epoch OPERATOR(pg_catalog.=) $1",
		2, {INT8OID, INT4OID}
	},
	/* the filter of all sealed generations: its table and generations */
	[KF_ALL_READ] = {
		"SELECT place, epochs FROM " LOCAL_SCHEMA ".key_filter_all",
		0, {InvalidOid}
	},
	[KF_ALL_FORGET] = {
		"DELETE FROM " LOCAL_SCHEMA ".key_filter_all",
		0, {InvalidOid}
	},
	[KF_ALL_RECORD] = {
		"INSERT INTO " LOCAL_SCHEMA ".key_filter_all (place, epochs, chunks)"
		" VALUES ($1, $2, $3)",
		3, {INT4OID, INT8ARRAYOID, INT4OID}
	},
};

static SPIPlanPtr filter_plans[KF_NUM_STMTS];
static StorageStmtSet filter_stmts = STORAGE_STMT_SET(filter_stmt_defs, filter_plans);

/*
 * Where a hash's bits are: its chunk among nchunks (from its high 32
 * bits), the 64-byte line of the chunk, and FILTER_PROBES bits of that
 * line, so that a test touches one cache line.  The line and the bits come
 * from a mix of the whole hash.
 */
static inline uint32
filter_chunk(uint64 hash, int32 nchunks)
{
	return (uint32) (((hash >> 32) * (uint64) nchunks) >> 32);
}

static inline void
filter_positions(uint64 hash, uint32 *pos)
{
	uint64		mix = hash;
	uint32		line;
	uint32		a;
	uint32		b;

	/* the finalizer of splitmix64 */
	mix = (mix ^ (mix >> 30)) * UINT64CONST(0xBF58476D1CE4E5B9);
	mix = (mix ^ (mix >> 27)) * UINT64CONST(0x94D049BB133111EB);
	mix ^= mix >> 31;
	line = (uint32) (((mix >> 32) * (uint64) FILTER_LINES) >> 32);
	a = (uint32) mix & (FILTER_LINE_BITS - 1);
	b = ((uint32) (mix >> 9) & (FILTER_LINE_BITS - 1)) | 1;
	for (int i = 0; i < FILTER_PROBES; i++)
		pos[i] = line * FILTER_LINE_BITS + ((a + (uint32) i * b) & (FILTER_LINE_BITS - 1));
}

/*
 * Whether the filter in table relid, of nchunks chunks, may hold the key
 * whose key_filter_hash() is hash: false only when the key is certainly
 * not there.
 */
static bool
filter_may_hold(Oid relid, int32 nchunks, uint64 hash)
{
	uint32		chunk = filter_chunk(hash, nchunks);
	uint32		pos[FILTER_PROBES];
	Relation	rel;
	Buffer		buf;
	Page		page;
	bool		may_hold = true;

	/*
	 * The state said the table had nchunks blocks when it was read; if it
	 * was truncated since (the generation dropped, or the filter of all
	 * sealed generations built again there), opening it brought the
	 * invalidation, and the state is no longer current.
	 */
	rel = table_open(relid, AccessShareLock);
	if (!keygen_state_is_current())
	{
		table_close(rel, NoLock);
		return true;
	}
	buf = ReadBuffer(rel, chunk);
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	if (!PageIsNew(page) && PageGetMaxOffsetNumber(page) >= FirstOffsetNumber)
	{
		ItemId		itemid = PageGetItemId(page, FirstOffsetNumber);

		/* (chunk int4, bits bytea), neither null: bits at a fixed place */
		if (ItemIdIsNormal(itemid) &&
			ItemIdGetLength(itemid) >= FILTER_TUPLE_MIN)
		{
			HeapTupleHeader htup = (HeapTupleHeader) PageGetItem(page, itemid);
			char	   *data = (char *) htup + htup->t_hoff;
			int32		chunkno;
			char	   *bits = data + INTALIGN(sizeof(int32));

			memcpy(&chunkno, data, sizeof(int32));
			if ((htup->t_infomask & HEAP_HASNULL) == 0 && chunkno == (int32) chunk &&
				VARATT_IS_4B_U(bits) &&
				VARSIZE(bits) == VARHDRSZ + FILTER_CHUNK_BYTES &&
				(char *) htup + ItemIdGetLength(itemid) >= bits + VARSIZE(bits))
			{
				const uint8 *bytes = (const uint8 *) VARDATA(bits);

				filter_positions(hash, pos);
				for (int i = 0; i < FILTER_PROBES && may_hold; i++)
					may_hold = (bytes[pos[i] / 8] & (1 << (pos[i] % 8))) != 0;
			}
		}
	}
	UnlockReleaseBuffer(buf);
	table_close(rel, NoLock);
	return may_hold;
}

/*
 * Whether generation slot, whose filter has nchunks chunks, may hold the
 * key whose key_filter_hash() is hash: false only when the key is
 * certainly not there.
 */
bool
keygen_filter_may_hold(KeyGenSlot slot, int32 nchunks, uint64 hash)
{
	return filter_may_hold(storage_locate()->gens[slot].filter_relid, nchunks, hash);
}

/*
 * Whether any of the generations the filter of all sealed generations
 * holds (st->in_filter_all) may hold the key whose key_filter_hash() is
 * hash: false only when none of them holds it.  st must have that filter
 * (filter_all_chunks > 0).
 */
bool
keygen_filter_all_may_hold(const KeyGenState *st, uint64 hash)
{
	Assert(st->filter_all_chunks > 0);
	return filter_may_hold(storage_locate()->filter_all_places[st->filter_all_place],
						   st->filter_all_chunks, hash);
}

/*
 * Keys generation gen holds, estimated from its key table's pages at the
 * density its statistics last counted, or at a short key's; a filter too
 * small for its keys only answers "may hold" more often.
 */
static double
generation_keys_estimate(const KeyGeneration *gen)
{
	Relation	rel = table_open(gen->keys_relid, AccessShareLock);
	double		keys;

	if (rel->rd_rel->reltuples > 0 && rel->rd_rel->relpages > 0)
		keys = rel->rd_rel->reltuples / rel->rd_rel->relpages *
			RelationGetNumberOfBlocks(rel) * 1.1;
	else
		keys = (double) RelationGetNumberOfBlocks(rel) * (BLCKSZ / 60);
	table_close(rel, AccessShareLock);
	return Max(keys, 1);
}

/* The chunks of a filter of that many keys, FILTER_BITS_PER_KEY each. */
static int32
filter_chunks_for(double keys)
{
	return (int32) Min(ceil(keys * FILTER_BITS_PER_KEY / FILTER_CHUNK_BITS) + 1,
					   (double) (MaxAllocHugeSize / FILTER_CHUNK_BYTES));
}

/*
 * Sets the bits of every key generation gen holds, in both its tables, in
 * a filter of nchunks chunks.
 */
static void
filter_add_generation(uint8 *bits, int32 nchunks, const KeyGeneration *gen)
{
	char	   *sql;
	Portal		portal;

	sql = psprintf("SELECT consumer_id, key FROM %s UNION ALL SELECT consumer_id, key FROM %s",
				   quote_qualified_identifier(STORAGE_SCHEMA, get_rel_name(gen->keys_relid)),
				   quote_qualified_identifier(STORAGE_SCHEMA, get_rel_name(gen->collisions_relid)));
	portal = SPI_cursor_open_with_args(NULL, sql, 0, NULL, NULL, NULL, true, 0);
	for (;;)
	{
		SPI_cursor_fetch(portal, true, FILTER_FETCH);
		if (SPI_processed == 0)
			break;
		for (uint64 i = 0; i < SPI_processed; i++)
		{
			bool		isnull;
			int32		consumer_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
																  SPI_tuptable->tupdesc, 1, &isnull));
			text	   *key = DatumGetTextPP(SPI_getbinval(SPI_tuptable->vals[i],
														   SPI_tuptable->tupdesc, 2, &isnull));
			uint64		hash = key_filter_hash(consumer_id, key);
			uint8	   *chunk = bits + (Size) filter_chunk(hash, nchunks) * FILTER_CHUNK_BYTES;
			uint32		pos[FILTER_PROBES];

			filter_positions(hash, pos);
			for (int p = 0; p < FILTER_PROBES; p++)
				chunk[pos[p] / 8] |= 1 << (pos[p] % 8);
		}
		SPI_freetuptable(SPI_tuptable);
		CHECK_FOR_INTERRUPTS();
	}
	SPI_cursor_close(portal);
}

/*
 * Empties filter table relid, which the caller has locked in ACCESS
 * EXCLUSIVE mode.
 */
static void
filter_empty(Oid relid)
{
	char	   *filter_name = quote_qualified_identifier(LOCAL_SCHEMA, get_rel_name(relid));

	if (SPI_execute(psprintf("TRUNCATE %s", filter_name), false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "could not empty filter %s", filter_name);
}

/*
 * Empties filter table relid, which the caller has locked in ACCESS
 * EXCLUSIVE mode, so that chunk n goes into block n, and writes the
 * nchunks chunks of bits into it.
 */
static void
filter_write(Oid relid, const uint8 *bits, int32 nchunks)
{
	char	   *filter_name = quote_qualified_identifier(LOCAL_SCHEMA, get_rel_name(relid));
	char	   *sql;
	Datum		args[2];
	Oid			argtypes[2] = {INT4OID, BYTEAOID};
	SPIPlanPtr	insert;
	bytea	   *chunk_bytes;

	filter_empty(relid);
	sql = psprintf("INSERT INTO %s (chunk, bits) VALUES ($1, $2)", filter_name);
	insert = SPI_prepare(sql, 2, argtypes);
	if (insert == NULL)
		elog(ERROR, "could not prepare the insert into filter %s", filter_name);
	chunk_bytes = palloc(VARHDRSZ + FILTER_CHUNK_BYTES);
	SET_VARSIZE(chunk_bytes, VARHDRSZ + FILTER_CHUNK_BYTES);
	for (int32 c = 0; c < nchunks; c++)
	{
		memcpy(VARDATA(chunk_bytes), bits + (Size) c * FILTER_CHUNK_BYTES,
			   FILTER_CHUNK_BYTES);
		args[0] = Int32GetDatum(c);
		args[1] = PointerGetDatum(chunk_bytes);
		if (SPI_execute_plan(insert, args, NULL, false, 0) != SPI_OK_INSERT)
			elog(ERROR, "could not write filter %s", filter_name);
		CHECK_FOR_INTERRUPTS();
	}
	SPI_freeplan(insert);
	pfree(chunk_bytes);
}

/* a zeroed filter of nchunks chunks */
static uint8 *
filter_alloc(int32 nchunks)
{
	return MemoryContextAllocExtended(CurrentMemoryContext,
									  (Size) nchunks * FILTER_CHUNK_BYTES,
									  MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
}

/*
 * Builds the filter of one sealed generation and records it; returns
 * false, doing nothing, if the filter's table is in use.
 */
static bool
build_filter(KeyGenSlot slot, int64 epoch)
{
	const KeyGeneration *gen = &storage_locate()->gens[slot];
	int32		nchunks;
	uint8	   *bits;
	Datum		args[2];

	/* never queue: a reader of an older filter there would wait behind */
	if (!ConditionalLockRelationOid(gen->filter_relid, AccessExclusiveLock))
		return false;

	nchunks = filter_chunks_for(generation_keys_estimate(gen));
	bits = filter_alloc(nchunks);
	filter_add_generation(bits, nchunks, gen);
	filter_write(gen->filter_relid, bits, nchunks);
	pfree(bits);

	args[0] = Int64GetDatum(epoch);
	args[1] = Int32GetDatum(nchunks);
	storage_stmt_run(&filter_stmts, KF_RECORD, args, NULL, 0);
	return true;
}

/*
 * Whether the epochs of a row of key_filter_all are exactly epochs[0..n-1]:
 * every one of them, and no other (a generation dropped since).
 */
static bool
filter_all_holds_exactly(ArrayType *held, const int64 *epochs, int n)
{
	Datum	   *held_epochs;
	bool	   *nulls;
	int			nheld;

	for (int i = 0; i < n; i++)
		if (!keygen_filter_all_holds(held, epochs[i]))
			return false;
	deconstruct_array(held, INT8OID, sizeof(int64), FLOAT8PASSBYVAL,
					  TYPALIGN_DOUBLE, &held_epochs, &nulls, &nheld);
	for (int h = 0; h < nheld; h++)
	{
		bool		sealed = false;

		for (int i = 0; i < n && !sealed && !nulls[h]; i++)
			sealed = DatumGetInt64(held_epochs[h]) == epochs[i];
		if (!sealed)
			return false;
	}
	return true;
}

/*
 * Empties filter table relid of the filter of all sealed generations if it
 * has pages and nobody reads it; returns false if it could not.
 */
static bool
filter_all_empty_unread(Oid relid)
{
	Relation	rel;
	bool		has_pages;

	if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
		return false;
	rel = table_open(relid, NoLock);
	has_pages = RelationGetNumberOfBlocks(rel) > 0;
	table_close(rel, NoLock);
	if (has_pages)
		filter_empty(relid);
	return true;
}

/*
 * Builds the filter of all sealed generations, those of epochs[] in
 * slots[], unless the one sessions read holds exactly those already;
 * returns whether it built it.  It is built in the table sessions do not
 * read, then named in key_filter_all, whose trigger makes every session
 * read the generations again.  A table that no filter of all sealed
 * generations needs any longer is emptied once nobody reads it: the other
 * table after a build, and both once no sealed generation is left, so that
 * the keys of dropped generations do not stay behind.
 */
static bool
build_filter_all(const int64 *epochs, const KeyGenSlot *slots, int n)
{
	const StorageInfo *si = storage_locate();
	int			place = 0;
	int			target;
	bool		current = false;
	double		keys = 0;
	int32		nchunks;
	uint8	   *bits;
	Datum		args[3];
	Datum	   *epoch_datums;

	if (!OidIsValid(si->filter_all_relid))
		return false;

	storage_stmt_run(&filter_stmts, KF_ALL_READ, NULL, NULL, 0);
	if (SPI_processed == 1)
	{
		place = DatumGetInt32(result_column(1));
		current = filter_all_holds_exactly(DatumGetArrayTypeP(result_column(2)),
										   epochs, n);
	}
	SPI_freetuptable(SPI_tuptable);
	target = place == 1 ? 2 : 1;

	if (n == 0)
	{
		/* the one sessions read holds dropped generations only */
		if (place != 0 && filter_all_empty_unread(si->filter_all_places[place]))
		{
			storage_stmt_run(&filter_stmts, KF_ALL_FORGET, NULL, NULL, 0);
			place = 0;
		}
		if (place == 0)
		{
			(void) filter_all_empty_unread(si->filter_all_places[1]);
			(void) filter_all_empty_unread(si->filter_all_places[2]);
		}
		return false;
	}

	if (current)
	{
		/* the other table, read before the last build at most */
		(void) filter_all_empty_unread(si->filter_all_places[target]);
		return false;
	}

	/* never queue: a session that read it before the last build waits behind */
	if (!ConditionalLockRelationOid(si->filter_all_places[target], AccessExclusiveLock))
		return false;

	for (int i = 0; i < n; i++)
		keys += generation_keys_estimate(&si->gens[slots[i]]);
	nchunks = filter_chunks_for(keys);
	bits = filter_alloc(nchunks);
	for (int i = 0; i < n; i++)
		filter_add_generation(bits, nchunks, &si->gens[slots[i]]);
	filter_write(si->filter_all_places[target], bits, nchunks);
	pfree(bits);

	epoch_datums = palloc(n * sizeof(Datum));
	for (int i = 0; i < n; i++)
		epoch_datums[i] = Int64GetDatum(epochs[i]);
	args[0] = Int32GetDatum(target);
	args[1] = PointerGetDatum(construct_array(epoch_datums, n, INT8OID, sizeof(int64),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	args[2] = Int32GetDatum(nchunks);
	storage_stmt_run(&filter_stmts, KF_ALL_FORGET, NULL, NULL, 0);
	storage_stmt_run(&filter_stmts, KF_ALL_RECORD, args, NULL, 0);
	return true;
}

/*
 * Builds the filters of the sealed generations that have none usable here,
 * then the filter of all sealed generations if it lacks one of them;
 * returns how many filters it built.  Runs as the owner of the storage.
 */
int
keygen_build_filters(void)
{
	const StorageInfo *si = storage_locate();
	int64		epochs[KEYGEN_RING];
	KeyGenSlot	slots[KEYGEN_RING];
	int64		sealed_epochs[KEYGEN_RING];
	KeyGenSlot	sealed_slots[KEYGEN_RING];
	int			n = 0;
	int			nsealed = 0;
	int			built = 0;
	Oid			save_userid;
	int			save_sec_context;

	if (!si->has_ring)
		return 0;

	/* one at a time with switches and drops, which change the generations */
	LockRelationOid(si->generations_relid, ShareUpdateExclusiveLock);
	(void) keygen_settle();

	storage_stmt_run(&filter_stmts, KF_UNFILTERED, NULL, NULL, 0);
	for (uint64 i = 0; i < SPI_processed && nsealed < KEYGEN_RING; i++)
	{
		bool		isnull[4];
		HeapTuple	tuple = SPI_tuptable->vals[i];
		int64		epoch = DatumGetInt64(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &isnull[0]));
		int32		slot = DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2, &isnull[1]));
		Datum		chunks = SPI_getbinval(tuple, SPI_tuptable->tupdesc, 3, &isnull[2]);
		TransactionId row_xmin = DatumGetTransactionId(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 4, &isnull[3]));

		if (slot < 1 || slot > KEYGEN_RING || !OidIsValid(si->gens[slot].filter_relid))
			continue;
		sealed_epochs[nsealed] = epoch;
		sealed_slots[nsealed] = slot;
		nsealed++;
		if (!isnull[2] && keygen_filter_usable(slot, DatumGetInt32(chunks), row_xmin) > 0)
			continue;
		epochs[n] = epoch;
		slots[n] = slot;
		n++;
	}
	SPI_freetuptable(SPI_tuptable);

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(si->owner,
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	for (int i = 0; i < n; i++)
		if (build_filter(slots[i], epochs[i]))
			built++;
	if (build_filter_all(sealed_epochs, sealed_slots, nsealed))
		built++;
	SetUserIdAndSecContext(save_userid, save_sec_context);
	return built;
}

PG_FUNCTION_INFO_V1(idem_key_filter_in_use);

/*
 * idem_consumer.key_filter_in_use(generation, filter_chunks, row_xmin):
 * whether sessions use this database's filter of a generation whose row
 * of key_generations, written by row_xmin, records filter_chunks; for the
 * view idem_key_generations.
 */
Datum
idem_key_filter_in_use(PG_FUNCTION_ARGS)
{
	int32		generation = PG_GETARG_INT32(0);

	if (generation < 1 || generation > KEYGEN_RING || !storage_locate()->has_ring)
		PG_RETURN_BOOL(false);
	PG_RETURN_BOOL(keygen_filter_usable(generation, PG_GETARG_INT32(1),
										PG_GETARG_TRANSACTIONID(2)) > 0);
}

PG_FUNCTION_INFO_V1(idem_key_generation_build_filters);

/*
 * idem_key_generation_build_filters(): builds the filters of the sealed
 * generations that lack one, and the filter of all of them if it lacks
 * one; returns how many filters it built.
 */
Datum
idem_key_generation_build_filters(PG_FUNCTION_ARGS)
{
	int			built;

	SPI_connect();
	built = keygen_build_filters();
	SPI_finish();
	PG_RETURN_INT32(built);
}
