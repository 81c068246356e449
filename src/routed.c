/*-------------------------------------------------------------------------
 *
 * routed.c
 *	  Routed keys, for Citus: keys stored with a route, the value of the
 *	  distribution column of the business row they protect, in
 *	  idem_consumer.routed_keys, which idem_citus_distribute() (SQL) makes
 *	  and distributes colocated with the business table.  Owns recording,
 *	  probing, forgetting and purging routed keys, the statements on the
 *	  routed dead letters (idem_consumer.routed_dead_letters, keyed like
 *	  the keys, used by dead_letter.c and dead_letter_resolve.c), and the
 *	  refusal of calls that would record or look up a key without its
 *	  route once keys are routed.
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
 * Whether keys are routed, as this backend last looked it up: every key
 * call asks, and two catalog lookups a call would be a visible part of the
 * cost of idem_apply for a duplicate.  The table appears at
 * idem_citus_distribute() and goes with DROP TABLE or DROP EXTENSION, none
 * of which invalidates the storage tables, so what is kept is forgotten at
 * any change of a relation's name or namespace in this database, by any
 * session (routed_relation_names_changed).
 */
static bool routed_keys_known = false;
static Oid	routed_keys_found = InvalidOid;

/*
 * Forgets whether keys are routed; called for every invalidation of
 * pg_class by name, a table created, dropped or renamed, in any session
 * (and for a reset of the caches, whose hash value is 0).
 */
static void
routed_relation_names_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	routed_keys_known = false;
}

/*
 * Registers the invalidation callback; called once from _PG_init.
 */
void
routed_init(void)
{
	CacheRegisterSyscacheCallback(RELNAMENSP, routed_relation_names_changed,
								  (Datum) 0);
}

/*
 * The routed keys' table, or InvalidOid if keys are not routed in this
 * database.
 */
Oid
routed_keys_relid(void)
{
	if (!routed_keys_known)
	{
		Oid			nspid;

		/*
		 * Known from before the lookup: an invalidation it accepts clears
		 * the flag again, so that the next call looks once more.
		 */
		routed_keys_known = true;
		nspid = get_namespace_oid(STORAGE_SCHEMA, true);
		routed_keys_found = OidIsValid(nspid) ?
			get_relname_relid("routed_keys", nspid) : InvalidOid;
	}
	return routed_keys_found;
}

/*
 * The type of the route column of the routed keys' table relid.
 */
static Oid
route_column_type(Oid relid)
{
	return get_atttype(relid, get_attnum(relid, "route"));
}

/*
 * The type of the routes of this database, or InvalidOid if keys are not
 * routed.
 */
Oid
routed_route_type(void)
{
	Oid			relid = routed_keys_relid();

	return OidIsValid(relid) ? route_column_type(relid) : InvalidOid;
}

/*
 * Raises an error if keys are routed in this database.  Every entry of the
 * key store that records, looks up or forgets a key without its route
 * calls it.
 */
void
routed_refuse_unrouted(void)
{
	if (OidIsValid(routed_keys_relid()))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("a key cannot be recorded, looked up or forgotten without its route: the keys of this database are routed"),
				 errdetail("idem_citus_distribute() made the keys live beside the business rows they protect; a key without its route would be recorded or looked up apart from them."),
				 errhint("Pass route => the business row's distribution column value.")));
}

/*
 * Returns the route value of argument argno, of type argtype, as a value
 * of the type of the route column of the routed keys' table relid, whose
 * type is set in *route_type.  An untyped literal ('42') is read by the
 * input function of that type; a value of another type must be one the
 * column takes by assignment, and is passed as it is, converted by the
 * statements that store it.
 */
static Datum
route_value(Oid relid, Datum value, Oid argtype, bool is_array, Oid *route_type)
{
	Oid			column_type = route_column_type(relid);
	Oid			wanted = is_array ? get_array_type(column_type) : column_type;
	Oid			input;
	Oid			ioparam;

	if (argtype == UNKNOWNOID)
	{
		getTypeInputInfo(wanted, &input, &ioparam);
		*route_type = wanted;
		return OidInputFunctionCall(input, DatumGetCString(value), ioparam, -1);
	}
	if (is_array)
		argtype = OidIsValid(argtype) ? get_element_type(argtype) : InvalidOid;
	if (!OidIsValid(argtype) ||
		!can_coerce_type(1, &argtype, &column_type, COERCION_ASSIGNMENT))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s of type %s cannot be stored as the keys' route, of type %s",
						is_array ? "routes" : "route",
						OidIsValid(argtype) ? format_type_be(argtype) : "unknown",
						format_type_be(column_type)),
				 is_array ?
				 errhint("Pass an array of the business rows' distribution column values with their type, for example routes => ARRAY[42]::%s[].",
						 format_type_be(column_type)) :
				 errhint("Pass the business row's distribution column value with its type, for example route => 42::%s.",
						 format_type_be(column_type))));
	*route_type = is_array ? get_array_type(argtype) : argtype;
	return value;
}

/*
 * Reads the route argument at argno, the last of the function's: fills
 * *route and *route_type and returns true when the call gives a route and
 * keys are routed in this database.  Returns false for a call without one
 * (NULL, or a database whose function has no route yet), which the
 * caller's key store refuses where keys are routed, and for a route given
 * where keys are not routed: it is not needed then, and ignored, so that
 * the same consumer runs on one server and on Citus.  A route of a type
 * that cannot be stored in the route column is refused.
 */
bool
routed_get_route_arg(FunctionCallInfo fcinfo, int argno, Datum *route, Oid *route_type)
{
	Oid			relid;

	if (argno >= PG_NARGS() || PG_ARGISNULL(argno))
		return false;
	relid = routed_keys_relid();
	if (!OidIsValid(relid))
		return false;
	*route = route_value(relid, PG_GETARG_DATUM(argno),
						 get_fn_expr_argtype(fcinfo->flinfo, argno), false,
						 route_type);
	return true;
}

