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
 *	- no key of a settled generation is newer than its seal, the time it
 *	  settled (keygen.c, fact 4);
 *	- a consumer's latest activity is at least the newest first_at of its
 *	  rows in generation_consumers, the processed_at of a key it recorded
 *	  (keygen.c, fact 3: every consumer with a key in a generation is
 *	  registered there).
 * Facts 3 and 4 hold only once a sealed generation has settled: a
 * generation still settling may yet gain keys and registrations, of the
 * transactions that recorded there before the switch and are still open,
 * and is neither dropped nor carried, however old.  The settle
 * (keygen_settle) is taken first, without waiting.
 * So a generation goes when, for each consumer registered in it, its seal
 * is older than the consumer's cutoff, and no pending dead letter's key is
 * in it; a consumer whose window is forever keeps it, and with it the keys
 * of every other consumer there.  A key is kept at most about two
 * generation intervals longer than its window.  The resolved dead-letter
 * entries of its keys go with it.
 *
 * Which keys are carried.  A consumer that has gone idle would keep the
 * generations of its keys for as long as it stays idle (its cutoff counts
 * from its latest activity), and a pending dead letter for as long as it
 * waits; so a generation kept only by those is dropped once their keys
 * are carried into the current generation (retire_action), and so is the
 * generation the next switch would open, whoever keeps it, lest the ring
 * stop.  Carrying keeps both facts of keygen.c: the keys keep their times,
 * older than any seal, and each consumer whose keys were carried is
 * registered in the current generation at its latest activity.  It keeps
 * every key recorded: a delivery that finds the key in neither place
 * (the copy not yet visible, the sealed generation emptied since) inserts
 * it into the current generation, where the copy's unique index entry
 * decides; and it holds a SHARE lock on the sealed generation, taken
 * without waiting, so that no forget there can be undone by a copy.
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
#include "utils/array.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "keystore_internal.h"

typedef enum RetireStmt
{
	KR_SEALED,
	KR_CONSUMERS_OF,
	KR_FORGET,
	KR_OPEN,
	KR_REGISTER,
	KR_REGISTERED_LATEST,
	KR_NUM_STMTS
} RetireStmt;

static const StorageStmt retire_stmt_defs[KR_NUM_STMTS] = {
	/*
	 * the settled generations, oldest first, with their seal in seconds:
	 * the settle, after which no key was recorded there (keygen.c)
	 */
	[KR_SEALED] = {
		"SELECT g.epoch, g.generation,"
		" pg_catalog.floor(pg_catalog.date_part('epoch', g.settled_at"
		" OPERATOR(pg_catalog.-) '2000-01-01 00:00:00+00'::pg_catalog.timestamptz))::pg_catalog.int4"
		" FROM " STORAGE_SCHEMA ".key_generations AS g"
		" WHERE g.settled_at IS NOT NULL AND g.epoch OPERATOR(pg_catalog.<>)"
		" (SELECT pg_catalog.max(x.epoch) FROM " STORAGE_SCHEMA ".key_generations AS x)"
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
	/* consumers $2 registered in generation $1 at their latest activity $3 */
	[KR_REGISTER] = {
		"INSERT INTO " STORAGE_SCHEMA ".generation_consumers (epoch, consumer_id, first_at)"
		" SELECT $1, r.consumer_id, r.first_at"
		" FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS r(consumer_id, first_at)",
		3, {INT8OID, INT4ARRAYOID, INT4ARRAYOID}
	},
	/* each consumer registered in the ring, with its newest registration */
	[KR_REGISTERED_LATEST] = {
		"SELECT consumer_id, pg_catalog.max(first_at)"
		" FROM " STORAGE_SCHEMA ".generation_consumers GROUP BY consumer_id",
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

/* how many carried keys are read at a time */
#define CARRY_PAGE 1000

/* a consumer registered in a sealed generation, and what it asks of it */
typedef struct GenerationConsumer
{
	int32		consumer_id;
	int32		latest;			/* its latest activity, seconds since 2000 */
	int32		cutoff;			/* its keys older than this have expired */
	bool		holds;			/* its window still covers keys here */
	bool		stopped;		/* only because its clock stopped */
} GenerationConsumer;

/* what retirement does with a sealed generation */
typedef enum RetireAction
{
	RETIRE_KEEP,
	RETIRE_DROP,				/* every key in it has expired */
	RETIRE_CARRY				/* drop it once its live keys are carried */
} RetireAction;

/*
 * Reads the consumers registered in a sealed generation, and whether each
 * still holds it by the bounds of the header; returns how many, in
 * *consumers.
 */
static int
read_generation_consumers(const SealedGeneration *gen, RetentionWindows *windows,
						  GenerationConsumer **consumers)
{
	Datum		arg = Int64GetDatum(gen->epoch);
	int32		now_secs = (int32) (GetCurrentTimestamp() / USECS_PER_SEC);
	GenerationConsumer *list;
	int			n;

	storage_stmt_run(&retire_stmts, KR_CONSUMERS_OF, &arg, NULL, 0);
	n = (int) SPI_processed;
	list = palloc(sizeof(GenerationConsumer) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;
		int32		cutoff;

		list[i].consumer_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
														  SPI_tuptable->tupdesc, 1, &isnull));
		list[i].latest = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
													 SPI_tuptable->tupdesc, 2, &isnull));
		list[i].cutoff = retention_cutoff(windows, list[i].consumer_id, list[i].latest);
		/* a key of second s is purgeable when s < cutoff; every s <= seal */
		list[i].holds = list[i].cutoff <= 0 || gen->sealed_at >= list[i].cutoff;
		/* counted from now instead, the window would have passed */
		cutoff = retention_cutoff(windows, list[i].consumer_id, now_secs);
		list[i].stopped = list[i].holds && cutoff > 0 && gen->sealed_at < cutoff;
	}
	SPI_freetuptable(SPI_tuptable);
	*consumers = list;
	return n;
}

