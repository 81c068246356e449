/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  The key store: recording and probing (consumer, key), and the
 *	  invariant that keeps the key store exact under concurrency.  Consumers
 *	  and their ids are consumers.c's; forgetting and removing keys,
 *	  keystore_remove.c's.
 *
 * The key store is six files.  storage.c finds the tables and their
 * owner; keystore_sql.c holds the fixed statements and runs them as that
 * owner; keystore_fastpath.c probes and inserts through the key index in
 * C; keystore_batch.c records the keys of a batch; keystore_remove.c
 * forgets and removes keys.  This file puts them
 * together, and the argument that the result is exact is here and nowhere
 * else:
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
 * From 1.2 on the key store is a ring of generations (keygen.c), each a
 * key table and its collisions kept as above.  A key is recorded only in
 * the current generation, after it was probed in every sealed one, newest
 * first, and in the legacy pair of keys recorded before the update to 1.2:
 * a key is in one generation at most.  keygen.c says why a switch of
 * generations between two deliveries of a key keeps that true.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "keystore_internal.h"

/*
 * Converts the current transaction's start time to the integer seconds
 * stored in processed_keys.processed_at.
 */
int32
keystore_processed_at_now(void)
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
record_key_sql(KeyGenSlot slot, int32 consumer_id, int32 processed_at, text *key,
			   const int32 *fingerprint, RecordedKey *recorded)
{
	bool		with_fp = storage_locate()->keys_have_fingerprints;
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

		keystore_execute_in(slot, with_fp ? KS_INSERT_KEY_FP : KS_INSERT_KEY, row, row_nulls, 0);
		if (SPI_processed == 1)
			return true;

		keystore_execute_in(slot, with_fp ? KS_PROBE_KEY_FP : KS_PROBE_KEY, key_args, NULL, 1);
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

		keystore_execute_in(slot, KS_CLAIM_OCCUPANT, key_args, NULL, 0);
		if (SPI_processed == 0)
			continue;			/* the occupant was deleted or replaced */

		keystore_execute_in(slot, with_fp ? KS_INSERT_COLLISION_FP : KS_INSERT_COLLISION,
							row, row_nulls, 0);
		if (SPI_processed == 1)
			return true;
		/* recorded meanwhile as a collision: probe again to read it */
	}
}

/*
 * Raises a serialization failure if a sealed generation holds a key that
 * the transaction's snapshot did not show: under REPEATABLE READ and
 * SERIALIZABLE, recording it anew would apply a message whose first
 * application committed after the snapshot, where INSERT ... ON CONFLICT
 * fails instead.  Only a snapshot taken before the generation was sealed
 * can miss a key there (keygen.c); the legacy generation's seal, the
 * update to 1.2, is not known, so it is always probed again.
 */
static void
sealed_key_invisible_check(KeyGenSlot slot, Datum *key_args)
{
	if (!IsolationUsesXactSnapshot() ||
		keygen_seal_visible(slot, GetTransactionSnapshot()))
		return;
	keystore_execute_snapshot(slot, KS_PROBE_KEY, key_args,
							  GetLatestSnapshot(), 1);
	if (SPI_processed == 1 &&
		(DatumGetBool(result_column(1)) || DatumGetBool(result_column(2))))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update"),
				 errdetail("The key was recorded by a transaction that committed after this transaction's snapshot was taken.")));
}

/*
 * Probes a sealed generation that is not settled yet, for a key about to
 * be recorded, with a dirty snapshot: a transaction still open may have
 * recorded the key there before the switch (keygen.c), and is waited for
 * as a unique index would wait, by the caller, without the gate
 * (wait->xid).  Returns whether the key is recorded there, and sets
 * *decided when the probe settles it; otherwise the generation is probed
 * as a settled one: another key in its place (a collision), or no index
 * to probe with, where every transaction that may still record there is
 * waited for first (wait->settle) unless none is left.  Under REPEATABLE
 * READ and SERIALIZABLE a key whose recording committed after the
 * snapshot fails to serialize, as a conflict in one table would.
 */
