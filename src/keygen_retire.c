/*-------------------------------------------------------------------------
 *
 * keygen_retire.c
 *	  Retention by whole generations: dropping a sealed generation of keys
 *	  once every key in it has expired, and emptying its tables so that the
 *	  ring can open it again (idem_key_generation_retire, and the purge
 *	  worker when idem_consumer.key_generation_interval is set).  Nothing is
 *	  deleted key by key: a generation is forgotten in key_generations, then
 *	  truncated.
 *
 * When a generation may go.  The rule of retention.c holds per key: a key
 * is purgeable when it is older than its consumer's window counted back
 * from that consumer's latest activity.  A generation goes when that holds
 * of every key in it, which is checked per consumer with two bounds that
 * can only keep keys longer:
 *	- no key of a sealed generation is newer than its seal, the opening of
 *	  the next generation (every transaction that recorded there had ended
 *	  before it, keygen.c);
 *	- a consumer's latest activity is at least the newest first_at of its
 *	  rows in generation_consumers, the processed_at of a key it recorded
 *	  (keygen_note_recording registers every consumer in the generation of
 *	  its keys, in the transaction that records them).
 * So a generation goes when, for each consumer registered in it, its seal
 * is older than the consumer's cutoff; a consumer whose window is forever,
 * or that has been idle since, keeps it, and with it the keys of every
 * other consumer there.  A key is kept at most about two generation
 * intervals longer than its window.  A generation that holds the key of a
 * pending dead letter is kept whole, as the purge keeps such keys; the
 * resolved dead-letter entries of its keys go with it.
 *
 * How it goes, in two steps that never wait for a lock:
 *	1. its rows in key_generations and generation_consumers are deleted:
 *	   once that commits, sessions stop probing it (the trigger of
 *	   key_generations tells them);
 *	2. at a later call, its tables and filter are truncated, as soon as no
 *	   transaction holds a lock on them (sessions that read the generations
 *	   before step 1 committed may still probe it; a key they do not find
 *	   there was purgeable anyway).  Truncating in the transaction of step
 *	   1 would make every delivery meanwhile queue behind the truncation's
 *	   ACCESS EXCLUSIVE until that transaction ends.  Until then the switch
 *	   does not open the generation again.
 * Each call takes the step 2 left from earlier ones; the purge worker
 * calls again at once.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_retire.c
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
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "keystore_internal.h"

typedef enum RetireStmt
{
	KR_SEALED,
	KR_CONSUMERS_OF,
	KR_FORGET,
	KR_OPEN,
	KR_NUM_STMTS
} RetireStmt;

static const StorageStmt retire_stmt_defs[KR_NUM_STMTS] = {
	/* the sealed generations, oldest first, with their seal in seconds */
	[KR_SEALED] = {
		"SELECT g.epoch, g.generation,"
		" pg_catalog.floor(pg_catalog.date_part('epoch', n.opened_at"
		" OPERATOR(pg_catalog.-) '2000-01-01 00:00:00+00'::pg_catalog.timestamptz))::pg_catalog.int4"
		" FROM " STORAGE_SCHEMA ".key_generations AS g"
		" CROSS JOIN LATERAL (SELECT x.opened_at FROM " STORAGE_SCHEMA ".key_generations AS x"
		"  WHERE x.epoch OPERATOR(pg_catalog.>) g.epoch ORDER BY x.epoch LIMIT 1) AS n"
		" ORDER BY g.epoch",
		0, {InvalidOid}
	},
	/* the consumers registered in generation $1, with their latest activity */
	[KR_CONSUMERS_OF] = {
		"SELECT r.consumer_id, (SELECT pg_catalog.max(a.first_at)"
		"  FROM " STORAGE_SCHEMA ".generation_consumers AS a"
		"  WHERE a.consumer_id OPERATOR(pg_catalog.=) r.consumer_id)"
		" FROM " STORAGE_SCHEMA ".generation_consumers AS r"
		" WHERE r.epoch OPERATOR(pg_catalog.=) $1"
		" GROUP BY r.consumer_id",
		1, {INT8OID}
	},
	[KR_FORGET] = {
		"WITH g AS (DELETE FROM " STORAGE_SCHEMA ".key_generations"
		"  WHERE epoch OPERATOR(pg_catalog.=) $1 RETURNING epoch)"
		" DELETE FROM " STORAGE_SCHEMA ".generation_consumers"
		" WHERE epoch OPERATOR(pg_catalog.=) $1",
		1, {INT8OID}
	},
	/* the generations open; before the first switch, none is listed */
	[KR_OPEN] = {
		"SELECT generation FROM " STORAGE_SCHEMA ".key_generations",
		0, {InvalidOid}
	},
};

static SPIPlanPtr retire_plans[KR_NUM_STMTS];
static StorageStmtSet retire_stmts = STORAGE_STMT_SET(retire_stmt_defs, retire_plans);

/* a sealed generation, as KR_SEALED reads it */
typedef struct SealedGeneration
{
	int64		epoch;
	KeyGenSlot	slot;
	int32		sealed_at;		/* seconds since 2000-01-01 */
} SealedGeneration;

/*
 * Whether every key of a sealed generation has expired, by the bounds of
 * the header, and none is the key of a pending dead letter.
 */
