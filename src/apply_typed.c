/*-------------------------------------------------------------------------
 *
 * apply_typed.c
 *	  idem_apply_v(), idem_try_apply_v(), idem_apply_rows_v() and
 *	  idem_try_apply_rows_v(): idem_apply(), idem_try_apply() and their
 *	  rows forms with parameters passed as values of their own types.
 *
 * Drivers that bind every value with its type (psycopg, JDBC) cannot pass
 * one text[] of mixed values.  These functions take VARIADIC "any", write
 * each value with its type's output function and hand the text array to
 * idem_apply() or idem_try_apply(), so that the apply itself, privileges,
 * in-flight checks, counters, dead letters and the (typed) fingerprint are
 * theirs, unchanged.  The business SQL converts the text into the types of
 * its parameters, as for the text[] form: a value's output is read back by
 * its type's input in the same session, and a parked message is replayed
 * under the TimeZone, DateStyle and IntervalStyle it was parked with, so
 * the values bound are the values given.  (Floating-point values lose
 * digits only in a session that sets extra_float_digits below 1.)
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/apply_typed.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "idem_consumer.h"

PG_FUNCTION_INFO_V1(idem_apply_v);
PG_FUNCTION_INFO_V1(idem_try_apply_v);
PG_FUNCTION_INFO_V1(idem_apply_rows_v);
PG_FUNCTION_INFO_V1(idem_try_apply_rows_v);

/* the text[] forms, apply.c and dead_letter.c */
extern PGDLLEXPORT Datum idem_apply(PG_FUNCTION_ARGS);
extern PGDLLEXPORT Datum idem_try_apply(PG_FUNCTION_ARGS);
extern PGDLLEXPORT Datum idem_apply_rows(PG_FUNCTION_ARGS);
extern PGDLLEXPORT Datum idem_try_apply_rows(PG_FUNCTION_ARGS);

/*
 * Returns the variadic arguments from argno on as a text array of their
 * output, NULL elements for NULL values; NULL when there are none.
 */
static ArrayType *
variadic_params_as_text(FunctionCallInfo fcinfo, int argno)
{
	int			nparams;
	Datum	   *elems;
	bool	   *nulls;
	int			dims[1];
	int			lbs[1] = {1};

	if (get_fn_expr_variadic(fcinfo->flinfo))
	{
		/* VARIADIC ARRAY[...]: one array argument holds the values */
		Oid			arraytype = get_fn_expr_argtype(fcinfo->flinfo, argno);
		Oid			elemtype = get_base_element_type(arraytype);
		ArrayType  *array;
		int16		typlen;
		bool		typbyval;
		char		typalign;
		Oid			outfunc;
		bool		isvarlena;
		Datum	   *values;

		if (PG_ARGISNULL(argno))
			return NULL;
		if (!OidIsValid(elemtype))
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("VARIADIC argument must be an array")));
		array = PG_GETARG_ARRAYTYPE_P(argno);
		business_params_check(array);
		get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
		deconstruct_array(array, elemtype, typlen, typbyval, typalign,
						  &values, &nulls, &nparams);
		if (nparams == 0)
			return NULL;
		getTypeOutputInfo(elemtype, &outfunc, &isvarlena);
		elems = palloc(nparams * sizeof(Datum));
		for (int i = 0; i < nparams; i++)
			elems[i] = nulls[i] ? (Datum) 0 :
				CStringGetTextDatum(OidOutputFunctionCall(outfunc, values[i]));
	}
	else
	{
		nparams = PG_NARGS() - argno;
		if (nparams <= 0)
			return NULL;
		elems = palloc(nparams * sizeof(Datum));
		nulls = palloc(nparams * sizeof(bool));
		for (int i = 0; i < nparams; i++)
		{
			Oid			argtype = get_fn_expr_argtype(fcinfo->flinfo, argno + i);
			Oid			outfunc;
			bool		isvarlena;

			nulls[i] = PG_ARGISNULL(argno + i);
			if (nulls[i])
				continue;
			if (!OidIsValid(argtype))
				ereport(ERROR,
						(errcode(ERRCODE_INDETERMINATE_DATATYPE),
						 errmsg("could not determine the type of parameter $%d", i + 1)));
			/* an unknown literal is a C string: its text is the value */
			if (argtype == UNKNOWNOID)
			{
				elems[i] = CStringGetTextDatum(PG_GETARG_POINTER(argno + i));
				continue;
			}
			getTypeOutputInfo(argtype, &outfunc, &isvarlena);
			elems[i] = CStringGetTextDatum(OidOutputFunctionCall(outfunc,
																 PG_GETARG_DATUM(argno + i)));
		}
	}
	dims[0] = nparams;
	return construct_md_array(elems, nulls, 1, dims, lbs, TEXTOID, -1, false,
							  TYPALIGN_INT);
}

