/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  The key store: recording, probing and forgetting (consumer, key),
 *	  removing keys for retention, and the invariant that keeps all of it
 *	  exact under concurrency.  Consumers and their ids are consumers.c's.
 *
 * The key store is four files.  storage.c finds the tables and their
 * owner; keystore_sql.c holds the fixed statements and runs them as that
 * owner; keystore_fastpath.c probes and inserts through the key index in
 * C.  This file puts them together, and the argument that the result is
 * exact is here and nowhere else:
 *
 * Uniqueness of (consumer, key) rests on the unique index of
 * processed_keys over a 32-bit hash of the pair, with key_collisions
 * holding the keys whose hash another key already took.  A new key costs
 * one INSERT ... ON CONFLICT DO NOTHING, which gives the documented
 * concurrency behaviour: a second inserter of the same hash waits for the
 * first transaction, then finds the row (first committed) or inserts its
 * own (first aborted); under REPEATABLE READ or SERIALIZABLE a row
 * committed after our snapshot was taken raises a serialization failure.
 * Only on a conflict do we look at the occupant of the hash to tell a
 * duplicate from a collision.
 *
 * The SQL statements are the reference path.  Recording a key and telling
 * a duplicate take the fast path instead whenever the storage is exactly
 * as the extension creates it.  The fast path decides only what it sees
 * unambiguously with the caller's snapshot: the key itself visible in its
 * hash's place (a duplicate), or the place free and the speculative
 * insertion through the unique index succeeding (a new key, inserted as
 * INSERT ... ON CONFLICT would insert it, so a concurrent inserter of the
 * same hash waits for us exactly as it would for the statement).  In every
 * other case it gives the speculative tuple up and the SQL path decides.
 * The speculative insertion is what makes giving up safe: the tuple is dead
 * to everyone at once.  A plain tuple deleted by its own transaction would
 * look like an insertion in progress to every other inserter of the hash
 * until that transaction ends, so two deliveries that both gave up behind a
 * holder of the key would, once the holder aborts, wait for each other: a
 * deadlock.  A batch inserts its keys the same way, and after a first new
 * key without probing each first; that changes what a key costs, not what
 * is decided.
 *
 * Invariant: a key is in key_collisions only while processed_keys holds a
 * different key of the same hash.  Recording a collision first updates the
 * occupant (a no-op update) so that a concurrent deletion of the occupant
 * waits for it, and whoever deletes an occupant moves a collision in its
 * place.  Hence a successful insert into processed_keys proves the key was
 * in neither table, and a key whose hash place is free is not recorded.
 *
 * Retention (retention.c) removes rows chunk by chunk: it reads the rows of
 * a range of heap blocks of a table and names the ones to remove by TID,
 * and keystore_remove_rows() removes them and keeps the invariant, moving
 * a collision into the place of every occupant it removed.
 * *
 * The caller must be connected to SPI.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "optimizer/plancat.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/bufpage.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "keystore_internal.h"

/*
 * Converts the current transaction's start time to the integer seconds
 * stored in processed_keys.processed_at.
 */
static int32
processed_at_now(void)
{
	int64		seconds = GetCurrentTransactionStartTimestamp() / USECS_PER_SEC;

	if (seconds < 0 || seconds > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("transaction start time is outside the range idem_consumer can record"),
				 errdetail("Processing times are stored as seconds from 2000-01-01 to 2068-01-19.")));
	return (int32) seconds;
}

/*
 * Fetches a column of the first row an SPI statement returned.
 */
static inline Datum
result_column(int colno)
{
	bool		isnull;

	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
						 colno, &isnull);
}


/*
 * Reads what KS_PROBE_KEY_FP found of a key recorded already.
 */
static void
recorded_from_probe(RecordedKey *recorded)
{
	bool		isnull;
	Datum		fingerprint;

	fingerprint = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull);
	recorded->has_fingerprint = !isnull;
	recorded->fingerprint = isnull ? 0 : DatumGetInt32(fingerprint);
	recorded->processed_at = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
														 SPI_tuptable->tupdesc,
														 4, &isnull));
}

