/*-------------------------------------------------------------------------
 *
 * keystore_batch.c
 *	  Recording the keys of a batch (idem_record_batch, idem_apply_batch):
 *	  one at a time through the fast path in the order of the unique
 *	  index, or, where the fast path cannot be used and the key store has
 *	  no generations (its SQL is older than 1.2), with set-based SQL
 *	  statements.
 *	  keystore.c says why recording a key is exact; this file applies it
 *	  to many keys, passing the gate once for the batch and letting it go
 *	  whenever a key must wait for another transaction.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore_batch.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"

#include "keystore_internal.h"

/*
 * Whether the keys of a batch must go one at a time where the fast path
 * cannot be used, rather than through the set-based statements, which
 * probe no sealed generation and would wait for a transaction inserting
 * one of the keys with the gate held (keygen.c): wherever the key store
 * has generations, or the legacy one still holds keys.
 */
bool
keystore_sealed_live(void)
{
	return storage_locate()->has_ring || keystore_legacy_live();
}

/* A key of a batch, sorted in the order of the unique index. */
typedef struct BatchKey
{
	int64		hash;
	int			index;			/* position in the batch */
	text	   *key;
} BatchKey;

/*
 * Orders batch keys by hash, then by key as COLLATE "C" does: the order of
 * KS_INSERT_BATCH.
 */
static int
batch_key_cmp_keys(const BatchKey *a, const BatchKey *b)
{
	int			len_a = VARSIZE_ANY_EXHDR(a->key);
	int			len_b = VARSIZE_ANY_EXHDR(b->key);
	int			cmp;

	if (a->hash != b->hash)
		return a->hash < b->hash ? -1 : 1;
	cmp = memcmp(VARDATA_ANY(a->key), VARDATA_ANY(b->key), Min(len_a, len_b));
	if (cmp != 0)
		return cmp;
	return len_a == len_b ? 0 : (len_a < len_b ? -1 : 1);
}

/*
 * qsort comparator of batch keys; the first occurrence of a key sorts
 * first.
 */
static int
batch_key_cmp(const void *a, const void *b)
{
	const BatchKey *ka = (const BatchKey *) a;
	const BatchKey *kb = (const BatchKey *) b;
	int			cmp = batch_key_cmp_keys(ka, kb);

	return cmp != 0 ? cmp : ka->index - kb->index;
}

/*
 * Returns a batch's keys in the order of the unique index, with their
 * hashes and places in the batch; sets every isnew to false.
 */
static BatchKey *
sort_batch(KeyGenSlot slot, int32 consumer_id, text **keys, int nkeys, bool *isnew)
{
	BatchKey   *sorted = palloc(Max(nkeys, 1) * sizeof(BatchKey));

	for (int i = 0; i < nkeys; i++)
	{
		sorted[i].hash = key_hash_in(slot, consumer_id, keys[i]);
		sorted[i].index = i;
		sorted[i].key = keys[i];
		isnew[i] = false;
	}
	qsort(sorted, nkeys, sizeof(BatchKey), batch_key_cmp);
	return sorted;
}

/*
 * Sets what a repeated key of a batch found to what its first occurrence,
 * at first, recorded or found.
 */
static void
repeat_as_first(RecordedKey *found, int first, const bool *isnew,
				const RecordedKey *recorded, const int32 *fingerprints,
				const bool *has_fingerprint, int32 processed_at)
{
	if (isnew[first])
	{
		found->has_fingerprint = fingerprints != NULL && has_fingerprint[first];
		found->fingerprint = found->has_fingerprint ? fingerprints[first] : 0;
		found->processed_at = processed_at;
	}
	else
		*found = recorded[first];
}

/*
 * Records the keys of a batch one at a time in the order of the unique
 * index, which rules out deadlocks between batches for the reason given at
 * KS_INSERT_BATCH.  Sets isnew[i] when keys[i] was not recorded before and
 * is the first occurrence of its key in the batch.
 *
 * fingerprints is NULL, or the fingerprint of each key's message
 * (has_fingerprint[i] false: none).  recorded is NULL, or receives for
 * each key that is not new what the storage holds of it; for a repeat in
 * the batch, its first occurrence as this call recorded it.
 *
 * Keys go through the fast path; a key it cannot decide takes the SQL
 * statements at its place in the order.  The first key is probed before
 * it is inserted.  If it was new, the batch is taken for a batch of new
 * messages and the keys that follow are inserted without a probe until
 * one finds its place taken (see fastpath_record): a batch of new keys
 * descends the index once per key, and a batch delivered again, whose
 * first key is recorded, probes every key and takes no transaction id.
 * When the fast path cannot be used at all, with require_fastpath this
 * returns false, doing nothing; otherwise every key takes the SQL
 * statements.
 */