static bool
generation_expired(const SealedGeneration *gen, RetentionWindows *windows)
{
	Datum		arg = Int64GetDatum(gen->epoch);

	storage_stmt_run(&retire_stmts, KR_CONSUMERS_OF, &arg, NULL, 0);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int32		consumer_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
															  SPI_tuptable->tupdesc, 1, &isnull));
		int32		latest = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
														 SPI_tuptable->tupdesc, 2, &isnull));
		int32		cutoff = retention_cutoff(windows, consumer_id, latest);

		/* a key of second s is purgeable when s < cutoff; every s <= seal */
		if (cutoff <= 0 || gen->sealed_at >= cutoff)
			return false;
	}

	keystore_execute_in(gen->slot, KS_PENDING_IN_GENERATION, NULL, NULL, 1);
	return SPI_processed == 0;
}

/*
 * Sets open[g] for each generation open now (in this transaction's view).
 */
static void
read_open(bool *open)
{
	memset(open, 0, sizeof(bool) * KEYGEN_NUM);
	storage_stmt_run(&retire_stmts, KR_OPEN, NULL, NULL, 0);
	if (SPI_processed == 0)
		open[1] = true;			/* the first generation, never switched */
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		int32		g = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
													SPI_tuptable->tupdesc, 1, &isnull));

		if (g >= 1 && g <= KEYGEN_RING)
			open[g] = true;
	}
	SPI_freetuptable(SPI_tuptable);
}

/*
 * Truncates the tables of the generations that were not open (open[g]
 * false) but hold rows, when no transaction holds a lock on them; returns
 * how many it emptied.
 */
static int
truncate_dropped(const bool *open)
{
	const StorageInfo *si = storage_locate();
	int			emptied = 0;

	for (KeyGenSlot g = 1; g <= KEYGEN_RING; g++)
	{
		const KeyGeneration *gen = &si->gens[g];
		Oid			relids[3] = {gen->keys_relid, gen->collisions_relid,
		gen->filter_relid};
		int			nlocked = 0;

		if (open[g] || keygen_generation_empty(gen))
			continue;

		/* never queue: a queued ACCESS EXCLUSIVE would stop every reader */
		while (nlocked < lengthof(relids) &&
			   (!OidIsValid(relids[nlocked]) ||
				ConditionalLockRelationOid(relids[nlocked], AccessExclusiveLock)))
			nlocked++;
		if (nlocked < lengthof(relids))
		{
			while (nlocked-- > 0)
				if (OidIsValid(relids[nlocked]))
					UnlockRelationOid(relids[nlocked], AccessExclusiveLock);
			continue;
		}
		keystore_execute_in(g, KS_TRUNCATE_GENERATION, NULL, NULL, 0);
		emptied++;
	}
	return emptied;
}

/*
 * Drops every sealed generation whose keys have all expired and truncates
 * the tables of those dropped by earlier calls that nothing reads any more;
 * returns how many generations it dropped.  Retention by generation need
 * not be on: a DBA may drop expired generations by hand.
 */
int
keygen_retire(void)
{
	const StorageInfo *si = storage_locate();
	RetentionWindows *windows;
	SealedGeneration *sealed;
	int			nsealed;
	int			dropped = 0;
	bool		open_before[KEYGEN_NUM];

	if (!si->has_ring)
		return 0;

	/* one at a time with switches: both read and write key_generations */
	LockRelationOid(si->generations_relid, ExclusiveLock);

	/*
	 * Only generations dropped by a transaction that has committed are
	 * truncated: until a drop commits, sessions still probe the generation,
	 * and would queue behind the truncation's lock.
	 */
	read_open(open_before);

	storage_stmt_run(&retire_stmts, KR_SEALED, NULL, NULL, 0);
	nsealed = (int) SPI_processed;
	sealed = palloc(sizeof(SealedGeneration) * Max(nsealed, 1));
	for (int i = 0; i < nsealed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		bool		isnull;

		sealed[i].epoch = DatumGetInt64(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 1, &isnull));
		sealed[i].slot = DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2, &isnull));
		sealed[i].sealed_at = DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc, 3, &isnull));
	}
	SPI_freetuptable(SPI_tuptable);

	windows = retention_windows_load();
	for (int i = 0; i < nsealed; i++)
	{
		Datum		arg = Int64GetDatum(sealed[i].epoch);

		CHECK_FOR_INTERRUPTS();
		if (sealed[i].slot < 1 || sealed[i].slot > KEYGEN_RING ||
			!generation_expired(&sealed[i], windows))
			continue;
		keystore_execute_in(sealed[i].slot, KS_EXPIRE_RESOLVED_IN_GENERATION,
							NULL, NULL, 0);
		storage_stmt_run(&retire_stmts, KR_FORGET, &arg, NULL, 0);
		dropped++;
	}

	(void) truncate_dropped(open_before);
	return dropped;
}

PG_FUNCTION_INFO_V1(idem_key_generation_retire);

/*
 * idem_key_generation_retire(): drops the sealed generations whose keys
 * have all expired; returns how many.
 */
Datum
idem_key_generation_retire(PG_FUNCTION_ARGS)
{
	int			dropped;

	SPI_connect();
	dropped = keygen_retire();
	SPI_finish();
	PG_RETURN_INT32(dropped);
}