/*
 * Records a key with the SQL statements; returns false if the key was
 * already recorded, and then fills *recorded (when not NULL).
 *
 * The first statement is one insert.  Its conflict means that the key's
 * hash is taken: by the key itself (a duplicate), or by another key, in
 * which case our key goes to key_collisions.  Each time a concurrent
 * transaction changed the occupant between two steps, we start over; so
 * too when the key turns up in key_collisions as we insert it there (a
 * concurrent transaction recorded it after our probe, and committed while
 * we waited for the occupant), so that the probe reads what was recorded.
 * Where the tables keep fingerprints (1.1), the statements carry one;
 * NULL when the caller has none.
 */
static bool
record_key_sql(int32 consumer_id, int32 processed_at, text *key,
			   const int32 *fingerprint, RecordedKey *recorded)
{
	bool		with_fp = storage_ready()->keys_have_fingerprints;
	Datum		key_args[2];
	Datum		row[4];
	char		row_nulls[4] = {' ', ' ', ' ', ' '};

	key_args[0] = row[0] = Int32GetDatum(consumer_id);
	row[1] = Int32GetDatum(processed_at);
	key_args[1] = row[2] = PointerGetDatum(key);
	row[3] = fingerprint != NULL ? Int32GetDatum(*fingerprint) : (Datum) 0;
	row_nulls[3] = fingerprint != NULL ? ' ' : 'n';

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();

		keystore_execute(with_fp ? KS_INSERT_KEY_FP : KS_INSERT_KEY, row, row_nulls, 0);
		if (SPI_processed == 1)
			return true;

		keystore_exec(with_fp ? KS_PROBE_KEY_FP : KS_PROBE_KEY, key_args, 1);
		if (SPI_processed == 0)
			continue;			/* the occupant was deleted meanwhile */
		if (DatumGetBool(result_column(1)) || DatumGetBool(result_column(2)))
		{
			if (recorded != NULL)
			{
				if (with_fp)
					recorded_from_probe(recorded);
				else
					memset(recorded, 0, sizeof(RecordedKey));
			}
			return false;
		}

		keystore_exec(KS_CLAIM_OCCUPANT, key_args, 0);
		if (SPI_processed == 0)
			continue;			/* the occupant was deleted or replaced */

		keystore_execute(with_fp ? KS_INSERT_COLLISION_FP : KS_INSERT_COLLISION,
						 row, row_nulls, 0);
		if (SPI_processed == 1)
			return true;
		/* recorded meanwhile as a collision: probe again to read it */
	}
}

/*
 * Records a key through an open fast path, leaving to the SQL statements
 * what the fast path cannot decide; returns false if the key was already
 * recorded, and then fills *recorded (when not NULL).
 *
 * A key is probed before it is inserted, so that a duplicate costs no
 * transaction id and no WAL.  With *insert_first (batches only, see
 * keystore_record_keys) it is inserted straight away instead, the unique
 * index's check at insertion telling whether its place is taken: one
 * descent of the index instead of two for a new key, and for a key whose
 * place is taken a speculative tuple given up (a WAL record) before the
 * probe.  A place found taken clears *insert_first.
 */
static bool
fastpath_record(FastPath *fp, int32 hash, int32 consumer_id,
				int32 processed_at, text *key, const int32 *fingerprint,
				RecordedKey *recorded, bool *insert_first)
{
	if (insert_first != NULL && *insert_first)
	{
		if (fastpath_insert(fp, hash, consumer_id, processed_at, key,
							fingerprint))
			return true;
		*insert_first = false;
		if (fastpath_probe(fp, hash, consumer_id, key, recorded) == PROBE_KEY)
			return false;
		/* another key, or a row the snapshot does not see: decide in SQL */
		return record_key_sql(consumer_id, processed_at, key, fingerprint,
							  recorded);
	}

	switch (fastpath_probe(fp, hash, consumer_id, key, recorded))
	{
		case PROBE_KEY:
			return false;
		case PROBE_EMPTY:
			if (fastpath_insert(fp, hash, consumer_id, processed_at, key,
								fingerprint))
				return true;
			break;
		case PROBE_OTHER:
			break;
	}
	return record_key_sql(consumer_id, processed_at, key, fingerprint, recorded);
}

