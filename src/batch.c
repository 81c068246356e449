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
 * All keys are recorded within this one call, in the order of the unique
 * index whatever their order in the array: that order is why two batches
 * cannot deadlock each other (see KS_INSERT_BATCH in keystore.c).  Through
 * keystore.c's fast path each key costs an index probe, and a new key a
 * speculative insertion, with no SQL statement per key.  When the storage
 * does not allow the fast path, the work is set-based SQL: one insert for
 * the whole batch, then, only if some keys were not inserted, one
 * statement that finds which of those are not simply recorded already.
 * Only such keys, hash collisions in practice, go through the per-key path
 * of idem_apply().
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
 * every element the way idem_apply() checks its key; sets *elems to the
 * elements.
 */
static ArrayType *
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
 * Appends one key to the function's result.
 */
static inline void
return_key(ReturnSetInfo *rsinfo, Datum key)
{
	bool		isnull = false;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &key, &isnull);
}

/*
 * Records a batch through keystore.c's fast path and returns the new keys;
 * returns -1, doing nothing, when the fast path cannot be used.
 */
static int64
record_batch_fast(ReturnSetInfo *rsinfo, int32 consumer_id,
				  Datum *elems, int nkeys)
{
	text	  **key_texts = palloc(nkeys * sizeof(text *));
	bool	   *isnew = palloc(nkeys * sizeof(bool));
	int64		nnew = 0;

	for (int i = 0; i < nkeys; i++)
		key_texts[i] = DatumGetTextPP(elems[i]);
	if (!keystore_record_keys(consumer_id, key_texts, nkeys, isnew))
		return -1;

	for (int i = 0; i < nkeys; i++)
	{
		if (isnew[i])
		{
			return_key(rsinfo, elems[i]);
			nnew++;
		}
	}
	return nnew;
}

/*
 * Records a batch with set-based SQL statements and returns the new keys;
 * returns how many there were.
 */
static int64
record_batch_sql(ReturnSetInfo *rsinfo, int32 consumer_id,
				 ArrayType *keys, int nkeys)
{
	uint64		ninserted;
	Datum	   *inserted;
	int64		nnew;

	ninserted = keystore_insert_batch(consumer_id, keys);
	inserted = palloc(Max(ninserted, 1) * sizeof(Datum));
	for (uint64 i = 0; i < ninserted; i++)
	{
		bool		isnull;

		inserted[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									1, &isnull);
		return_key(rsinfo, inserted[i]);
	}
	nnew = (int64) ninserted;

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
			{
				return_key(rsinfo, PointerGetDatum(unresolved[i]));
				nnew++;
			}
		}
	}
	return nnew;
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
	Datum	   *elems;
	int			nkeys;
	int32		consumer_id;
	int64		nnew;
	int			call;

	consumer = text_to_cstring(get_name_arg(fcinfo, 0, "consumer",
											 IDEM_MAX_CONSUMER_BYTES));
	keys = get_keys_arg(fcinfo, 1, &elems, &nkeys);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (keys == NULL)
		return (Datum) 0;

	call = stats_call_begin(consumer);
	SPI_connect();

	consumer_id = keystore_consumer_id(consumer, true);
	inflight_check_keys(consumer_id, consumer, elems, nkeys, "record");
	nnew = record_batch_fast(rsinfo, consumer_id, elems, nkeys);
	if (nnew < 0)
		nnew = record_batch_sql(rsinfo, consumer_id, keys, nkeys);

	SPI_finish();

	/* every element is a delivery: the new keys applied, the rest duplicates */
	stats_call_end(call, (int) nnew, nkeys - (int) nnew, 0, DT_NOBEGIN);

	return (Datum) 0;
}