/*
 * Decides what becomes of a sealed generation.  It is dropped when every
 * key in it has expired and none is a pending dead letter's.  Otherwise
 * the consumers whose windows still cover its keys keep it, and with it
 * every other consumer's keys, but for two cases where its live keys are
 * carried into the current generation and it is dropped all the same:
 *	- every consumer that keeps it does so only because it has been idle:
 *	  windows count from a consumer's latest activity, so an idle consumer
 *	  would keep it, and the others' expired keys, for as long as it stays
 *	  idle, where counted from now its window has passed;
 *	- its place is the next one a switch opens: the ring would stop.
 * Either way only the keeping consumers' keys inside their windows are
 * copied, once per generation they outlive: a key already expired stays
 * behind, or it would be carried for as long as the consumer's newer keys.
 */
static RetireAction
retire_action(const SealedGeneration *gen, const GenerationConsumer *consumers,
			  int nconsumers, KeyGenSlot next_opened)
{
	bool		held = false;
	bool		held_by_window = false;

	for (int i = 0; i < nconsumers; i++)
		if (consumers[i].holds)
		{
			held = true;
			if (!consumers[i].stopped)
				held_by_window = true;
		}
	if (!held)
	{
		keystore_execute_in(gen->slot, KS_PENDING_IN_GENERATION, NULL, NULL, 1);
		held = SPI_processed > 0;
	}
	if (!held)
		return RETIRE_DROP;
	return !held_by_window || gen->slot == next_opened ? RETIRE_CARRY : RETIRE_KEEP;
}

/*
 * Returns an int4[] of the ids of consumers[i] with chosen[i] set; of the
 * consumers that hold their generation when chosen is NULL.  With cutoffs,
 * also sets *cutoffs to an int4[] of the same consumers' cutoffs.
 */
static Datum
consumer_array(const GenerationConsumer *consumers, int nconsumers, const bool *chosen,
			   Datum *cutoffs)
{
	Datum	   *ids = palloc(sizeof(Datum) * Max(nconsumers, 1));
	Datum	   *their_cutoffs = palloc(sizeof(Datum) * Max(nconsumers, 1));
	int			n = 0;

	for (int i = 0; i < nconsumers; i++)
		if (chosen ? chosen[i] : consumers[i].holds)
		{
			their_cutoffs[n] = Int32GetDatum(consumers[i].cutoff);
			ids[n++] = Int32GetDatum(consumers[i].consumer_id);
		}
	if (cutoffs)
		*cutoffs = PointerGetDatum(construct_array(their_cutoffs, n, INT4OID, sizeof(int32),
												   true, TYPALIGN_INT));
	return PointerGetDatum(construct_array(ids, n, INT4OID, sizeof(int32), true,
										   TYPALIGN_INT));
}

/*
 * Copies into generation current the keys of a sealed generation that are
 * still live: those of the consumers that hold it not older than their
 * cutoffs, and those of pending dead letters; notes in carried[i] whether
 * consumers[i] had one copied.
 * Returns false, copying nothing, when a transaction holds the sealed
 * generation against the SHARE lock that keeps forgets out while the keys
 * are copied (a forget there would otherwise be undone by its copy).
 */
