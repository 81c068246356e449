/*-------------------------------------------------------------------------
 *
 * keygen.c
 *	  The generations of the key store from 1.2 on: which pair of the ring
 *	  takes new keys (the current generation) and which are sealed, as
 *	  idem_consumer.key_generations says (kept per backend by
 *	  keygen_state.c); the switch that seals the current generation and
 *	  opens the next one (idem_key_generation_switch); the gate a delivery
 *	  passes to record a key; and the settle that tells when a sealed
 *	  generation holds every key it ever will.  keystore.c probes and
 *	  records keys in the generations this file names.
 *
 * What makes a switch exact is one rule and one lock, the gate:
 *
 *	1. A transaction records a key in a generation only while it holds
 *	   key_generations in ROW SHARE mode (the gate) and, holding it, has
 *	   found the generation current (keygen_gate_pass); it holds the gate
 *	   from then until the key is in the generation's unique index, and
 *	   never while it waits for another transaction or after.
 *	2. The switch holds key_generations in EXCLUSIVE mode, which conflicts
 *	   with the gate, from before it reads the current generation until it
 *	   commits, and its commit invalidates every backend's cached state (a
 *	   relcache invalidation of key_generations, which the table's trigger
 *	   registers for every change).
 *
 * By 2, no transaction is between finding generation A current and having
 * put its key into A's index when the switch sealing A commits, and one
 * that passes the gate after that commit processes the invalidation as it
 * is granted the gate, finds A sealed by 1, and records in the new current
 * generation B.  So once the switch has committed nobody records into A,
 * and every key that will ever be in A is in A's index: committed, or
 * inserted by a transaction still in progress (one idle in its
 * transaction, or prepared).  A transaction that records a key in B probes
 * A first.  While A is settling (below), it probes it with a dirty
 * snapshot, which sees the rows of transactions in progress, and waits
 * for such a transaction (after letting the gate go, keygen_gate_wait), as
 * a unique index waits for a concurrent inserter of the same key; then it
 * probes again: the key is a duplicate if that transaction committed, and
 * absent if it rolled back.  Once A has settled, the probe's own snapshot
 * sees every key there: under READ COMMITTED every probe takes a new
 * snapshot, later than the state it read; under REPEATABLE READ and
 * SERIALIZABLE, whose snapshot may predate the settle, keystore.c probes A
 * again with the latest snapshot when keygen_seal_visible() says the
 * transaction's snapshot does not see it, and fails to serialize (40001)
 * if the key is there, as a conflict in one table would (a key a dirty
 * probe finds committed after the snapshot fails the same way).  A key
 * delivered on both sides of a switch is therefore recorded once
 * (isolation specs key_generation_switch.spec and key_generation_gate.spec
 * run each interleaving).  The switch never waits for a delivery's
 * transaction: only for the gate, which no one holds for long, so a
 * transaction left open cannot stop the ring.
 *
 * Settling.  A sealed generation is settling until no transaction that
 * may have recorded a key there is left; keygen_gate.c keeps the gate,
 * the lock that tells who may still record in a generation, and the
 * settle itself.
 *
 * Who counts on a settle.  Retirement (keygen_retire.c) drops a settled
 * generation without reading its keys, from two facts per generation that
 * this file keeps true, and leaves one still settling alone:
 *
 *	3. Every consumer with a key in the generation is registered there
 *	   (generation_consumers) by a transaction that commits if the key
 *	   does: keygen_note_recording registers in the recording transaction,
 *	   with the gate still passed, unless this session's registration is
 *	   known to have committed or belongs to the recording transaction
 *	   itself.  A registration still in progress in another transaction
 *	   counts for nothing, as that transaction may yet roll back: the only
 *	   such transaction of this session is one it prepared (PREPARE
 *	   TRANSACTION), which stays in progress after the session moves on.
 *	   Once settled, every registration there has committed or rolled back
 *	   with its key.
 *	4. No key in a settled generation is newer than its seal, settled_at:
 *	   a key's processed_at is its transaction's start, and every
 *	   transaction that recorded there had ended when the settle read the
 *	   clock.
 * The filters (keygen_filter.c) are built only for settled generations,
 * for the same reason: a key committed later would be missing.
 *
 * The switch never queues for its lock: a queued EXCLUSIVE would hold up
 * every delivery behind it for as long as it waited.  It tries the lock
 * without waiting, sleeping on its latch between tries, up to the wait it
 * was given.  Retirement and filter builds, which change key_generations
 * too, take SHARE UPDATE EXCLUSIVE, which conflicts with the switch and
 * with each other but not with the gate.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/bufmgr.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "keygen_state.h"
#include "keygen_gate.h"
#include "keygen_holders.h"
#include "keygen.h"

/* how long the switch sleeps between two tries of its lock */
#define SWITCH_LOCK_RETRY_MS 1

