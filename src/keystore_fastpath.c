/*-------------------------------------------------------------------------
 *
 * keystore_fastpath.c
 *	  The fast path on the key index: probing a key's hash in the unique
 *	  index of a generation's key table and inserting a new key there
 *	  without the executor.
 *
 * It is used only when the storage is exactly as the extension creates it
 * (storage.c recognises the index; key_fastpath_open checks the table), and it
 * decides only the two plain cases: a visible row of the key itself is a
 * duplicate (no transaction id, no WAL, no waiting), and a free hash takes
 * the new key.  A new key is inserted the way INSERT ... ON CONFLICT does
 * it, with the speculative insertion of fastpath.c, which the fast path
 * of external effects shares, as all three fast paths share the check of
 * their table (fastpath_table_matches).
 * Anything else (another key in the hash's place, a row not visible to the
 * snapshot, a concurrent inserter) is left to the SQL statements, which
 * wait and decide; keystore.c says why that is exact.
 *
 * A key's place can also be read with a dirty snapshot, as a unique check
 * reads it (key_dirty_probe): that sees the rows of transactions still in
 * progress, whose end the caller waits for.  keystore.c probes so the
 * sealed generations that are not settled yet, and the current one before
 * an insertion that would wait (keygen.c says why).
 *
 * This file touches the key tables of the generations and their indexes
 * only, never their collisions or the other tables.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore_fastpath.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/stratnum.h"
#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapshot.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "keystore_fastpath.h"
#include "fastpath.h"
#include "text_bytes.h"

/*
 * The key table as the extension creates it: (consumer_id int4,
 * processed_at int4, key text COLLATE "C"), all NOT NULL, and from version
 * 1.1 on a fourth, fingerprint int4, nullable; no default, check
 * constraint or trigger.  The fast path forms its tuples from these values
 * alone, so any other column (even a dropped one, which still takes a
 * slot) would get a garbage value instead of its default.
 */
static const FastPathColumn key_columns[] = {
	{NULL, INT4OID, true, false},	/* consumer_id */
	{NULL, INT4OID, true, false},	/* processed_at */
	{NULL, TEXTOID, true, true},	/* key */
	{"fingerprint", INT4OID, false, false},
};

/* the table of a 1.0 storage, then of a later one */
static const FastPathTableShape key_shapes[] = {
	{.columns = key_columns, .ncolumns = 3, .defaults = FASTPATH_DEFAULTS_NONE},
	{.columns = key_columns, .ncolumns = 4, .defaults = FASTPATH_DEFAULTS_NONE},
};

/*
 * Whether the key table of each generation suits the fast path, as
 * key_table_usable found it, kept until a relcache invalidation of the
 * table: everything it reads (the table's kind, columns, triggers, row
 * security, check constraints and indexes) changes only with one, and a
 * duplicate spares reading them at every call (test/bench/instructions).
 */
typedef struct KeyTableVerdict
{
	Oid			keys_relid;		/* InvalidOid: none */
	Oid			hash_index;
	bool		usable;
} KeyTableVerdict;

static KeyTableVerdict verdicts[KEYGEN_NUM];
static bool verdict_callback_registered = false;
static uint64 verdict_invalidations = 0;

/*
 * Forgets the verdict of a key table whose relcache entry is invalidated
 * (all of them for InvalidOid).
 */
static void
verdict_relcache_callback(Datum arg, Oid relid)
{
	verdict_invalidations++;
	for (int i = 0; i < KEYGEN_NUM; i++)
		if (relid == InvalidOid || verdicts[i].keys_relid == relid)
			verdicts[i].keys_relid = InvalidOid;
}

/*
 * Tells whether an opened key table suits the fast path: as key_shapes
 * describes it (fastpath_table_matches), with hash_index as its only
 * index.
 */
static bool
key_table_usable(Relation keys, Oid hash_index)
{
	List	   *indexes = RelationGetIndexList(keys);
	bool		usable;

	usable = fastpath_table_matches(keys,
									&key_shapes[RelationGetDescr(keys)->natts == 3 ? 0 : 1]) &&
		list_length(indexes) == 1 &&
		linitial_oid(indexes) == hash_index;
	list_free(indexes);
	return usable;
}

/*
 * key_table_usable for the key table of generation slot, from its verdict
 * while no invalidation has come since.  The table is open and locked, so
 * the invalidations of whatever changed it have been processed.  A
 * verdict during which one came (reading the index list may process
 * some) is used once but not kept.
 */
