/*-------------------------------------------------------------------------
 *
 * keygen_gate.c
 *	  The gate a delivery passes to record a key in the current generation
 *	  of keys, what it waits for with the gate let go, and the settle of a
 *	  sealed generation: the lock that tells whether a transaction may
 *	  still record keys there, and keygen_settle, which sets settled_at
 *	  once none is left.  keygen.c gives the argument these serve (rules 1
 *	  and 2, facts 3 and 4); keystore.c takes the gate and waits.
 *
 * Settling.  A sealed generation is settling until no transaction that
 * may have recorded a key there is left.  A transaction takes the settle
 * lock of the current generation (its filter table in ROW SHARE mode)
 * with the gate passed, right before it inserts a key there, and keeps it
 * to its end; keygen_settle takes it in EXCLUSIVE mode without waiting,
 * and once granted, sets the generation's settled_at: by 1 and 2 no
 * transaction takes it after the switch.  A delivery that only probed, or
 * waited, takes none, so it holds back no settle.
 *
 * A generation's settle lock is its filter table: the filter is built only
 * once the generation has settled (keygen_filter.c), and its readers'
 * ACCESS SHARE conflicts neither with a recorder's ROW SHARE nor with a
 * settle's EXCLUSIVE.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_gate.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "storage/proc.h"

#include "compat.h"
#include "keygen_state.h"
#include "keygen_gate.h"

typedef enum GateStmt
{
	KG_UNSETTLED,
	KG_SETTLE,
	KG_NUM_STMTS
} GateStmt;

static const StorageStmt gate_stmt_defs[KG_NUM_STMTS] = {
	/* the sealed generations not settled yet */
	[KG_UNSETTLED] = {
		"SELECT g.epoch, g.generation FROM " STORAGE_SCHEMA ".key_generations AS g"
		" WHERE g.settled_at IS NULL AND g.epoch OPERATOR(pg_catalog.<>)"
		" (SELECT pg_catalog.max(x.epoch) FROM " STORAGE_SCHEMA ".key_generations AS x)",
		0, {InvalidOid}
	},
	/*
	 * The settle's time is read once no transaction that may have recorded
	 * keys in the generation is left: no key there is newer.
	 */
	[KG_SETTLE] = {
		"UPDATE " STORAGE_SCHEMA ".key_generations SET settled_at = pg_catalog.clock_timestamp()"
		" WHERE epoch OPERATOR(pg_catalog.=) $1 AND settled_at IS NULL",
		1, {INT8OID}
	},
};

static SPIPlanPtr gate_plans[KG_NUM_STMTS];
static StorageStmtSet gate_stmts = STORAGE_STMT_SET(gate_stmt_defs, gate_plans);

/*
 * Returns the current generation, having locked its key table in ROW
 * EXCLUSIVE mode.  A generation found sealed once locked is let go again:
 * the lock was new, as the invalidation processed when it was granted
 * shows.  The generation may be sealed at any time after: only the gate
 * (keygen_gate_pass) keeps it current.
 */
KeyGenSlot
keygen_lock_current(void)
{
	for (;;)
	{
		KeyGenSlot	slot = keygen_state()->current;
		Oid			keys_relid = storage_locate()->gens[slot].keys_relid;

		LockRelationOid(keys_relid, RowExclusiveLock);
		if (keygen_state()->current == slot)
			return slot;
		UnlockRelationOid(keys_relid, RowExclusiveLock);
	}
}

/*
 * Passes the gate (keygen.c, rule 1) if generation slot, locked by
 * keygen_lock_current, is still current then; returns whether it did.
 * Passing it processes the invalidation of a switch that committed, which
 * a switch sends before it lets the gate go, so the generation found
 * current stays current until the gate is let go.  The caller records its
 * keys there and then lets the gate go (keygen_gate_release), or gives it
 * up to wait (keygen_gate_wait): it never waits for another transaction
 * while it holds it.
 */
bool
keygen_gate_pass(KeyGenSlot slot)
{
	const StorageInfo *si = storage_locate();

	if (!si->has_ring)
		return true;
	LockRelationOid(si->generations_relid, RowShareLock);
	if (keygen_state()->current == slot)
		return true;
	UnlockRelationOid(si->generations_relid, RowShareLock);
	return false;
}

/*
 * Locks the current generation and passes the gate; returns the generation.
 */
KeyGenSlot
keygen_gate_enter(void)
{
	for (;;)
	{
		KeyGenSlot	slot = keygen_lock_current();

		if (keygen_gate_pass(slot))
			return slot;
	}
}

/*
 * Lets the gate go: a switch may seal the generation now.
 */
void
keygen_gate_release(void)
{
	const StorageInfo *si = storage_locate();

	if (si->has_ring)
		UnlockRelationOid(si->generations_relid, RowShareLock);
}

/*
 * The lock that tells a settle whether a transaction may still record keys
 * in a generation: the table of its filter, which a recorder holds in ROW
 * SHARE mode and a settle takes in EXCLUSIVE mode (the filter is built
 * only once settled, and its readers' ACCESS SHARE conflicts with
 * neither); where the generation has no filter table, its key table, in
 * ROW EXCLUSIVE and SHARE modes.
 */