bool
keystore_record_keys(int32 consumer_id, text **keys, int nkeys,
					 const int32 *fingerprints, const bool *has_fingerprint,
					 bool require_fastpath, bool *isnew, RecordedKey *recorded)
{
	KeyFastPath fp;
	KeyGenSlot	slot;
	bool		fast;
	BatchKey   *sorted;
	int32		processed_at;
	MemoryContext keycxt;
	bool		insert_first = false;
	bool		any_new = false;
	GateWait	wait = {InvalidTransactionId, 0};

	routed_refuse_unrouted(NULL);
	inflight_note_recording();

	slot = keygen_gate_enter();
	fast = key_fastpath_open(&fp, slot, true);
	if (!fast && require_fastpath)
	{
		keygen_gate_release();
		return false;
	}

	processed_at = keystore_processed_at_now();
	sorted = sort_batch(slot, consumer_id, keys, nkeys, isnew);

	keycxt = AllocSetContextCreate(CurrentMemoryContext,
								   "idem_consumer batch key",
								   ALLOCSET_SMALL_SIZES);
	for (int i = 0; i < nkeys; i++)
	{
		int			index = sorted[i].index;
		const int32 *fingerprint = NULL;
		RecordedKey *found = recorded != NULL ? &recorded[index] : NULL;
		MemoryContext oldcxt;

		CHECK_FOR_INTERRUPTS();
		if (fingerprints != NULL && has_fingerprint[index])
			fingerprint = &fingerprints[index];

		if (i > 0 && batch_key_cmp_keys(&sorted[i - 1], &sorted[i]) == 0)
		{
			/* a repeat: one message, as its first occurrence left it */
			if (found != NULL)
				repeat_as_first(found, sorted[i - 1].index, isnew, recorded,
								fingerprints, has_fingerprint, processed_at);
			continue;
		}

		oldcxt = MemoryContextSwitchTo(keycxt);
		if (fast)
		{
			isnew[index] = fastpath_record(&fp, keygen_state(), slot,
										   sorted[i].hash, consumer_id,
										   processed_at, sorted[i].key,
										   fingerprint, found, &insert_first,
										   PROBE_UNKNOWN, &wait);
			/* the first key, never a repeat, decides for those after it */
			if (i == 0)
				insert_first = isnew[index];
		}
		else
			isnew[index] =
				!recorded_before(keygen_state(), consumer_id, sorted[i].key,
								 found, true, &wait) &&
				!GATE_WAIT_NEEDED(&wait) &&
				record_current_sql(slot, sorted[i].hash, consumer_id, processed_at,
								   sorted[i].key, fingerprint, found, &wait);
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(keycxt);

		if (GATE_WAIT_NEEDED(&wait))
		{
			/*
			 * The keys recorded so far are in this generation: register
			 * them there before the gate goes, then wait and take this key
			 * again in whichever generation is current then.
			 */
			if (any_new)
				keygen_note_recording(consumer_id, processed_at);
			any_new = false;
			if (fast)
				key_fastpath_close(&fp);
			keygen_gate_wait(&wait);
			slot = keygen_gate_enter();
			fast = key_fastpath_open(&fp, slot, true);
			insert_first = false;
			i--;
			continue;
		}
		any_new |= isnew[index];
	}
	MemoryContextDelete(keycxt);
	pfree(sorted);

	if (fast)
		key_fastpath_close(&fp);
	if (any_new)
		keygen_note_recording(consumer_id, processed_at);
	keygen_gate_release();
	return true;
}

/*
 * Inserts the keys of a batch that are not recorded; returns how many were
 * inserted and leaves their keys in SPI_tuptable.  Keys that conflicted
 * are either recorded already or collide: see keystore_unresolved_batch.
 * Only where keystore_sealed_live() is false: no generation but the
 * current one.
 */
uint64
keystore_insert_batch(int32 consumer_id, ArrayType *keys)
{
	Datum		args[3];

	routed_refuse_unrouted(NULL);
	inflight_note_recording();
	args[0] = Int32GetDatum(consumer_id);
	args[1] = Int32GetDatum(keystore_processed_at_now());
	args[2] = PointerGetDatum(keys);
	/* before the insert, whose rows the caller reads in SPI_tuptable */
	keygen_note_recording(consumer_id, DatumGetInt32(args[1]));
	keystore_execute_in(keygen_state()->current, KS_INSERT_BATCH, args, NULL, 0);
	return SPI_processed;
}

/*
 * Finds the keys of a batch that keystore_insert_batch did not insert
 * (inserted holds those it did) and that are not recorded either; returns
 * how many and leaves them in SPI_tuptable.  Each needs
 * keystore_record_key, which tells a collision from a key whose occupant
 * was deleted meanwhile.  Runs as a statement of its own, so that under
 * READ COMMITTED it sees the rows the insert waited for.  Only where
 * keystore_sealed_live() is false.
 */
uint64
keystore_unresolved_batch(int32 consumer_id, ArrayType *keys,
						  ArrayType *inserted)
{
	Datum		args[3];

	args[0] = Int32GetDatum(consumer_id);
	args[1] = PointerGetDatum(keys);
	args[2] = PointerGetDatum(inserted);
	keystore_execute_in(keygen_state()->current, KS_UNRESOLVED_BATCH, args, NULL, 0);
	return SPI_processed;
}
