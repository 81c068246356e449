/*-------------------------------------------------------------------------
 *
 * keystore_remove.c
 *	  Forgetting keys (idem_forget's part in the key store) and removing
 *	  them for retention, keeping the invariant of keystore.c: whoever
 *	  removes the occupant of a hash moves a collision into its place.
 *
 * Retention (retention.c) removes rows chunk by chunk: it reads the rows of
 * a range of heap blocks of a table and names the ones to remove by TID,
 * and keystore_remove_rows() removes them and keeps the invariant, moving
 * a collision into the place of every occupant it removed.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore_remove.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/htup_details.h"
#include "access/table.h"
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

#include "compat.h"
#include "keystore_internal.h"

/*
 * Moves a collision of a deleted occupant into its place in the key table
 * of its generation, so that every collision keeps an occupant.  hash is
 * the deleted occupant's.
 */
static void
promote_collision(KeyGenSlot slot, int64 hash)
{
	Datum		hash_arg = Int64GetDatum(hash);
	bool		with_fp = storage_locate()->keys_have_fingerprints;

	for (;;)
	{
		Datum		collision_args[2];
		Datum		row[4];
		char		row_nulls[4] = {' ', ' ', ' ', 'n'};

		CHECK_FOR_INTERRUPTS();

		keystore_execute_in(slot, KS_FIND_COLLISION, &hash_arg, NULL, 1);
		if (SPI_processed == 0)
			return;
		collision_args[0] = row[0] = result_column(1);
		collision_args[1] = row[2] = PointerGetDatum(PG_DETOAST_DATUM_COPY(result_column(2)));

		keystore_execute_in(slot, with_fp ? KS_DELETE_COLLISION_FP : KS_DELETE_COLLISION,
							collision_args, NULL, 0);
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

		keystore_execute_in(slot, with_fp ? KS_INSERT_KEY_FP : KS_INSERT_KEY,
							row, row_nulls, 0);
		if (SPI_processed != 1)
			elog(ERROR, "could not move a hash collision of idem_consumer into its key table");
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
	keystore_execute(KS_DELETE_RESOLVED_ENTRY, key_args, NULL, 0);
	if (SPI_processed > 0)
		return;

	keystore_execute(KS_ENTRY_STATUS, key_args, NULL, 1);
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
		processed_at == keystore_processed_at_now();
}

/*
 * Tells whether the current transaction recorded a key.  Only the key's
 * own row in the key table lets the fast path answer; a collision, or
 * another key in the hash's place, is the SQL path's.  A key is recorded
 * in the current generation only, which no switch seals before this
 * transaction ends (keygen.c).
 */
static bool
key_recorded_here(int32 consumer_id, text *key, Datum *key_args)
{
	KeyFastPath	fp;
	KeyGenSlot	slot = keygen_state()->current;

	if (key_fastpath_open(&fp, slot, false))
	{
		RecordedKey recorded;
		KeyProbe	found = key_fastpath_probe(&fp, key_hash_in(slot, consumer_id, key),
											   consumer_id, key, &recorded);

		key_fastpath_close(&fp);
		if (found == PROBE_EMPTY)
			return false;
		if (found == PROBE_KEY)
			return recorded_here(fp.found_xmin, recorded.processed_at);
	}

	keystore_execute_in(slot, KS_KEY_WRITES, key_args, NULL, 0);
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
 * Removes a key from a generation; returns whether the generation had it.
 */
static bool
forget_in(KeyGenSlot slot, int32 consumer_id, text *key, Datum *key_args)
{
	keystore_execute_in(slot, KS_DELETE_KEY, key_args, NULL, 0);
	if (SPI_processed == 1)
	{
		promote_collision(slot, key_hash_in(slot, consumer_id, key));
		return true;
	}

	keystore_execute_in(slot, KS_DELETE_COLLISION, key_args, NULL, 0);
	if (SPI_processed == 1)
		return true;

	/* a concurrent forget may have just moved the key out of the collisions */
	keystore_execute_in(slot, KS_DELETE_KEY, key_args, NULL, 0);
	if (SPI_processed == 1)
	{
		promote_collision(slot, key_hash_in(slot, consumer_id, key));
		return true;
	}
	return false;
}

/*
 * Removes a key and its resolved dead-letter entry; returns whether the
 * key was recorded.  Refuses a key recorded by the current transaction,
 * and a key whose dead-letter entry is pending.  A key is in one
 * generation at most (keystore.c): the current one, a sealed one, or the
 * legacy one of a database updated to 1.2.
 */
bool
keystore_forget_key(int32 consumer_id, text *key)
{
	Datum		key_args[2];
	const KeyGenState *st;

	routed_refuse_unrouted(NULL);
	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);
	refuse_forget_recorded_here(consumer_id, key, key_args);
	forget_dead_letter(key_args);

	st = keygen_state_latest();
	if (forget_in(st->current, consumer_id, key, key_args))
		return true;
	for (int i = 0; i < st->nsealed; i++)
		if (forget_in(st->sealed[i], consumer_id, key, key_args))
			return true;
	return keystore_legacy_live() &&
		forget_in(KEYGEN_LEGACY, consumer_id, key, key_args);
}

StaticAssertDecl(KS_NUM_TABLES == 2 * KEYGEN_NUM,
				 "a purge walks two tables per generation");

/*
 * The generation a table of the purge belongs to, and the table's OID.
 */
static KeyGenSlot
table_generation(KeystoreTable table)
{
	return table / 2;
}

static bool
table_holds_keys(KeystoreTable table)
{
	return table % 2 == 1;
}

static Oid
table_relid(const StorageInfo *si, KeystoreTable table)
{
	const KeyGeneration *gen = &si->gens[table_generation(table)];

	return table_holds_keys(table) ? gen->keys_relid : gen->collisions_relid;
}

/*
 * Fills blocks[KS_NUM_TABLES] with the number of heap blocks of each table
 * that holds keys; 0 for those of a generation the database does not
 * have, and for the ring's when its generations are dropped whole
 * (keygen_retire.c): a purge then reads and deletes only the legacy keys.
 */
void
keystore_table_blocks(BlockNumber *blocks)
{
	const StorageInfo *si = storage_locate();

	for (int i = 0; i < KS_NUM_TABLES; i++)
	{
		Oid			relid = table_relid(si, (KeystoreTable) i);
		Relation	rel;

		blocks[i] = 0;
		if (!OidIsValid(relid) ||
			(table_generation(i) != KEYGEN_LEGACY && keygen_retention_by_generation()))
			continue;
		rel = table_open(relid, AccessShareLock);
		blocks[i] = RelationGetNumberOfBlocks(rel);
		table_close(rel, AccessShareLock);
	}
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
	int64	   *colliding;
	uint64		ncolliding;
	KeyGenSlot	slot = table_generation(table);

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
	if (!table_holds_keys(table))
	{
		keystore_execute_in(slot, KS_REMOVE_COLLISIONS, remove_args, NULL, 0);
		return SPI_processed;
	}

	keystore_execute_in(slot, KS_REMOVE_KEYS, remove_args, NULL, 0);
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
	arg = PointerGetDatum(construct_array(hashes, (int) removed, INT8OID,
										  sizeof(int64), FLOAT8PASSBYVAL,
										  TYPALIGN_DOUBLE));

	keystore_execute_in(slot, KS_COLLIDING_HASHES, &arg, NULL, 0);
	ncolliding = SPI_processed;
	colliding = palloc(sizeof(int64) * Max(ncolliding, 1));
	for (uint64 i = 0; i < ncolliding; i++)
	{
		bool		isnull;

		colliding[i] = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
												   SPI_tuptable->tupdesc,
												   1, &isnull));
	}
	SPI_freetuptable(SPI_tuptable);

	for (uint64 i = 0; i < ncolliding; i++)
		promote_collision(slot, colliding[i]);

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
	const StorageInfo *si = storage_locate();
	Oid			relids[KS_NUM_TABLES];
	double		total = 0;

	for (int i = 0; i < KS_NUM_TABLES; i++)
		relids[i] = table_relid(si, (KeystoreTable) i);
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