static Oid
settle_lock(KeyGenSlot slot, LOCKMODE *recorder_mode, LOCKMODE *settle_mode)
{
	const KeyGeneration *gen = &storage_locate()->gens[slot];

	if (OidIsValid(gen->filter_relid))
	{
		*recorder_mode = RowShareLock;
		*settle_mode = ExclusiveLock;
		return gen->filter_relid;
	}
	*recorder_mode = RowExclusiveLock;
	*settle_mode = ShareLock;
	return gen->keys_relid;
}

/*
 * Notes that this transaction may record keys in generation slot, the
 * current one, to the end of the transaction: taken with the gate passed,
 * right before an insertion, and not by a delivery that only probed or
 * waited, so that only transactions that may hold a key there hold back
 * the settle of the generation.
 */
void
keygen_mark_recording(KeyGenSlot slot)
{
	static struct
	{
		LocalTransactionId lxid;
		SubTransactionId subxid;
		uint64		storage_generation;
		KeyGenSlot	slot;
	}			marked;
	LOCKMODE	recorder_mode;
	LOCKMODE	settle_mode;
	Oid			relid;
	const StorageInfo *si = storage_locate();

	/*
	 * Taken already in this very subtransaction: held until it ends, as
	 * nothing lets it go before (a subtransaction's abort lets go of what
	 * it took, so a lock of another subtransaction is taken again).
	 */
	if (marked.lxid == compat_my_lxid() && marked.subxid == GetCurrentSubTransactionId() &&
		marked.storage_generation == si->generation && marked.slot == slot)
		return;
	if (!si->has_ring || slot == KEYGEN_LEGACY)
		return;
	relid = settle_lock(slot, &recorder_mode, &settle_mode);
	LockRelationOid(relid, recorder_mode);
	marked.lxid = compat_my_lxid();
	marked.subxid = GetCurrentSubTransactionId();
	marked.storage_generation = si->generation;
	marked.slot = slot;
}

/*
 * Whether no transaction but this one may still record keys in sealed
 * generation slot: the lock of a settle, taken without waiting and kept.
 */
bool
keygen_settled_for_me(KeyGenSlot slot)
{
	LOCKMODE	recorder_mode;
	LOCKMODE	settle_mode;
	Oid			relid = settle_lock(slot, &recorder_mode, &settle_mode);

	return ConditionalLockRelationOid(relid, settle_mode);
}

/*
 * Lets the gate go and waits for what *wait names, then clears it; the
 * caller passes the gate again and probes the key anew, in whatever
 * generation is current by then (keygen_gate_enter).  The lock of a
 * settle waited for is kept, so that probing again finds every transaction
 * that may have recorded there ended.
 */
void
keygen_gate_wait(GateWait *wait)
{
	keygen_gate_release();
	if (TransactionIdIsValid(wait->xid))
		XactLockTableWait(wait->xid, NULL, NULL, XLTW_None);
	if (wait->settle != 0)
	{
		LOCKMODE	recorder_mode;
		LOCKMODE	settle_mode;
		Oid			relid = settle_lock(wait->settle, &recorder_mode, &settle_mode);

		LockRelationOid(relid, settle_mode);
	}
	wait->xid = InvalidTransactionId;
	wait->settle = 0;
}

/*
 * Settles the sealed generations that no transaction that may have
 * recorded keys there holds any longer (the lock of a settle is free,
 * taken without waiting), setting their settled_at: from then on they hold
 * every key recorded there, none newer than settled_at, and are probed
 * with the transaction's snapshot, filtered and retired.  Returns how many
 * it settled.  The caller holds key_generations against switches.
 */
int
keygen_settle(void)
{
	const StorageInfo *si = storage_locate();
	SPITupleTable *unsettled;
	uint64		n;
	int			settled = 0;

	if (!si->has_ring)
		return 0;
	storage_stmt_run(&gate_stmts, KG_UNSETTLED, NULL, NULL, 0);
	unsettled = SPI_tuptable;
	n = SPI_processed;
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		epoch = SPI_getbinval(unsettled->vals[i], unsettled->tupdesc, 1, &isnull);
		int32		slot = DatumGetInt32(SPI_getbinval(unsettled->vals[i],
													   unsettled->tupdesc, 2, &isnull));
		LOCKMODE	recorder_mode;
		LOCKMODE	settle_mode;
		Oid			relid;

		if (slot < 1 || slot > KEYGEN_RING)
			continue;
		relid = settle_lock(slot, &recorder_mode, &settle_mode);
		if (!ConditionalLockRelationOid(relid, settle_mode))
			continue;
		storage_stmt_run(&gate_stmts, KG_SETTLE, &epoch, NULL, 0);
		settled += (int) SPI_processed;
		UnlockRelationOid(relid, settle_mode);
	}
	SPI_freetuptable(unsettled);
	if (settled > 0)
		keygen_state_forget();
	return settled;
}