/*
 * idem_consumer.key_generation_interval, in seconds; 0: no switch (keys
 * purged one by one); KEYGEN_INTERVAL_DERIVED: from the retention windows
 */
#define KEYGEN_INTERVAL_DERIVED (-1)
static int	key_generation_interval = KEYGEN_INTERVAL_DERIVED;

/* a consumer registered in a generation by this session */
typedef struct RegisteredKey
{
	uint64		storage_generation; /* of the storage it belongs to */
	int64		epoch;
	int32		consumer_id;
} RegisteredKey;

typedef struct RegisteredConsumer
{
	RegisteredKey key;
	TransactionId xid;			/* that registered it; invalid once committed */
} RegisteredConsumer;

static HTAB *registered = NULL;

/*
 * The rows a switch writes: the first generation's, which opened with the
 * extension, on the first switch; and the next one's ($2).
 */
typedef enum KeyGenStmt
{
	KG_RECORD_FIRST,
	KG_OPEN_NEXT,
	KG_SWITCH_DUE,
	KG_REGISTER,
	KG_NUM_STMTS
} KeyGenStmt;

static const StorageStmt keygen_stmt_defs[KG_NUM_STMTS] = {
	[KG_RECORD_FIRST] = {
		"INSERT INTO " STORAGE_SCHEMA ".key_generations (epoch, generation, opened_at)"
		" SELECT 1, $1, NULL WHERE NOT EXISTS"
		" (SELECT FROM " STORAGE_SCHEMA ".key_generations)",
		1, {INT4OID}
	},
	/*
	 * The opening's time is read once the switch holds the gate, not at
	 * its transaction's start: a transaction that began while the switch
	 * waited may have recorded keys since in the generation it seals.
	 */
	[KG_OPEN_NEXT] = {
		"INSERT INTO " STORAGE_SCHEMA ".key_generations (epoch, generation, opened_at)"
		" SELECT pg_catalog.max(epoch) OPERATOR(pg_catalog.+) 1, $1, pg_catalog.clock_timestamp()"
		" FROM " STORAGE_SCHEMA ".key_generations",
		1, {INT4OID}
	},
	/* whether the current generation is $1 seconds old; the first always */
	[KG_SWITCH_DUE] = {
		"SELECT COALESCE((SELECT g.opened_at OPERATOR(pg_catalog.<=)"
		" (pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.make_interval(secs => $1))"
		" FROM " STORAGE_SCHEMA ".key_generations AS g"
		" ORDER BY g.epoch DESC LIMIT 1), true)",
		1, {INT4OID}
	},
	[KG_REGISTER] = {
		"INSERT INTO " STORAGE_SCHEMA ".generation_consumers (epoch, consumer_id, first_at)"
		" VALUES ($1, $2, $3)",
		3, {INT8OID, INT4OID, INT4OID}
	},
};

static SPIPlanPtr keygen_plans[KG_NUM_STMTS];
static StorageStmtSet keygen_stmts = STORAGE_STMT_SET(keygen_stmt_defs, keygen_plans);

PG_FUNCTION_INFO_V1(idem_key_generation_switch);

/*
 * Registers the invalidation callback of the generations this backend
 * keeps (keygen_state.c) and defines key_generation_interval; called once
 * from _PG_init.
 */
void
keygen_init(void)
{
	keygen_state_init();
	DefineCustomIntVariable("idem_consumer.key_generation_interval",
							"Sets how long a generation of keys takes new keys before the purge worker switches to the next one.",
							"Keys then expire by whole generations, which the worker drops once every key in them has expired. "
							"-1 derives it from the retention windows: a fourteenth of the longest, between a minute and a day. "
							"0 switches never and purges expired keys one by one.",
							&key_generation_interval,
							KEYGEN_INTERVAL_DERIVED,
							KEYGEN_INTERVAL_DERIVED,
							365 * SECS_PER_DAY,
							PGC_SUSET,
							GUC_UNIT_S,
							NULL,
							NULL,
							NULL);
}