/*
 * Records a key with the fingerprint of its message (NULL: none); returns
 * false if the key was already recorded, and then fills *recorded (when
 * not NULL) with what the storage holds of it.  In a database whose SQL is
 * still 1.0 the fingerprint is not kept and none is ever found.
 */
bool
keystore_record_key_fp(int32 consumer_id, text *key, const int32 *fingerprint,
					   RecordedKey *recorded)
{
	FastPath	fp;
	bool		isnew;

	inflight_note_recording();
	if (!fastpath_open(&fp, true))
		return record_key_sql(consumer_id, processed_at_now(), key,
							  fingerprint, recorded);

	isnew = fastpath_record(&fp, key_hash_value(consumer_id, key),
							consumer_id, processed_at_now(), key, fingerprint,
							recorded, NULL);
	fastpath_close(&fp);
	return isnew;
}

/*
 * Records a key without a fingerprint; returns false if the key was
 * already recorded.
 */
bool
keystore_record_key(int32 consumer_id, text *key)
{
	return keystore_record_key_fp(consumer_id, key, NULL, NULL);
}

/* A key of a batch, sorted in the order of the unique index. */
typedef struct BatchKey
{
	int32		hash;
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
	FastPath	fp;
	bool		fast;
	BatchKey   *sorted;
	int32		processed_at;
	MemoryContext keycxt;
	bool		insert_first = false;

	inflight_note_recording();

	fast = fastpath_open(&fp, true);
	if (!fast && require_fastpath)
		return false;

	processed_at = processed_at_now();
	sorted = palloc(Max(nkeys, 1) * sizeof(BatchKey));
	for (int i = 0; i < nkeys; i++)
	{
		sorted[i].hash = key_hash_value(consumer_id, keys[i]);
		sorted[i].index = i;
		sorted[i].key = keys[i];
		isnew[i] = false;
	}
	qsort(sorted, nkeys, sizeof(BatchKey), batch_key_cmp);

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
			{
				int			first = sorted[i - 1].index;

				if (isnew[first])
				{
					found->has_fingerprint = fingerprints != NULL && has_fingerprint[first];
					found->fingerprint = found->has_fingerprint ? fingerprints[first] : 0;
					found->processed_at = processed_at;
				}
				else
					*found = recorded[first];
			}
			continue;
		}

		oldcxt = MemoryContextSwitchTo(keycxt);
		if (fast)
		{
			isnew[index] = fastpath_record(&fp, sorted[i].hash, consumer_id,
										   processed_at, sorted[i].key,
										   fingerprint, found, &insert_first);
			/* the first key, never a repeat, decides for those after it */
			if (i == 0)
				insert_first = isnew[index];
		}
		else
			isnew[index] = record_key_sql(consumer_id, processed_at,
										  sorted[i].key, fingerprint, found);
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(keycxt);
	}
	MemoryContextDelete(keycxt);
	pfree(sorted);

	if (fast)
		fastpath_close(&fp);
	return true;
}

/*
 * Inserts the keys of a batch that are not recorded; returns how many were
 * inserted and leaves their keys in SPI_tuptable.  Keys that conflicted
 * are either recorded already or collide: see keystore_unresolved_batch.
 */
uint64
keystore_insert_batch(int32 consumer_id, ArrayType *keys)
{
	Datum		args[3];

	inflight_note_recording();
	args[0] = Int32GetDatum(consumer_id);
	args[1] = Int32GetDatum(processed_at_now());
	args[2] = PointerGetDatum(keys);
	keystore_exec(KS_INSERT_BATCH, args, 0);
	return SPI_processed;
}

/*
 * Finds the keys of a batch that keystore_insert_batch did not insert
 * (inserted holds those it did) and that are not recorded either; returns
 * how many and leaves them in SPI_tuptable.  Each needs
 * keystore_record_key, which tells a collision from a key whose occupant
 * was deleted meanwhile.  Runs as a statement of its own, so that under
 * READ COMMITTED it sees the rows the insert waited for.
 */