static bool
key_table_usable_cached(KeyGenSlot slot, Relation keys, Oid hash_index)
{
	KeyTableVerdict *verdict = &verdicts[slot];
	uint64		invalidations;
	bool		usable;

	if (verdict->keys_relid == RelationGetRelid(keys) &&
		verdict->hash_index == hash_index)
		return verdict->usable;

	if (!verdict_callback_registered)
	{
		storage_relcache_subscribe(verdict_relcache_callback);
		verdict_callback_registered = true;
	}
	invalidations = verdict_invalidations;
	usable = key_table_usable(keys, hash_index);
	if (verdict_invalidations == invalidations)
	{
		verdict->keys_relid = RelationGetRelid(keys);
		verdict->hash_index = hash_index;
		verdict->usable = usable;
	}
	return usable;
}

/*
 * Opens the key table of a generation and its unique index for the fast
 * path, to write or only to read; returns false when the SQL statements
 * must do the work: idem_consumer.fast_path is off, the table does not
 * suit the fast path (key_table_usable), or the transaction cannot write
 * (the SQL path then raises the usual error).
 */
bool
key_fastpath_open(KeyFastPath *fp, KeyGenSlot slot, bool write)
{
	LOCKMODE	lockmode = write ? RowExclusiveLock : AccessShareLock;
	const KeyGeneration *gen = &storage_locate()->gens[slot];

	if (!fastpath_enabled() || !OidIsValid(gen->hash_index) ||
		(write && (XactReadOnly || IsInParallelMode())))
		return false;

	fp->keys = table_open(gen->keys_relid, lockmode);
	if (!key_table_usable_cached(slot, fp->keys, gen->hash_index))
	{
		table_close(fp->keys, NoLock);
		return false;
	}

	fp->hash_index = index_open(gen->hash_index, lockmode);
	fp->hash64 = gen->hash64;
	fp->index_info = NULL;
	fp->scan = NULL;
	fp->slot = NULL;
	fp->cxt = CurrentMemoryContext;

	fp->snapshot = fastpath_push_snapshot();
	return true;
}

/*
 * Ends the fast path; the locks are kept until the end of the transaction,
 * as the executor keeps them.
 */
void
key_fastpath_close(KeyFastPath *fp)
{
	if (fp->scan != NULL)
		index_endscan(fp->scan);
	if (fp->slot != NULL)
		ExecDropSingleTupleTableSlot(fp->slot);
	PopActiveSnapshot();
	index_close(fp->hash_index, NoLock);
	table_close(fp->keys, NoLock);
}

/*
 * Copies what the storage holds of a key from its row in a key table:
 * its time, and its fingerprint where the table has one.
 */
static void
recorded_from_slot(TupleTableSlot *slot, RecordedKey *recorded)
{
	bool		isnull;

	recorded->processed_at = DatumGetInt32(slot_getattr(slot, 2, &isnull));
	recorded->has_fingerprint = false;
	recorded->fingerprint = 0;
	if (slot->tts_tupleDescriptor->natts > 3)
	{
		Datum		fingerprint = slot_getattr(slot, 4, &isnull);

		recorded->has_fingerprint = !isnull;
		recorded->fingerprint = isnull ? 0 : DatumGetInt32(fingerprint);
	}
}

/* sets a scan key on a key's hash, of the width the index keeps */
static inline void
hash_scankey(ScanKey skey, bool hash64, int64 hash)
{
	if (hash64)
		ScanKeyInit(skey, 1, BTEqualStrategyNumber, F_INT8EQ, Int64GetDatum(hash));
	else
		ScanKeyInit(skey, 1, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum((int32) hash));
}

/* whether the row in a key table's slot is the key of consumer_id */
static inline bool
slot_holds_key(TupleTableSlot *slot, int32 consumer_id, text *key)
{
	bool		isnull;
	text	   *occupant;

	if (DatumGetInt32(slot_getattr(slot, 1, &isnull)) != consumer_id)
		return false;
	occupant = DatumGetTextPP(slot_getattr(slot, 3, &isnull));
	return text_bytes_equal(occupant, key);
}

/*
 * Looks up a key's hash in the unique index and reports what the snapshot
 * sees in its place; the unique index lets a snapshot see at most one row
 * of a hash.
 */
KeyProbe
key_fastpath_probe(KeyFastPath *fp, int64 hash, int32 consumer_id, text *key,
				   RecordedKey *recorded)
{
	ScanKeyData skey;
	KeyProbe	found = PROBE_EMPTY;
	MemoryContext oldcxt;

	/* the scan allocates as it goes and lives as long as fp */
	oldcxt = MemoryContextSwitchTo(fp->cxt);
	if (fp->scan == NULL)
	{
		fp->scan = compat_index_beginscan(fp->keys, fp->hash_index, fp->snapshot, 1, 0);
		fp->slot = table_slot_create(fp->keys, NULL);
	}
	hash_scankey(&skey, fp->hash64, hash);
	index_rescan(fp->scan, &skey, 1, NULL, 0);

	if (index_getnext_slot(fp->scan, ForwardScanDirection, fp->slot))
	{
		bool		isnull;

		found = PROBE_OTHER;
		if (slot_holds_key(fp->slot, consumer_id, key))
		{
			found = PROBE_KEY;
			fp->found_xmin = DatumGetTransactionId(slot_getsysattr(fp->slot,
																   MinTransactionIdAttributeNumber,
																   &isnull));
			if (recorded != NULL)
				recorded_from_slot(fp->slot, recorded);
		}
		ExecClearTuple(fp->slot);
	}
	MemoryContextSwitchTo(oldcxt);
	return found;
}