/*
 * Calls a text[] form with the first three arguments of fcinfo, the
 * variadic values as text, and no event time: idem_apply or idem_try_apply
 * (five arguments) when rows_form is false; else idem_apply_rows or
 * idem_try_apply_rows (seven arguments) with fcinfo's fourth argument as
 * expect_rows and the values after it.  The callee shares fcinfo's flinfo,
 * so its result type (the rows form's record) and its per-call-site caches
 * are those of the typed function.
 */
static Datum
call_text_form(PGFunction form, bool rows_form, FunctionCallInfo fcinfo)
{
	LOCAL_FCINFO(inner, 7);
	int			params_argno = rows_form ? 4 : 3;
	ArrayType  *params = variadic_params_as_text(fcinfo, params_argno);
	int			nargs = rows_form ? 7 : 5;
	Datum		result;

	InitFunctionCallInfoData(*inner, fcinfo->flinfo, nargs, InvalidOid,
							 NULL, NULL);
	for (int i = 0; i < 3; i++)
	{
		inner->args[i].value = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		inner->args[i].isnull = PG_ARGISNULL(i);
	}
	inner->args[3].value = PointerGetDatum(params);
	inner->args[3].isnull = params == NULL;
	if (rows_form)
	{
		inner->args[4].value = PG_ARGISNULL(3) ? (Datum) 0 : PG_GETARG_DATUM(3);
		inner->args[4].isnull = PG_ARGISNULL(3);
		for (int i = 5; i < nargs; i++)
		{
			/* no event time, no fingerprint of the caller's */
			inner->args[i].value = (Datum) 0;
			inner->args[i].isnull = true;
		}
	}
	else
	{
		inner->args[4].value = (Datum) 0;
		inner->args[4].isnull = true;
	}
	result = form(inner);
	if (inner->isnull)
		PG_RETURN_NULL();
	return result;
}

/*
 * idem_apply_v(key, consumer, sql, VARIADIC params "any"): idem_apply()
 * with typed parameter values.
 */
Datum
idem_apply_v(PG_FUNCTION_ARGS)
{
	return call_text_form(idem_apply, false, fcinfo);
}

/*
 * idem_try_apply_v(key, consumer, sql, VARIADIC params "any"):
 * idem_try_apply() with typed parameter values.
 */
Datum
idem_try_apply_v(PG_FUNCTION_ARGS)
{
	return call_text_form(idem_try_apply, false, fcinfo);
}

/*
 * idem_apply_rows_v(key, consumer, sql, expect_rows, VARIADIC params
 * "any"): idem_apply_rows() with typed parameter values.
 */
Datum
idem_apply_rows_v(PG_FUNCTION_ARGS)
{
	return call_text_form(idem_apply_rows, true, fcinfo);
}

/*
 * idem_try_apply_rows_v(key, consumer, sql, expect_rows, VARIADIC params
 * "any"): idem_try_apply_rows() with typed parameter values.
 */
Datum
idem_try_apply_rows_v(PG_FUNCTION_ARGS)
{
	return call_text_form(idem_try_apply_rows, true, fcinfo);
}
