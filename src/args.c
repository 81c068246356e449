/*-------------------------------------------------------------------------
 *
 * args.c
 *	  Validators of the arguments of the SQL-callable functions: keys and
 *	  batches of keys, consumer names, business SQL text, counts,
 *	  dead-letter ids, the durations, fences and flags of external
 *	  effects, retention windows, owners.  (The arguments of a message
 *	  are apply.c's get_message_args.)
 *
 * Every API function checks its arguments with these before it records or
 * changes anything, so that a bad call leaves nothing behind and the same
 * mistake gets the same SQLSTATE and message whichever function it was
 * made in.  They read only the call's arguments.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/args.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"
#include "duration.h"

/* Longest retention window accepted; NULL is how to keep keys forever. */
#define MAX_RETENTION			"100 years"

/*
 * Returns a non-null, non-empty text argument no longer than max_bytes.
 */
text *
get_name_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
			 int max_bytes)
{
	text	   *value;
	int			len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));

	value = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(value);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", argname)));
	if (len > max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", argname),
				 errdetail("The %s is %d bytes long; the limit is %d bytes.",
						   argname, len, max_bytes)));
	return value;
}

/*
 * Returns a non-null integer argument of at least 1: a count or a size.
 */
int32
get_count_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	int32		value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	value = PG_GETARG_INT32(argno);
	if (value < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at least 1", argname),
				 errdetail("The value given is %d.", value)));
	return value;
}

/*
 * Returns the key argument.
 */
text *
get_key_arg(FunctionCallInfo fcinfo, int argno)
{
	return get_name_arg(fcinfo, argno, "key", IDEM_MAX_KEY_BYTES);
}

/*
 * Returns the consumer argument as a C string.
 */
char *
get_consumer_arg(FunctionCallInfo fcinfo, int argno)
{
	return text_to_cstring(get_name_arg(fcinfo, argno, "consumer",
										 IDEM_MAX_CONSUMER_BYTES));
}

/*
 * Returns the sql argument as a C string.
 */
char *
get_sql_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *sql;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("sql must not be null")));
	sql = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (sql[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sql must not be empty")));
	return sql;
}

/*
 * Returns the keys argument, or NULL for an empty batch, after checking
 * every element the way idem_apply() checks its key; sets *elems to the
 * elements.
 */
ArrayType *
get_keys_arg(FunctionCallInfo fcinfo, int argno, Datum **elems, int *nkeys)
{
	ArrayType  *keys;
	bool	   *nulls;
	int			nelems;
	int			lbound;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("keys must not be null"),
				 errhint("Pass an empty array for an empty batch.")));

	keys = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(keys) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("keys must be a one-dimensional array"),
				 errdetail("The array has %d dimensions.", ARR_NDIM(keys))));
	if (ARR_NDIM(keys) == 0)
	{
		*nkeys = 0;
		return NULL;
	}

	lbound = ARR_LBOUND(keys)[0];
	deconstruct_array(keys, TEXTOID, -1, false, TYPALIGN_INT,
					  elems, &nulls, &nelems);
	for (int i = 0; i < nelems; i++)
	{
		int			len;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("key must not be null"),
					 errdetail("Element %d of keys is null.", lbound + i)));
		len = VARSIZE_ANY_EXHDR(DatumGetPointer((*elems)[i]));
		if (len == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("key must not be empty"),
					 errdetail("Element %d of keys is empty.", lbound + i)));
		if (len > IDEM_MAX_KEY_BYTES)
			ereport(ERROR,
					(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
					 errmsg("key is too long"),
					 errdetail("Element %d of keys is %d bytes long; the limit is %d bytes.",
							   lbound + i, len, IDEM_MAX_KEY_BYTES)));
	}
	pfree(nulls);

	*nkeys = nelems;
	return keys;
}