uint64
keystore_unresolved_batch(int32 consumer_id, ArrayType *keys,
						  ArrayType *inserted)
{
	Datum		args[3];

	args[0] = Int32GetDatum(consumer_id);
	args[1] = PointerGetDatum(keys);
	args[2] = PointerGetDatum(inserted);
	keystore_exec(KS_UNRESOLVED_BATCH, args, 0);
	return SPI_processed;
}

/*
 * Returns whether a key is recorded and visible to this transaction.
 */
bool
keystore_key_exists(int32 consumer_id, text *key)
{
	Datum		key_args[2];
	FastPath	fp;

	/* a collision is visible only with its occupant, see the invariant */
	if (fastpath_open(&fp, false))
	{
		KeyProbe	found = fastpath_probe(&fp, key_hash_value(consumer_id, key),
										   consumer_id, key, NULL);

		fastpath_close(&fp);
		if (found != PROBE_OTHER)
			return found == PROBE_KEY;
	}

	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);
	keystore_exec(KS_PROBE_KEY, key_args, 1);
	return SPI_processed == 1 &&
		(DatumGetBool(result_column(1)) || DatumGetBool(result_column(2)));
}


/*
 * Moves a collision of a deleted occupant into its place in processed_keys,
 * so that every collision keeps an occupant.  hash is the deleted
 * occupant's.
 */
static void
promote_collision(int32 hash)
{
	Datum		hash_arg = Int32GetDatum(hash);
	bool		with_fp = storage_ready()->keys_have_fingerprints;

	for (;;)
	{
		Datum		collision_args[2];
		Datum		row[4];
		char		row_nulls[4] = {' ', ' ', ' ', 'n'};

		CHECK_FOR_INTERRUPTS();

		keystore_exec(KS_FIND_COLLISION, &hash_arg, 1);
		if (SPI_processed == 0)
			return;
		collision_args[0] = row[0] = result_column(1);
		collision_args[1] = row[2] = PointerGetDatum(PG_DETOAST_DATUM_COPY(result_column(2)));

		keystore_exec(with_fp ? KS_DELETE_COLLISION_FP : KS_DELETE_COLLISION,
					  collision_args, 0);
		if (SPI_processed == 0)
			continue;			/* forgotten meanwhile: look again */
		row[1] = result_column(1);
		if (with_fp)
		{
			bool		isnull;

			row[3] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
								   2, &isnull);
			row_nulls[3] = isnull ? 'n' : ' ';
		}

		keystore_execute(with_fp ? KS_INSERT_KEY_FP : KS_INSERT_KEY, row, row_nulls, 0);
		if (SPI_processed != 1)
			elog(ERROR, "could not move a hash collision of idem_consumer into processed_keys");
		return;
	}
}

/*
 * Prepares forgetting a key: removes the key's resolved dead-letter entry,
 * which would otherwise describe a processing the key no longer records,
 * and refuses while the entry is pending.  The broker has been told the
 * message is done, so a pending entry may be its only copy, and a
 * redelivery applied after the forget would make a later replay apply it
 * twice.  Retention keeps such keys for the same reason.
 */
static void
forget_dead_letter(Datum *key_args)
{
	keystore_exec(KS_DL_DELETE_RESOLVED, key_args, 0);
	if (SPI_processed > 0)
		return;

	keystore_exec(KS_DL_KEY_STATUS, key_args, 1);
	if (SPI_processed > 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot forget a key whose message is dead-lettered"),
				 errdetail("Dead-letter entry %lld of the key is pending.",
						   (long long) DatumGetInt64(result_column(2))),
				 errhint("Replay the entry with idem_dlq_replay or discard it with idem_dlq_discard first.")));
}

/*
 * Tells whether a row of a key was recorded by the current transaction:
 * written by it (xmin, the raw value, as the SQL column shows it) and
 * stamped with its start time.  The time keeps out rows frozen long ago
 * whose raw xmin a wrapped-around transaction id meets again, and rows
 * this transaction only rewrote (an occupant claimed for a collision, a
 * collision moved in place of a forgotten occupant) unless they were
 * recorded in the same second: those are refused too, erring on the side
 * of keeping a key.  Both paths ask the same.
 */