/*
 * Reads, per consumer, the newest processed_at, the number of rows and the
 * oldest processed_at in the blocks of a table from lo up to hi (TIDs
 * (lo, 0) and (hi, 0)), into SPI_tuptable; for the first pass of a purge.
 */
void
keystore_read_latest(KeystoreTable table, Datum lo, Datum hi)
{
	Datum		args[2] = {lo, hi};

	keystore_execute_in(table_generation(table),
						table_holds_keys(table) ? KS_LATEST_KEYS : KS_LATEST_COLLISIONS,
						args, NULL, 0);
}

/*
 * Reads, per consumer, the TIDs of the rows of a table's blocks from lo up
 * to hi that are older than the consumer's cutoff, into SPI_tuptable;
 * consumer_ids and cutoffs are parallel int4 arrays, and consumers not in
 * them keep everything.  Keys of pending dead letters are never among
 * them.
 */
void
keystore_read_purgeable(KeystoreTable table, Datum consumer_ids, Datum cutoffs,
						Datum lo, Datum hi)
{
	Datum		args[4] = {consumer_ids, cutoffs, lo, hi};

	keystore_execute_in(table_generation(table),
						table_holds_keys(table) ? KS_PURGEABLE_KEYS : KS_PURGEABLE_COLLISIONS,
						args, NULL, 0);
}
