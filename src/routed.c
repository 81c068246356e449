/*-------------------------------------------------------------------------
 *
 * routed.c
 *	  Routed keys, for Citus: keys stored with a route, the value of the
 *	  distribution column of the business row they protect, in
 *	  idem_consumer.routed_keys, which idem_citus_distribute() (SQL) makes
 *	  and distributes colocated with the business table.  Owns recording
 *	  (a key, or a batch's keys in the order batch.c's header gives),
 *	  probing, forgetting and purging routed keys, and the statements on
 *	  the routed dead letters (idem_consumer.routed_dead_letters, keyed
 *	  like the keys, used by dead_letter.c and dead_letter_entry.c): the
 *	  routed place's operations (key_place.h).
 *	  Whether keys are routed, the route arguments, and the refusal of
 *	  calls that would record or look up a key without its route once keys
 *	  are routed are routing.c's.
 *
 * Why a routed key is exact.  routed_keys is unique on (route, consumer,
 * key), and Citus colocates it with the business table: the key of a
 * message and the rows its business SQL writes are in shards of one
 * colocation group, placed on one node and moved together.  A key is
 * recorded by one INSERT ... ON CONFLICT DO NOTHING in the caller's
 * transaction, which Citus routes to the shard of its route, and the
 * business SQL writes the rows of the same route:
 *	- in a function delegated to the shard's node, both are local writes
 *	  of one transaction;
 *	- on the coordinator, Citus sends both over the one connection it uses
 *	  for that colocated placement in the transaction, so they commit in
 *	  one transaction of that node (or, if the transaction wrote to other
 *	  nodes too, under Citus's two-phase commit).
 * Either way the key commits if and only if the business rows do, on the
 * node that holds them, whatever node or connection fails; a shard move
 * copies both in one logical stream and switches them together.  What the
 * coordinator records of its own (consumers, counters) decides nothing.
 * A dead-letter entry is keyed and colocated like its key, and written in
 * the same transaction, so it too commits and moves with the key.
 * Concurrent deliveries of one key meet at the shard's unique index as
 * they would on one server (keystore.c): the second waits for the first
 * transaction and then finds its key, or inserts its own.
 *
 * The keys are unique on the key itself, not on a hash: the route and the
 * consumer's name mean the same on every node, while a consumer's id and
 * the seed of the key hash are each node's own.  Keys and consumer names
 * are short (IDEM_MAX_KEY_BYTES), so the index takes them whole.
 *
 * The statements run as the owner of the storage, like every statement of
 * the key store, with the route's own type: the table's route column has
 * the type of the business table's distribution column, and the call's
 * argument is converted to it by the INSERT's assignment.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/routed.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "parser/parse_coerce.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/typcache.h"

#include "keystore_internal.h"

/* the row of the route, consumer and key of the statement's first arguments */
#define ROUTED_KEY_IS_ARGS \
	" WHERE route OPERATOR(pg_catalog.=) $1" \
	" AND consumer OPERATOR(pg_catalog.=) $2 AND key OPERATOR(pg_catalog.=) $3"

/*
 * The statements; argtypes[0], the route's, is set to the type of the
 * call's route before they are prepared (routed_stmts_for).
 */