/*
 * Takes a lock without queueing for it, trying again every millisecond
 * until deadline, sleeping on the latch so that an interrupt or the
 * postmaster's death ends the wait at once; returns whether it has the
 * lock.  The tries stay a millisecond apart: under a steady load the lock
 * is free only between two deliveries' transactions, and tries further
 * apart miss those gaps.
 */
static bool
lock_within(Oid relid, LOCKMODE mode, TimestampTz deadline)
{
	for (;;)
	{
		if (ConditionalLockRelationOid(relid, mode))
			return true;
		if (GetCurrentTimestamp() >= deadline)
			return false;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 SWITCH_LOCK_RETRY_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Whether the tables of a generation, keys, collisions and filter, are all
 * empty: a dropped generation's are not until they are truncated
 * (keygen_retire.c).
 */
bool
keygen_generation_empty(const KeyGeneration *gen)
{
	Oid			relids[3] = {gen->keys_relid, gen->collisions_relid,
	gen->filter_relid};

	for (int i = 0; i < lengthof(relids); i++)
	{
		Relation	rel;
		bool		empty;

		if (!OidIsValid(relids[i]))
			continue;
		rel = table_open(relids[i], AccessShareLock);
		empty = RelationGetNumberOfBlocks(rel) == 0;
		table_close(rel, AccessShareLock);
		if (!empty)
			return false;
	}
	return true;
}

/*
 * Seals the current generation and opens the next one of the ring, waiting
 * at most wait_ms for the gate, then settles what it can; returns the
 * generation opened.  When that cannot be done now (the wait ran out, or
 * the next generation still holds keys) it raises an error, or with quiet
 * returns 0.
 */
static KeyGenSlot
keygen_switch(int64 wait_ms, bool quiet)
{
	const StorageInfo *si = storage_locate();
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), wait_ms);
	const KeyGenState *st;
	KeyGenSlot	sealing;
	KeyGenSlot	opening;
	Datum		arg;

	if (!si->has_ring)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the key store of this database has no generations"),
				 errhint("Update the extension with ALTER EXTENSION idem_consumer UPDATE.")));

	/* the gate, and one switch, retirement or build at a time (rule 2) */
	if (!lock_within(si->generations_relid, ExclusiveLock, deadline))
	{
		keygen_switch_held_back(keygen_state_latest()->current, quiet);
		return 0;
	}
	keygen_switch_held_back(0, quiet);

	st = keygen_state_latest();
	sealing = st->current;
	opening = sealing % KEYGEN_RING + 1;
	for (int i = 0; i < st->nsealed; i++)
		if (st->sealed[i] == opening)
		{
			if (quiet)
				return 0;
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("could not switch key generations: generation %d still holds keys",
							opening),
					 errdetail("The ring has %d generations, all in use.", KEYGEN_RING),
					 st->unsettled[opening] ?
					 errhint("Generation %d is not settled yet: a transaction that recorded keys there is still open; end it, then run idem_key_generation_retire().",
							 opening) :
					 errhint("Run idem_key_generation_retire(), which carries the live keys of generation %d into the current one and drops it; switch less often than the longest retention window divided by %d.",
							 opening, KEYGEN_RING - 2)));
		}
	if (!keygen_generation_empty(&si->gens[opening]))
	{
		if (quiet)
			return 0;
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("could not switch key generations: generation %d is dropped but not yet emptied",
						opening),
				 errhint("Run idem_key_generation_retire() once the transactions that still read it have ended.")));
	}

	arg = Int32GetDatum(sealing);
	storage_stmt_run(&keygen_stmts, KG_RECORD_FIRST, &arg, NULL, 0);
	arg = Int32GetDatum(opening);
	storage_stmt_run(&keygen_stmts, KG_OPEN_NEXT, &arg, NULL, 0);
	if (SPI_processed != 1)
		elog(ERROR, "could not open generation %d of idem_consumer", opening);
	(void) keygen_settle();

	keygen_state_forget();
	return opening;
}

/*
 * Switches generations if key_generation_interval is set and the current
 * generation is at least that old (the first one, opened with the
 * extension, at once), waiting at most wait_ms; returns the generation
 * opened, or 0.  For the purge worker, in a transaction of its own.
 */
int
keygen_switch_if_due(int64 wait_ms)
{
	const StorageInfo *si = storage_locate();
	Datum		arg;
	Datum		due;
	bool		isnull;

	if (!si->has_ring)
		return 0;
	arg = Int32GetDatum(keygen_interval_seconds());
	if (DatumGetInt32(arg) <= 0)
		return 0;
	storage_stmt_run(&keygen_stmts, KG_SWITCH_DUE, &arg, NULL, 1);
	due = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!DatumGetBool(due))
		return 0;
	return keygen_switch(wait_ms, true);
}

