/*-------------------------------------------------------------------------
 *
 * routing.c
 *	  Whether the keys of this database are routed, for Citus: whether
 *	  idem_consumer.routed_keys exists, as each backend last looked it up
 *	  (forgotten when any session creates, drops or renames a table), and
 *	  the type of its route; the refusal of calls that would record or
 *	  look up a key, or act on an effect, without its route once keys are
 *	  routed (key_place_resolve.c resolves every call's place through
 *	  it); the route
 *	  arguments of the calls; and what the routed keys (routed.c) and the
 *	  routed effects (effects_store_sql.c) share: the route type of their
 *	  statements and the cutoffs of their purge.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/routing.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "parser/parse_coerce.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

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
 * Raises an error if keys are routed in this database: a key, or the
 * effect of effect_function (NULL: a key), without its route would be
 * stored or looked up apart from the business rows it protects.  Every
 * call without a route is resolved through it (key_place_resolve.c),
 * and every entry of the key store that records, looks up or forgets a
 * key calls it too.
 */
void
routed_refuse_unrouted(const char *effect_function)
{
	if (!OidIsValid(routed_keys_relid()))
		return;
	if (effect_function != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s cannot act on an effect without its route: the keys of this database are routed",
						effect_function),
				 errdetail("idem_citus_distribute() made effects live beside the business rows of their route."),
				 errhint("Pass route => the business row's distribution column value.")));
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