/*
 * Returns the fingerprints of a batch's messages, aligned with its nkeys
 * keys: fingerprints[i] and has_fingerprint[i] for keys[i]; a NULL array
 * or element is no fingerprint.
 */
void
get_fingerprints_arg(FunctionCallInfo fcinfo, int argno, int nkeys,
					 int32 *fingerprints, bool *has_fingerprint)
{
	ArrayType  *array;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;

	memset(has_fingerprint, 0, nkeys * sizeof(bool));
	if (PG_ARGISNULL(argno))
		return;
	array = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("fingerprints must be a one-dimensional array"),
				 errdetail("The array has %d dimensions.", ARR_NDIM(array))));
	nelems = ARR_NDIM(array) == 0 ? 0 : ARR_DIMS(array)[0];
	if (nelems != nkeys)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("fingerprints must have one element per key"),
				 errdetail("There are %d keys and %d fingerprints.", nkeys, nelems)));
	if (nelems == 0)
		return;
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &nelems);
	for (int i = 0; i < nelems; i++)
	{
		if (nulls[i])
			continue;
		fingerprints[i] = fingerprint_of_text(DatumGetTextPP(elems[i]));
		has_fingerprint[i] = true;
	}
}

/*
 * Returns the dead-letter entry id argument.
 */
int64
get_id_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id must not be null")));
	return PG_GETARG_INT64(argno);
}

/*
 * Returns a duration argument (a lease, an extension, a delay) in
 * microseconds: not null, positive, at most max_us (MAX_LEASE_US or
 * MAX_DELAY_US), however far beyond it the interval goes.
 */
int64
get_duration_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
				 int64 max_us)
{
	Interval   *value;
	int64		us;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	value = PG_GETARG_INTERVAL_P(argno);
	us = interval_to_us(value);
	if (us > max_us)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s is too long", argname),
				 errdetail("The limit is %s.", max_us == MAX_LEASE_US ? "1 day" : "30 days")));
	if (us <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be positive", argname),
				 errdetail("The value given is %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   PointerGetDatum(value))))));
	return us;
}

/*
 * Returns the fence argument: not null, at least 1.
 */
int64
get_fence_arg(FunctionCallInfo fcinfo, int argno)
{
	int64		fence;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fence must not be null")));
	fence = PG_GETARG_INT64(argno);
	if (fence < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fence must be at least 1"),
				 errdetail("The value given is %lld; fences come from idem_effect_begin or idem_effect_claim.",
						   (long long) fence)));
	return fence;
}

/*
 * Returns a boolean argument that must not be null.
 */
bool
get_bool_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	return PG_GETARG_BOOL(argno);
}

/*
 * Raises an error unless retention is a positive interval of at most
 * MAX_RETENTION.
 */
void
check_retention_arg(Interval *retention)
{
	Datum		max_retention;

	if (retention->month < 0 || retention->day < 0 || retention->time < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retention must be a positive interval"),
				 errdetail("No field of the interval may be negative, and \"%s\" has one.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(retention))))));
	if (retention->month == 0 && retention->day == 0 && retention->time == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retention must be a positive interval"),
				 errhint("Use NULL to keep the consumer's keys forever.")));

	max_retention = DirectFunctionCall3(interval_in, CStringGetDatum(MAX_RETENTION),
										ObjectIdGetDatum(InvalidOid), Int32GetDatum(-1));
	if (DatumGetInt32(DirectFunctionCall2(interval_cmp, IntervalPGetDatum(retention),
										  max_retention)) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retention must be at most %s", MAX_RETENTION),
				 errhint("Use NULL to keep the consumer's keys forever.")));
}

/*
 * Returns a role argument, the current role when NULL.
 */
Oid
get_role_arg(FunctionCallInfo fcinfo, int argno, bool null_is_current)
{
	if (PG_ARGISNULL(argno))
	{
		if (null_is_current)
			return GetUserId();
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("owner must not be null")));
	}
	return PG_GETARG_OID(argno);
}