static bool
recorded_here(TransactionId xmin, int32 processed_at)
{
	return TransactionIdIsCurrentTransactionId(xmin) &&
		processed_at == processed_at_now();
}

/*
 * Tells whether the current transaction recorded a key.  Only the key's
 * own row in processed_keys lets the fast path answer; a collision, or
 * another key in the hash's place, is the SQL path's.
 */
static bool
key_recorded_here(int32 consumer_id, text *key, Datum *key_args)
{
	FastPath	fp;

	if (fastpath_open(&fp, false))
	{
		RecordedKey recorded;
		KeyProbe	found = fastpath_probe(&fp, key_hash_value(consumer_id, key),
										   consumer_id, key, &recorded);

		fastpath_close(&fp);
		if (found == PROBE_EMPTY)
			return false;
		if (found == PROBE_KEY)
			return recorded_here(fp.found_xmin, recorded.processed_at);
	}

	keystore_exec(KS_KEY_WRITES, key_args, 0);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		bool		isnull;

		if (recorded_here(DatumGetTransactionId(SPI_getbinval(row, SPI_tuptable->tupdesc, 1, &isnull)),
						  DatumGetInt32(SPI_getbinval(row, SPI_tuptable->tupdesc, 2, &isnull))))
			return true;
	}
	return false;
}

/*
 * Raises object_in_use if the current transaction recorded the key.  Its
 * message's changes and its record commit or roll back together; a
 * forget in between, from the business SQL, a trigger or a deferred
 * constraint trigger firing at commit after every other check, would
 * commit the changes without the record, and the redelivery would apply
 * the message again.
 */
static void
refuse_forget_recorded_here(int32 consumer_id, text *key, Datum *key_args)
{
	if (!key_recorded_here(consumer_id, key, key_args))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_IN_USE),
			 errmsg("cannot forget key \"%s\" in the transaction that recorded it",
					text_to_cstring(key)),
			 errdetail("The key and the changes of its message commit or roll back together; "
					   "forgetting the key before then would let its next delivery apply the message again."),
			 errhint("Forget the key in a later transaction, once the one that recorded it has committed.")));
}

/*
 * Removes a key and its resolved dead-letter entry; returns whether the
 * key was recorded.  Refuses a key recorded by the current transaction,
 * and a key whose dead-letter entry is pending.
 */
bool
keystore_forget_key(int32 consumer_id, text *key)
{
	Datum		key_args[2];

	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);
	refuse_forget_recorded_here(consumer_id, key, key_args);
	forget_dead_letter(key_args);

	keystore_exec(KS_DELETE_KEY, key_args, 0);
	if (SPI_processed == 1)
	{
		promote_collision(key_hash_value(consumer_id, key));
		return true;
	}

	keystore_exec(KS_DELETE_COLLISION, key_args, 0);
	if (SPI_processed == 1)
		return true;

	/* a concurrent forget may have just moved the key out of key_collisions */
	keystore_exec(KS_DELETE_KEY, key_args, 0);
	if (SPI_processed == 1)
	{
		promote_collision(key_hash_value(consumer_id, key));
		return true;
	}
	return false;
}

/*
 * Fills blocks[KS_NUM_TABLES] with the number of heap blocks of each table
 * that holds keys.
 */
void
keystore_table_blocks(BlockNumber *blocks)
{
	keystore_exec(KS_TABLE_SIZES, NULL, 1);
	for (int i = 0; i < KS_NUM_TABLES; i++)
		blocks[i] = (BlockNumber) (DatumGetInt64(result_column(i + 1)) / BLCKSZ);
	SPI_freetuptable(SPI_tuptable);
}

/*
 * Removes the rows of a table at the given TIDs that are still older than
 * their consumer's cutoff (consumer_ids and cutoffs are the parallel int4
 * arrays the TIDs were selected with) and returns how many it removed; rows
 * removed or updated meanwhile by others are skipped.
 *
 * The TIDs should come from a statement of the current transaction, whose
 * snapshot keeps them from being reused; the cutoffs are checked again all
 * the same, so that a reused TID could never remove a key inside its
 * window.  Removing a row of processed_keys may leave
 * collisions without their occupant: one statement finds which of the
 * removed hashes have any (rarely one in thousands), in a snapshot taken
 * after the removal so that it also sees a collision recorded by a
 * transaction we waited for; promote_collision() then fills each place.
 */