static StorageStmt routed_stmt_defs[RK_NUM_STMTS] = {
	[RK_INSERT] = {
		"INSERT INTO " STORAGE_SCHEMA ".routed_keys (route, consumer, key, fingerprint, processed_at)"
		" VALUES ($1, $2, $3, $4, $5)"
		" ON CONFLICT (route, consumer, key) DO NOTHING RETURNING 1",
		5, {InvalidOid, TEXTOID, TEXTOID, INT4OID, INT4OID}
	},
	[RK_PROBE] = {
		"SELECT fingerprint, processed_at FROM " STORAGE_SCHEMA ".routed_keys"
		ROUTED_KEY_IS_ARGS,
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
	[RK_FORGET] = {
		"DELETE FROM " STORAGE_SCHEMA ".routed_keys"
		ROUTED_KEY_IS_ARGS
		" RETURNING 1",
		3, {InvalidOid, TEXTOID, TEXTOID}
	},

	/*
	 * A message's dead-letter entry: a new one, or a new failure in the
	 * place of a resolved entry that outlived its key (a key removed by
	 * hand leaves its entry).  A pending entry stays as it is.  The times
	 * are the new row's defaults: Citus refuses now() in DO UPDATE.
	 */
	[RK_DL_INSERT] = {
		"INSERT INTO " STORAGE_SCHEMA ".routed_dead_letters AS d (route, consumer, key,"
		" sql, params, event_time, settings, sqlstate, message, detail, hint, context,"
		" dead_lettered_by, expect_rows)"
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
		" ON CONFLICT (route, consumer, key) DO UPDATE SET sql = excluded.sql,"
		" params = excluded.params, event_time = excluded.event_time,"
		" settings = excluded.settings, sqlstate = excluded.sqlstate,"
		" message = excluded.message, detail = excluded.detail, hint = excluded.hint,"
		" context = excluded.context, first_failed_at = excluded.first_failed_at,"
		" last_failed_at = excluded.last_failed_at, attempts = 1,"
		" dead_lettered_by = excluded.dead_lettered_by, status = 'pending',"
		" resolved_at = NULL, resolved_by = NULL, discard_reason = NULL,"
		" kind = excluded.kind, expect_rows = excluded.expect_rows"
		" WHERE d.status OPERATOR(pg_catalog.<>) 'pending'",
		14, {InvalidOid, TEXTOID, TEXTOID, TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID,
			TEXTARRAYOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, INT8OID}
	},
	[RK_DL_STATUS] = {
		"SELECT status FROM " STORAGE_SCHEMA ".routed_dead_letters"
		ROUTED_KEY_IS_ARGS,
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
	/* in the order of dead_letter_resolve.c's routed entries */
	[RK_DL_LOCK] = {
		"SELECT sql, params, settings, status, resolved_by, discard_reason,"
		" dead_lettered_by, kind OPERATOR(pg_catalog.=) 'effect', expect_rows"
		" FROM " STORAGE_SCHEMA ".routed_dead_letters"
		ROUTED_KEY_IS_ARGS
		" FOR NO KEY UPDATE",
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
	[RK_DL_FAILED_AGAIN] = {
		"UPDATE " STORAGE_SCHEMA ".routed_dead_letters"
		" SET attempts = attempts OPERATOR(pg_catalog.+) 1, last_failed_at = pg_catalog.now(),"
		" sqlstate = $4, message = $5, detail = $6, hint = $7, context = $8"
		ROUTED_KEY_IS_ARGS,
		8, {InvalidOid, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID}
	},
	[RK_DL_REPLAYED] = {
		"UPDATE " STORAGE_SCHEMA ".routed_dead_letters"
		" SET status = 'replayed', attempts = attempts OPERATOR(pg_catalog.+) 1,"
		" resolved_at = pg_catalog.now(), resolved_by = $4"
		ROUTED_KEY_IS_ARGS,
		4, {InvalidOid, TEXTOID, TEXTOID, TEXTOID}
	},
	[RK_DL_DISCARDED] = {
		"UPDATE " STORAGE_SCHEMA ".routed_dead_letters"
		" SET status = 'discarded', resolved_at = pg_catalog.now(), resolved_by = $4,"
		" discard_reason = $5"
		ROUTED_KEY_IS_ARGS,
		5, {InvalidOid, TEXTOID, TEXTOID, TEXTOID, TEXTOID}
	},
	/* a forget takes a resolved entry with its key, not an effect's */
	[RK_DL_DELETE_RESOLVED] = {
		"DELETE FROM " STORAGE_SCHEMA ".routed_dead_letters"
		ROUTED_KEY_IS_ARGS
		" AND status OPERATOR(pg_catalog.<>) 'pending'"
		" AND kind OPERATOR(pg_catalog.=) 'message'",
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
};

/* The statements of the purge, which take no route. */
typedef enum RoutedPurgeStmt
{
	RP_LATEST,
	RP_PURGE,
	RP_PURGE_ENTRIES,
	RP_NUM_STMTS
} RoutedPurgeStmt;

static const StorageStmt routed_purge_stmt_defs[RP_NUM_STMTS] = {
	/* every consumer's latest activity, or consumer $1's */
	[RP_LATEST] = {
		"SELECT consumer, pg_catalog.max(processed_at) FROM " STORAGE_SCHEMA ".routed_keys"
		" WHERE $1 IS NULL OR consumer OPERATOR(pg_catalog.=) $1"
		" GROUP BY consumer",
		1, {TEXTOID}
	},
	/*
	 * the keys older than the cutoffs $2 of the consumers $1, but for the
	 * keys of pending dead letters, whose messages a replay still applies
	 * (docs/retention.md); the entry and its key are in colocated shards,
	 * so Citus runs the anti-join on each shard
	 */
	[RP_PURGE] = {
		"DELETE FROM " STORAGE_SCHEMA ".routed_keys AS k"
		" WHERE k.processed_at OPERATOR(pg_catalog.<)"
		" COALESCE($2[pg_catalog.array_position($1, k.consumer)], 0)"
		" AND NOT EXISTS (SELECT FROM " STORAGE_SCHEMA ".routed_dead_letters AS d"
		" WHERE d.route OPERATOR(pg_catalog.=) k.route"
		" AND d.consumer OPERATOR(pg_catalog.=) k.consumer"
		" AND d.key OPERATOR(pg_catalog.=) k.key"
		" AND d.status OPERATOR(pg_catalog.=) 'pending')",
		2, {TEXTARRAYOID, INT4ARRAYOID}
	},
	/*
	 * the resolved entries of messages whose keys are gone: they expire
	 * with them (an effect's entry expires with its effect)
	 */
	[RP_PURGE_ENTRIES] = {
		"DELETE FROM " STORAGE_SCHEMA ".routed_dead_letters AS d"
		" WHERE d.status OPERATOR(pg_catalog.<>) 'pending'"
		" AND d.kind OPERATOR(pg_catalog.=) 'message'"
		" AND NOT EXISTS (SELECT FROM " STORAGE_SCHEMA ".routed_keys AS k"
		" WHERE k.route OPERATOR(pg_catalog.=) d.route"
		" AND k.consumer OPERATOR(pg_catalog.=) d.consumer"
		" AND k.key OPERATOR(pg_catalog.=) d.key)",
		0, {InvalidOid}
	},
};

static SPIPlanPtr routed_plans[RK_NUM_STMTS];
static StorageStmtSet routed_stmts = STORAGE_STMT_SET(routed_stmt_defs, routed_plans);
static SPIPlanPtr routed_purge_plans[RP_NUM_STMTS];
static StorageStmtSet routed_purge_stmts = STORAGE_STMT_SET(routed_purge_stmt_defs,
															routed_purge_plans);

/* the route type the plans were prepared for */
static Oid	routed_plans_type = InvalidOid;

/*
 * Runs statement stmt with the route of type route_type first, preparing
 * the statements again if the last call's route had another type.
 */
void
routed_execute(RoutedStmt stmt, Oid route_type, Datum *args, const char *nulls)
{
	routed_stmts_retype(&routed_stmts, routed_stmt_defs, &routed_plans_type, route_type);
	storage_stmt_run(&routed_stmts, stmt, args, nulls, 0);
}

static int32 citus_local_group(void);

/*
 * Refuses, before anything is written, routed business SQL on the Citus
 * coordinator run by another role than the owner of the key store.  The
 * key and any dead-letter entry are written as that owner and the business
 * SQL as business_role, and Citus refuses a transaction that writes one
 * group of colocated shards over the connections of two roles, with an
 * error that names neither.  In a function delegated to the shard's worker
 * both are local writes, which Citus allows.
 */
void
routed_refuse_two_roles(const char *function_name, const char *consumer,
						Oid business_role)
{
	Oid			owner = storage_locate()->owner;

	if (business_role == owner || citus_local_group() != 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("%s on the Citus coordinator runs business SQL only as the owner of the key store, role \"%s\"",
					function_name, GetUserNameFromId(owner, false)),
			 errdetail("The key of consumer \"%s\" would be written as \"%s\" and the business SQL run as \"%s\", and Citus refuses a transaction that writes colocated shards as two roles.",
					   consumer, GetUserNameFromId(owner, false),
					   GetUserNameFromId(business_role, false)),
			 errhint("Call it inside a function delegated to the shard's worker (create_distributed_function(..., force_delegation => true)), where any role with the grants may.")));
}

/*
 * Records (route, consumer, key) with the fingerprint, if any; returns
 * false if it was recorded already, and then fills *recorded.
 */
bool
routed_record_key(Datum route, Oid route_type, const char *consumer, text *key,
				  const int32 *fingerprint, RecordedKey *recorded)
{
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	Datum		value;

	args[0] = route;
	args[1] = CStringGetTextDatum(consumer);
	args[2] = PointerGetDatum(key);
	args[3] = fingerprint ? Int32GetDatum(*fingerprint) : (Datum) 0;
	nulls[3] = fingerprint ? ' ' : 'n';
	args[4] = Int32GetDatum(keystore_processed_at_now());
	routed_execute(RK_INSERT, route_type, args, nulls);
	if (SPI_processed == 1)
		return true;

	/*
	 * The key was there, committed before our insert (or before our
	 * snapshot, under REPEATABLE READ, or the insert would have failed): a
	 * plain read sees it.
	 */
	routed_execute(RK_PROBE, route_type, args, NULL);
	if (SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not read the routed key of consumer \"%s\" that a concurrent transaction recorded",
						consumer),
				 errhint("Retry the transaction.")));
	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	recorded->has_fingerprint = !isnull;
	recorded->fingerprint = isnull ? 0 : DatumGetInt32(value);
	recorded->processed_at = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
														 SPI_tuptable->tupdesc, 2,
														 &isnull));
	return false;
}

