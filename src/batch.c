/*-------------------------------------------------------------------------
 *
 * batch.c
 *	  The SQL-callable idem_record_batch(): records a batch of keys in one
 *	  call and returns those that were new, so that a consumer applies a
 *	  whole batch of messages in one statement.
 *
 * The guarantees are idem_apply()'s: the keys are recorded in the caller's
 * transaction, a key recorded by a concurrent transaction is waited for
 * (READ COMMITTED) or raises a serialization failure (REPEATABLE READ and
 * above), and nothing is recorded when the arguments are bad.  A key that
 * occurs several times in the batch is one message and is returned once.
 *
 * The common cases are set-based: one insert for the whole batch (see
 * keystore.c for why batches cannot deadlock each other), then, only if
 * some keys were not inserted, one statement that finds which of those are
 * not simply recorded already.  Only such keys, hash collisions in
 * practice, go through the per-key path of idem_apply().
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "idem_consumer.h"

PG_FUNCTION_INFO_V1(idem_record_batch);

/*
 * Returns the keys argument, or NULL for an empty batch, after checking
 * every element the way idem_apply() checks its key.
 */
static ArrayType *
get_keys_arg(FunctionCallInfo fcinfo, int argno, int *nkeys)
{
	ArrayType  *keys;
	Datum	   *elems;
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
					  &elems, &nulls, &nelems);
	for (int i = 0; i < nelems; i++)
	{
		int			len;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("key must not be null"),
					 errdetail("Element %d of keys is null.", lbound + i)));
		len = VARSIZE_ANY_EXHDR(DatumGetPointer(elems[i]));
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
	pfree(elems);
	pfree(nulls);

	*nkeys = nelems;
	return keys;
}

/*
 * Appends one key to the function's result.
 */
static inline void
return_key(ReturnSetInfo *rsinfo, Datum key)
{
	bool		isnull = false;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &key, &isnull);
}

/*
 * idem_record_batch(consumer, keys): records every key of the batch for
 * consumer; returns the keys that were not recorded before, each once.
 */
Datum
idem_record_batch(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *consumer;
	ArrayType  *keys;
	int			nkeys;
	int32		consumer_id;
	uint64		ninserted;
	Datum	   *inserted;

	consumer = text_to_cstring(idem_name_arg(fcinfo, 0, "consumer",
											 IDEM_MAX_CONSUMER_BYTES));
	keys = get_keys_arg(fcinfo, 1, &nkeys);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (keys == NULL)
		return (Datum) 0;

	SPI_connect();

	consumer_id = keystore_consumer_id(consumer, true);

	ninserted = keystore_insert_batch(consumer_id, keys);
	inserted = palloc(Max(ninserted, 1) * sizeof(Datum));
	for (uint64 i = 0; i < ninserted; i++)
	{
		bool		isnull;

		inserted[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									1, &isnull);
		return_key(rsinfo, inserted[i]);
	}

	/* some keys were repeated, recorded already, or collide */
	if (ninserted < nkeys)
	{
		ArrayType  *inserted_array;
		uint64		nunresolved;
		text	  **unresolved;

		inserted_array = construct_array(inserted, (int) ninserted, TEXTOID,
										 -1, false, TYPALIGN_INT);
		nunresolved = keystore_unresolved_batch(consumer_id, keys, inserted_array);

		/* copied: keystore_record_key runs statements of its own */
		unresolved = palloc(Max(nunresolved, 1) * sizeof(text *));
		for (uint64 i = 0; i < nunresolved; i++)
		{
			bool		isnull;

			unresolved[i] = DatumGetTextPCopy(SPI_getbinval(SPI_tuptable->vals[i],
															SPI_tuptable->tupdesc,
															1, &isnull));
		}
		for (uint64 i = 0; i < nunresolved; i++)
		{
			if (keystore_record_key(consumer_id, unresolved[i]))
				return_key(rsinfo, PointerGetDatum(unresolved[i]));
		}
	}

	SPI_finish();

	return (Datum) 0;
}