static bool
recorded_unsettled(KeyGenSlot slot, int32 consumer_id, text *key,
				   RecordedKey *recorded, GateWait *wait, bool *decided)
{
	TransactionId xmin = InvalidTransactionId;
	KeyProbe	probe;

	probe = key_dirty_probe(slot, key_hash_in(slot, consumer_id, key), consumer_id,
							key, recorded, &xmin, &wait->xid);
	*decided = probe != PROBE_OTHER && probe != PROBE_UNKNOWN;
	if (probe == PROBE_UNKNOWN && !keygen_settled_for_me(slot))
	{
		wait->settle = slot;
		*decided = true;
	}
	if (probe != PROBE_KEY)
		return false;
	if (IsolationUsesXactSnapshot() && !TransactionIdIsCurrentTransactionId(xmin) &&
		XidInMVCCSnapshot(xmin, GetTransactionSnapshot()))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update"),
				 errdetail("The key was recorded by a transaction that committed after this transaction's snapshot was taken.")));
	return true;
}

/*
 * Tells whether a sealed generation records a key, and then fills
 * *recorded (when not NULL).  Nothing inserts into a sealed generation but
 * a collision moved into the place of its occupant and, until it is
 * settled, the transactions that recorded there before it was sealed; so
 * a key absent from a settled generation is absent for good, and a new key
 * goes into the current generation.  for_recording: the key is about to be
 * recorded if absent (see sealed_key_invisible_check and
 * recorded_unsettled, which may ask the caller to wait and probe again).
 */
static bool
recorded_in_sealed(const KeyGenState *st, KeyGenSlot slot, int32 consumer_id,
				   text *key, RecordedKey *recorded, bool for_recording,
				   GateWait *wait)
{
	KeyFastPath fp;
	Datum		key_args[2];
	bool		with_fp = storage_locate()->keys_have_fingerprints;
	bool		found;

	if (for_recording && slot != KEYGEN_LEGACY && st->unsettled[slot])
	{
		bool		decided;

		found = recorded_unsettled(slot, consumer_id, key, recorded, wait, &decided);
		if (decided)
			return found;
	}

	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);
	if (key_fastpath_open(&fp, slot, false))
	{
		KeyProbe	probe = key_fastpath_probe(&fp, key_hash_in(slot, consumer_id, key),
											   consumer_id, key, recorded);

		key_fastpath_close(&fp);
		if (probe == PROBE_KEY)
			return true;
		if (probe == PROBE_EMPTY)
		{
			if (for_recording)
				sealed_key_invisible_check(slot, key_args);
			return false;
		}
	}

	keystore_execute_in(slot, with_fp ? KS_PROBE_KEY_FP : KS_PROBE_KEY,
						key_args, NULL, 1);
	found = SPI_processed == 1 &&
		(DatumGetBool(result_column(1)) || DatumGetBool(result_column(2)));
	if (found && recorded != NULL)
	{
		if (with_fp)
			recorded_from_probe(recorded);
		else
			memset(recorded, 0, sizeof(RecordedKey));
	}
	if (!found && for_recording)
		sealed_key_invisible_check(slot, key_args);
	return found;
}

/*
 * Tells whether any sealed generation of st records a key, newest first,
 * and then fills *recorded (when not NULL).  A key is in one generation at
 * most: the generations before the current one are probed before it is
 * recorded.  With for_recording, returns false with GATE_WAIT_NEEDED(wait)
 * when the caller must wait and probe again.
 */
bool
recorded_before(const KeyGenState *st, int32 consumer_id, text *key,
				RecordedKey *recorded, bool for_recording, GateWait *wait)
{
	uint64		filter_hash = 0;
	bool		hashed = false;
	bool		outside_filter_all = false;

	/* one page for all the sealed generations it holds, instead of a page each */
	if (st->filter_all_chunks > 0 && st->nsealed > 0)
	{
		filter_hash = key_filter_hash(consumer_id, key);
		hashed = true;
		outside_filter_all = !keygen_filter_all_may_hold(st, filter_hash);
	}

	for (int i = 0; i < st->nsealed; i++)
	{
		KeyGenSlot	slot = st->sealed[i];

		if (outside_filter_all && st->in_filter_all[slot])
			continue;
		/* a key the filter does not hold is not there, whatever the snapshot */
		if (st->filter_chunks[slot] > 0)
		{
			if (!hashed)
				filter_hash = key_filter_hash(consumer_id, key);
			hashed = true;
			if (!keygen_filter_may_hold(slot, st->filter_chunks[slot], filter_hash))
				continue;
		}
		if (recorded_in_sealed(st, slot, consumer_id, key, recorded, for_recording,
							   wait))
			return true;
		if (for_recording && GATE_WAIT_NEEDED(wait))
			return false;
	}
	return keystore_legacy_live() &&
		recorded_in_sealed(st, KEYGEN_LEGACY, consumer_id, key, recorded,
						   for_recording, wait);
}