/* A key of a batch with fingerprints, its place in the batch and its route. */
typedef struct RoutedBatchKey
{
	Datum		route;			/* where keys are routed */
	text	   *key;
	int			place;
} RoutedBatchKey;

/*
 * Compares two keys of a routed batch by their routes, in the type's
 * order, then by the bytes of the keys.
 */
static int
routed_batch_key_cmp(const void *a, const void *b, void *arg)
{
	TypeCacheEntry *typentry = (TypeCacheEntry *) arg;
	const RoutedBatchKey *ka = (const RoutedBatchKey *) a;
	const RoutedBatchKey *kb = (const RoutedBatchKey *) b;
	int			cmp;
	int			la = VARSIZE_ANY_EXHDR(ka->key);
	int			lb = VARSIZE_ANY_EXHDR(kb->key);

	cmp = DatumGetInt32(FunctionCall2Coll(&typentry->cmp_proc_finfo,
										  typentry->typcollation,
										  ka->route, kb->route));
	if (cmp != 0)
		return cmp;
	cmp = memcmp(VARDATA_ANY(ka->key), VARDATA_ANY(kb->key), Min(la, lb));
	return cmp != 0 ? cmp : (la > lb) - (la < lb);
}

/*
 * Records a routed batch's keys under their routes, in the order that
 * keeps two batches from deadlocking over the whole cluster (batch.c's
 * header says why): sorted by route, then by the bytes of the key.  A key repeated
 * under one route is one message: only its first place is recorded, the
 * others are marked neither new nor reused.  Fills isnew and recorded by
 * the keys' places.
 */