uint64
keystore_remove_rows(KeystoreTable table, ItemPointer tids, int ntids,
					 Datum consumer_ids, Datum cutoffs)
{
	Datum	   *tid_datums;
	Datum		arg;
	Datum		remove_args[3];
	uint64		removed;
	Datum	   *hashes;
	int32	   *colliding;
	uint64		ncolliding;

	if (ntids == 0)
		return 0;

	tid_datums = palloc(sizeof(Datum) * ntids);
	for (int i = 0; i < ntids; i++)
		tid_datums[i] = PointerGetDatum(&tids[i]);
	arg = PointerGetDatum(construct_array(tid_datums, ntids, TIDOID,
										  sizeof(ItemPointerData), false,
										  TYPALIGN_SHORT));

	remove_args[0] = arg;
	remove_args[1] = consumer_ids;
	remove_args[2] = cutoffs;
	if (table == KS_TABLE_COLLISIONS)
	{
		keystore_exec(KS_REMOVE_COLLISIONS, remove_args, 0);
		return SPI_processed;
	}

	keystore_exec(KS_REMOVE_KEYS, remove_args, 0);
	removed = SPI_processed;
	if (removed == 0)
		return 0;

	hashes = palloc(sizeof(Datum) * removed);
	for (uint64 i = 0; i < removed; i++)
	{
		bool		isnull;

		hashes[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								  1, &isnull);
	}
	SPI_freetuptable(SPI_tuptable);
	arg = PointerGetDatum(construct_array(hashes, (int) removed, INT4OID,
										  sizeof(int32), true, TYPALIGN_INT));

	keystore_exec(KS_COLLIDING_HASHES, &arg, 0);
	ncolliding = SPI_processed;
	colliding = palloc(sizeof(int32) * Max(ncolliding, 1));
	for (uint64 i = 0; i < ncolliding; i++)
	{
		bool		isnull;

		colliding[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
												   SPI_tuptable->tupdesc,
												   1, &isnull));
	}
	SPI_freetuptable(SPI_tuptable);

	for (uint64 i = 0; i < ncolliding; i++)
		promote_collision(colliding[i]);

	return removed;
}

/*
 * Returns the number of keys stored, all consumers together, without
 * reading a row: the live rows the cumulative statistics keep for each
 * table (counted up and down by every committed insert and delete, set
 * exactly by VACUUM and ANALYZE).  A table the statistics do not know
 * (after a crash, say) is estimated from its pages instead, at the
 * density its last VACUUM or ANALYZE counted, or at rows of average width
 * if never counted.
 */
double
keystore_keys_estimate(void)
{
	const StorageInfo *si = storage_ready();
	Oid			relids[2];
	double		total = 0;

	relids[0] = si->keys_relid;
	relids[1] = get_relname_relid("key_collisions", get_rel_namespace(si->keys_relid));
	for (int i = 0; i < lengthof(relids); i++)
	{
		PgStat_StatTabEntry *tabentry;
		Relation	rel;
		BlockNumber pages;

		if (!OidIsValid(relids[i]))
			continue;
		tabentry = pgstat_fetch_stat_tabentry(relids[i]);
		if (tabentry != NULL)
		{
			total += Max(compat_live_tuples(tabentry), 0);
			continue;
		}

		rel = table_open(relids[i], AccessShareLock);
		pages = RelationGetNumberOfBlocks(rel);
		if (pages == 0)
			;
		else if (rel->rd_rel->reltuples >= 0 && rel->rd_rel->relpages > 0)
			total += rint(rel->rd_rel->reltuples / rel->rd_rel->relpages * pages);
		else
		{
			int32		width = get_rel_data_width(rel, NULL) +
				MAXALIGN(SizeofHeapTupleHeader) + sizeof(ItemIdData);

			total += floor((double) (BLCKSZ - SizeOfPageHeaderData) / width) * pages;
		}
		table_close(rel, AccessShareLock);
	}
	return total;
}