/*
 * Reads the routes argument of a batch at argno, one route per key of the
 * nkeys: fills *routes and *route_type and returns true when the call
 * gives routes and keys are routed in this database, returns false when
 * it gives none (NULL) or they are not routed (the routes are then not
 * needed, and ignored).  Routes that are not an array of one per key, or
 * a NULL route, are refused either way; routes of a type that cannot be
 * stored in the route column where keys are routed.
 */
bool
routed_get_routes_arg(FunctionCallInfo fcinfo, int argno, int nkeys, Datum **routes,
					  Oid *route_type)
{
	Oid			relid = routed_keys_relid();
	Oid			argtype;
	Datum		value;
	ArrayType  *array;
	Oid			elemtype;
	int16		typlen;
	bool		typbyval;
	char		typalign;
	bool	   *nulls;
	int			nroutes = 0;

	if (argno >= PG_NARGS() || PG_ARGISNULL(argno))
		return false;
	argtype = get_fn_expr_argtype(fcinfo->flinfo, argno);
	value = PG_GETARG_DATUM(argno);
	if (argtype != UNKNOWNOID &&
		(!OidIsValid(argtype) || !OidIsValid(get_element_type(argtype))))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("routes must be an array"),
				 errdetail("The routes given are of type %s.",
						   OidIsValid(argtype) ? format_type_be(argtype) : "unknown"),
				 errhint("Pass the distribution column value of each key's business row, in the order of the keys.")));
	if (OidIsValid(relid))
		value = route_value(relid, value, argtype, true, &argtype);
	else if (argtype == UNKNOWNOID)
		/* read as text only to count and check them */
		value = OidInputFunctionCall(F_ARRAY_IN, DatumGetCString(value), TEXTOID, -1);
	array = DatumGetArrayTypeP(value);
	elemtype = ARR_ELEMTYPE(array);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("routes must be a one-dimensional array"),
				 errdetail("The array has %d dimensions.", ARR_NDIM(array))));
	*routes = NULL;
	if (ARR_NDIM(array) == 1)
	{
		get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
		deconstruct_array(array, elemtype, typlen, typbyval, typalign,
						  routes, &nulls, &nroutes);
	}
	if (nroutes != nkeys)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("routes must have one element per key"),
				 errdetail("keys has %d elements, routes %d.", nkeys, nroutes)));
	for (int i = 0; i < nroutes; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("route must not be null"),
					 errdetail("Element %d of routes is null.", ARR_LBOUND(array)[0] + i)));

	if (!OidIsValid(relid))
		return false;
	*route_type = elemtype;
	return true;
}

/*
 * Makes the statements of a set whose first argument is a route (defs,
 * the set's own texts) take a route of type route_type, forgetting their
 * plans if they were prepared for another type (*plans_type).
 */
void
routed_stmts_retype(StorageStmtSet *set, StorageStmt *defs, Oid *plans_type,
					Oid route_type)
{
	storage_stmts_current(set);
	if (route_type == *plans_type)
		return;
	for (int i = 0; i < set->nstmts; i++)
	{
		if (set->plans[i] != NULL)
			SPI_freeplan(set->plans[i]);
		set->plans[i] = NULL;
		defs[i].argtypes[0] = route_type;
	}
	*plans_type = route_type;
}

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
 * Reads the latest activity of consumers, the rows (name, latest) of the
 * last storage statement's result, latest an int4 of seconds
 * (processed_at) or a timestamptz, and sets args[0] to the names of the
 * consumers with something older than their window by the rule of
 * retention.c, args[1] to their cutoffs, of latest's type; returns false
 * when no consumer has.  Consumers take their windows from this node's
 * settings: one not registered here follows idem_consumer.retention.
 * Serves the routed keys and the routed effects alike.
 */
bool
routed_purge_cutoffs(RetentionWindows *windows, Datum *args)
{
	SPITupleTable *latest = SPI_tuptable;
	uint64		nconsumers = SPI_processed;
	bool		in_seconds = SPI_gettypeid(latest->tupdesc, 2) == INT4OID;
	Datum	   *names = palloc(sizeof(Datum) * Max(nconsumers, 1));
	Datum	   *cutoffs = palloc(sizeof(Datum) * Max(nconsumers, 1));
	int			n = 0;

	for (uint64 i = 0; i < nconsumers; i++)
	{
		bool		isnull;
		char	   *name = TextDatumGetCString(SPI_getbinval(latest->vals[i],
															 latest->tupdesc, 1, &isnull));
		Datum		last = SPI_getbinval(latest->vals[i], latest->tupdesc, 2, &isnull);
		int32		cutoff = retention_cutoff(windows,
											  keystore_consumer_id(name, false),
											  in_seconds ? DatumGetInt32(last) :
											  (int32) (DatumGetTimestampTz(last) / USECS_PER_SEC));

		if (cutoff <= 0)
			continue;
		names[n] = CStringGetTextDatum(name);
		cutoffs[n] = in_seconds ? Int32GetDatum(cutoff) :
			TimestampTzGetDatum((TimestampTz) cutoff * USECS_PER_SEC);
		n++;
	}
	if (n == 0)
		return false;
	args[0] = PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
	args[1] = PointerGetDatum(in_seconds ?
							  construct_array(cutoffs, n, INT4OID, sizeof(int32), true,
											  TYPALIGN_INT) :
							  construct_array(cutoffs, n, TIMESTAMPTZOID, sizeof(TimestampTz),
											  FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
	return true;
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