void
routed_record_keys(const char *consumer, Datum *elems, Datum *routes,
					Oid route_type, int nkeys, const int32 *fingerprints,
					const bool *has_fingerprint, bool *isnew, bool *repeated,
					RecordedKey *recorded)
{
	TypeCacheEntry *typentry;
	RoutedBatchKey   *batch;

	typentry = lookup_type_cache(route_type, TYPECACHE_CMP_PROC_FINFO);
	if (!OidIsValid(typentry->cmp_proc_finfo.fn_oid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_FUNCTION),
				 errmsg("routes of type %s cannot be ordered", format_type_be(route_type)),
				 errhint("Pass the routes with the type of the distribution column.")));
	batch = palloc(nkeys * sizeof(RoutedBatchKey));
	for (int i = 0; i < nkeys; i++)
	{
		batch[i].route = routes[i];
		batch[i].key = DatumGetTextPP(elems[i]);
		batch[i].place = i;
	}
	qsort_arg(batch, nkeys, sizeof(RoutedBatchKey), routed_batch_key_cmp, typentry);

	for (int i = 0; i < nkeys; i++)
	{
		int			place = batch[i].place;

		CHECK_FOR_INTERRUPTS();
		repeated[place] = i > 0 &&
			routed_batch_key_cmp(&batch[i - 1], &batch[i], typentry) == 0;
		if (repeated[place])
			continue;
		isnew[place] = routed_record_key(batch[i].route, route_type, consumer,
										 batch[i].key,
										 has_fingerprint[place] ? &fingerprints[place] : NULL,
										 &recorded[place]);
	}
}