/*
 * Records a key in the current generation, slot, with the SQL statements,
 * unless a transaction in progress holds its hash's place there: the
 * insertion would wait for it with the gate held, so the caller waits
 * instead (wait->xid), without the gate, and comes back.  A transaction
 * that takes the place between this probe and the insertion is still
 * waited for with the gate held; the fast path's insertion never waits.
 */
bool
record_current_sql(KeyGenSlot slot, int64 hash, int32 consumer_id, int32 processed_at,
				   text *key, const int32 *fingerprint, RecordedKey *recorded,
				   GateWait *wait)
{
	TransactionId xmin;

	if (key_dirty_probe(slot, hash, consumer_id, key, NULL, &xmin,
						&wait->xid) == PROBE_IN_PROGRESS)
		return false;
	keygen_mark_recording(slot);
	return record_key_sql(slot, consumer_id, processed_at, key, fingerprint,
						  recorded);
}

/*
 * Records a key through an open fast path on the current generation,
 * probing the sealed generations of st before it inserts and leaving to
 * the SQL statements what the fast path cannot decide; returns false if
 * the key was already recorded, and then fills *recorded (when not NULL).
 *
 * A key is probed in the current generation first: a redelivery mostly
 * follows its first delivery closely, while the key is there, and is then
 * found without a probe of the sealed generations.  A key is in one
 * generation at most, so finding it there settles the delivery; not
 * finding it leaves the sealed generations to probe before the insertion,
 * whose unique check decides for a key recorded meanwhile as it does
 * after any probe.  Probing first also spares a duplicate a transaction
 * id and any WAL.
 *
 * With *insert_first (batches only, see keystore_record_keys) a key absent
 * from the sealed generations is inserted straight away instead, the
 * unique index's check at insertion telling whether its place is taken:
 * one descent of the index instead of two for a new key, and for a key
 * whose place is taken a speculative tuple given up (a WAL record) before
 * the probe.  A key found recorded clears *insert_first.
 *
 * probe is what a probe of the current generation found already, or
 * PROBE_UNKNOWN.  Called with the gate passed (keygen_gate_pass); returns
 * false with GATE_WAIT_NEEDED(wait) when the key must wait for another
 * transaction, which the caller does without the gate before it records
 * the key again.
 */
bool
fastpath_record(KeyFastPath *fp, const KeyGenState *st, KeyGenSlot slot,
				int64 hash, int32 consumer_id, int32 processed_at, text *key,
				const int32 *fingerprint, RecordedKey *recorded,
				bool *insert_first, KeyProbe probe, GateWait *wait)
{
	if (insert_first != NULL && *insert_first)
	{
		if (recorded_before(st, consumer_id, key, recorded, true, wait))
		{
			*insert_first = false;
			return false;
		}
		if (GATE_WAIT_NEEDED(wait))
			return false;
		keygen_mark_recording(slot);
		if (key_fastpath_insert(fp, hash, consumer_id, processed_at, key,
								fingerprint))
			return true;
		*insert_first = false;
		if (key_fastpath_probe(fp, hash, consumer_id, key, recorded) == PROBE_KEY)
			return false;
		/* another key, or a row the snapshot does not see: decide in SQL */
		return record_current_sql(slot, hash, consumer_id, processed_at, key,
								  fingerprint, recorded, wait);
	}

	if (probe == PROBE_UNKNOWN)
		probe = key_fastpath_probe(fp, hash, consumer_id, key, recorded);
	if (probe == PROBE_KEY)
		return false;
	if (recorded_before(st, consumer_id, key, recorded, true, wait))
	{
		if (insert_first != NULL)
			*insert_first = false;
		return false;
	}
	if (GATE_WAIT_NEEDED(wait))
		return false;
	keygen_mark_recording(slot);
	if (probe == PROBE_EMPTY &&
		key_fastpath_insert(fp, hash, consumer_id, processed_at, key,
							fingerprint))
		return true;
	return record_current_sql(slot, hash, consumer_id, processed_at, key,
							  fingerprint, recorded, wait);
}