static bool
carry_live_keys(const SealedGeneration *gen, KeyGenSlot current,
				const GenerationConsumer *consumers, int nconsumers, bool *carried)
{
	const KeyGeneration *g = &storage_locate()->gens[gen->slot];
	KeystoreStmt tables[2] = {KS_CARRY_KEYS, KS_CARRY_COLLISIONS};
	Datum		args[4];

	if (!ConditionalLockRelationOid(g->keys_relid, ShareLock))
		return false;
	if (!ConditionalLockRelationOid(g->collisions_relid, ShareLock))
	{
		UnlockRelationOid(g->keys_relid, ShareLock);
		return false;
	}

	args[0] = consumer_array(consumers, nconsumers, NULL, &args[3]);
	args[2] = Int32GetDatum(CARRY_PAGE);
	for (int t = 0; t < lengthof(tables); t++)
	{
		ItemPointerData after;

		ItemPointerSet(&after, 0, 0);
		for (;;)
		{
			uint64		n;
			SPITupleTable *page;

			CHECK_FOR_INTERRUPTS();
			args[1] = PointerGetDatum(&after);
			keystore_execute_in(gen->slot, tables[t], args, NULL, 0);
			n = SPI_processed;
			page = SPI_tuptable;	/* each carried key runs statements */
			for (uint64 r = 0; r < n; r++)
			{
				HeapTuple	row = page->vals[r];
				TupleDesc	desc = page->tupdesc;
				bool		isnull;
				bool		fp_null;
				int32		consumer_id = DatumGetInt32(SPI_getbinval(row, desc, 2, &isnull));
				int32		processed_at = DatumGetInt32(SPI_getbinval(row, desc, 3, &isnull));
				text	   *key = DatumGetTextPP(SPI_getbinval(row, desc, 4, &isnull));
				int32		fingerprint = DatumGetInt32(SPI_getbinval(row, desc, 5, &fp_null));

				if (r == n - 1)
					after = *(ItemPointer) DatumGetPointer(SPI_getbinval(row, desc, 1, &isnull));
				(void) keystore_carry_key(current, consumer_id, processed_at, key,
										  fp_null ? NULL : &fingerprint);
				for (int i = 0; i < nconsumers; i++)
					if (consumers[i].consumer_id == consumer_id)
						carried[i] = true;
			}
			SPI_freetuptable(page);
			if (n < CARRY_PAGE)
				break;
		}
	}
	return true;
}

/*
 * Registers in the current generation each consumer whose keys were
 * carried there, at its latest activity: its keys there are no newer, and
 * the generation must not outlive its window counted from that activity
 * any more than the one it came from (keygen.c, fact 3).
 */
static void
register_carried(int64 current_epoch, const GenerationConsumer *consumers,
				 int nconsumers, const bool *carried)
{
	Datum	   *latest = palloc(sizeof(Datum) * Max(nconsumers, 1));
	int			n = 0;
	Datum		args[3];

	for (int i = 0; i < nconsumers; i++)
		if (carried[i])
			latest[n++] = Int32GetDatum(consumers[i].latest);
	if (n == 0)
		return;
	args[0] = Int64GetDatum(current_epoch);
	args[1] = consumer_array(consumers, nconsumers, carried, NULL);
	args[2] = PointerGetDatum(construct_array(latest, n, INT4OID, sizeof(int32), true,
											  TYPALIGN_INT));
	storage_stmt_run(&retire_stmts, KR_REGISTER, args, NULL, 0);
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
	const KeyGenState *state;

	if (!si->has_ring)
		return 0;

	/*
	 * One at a time with switches and builds: all read and write
	 * key_generations.  Not in a mode that closes the gate: deliveries go
	 * on meanwhile.
	 */
	LockRelationOid(si->generations_relid, ShareUpdateExclusiveLock);
	(void) keygen_settle();

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
	state = keygen_state_latest();
	for (int i = 0; i < nsealed; i++)
	{
		Datum		arg = Int64GetDatum(sealed[i].epoch);
		GenerationConsumer *consumers;
		int			nconsumers;
		RetireAction action;
		bool	   *carried;
		Datum		spared[2];

		CHECK_FOR_INTERRUPTS();
		if (sealed[i].slot < 1 || sealed[i].slot > KEYGEN_RING)
			continue;
		nconsumers = read_generation_consumers(&sealed[i], windows, &consumers);
		action = retire_action(&sealed[i], consumers, nconsumers,
							   state->current % KEYGEN_RING + 1);
		if (action == RETIRE_KEEP)
			continue;
		carried = palloc0(sizeof(bool) * Max(nconsumers, 1));
		if (action == RETIRE_CARRY)
		{
			if (!carry_live_keys(&sealed[i], keygen_lock_current(), consumers,
								 nconsumers, carried))
				continue;
			register_carried(state->current_epoch, consumers, nconsumers, carried);
		}
		spared[0] = consumer_array(consumers, nconsumers, carried, &spared[1]);
		keystore_execute_in(sealed[i].slot, KS_EXPIRE_RESOLVED_IN_GENERATION,
							spared, NULL, 0);
		storage_stmt_run(&retire_stmts, KR_FORGET, &arg, NULL, 0);
		dropped++;
	}

	(void) truncate_dropped(open_before);
	return dropped;
}

/*
 * Calls note(consumer_id, latest, arg) for each consumer registered in a
 * generation of the ring, latest its newest registration: a lower bound of
 * its latest activity (keygen.c, fact 3), for a purge of the legacy tables
 * that does not read the ring's.
 */
void
keygen_registered_activity(void (*note) (int32 consumer_id, int32 latest, void *arg),
						   void *arg)
{
	if (!storage_locate()->has_ring)
		return;
	storage_stmt_run(&retire_stmts, KR_REGISTERED_LATEST, NULL, NULL, 0);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;

		note(DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull)),
			 DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2, &isnull)),
			 arg);
	}
	SPI_freetuptable(SPI_tuptable);
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