/*
 * Inserts a key whose hash the probe found free, as a speculative
 * insertion; returns false, killing the speculative tuple, if the unique
 * index already has an entry of that hash that may be live.  Such an entry
 * comes from a transaction still running or committed after our snapshot,
 * or from this one: the SQL path must wait for it, fail to serialize, or
 * tell a duplicate from a collision.
 */
bool
key_fastpath_insert(KeyFastPath *fp, int64 hash, int32 consumer_id,
					int32 processed_at, text *key, const int32 *fingerprint)
{
	TupleDesc	tupdesc = RelationGetDescr(fp->keys);
	TupleTableSlot *slot;
	Datum		index_value = fp->hash64 ? Int64GetDatum(hash) :
		Int32GetDatum((int32) hash);
	bool		index_isnull = false;
	bool		inserted;

	slot = MakeSingleTupleTableSlot(tupdesc, &TTSOpsVirtual);
	slot->tts_values[0] = Int32GetDatum(consumer_id);
	slot->tts_values[1] = Int32GetDatum(processed_at);
	slot->tts_values[2] = PointerGetDatum(key);
	memset(slot->tts_isnull, 0, tupdesc->natts * sizeof(bool));
	if (tupdesc->natts > 3)
	{
		slot->tts_values[3] = fingerprint != NULL ? Int32GetDatum(*fingerprint) : (Datum) 0;
		slot->tts_isnull[3] = fingerprint == NULL;
	}
	ExecStoreVirtualTuple(slot);

	if (fp->index_info == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(fp->cxt);

		fp->index_info = BuildIndexInfo(fp->hash_index);
		MemoryContextSwitchTo(oldcxt);
	}

	inserted = fastpath_insert_speculative(fp->keys, slot, fp->hash_index,
										   fp->index_info, &index_value,
										   &index_isnull);

	ExecDropSingleTupleTableSlot(slot);
	return inserted;
}

/*
 * Looks up a key's hash in the unique index of a generation's key table
 * with a dirty snapshot, as the unique check of an insertion does, and
 * reports what is in its place: the key (committed, or this transaction's
 * own), another key, nothing, or a row that a transaction still in
 * progress inserts or deletes, PROBE_IN_PROGRESS with that transaction in
 * *wait_xid, for the caller to wait for (after giving up what it must not
 * hold while it waits) and probe again.  *xmin receives the inserter of
 * the key found.  Returns PROBE_UNKNOWN when the storage has no index the
 * fast path knows.  Whatever idem_consumer.fast_path says: this is the
 * only way to see a key a transaction in progress recorded.
 */
KeyProbe
key_dirty_probe(KeyGenSlot gen_slot, int64 hash, int32 consumer_id, text *key,
				RecordedKey *recorded, TransactionId *xmin, TransactionId *wait_xid)
{
	const KeyGeneration *gen = &storage_locate()->gens[gen_slot];
	SnapshotData dirty;
	Relation	keys;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData skey;
	KeyProbe	found = PROBE_EMPTY;

	if (!OidIsValid(gen->hash_index))
		return PROBE_UNKNOWN;
	keys = table_open(gen->keys_relid, AccessShareLock);
	index = index_open(gen->hash_index, AccessShareLock);
	InitDirtySnapshot(dirty);
	scan = compat_index_beginscan(keys, index, &dirty, 1, 0);
	slot = table_slot_create(keys, NULL);
	hash_scankey(&skey, gen->hash64, hash);
	index_rescan(scan, &skey, 1, NULL, 0);

	/* a unique index: at most one live row, and others dead or dying */
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;

		if (TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax))
		{
			*wait_xid = TransactionIdIsValid(dirty.xmin) ? dirty.xmin : dirty.xmax;
			found = PROBE_IN_PROGRESS;
			break;
		}
		found = PROBE_OTHER;
		if (slot_holds_key(slot, consumer_id, key))
		{
			found = PROBE_KEY;
			*xmin = DatumGetTransactionId(slot_getsysattr(slot,
														  MinTransactionIdAttributeNumber,
														  &isnull));
			if (recorded != NULL)
				recorded_from_slot(slot, recorded);
			break;
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(keys, NoLock);
	return found;
}