/*
 * The interval between switches in seconds; 0 when none is scheduled.
 * Derived, it is a fourteenth of the longest finite retention window, so
 * that the ring's sixteen places hold a window and the two generations
 * around its ends; at least a minute, so that switches stay cheap beside
 * short windows, and at most a day, so that short windows are not held
 * weeks by a long one.  Needs an SPI connection when derived.
 */
int
keygen_interval_seconds(void)
{
	int32		longest;

	if (key_generation_interval != KEYGEN_INTERVAL_DERIVED)
		return key_generation_interval;
	longest = retention_longest_window_secs();
	if (longest <= 0)
		return 0;				/* every key is kept forever */
	return Min(Max(longest / (KEYGEN_RING - 2), SECS_PER_MINUTE), SECS_PER_DAY);
}

/*
 * Whether keys expire by whole generations (key_generation_interval is
 * set): the purge then leaves the ring's tables to keygen_retire.c.
 */
bool
keygen_retention_by_generation(void)
{
	return key_generation_interval != 0 && storage_locate()->has_ring;
}

/*
 * Notes that this transaction recorded a new key of a consumer in the
 * current generation, registering the consumer there (generation_consumers)
 * on its first key in the generation, in this transaction, so that the
 * registration commits or rolls back with the key.  A registration is
 * trusted once its transaction is known to have committed.
 */
void
keygen_note_recording(int32 consumer_id, int32 processed_at)
{
	const KeyGenState *st = keygen_state();
	RegisteredConsumer *entry;
	RegisteredKey regkey;
	bool		found;
	Datum		args[3];

	if (!storage_locate()->has_ring)
		return;
	if (registered == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(RegisteredKey);
		ctl.entrysize = sizeof(RegisteredConsumer);
		registered = hash_create("idem_consumer generation consumers", 64, &ctl,
								 HASH_ELEM | HASH_BLOBS);
	}
	memset(&regkey, 0, sizeof(regkey));
	regkey.epoch = st->current_epoch;
	regkey.consumer_id = consumer_id;
	regkey.storage_generation = storage_locate()->generation;
	entry = hash_search(registered, &regkey, HASH_ENTER, &found);
	/*
	 * A registration of this session's counts once it has committed, or
	 * while it is part of this very transaction.  Anything else registers
	 * again: an aborted one, and one still in progress that is not ours,
	 * which can only be a transaction this session prepared (PREPARE
	 * TRANSACTION) and left to be committed or rolled back later, by
	 * anyone: its registration is not this transaction's to count on.
	 */
	if (found)
	{
		if (!TransactionIdIsValid(entry->xid) ||
			TransactionIdIsCurrentTransactionId(entry->xid))
			return;
		if (TransactionIdDidCommit(entry->xid))
		{
			entry->xid = InvalidTransactionId;
			return;
		}
	}

	args[0] = Int64GetDatum(st->current_epoch);
	args[1] = Int32GetDatum(consumer_id);
	args[2] = Int32GetDatum(processed_at);
	storage_stmt_run(&keygen_stmts, KG_REGISTER, args, NULL, 0);
	entry->xid = GetCurrentTransactionId();
}

/*
 * idem_key_generation_switch(wait interval): seals the current generation
 * of keys and opens the next one; returns the generation opened.
 */
Datum
idem_key_generation_switch(PG_FUNCTION_ARGS)
{
	Interval   *wait = PG_GETARG_INTERVAL_P(0);
	int64		wait_us;
	KeyGenSlot	opened;

	wait_us = wait->time + (int64) wait->day * USECS_PER_DAY;
	if (wait->month != 0 || wait->day < 0 || wait->day > 1 ||
		wait_us < 0 || wait_us > USECS_PER_DAY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("wait must be between 0 and 1 day")));
	/* keys it recorded itself would be in a generation it sealed */
	if (TransactionIdIsValid(GetTopTransactionIdIfAny()))
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("idem_key_generation_switch must run in a transaction of its own"),
				 errdetail("This transaction has written already."),
				 errhint("Call it alone, outside any explicit transaction block.")));

	SPI_connect();
	opened = keygen_switch(wait_us / 1000, false);
	SPI_finish();
	PG_RETURN_INT32(opened);
}