/*
 * Records a key carried out of a sealed generation into the current one,
 * slot, with the time and fingerprint it was recorded with; returns
 * whether it was not there yet.  For retirement (keygen_retire.c), which
 * holds the current generation locked and the sealed one against removals.
 */
bool
keystore_carry_key(KeyGenSlot slot, int32 consumer_id, int32 processed_at,
				   text *key, const int32 *fingerprint)
{
	return record_key_sql(slot, consumer_id, processed_at, key, fingerprint, NULL);
}

/*
 * Records a key with the fingerprint of its message (NULL: none); returns
 * false if the key was already recorded, and then fills *recorded (when
 * not NULL) with what the storage holds of it.  In a database whose SQL is
 * still 1.0 the fingerprint is not kept and none is ever found.  The gate
 * is held from finding the current generation until the key and its
 * consumer's registration are recorded there, and given up for any wait.
 */
bool
keystore_record_key_fp(int32 consumer_id, text *key, const int32 *fingerprint,
					   RecordedKey *recorded)
{
	KeyFastPath fp;
	KeyGenSlot	slot;
	int32		processed_at;
	bool		isnew = false;
	GateWait	wait = {InvalidTransactionId, 0};

	routed_refuse_unrouted(NULL);
	inflight_note_recording();
	processed_at = keystore_processed_at_now();
	for (;;)
	{
		slot = keygen_lock_current();
		if (key_fastpath_open(&fp, slot, true))
		{
			int64		hash = key_hash_in(slot, consumer_id, key);
			KeyProbe	probe = key_fastpath_probe(&fp, hash, consumer_id, key, recorded);

			/* a duplicate there is one whatever is current: no gate */
			if (probe == PROBE_KEY)
			{
				key_fastpath_close(&fp);
				return false;
			}
			if (!keygen_gate_pass(slot))
			{
				key_fastpath_close(&fp);
				continue;
			}
			isnew = fastpath_record(&fp, keygen_state(), slot, hash, consumer_id,
									processed_at, key, fingerprint, recorded, NULL,
									probe, &wait);
			key_fastpath_close(&fp);
		}
		else if (!keygen_gate_pass(slot))
			continue;
		else
			isnew = !recorded_before(keygen_state(), consumer_id, key, recorded, true,
									 &wait) &&
				!GATE_WAIT_NEEDED(&wait) &&
				record_current_sql(slot, key_hash_in(slot, consumer_id, key),
								   consumer_id, processed_at, key, fingerprint,
								   recorded, &wait);
		if (likely(!GATE_WAIT_NEEDED(&wait)))
			break;
		keygen_gate_wait(&wait);
	}
	if (isnew)
		keygen_note_recording(consumer_id, processed_at);
	keygen_gate_release();
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

/*
 * Returns whether a key is recorded and visible to this transaction.
 */
bool
keystore_key_exists(int32 consumer_id, text *key)
{
	Datum		key_args[2];
	KeyFastPath fp;
	const KeyGenState *st;
	KeyGenSlot	slot;

	routed_refuse_unrouted(NULL);
	st = keygen_state_latest();
	slot = st->current;
	if (recorded_before(st, consumer_id, key, NULL, false, NULL))
		return true;

	/* a collision is visible only with its occupant, see the invariant */
	if (key_fastpath_open(&fp, slot, false))
	{
		KeyProbe	found = key_fastpath_probe(&fp, key_hash_in(slot, consumer_id, key),
											   consumer_id, key, NULL);

		key_fastpath_close(&fp);
		if (found != PROBE_OTHER)
			return found == PROBE_KEY;
	}

	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);
	keystore_execute_in(slot, KS_PROBE_KEY, key_args, NULL, 1);
	return SPI_processed == 1 &&
		(DatumGetBool(result_column(1)) || DatumGetBool(result_column(2)));
}

/*
 * Moves the identity sequence of dead_letters past the largest id the
 * table holds, if it is behind it (IDS_PAST_ROWS in idem_consumer.h); for
 * the dead-letter queue and the entries of external effects, before they
 * insert.
 */
void
keystore_dead_letter_ids_past_rows(void)
{
	keystore_execute(KS_DEAD_LETTER_IDS_PAST_ROWS, NULL, NULL, 0);
}