/*
 * Whether (route, consumer, key) is recorded and visible to the current
 * transaction.
 */
bool
routed_key_exists(Datum route, Oid route_type, const char *consumer, text *key)
{
	Datum		args[3] = {route, CStringGetTextDatum(consumer), PointerGetDatum(key)};

	routed_execute(RK_PROBE, route_type, args, NULL);
	return SPI_processed > 0;
}

/*
 * Removes (route, consumer, key) and its resolved dead-letter entry;
 * returns whether the key was recorded.  Refuses while the entry is
 * pending, for the reason keystore_forget_key() gives.
 */
bool
routed_forget_key(Datum route, Oid route_type, const char *consumer, text *key)
{
	Datum		args[3] = {route, CStringGetTextDatum(consumer), PointerGetDatum(key)};

	routed_execute(RK_DL_DELETE_RESOLVED, route_type, args, NULL);
	if (SPI_processed == 0)
	{
		routed_execute(RK_DL_STATUS, route_type, args, NULL);
		if (SPI_processed > 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("cannot forget a key whose message is dead-lettered"),
					 errdetail("The dead-letter entry of key \"%s\" of consumer \"%s\" is pending.",
							   text_to_cstring(key), consumer),
					 errhint("Replay the entry with idem_dlq_replay(key, consumer, route) or discard it with idem_dlq_discard(key, consumer, reason, route) first.")));
	}
	routed_execute(RK_FORGET, route_type, args, NULL);
	return SPI_processed > 0;
}

/*
 * The Citus group of this node: 0 on the coordinator, -1 without Citus.
 */
static int32
citus_local_group(void)
{
	bool		isnull;
	Datum		group;

	if (!OidIsValid(get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE)))
		return -1;
	if (SPI_execute("SELECT groupid FROM pg_catalog.pg_dist_local_group", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read pg_dist_local_group");
	if (SPI_processed != 1)
		return -1;
	group = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? -1 : DatumGetInt32(group);
}

/*
 * Whether this node purges the routed keys: on Citus, only the coordinator,
 * whose consumers' windows decide, so that nodes with other settings do
 * not each purge by their own; without Citus, this server.
 */
static bool
routed_purge_here(void)
{
	return citus_local_group() <= 0;
}

/*
 * Removes the routed keys that have expired by the rule of retention.c (a
 * key older than its consumer's window counted back from that consumer's
 * latest routed key, cutoffs from routed_purge_cutoffs), of one consumer
 * or of all (consumer NULL); returns how many.  Two scans of the routed
 * keys, which Citus runs on every shard at once: one for the latest
 * activity of each consumer, one that deletes, so a purge costs in
 * proportion to the keys stored, not to the keys it removes.  The routed
 * effects expire by the same rule (effects_purge_routed).
 */
uint64
routed_purge(const char *consumer)
{
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	RetentionWindows *windows;
	uint64		removed = 0;

	if (!OidIsValid(routed_keys_relid()) || !routed_purge_here())
		return 0;

	/* first: it reads a table, and the cutoffs read RP_LATEST's result */
	windows = retention_windows_load();
	args[0] = consumer ? CStringGetTextDatum(consumer) : (Datum) 0;
	nulls[0] = consumer ? ' ' : 'n';
	storage_stmt_run(&routed_purge_stmts, RP_LATEST, args, nulls, 0);
	if (routed_purge_cutoffs(windows, args))
	{
		storage_stmt_run(&routed_purge_stmts, RP_PURGE, args, NULL, 0);
		removed = SPI_processed;
		if (removed > 0)
			storage_stmt_run(&routed_purge_stmts, RP_PURGE_ENTRIES, NULL, NULL, 0);
	}
	(void) effects_purge_routed(consumer, windows);
	return removed;
}
