/*-------------------------------------------------------------------------
 *
 * batch.c
 *	  The SQL-callable idem_record_batch(), with and without fingerprints
 *	  and routes: records a batch of keys in one call and returns those
 *	  that were new, so that a consumer applies a whole batch of messages
 *	  in one statement.
 *
 * The guarantees are idem_apply()'s: the keys are recorded in the caller's
 * transaction, a key recorded by a concurrent transaction is waited for
 * (READ COMMITTED) or raises a serialization failure (REPEATABLE READ and
 * above), and nothing is recorded when the arguments are bad.  A key that
 * occurs several times in the batch is one message and is returned once.
 *
 * All keys are recorded within this one call, in the order of the unique
 * index whatever their order in the array: that order is why two batches
 * cannot deadlock each other (see KS_INSERT_BATCH in keystore_sql.c).  Through
 * keystore.c's fast path each key costs an index probe, and a new key a
 * speculative insertion, with no SQL statement per key.  When the storage
 * does not allow the fast path, keys go one at a time through the SQL
 * statements, but for a key store without generations (its SQL older than
 * 1.2), where the work is set-based SQL: one insert for
 * the whole batch, then, only if some keys were not inserted, one
 * statement that finds which of those are not simply recorded already.
 * Only such keys, hash collisions in practice, go through the per-key path
 * of idem_apply().
 *
 * Where keys are routed (routed.c, routed_record_keys), a batch's keys are
 * spread over the shards of their routes, and the order that keeps two
 * batches from deadlocking is taken over the whole cluster: route by
 * route, in the order of the routes, each route's keys in the order of
 * their bytes, one statement per key, which Citus sends to the key's
 * shard.  One statement for the whole batch would let Citus write its
 * shards in parallel, in no order, and two batches could then each hold a
 * key the other waits for.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/batch.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

#include "idem_consumer.h"

PG_FUNCTION_INFO_V1(idem_record_batch);
PG_FUNCTION_INFO_V1(idem_record_batch_fingerprinted);

/*
 * Appends one key to the result of idem_record_batch(consumer, keys).
 */
static inline void
return_key(ReturnSetInfo *rsinfo, Datum key)
{
	bool		isnull = false;

	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, &key, &isnull);
}

/*
 * Records a batch key by key in keystore.c and returns the new keys; with
 * require_fastpath, returns -1, doing nothing, when the fast path cannot be
 * used.
 */
static int64
record_batch_by_key(ReturnSetInfo *rsinfo, int32 consumer_id,
					Datum *elems, int nkeys, bool require_fastpath)
{
	text	  **key_texts = palloc(nkeys * sizeof(text *));
	bool	   *isnew = palloc(nkeys * sizeof(bool));
	int64		nnew = 0;

	for (int i = 0; i < nkeys; i++)
		key_texts[i] = DatumGetTextPP(elems[i]);
	if (!keystore_record_keys(consumer_id, key_texts, nkeys, NULL, NULL,
							  require_fastpath, isnew, NULL))
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
 * Records the keys of a batch for consumer in the key store and returns
 * the new ones, each once; keys is non-empty, with its nkeys elems.
 */
static void
record_batch(FunctionCallInfo fcinfo, const char *consumer, ArrayType *keys,
			 Datum *elems, int nkeys)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		consumer_id;
	int64		nnew;
	int			call;

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, true);
	inflight_check_keys(consumer_id, consumer, elems, nkeys, "record");
	inflight_check_call(fcinfo);
	call = stats_call_begin(consumer);

	nnew = record_batch_by_key(rsinfo, consumer_id, elems, nkeys, true);
	/* the set-based statements know only the generation of new keys */
	if (nnew < 0 && keystore_sealed_live())
		nnew = record_batch_by_key(rsinfo, consumer_id, elems, nkeys, false);
	else if (nnew < 0)
		nnew = record_batch_sql(rsinfo, consumer_id, keys, nkeys);

	SPI_finish();

	/* every element is a delivery: the new keys applied, the rest duplicates */
	stats_call_end(call, (int) nnew, nkeys - (int) nnew, 0, DT_NOBEGIN);
}

/*
 * idem_record_batch(consumer, keys): records every key of the batch for
 * consumer; returns the keys that were not recorded before, each once.
 */
Datum
idem_record_batch(PG_FUNCTION_ARGS)
{
	char	   *consumer;
	ArrayType  *keys;
	Datum	   *elems;
	int			nkeys;

	consumer = text_to_cstring(get_name_arg(fcinfo, 0, "consumer",
											 IDEM_MAX_CONSUMER_BYTES));
	keys = get_keys_arg(fcinfo, 1, &elems, &nkeys);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (keys != NULL)
		record_batch(fcinfo, consumer, keys, elems, nkeys);
	return (Datum) 0;
}

/*
 * idem_record_batch(consumer, keys, fingerprints, routes): records every
 * key of the batch with the fingerprint of its message, where keys are
 * routed under its route, the element of routes at its position; returns
 * each new key once with reused = false, and each key found recorded for
 * another message with reused = true, with its route as text (NULL where
 * keys are not routed): the same key under two routes is two messages.
 * A reused key is not recorded again and counts as a reuse, not as a
 * duplicate.  Every key takes the per-key path in the order of the unique
 * index (or of the routes), so that the fingerprint of each is compared.
 * The 1.1 function has the first three arguments and no route column.
 */
Datum
idem_record_batch_fingerprinted(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *consumer;
	ArrayType  *keys;
	Datum	   *elems;
	int			nkeys;
	int32	   *fingerprints;
	bool	   *has_fingerprint;
	Datum	   *routes;
	KeyPlace	place;
	bool		check_fingerprint;
	bool	   *isnew;
	bool	   *repeated;
	RecordedKey *recorded;
	int			nnew = 0;
	int			nreused = 0;
	int			call;
	Oid			route_out = InvalidOid;

	consumer = text_to_cstring(get_name_arg(fcinfo, 0, "consumer",
											 IDEM_MAX_CONSUMER_BYTES));
	keys = get_keys_arg(fcinfo, 1, &elems, &nkeys);
	fingerprints = palloc(Max(nkeys, 1) * sizeof(int32));
	has_fingerprint = palloc(Max(nkeys, 1) * sizeof(bool));
	get_fingerprints_arg(fcinfo, 2, nkeys, fingerprints, has_fingerprint);
	key_place_resolve_routes(fcinfo, 3, nkeys, consumer, &routes, &place);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (keys == NULL)
		return (Datum) 0;

	SPI_connect();
	place.consumer_id = keystore_consumer_id_and_fp_check(consumer, true,
														  &check_fingerprint);
	inflight_check_keys(place.consumer_id, consumer, elems, nkeys, "record");
	inflight_check_call(fcinfo);
	key_place_admit_role(&place, "idem_record_batch", GetUserId());
	call = stats_call_begin(consumer);
	if (!check_fingerprint)
		memset(has_fingerprint, 0, nkeys * sizeof(bool));

	isnew = palloc0(nkeys * sizeof(bool));
	repeated = palloc0(nkeys * sizeof(bool));
	recorded = palloc0(nkeys * sizeof(RecordedKey));
	place.ops->record_batch(&place, elems, routes, nkeys, fingerprints,
							has_fingerprint, isnew, repeated, recorded);
	if (routes != NULL)
	{
		bool		isvarlena;

		getTypeOutputInfo(place.route_type, &route_out, &isvarlena);
	}

	for (int i = 0; i < nkeys; i++)
	{
		Datum		values[3];
		bool		nulls[3] = {false, false, routes == NULL};

		if (isnew[i])
			nnew++;
		else if (!repeated[i] && has_fingerprint[i] &&
				 fingerprint_differs(fingerprints[i], &recorded[i]))
			nreused++;
		else
			continue;
		values[0] = elems[i];
		values[1] = BoolGetDatum(!isnew[i]);
		if (routes != NULL)
			values[2] = CStringGetTextDatum(OidOutputFunctionCall(route_out, routes[i]));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		if (!isnew[i])
			stats_call_key_reuse(call);
	}
	SPI_finish();

	stats_call_end(call, nnew, nkeys - nnew - nreused, 0, DT_NOBEGIN);

	return (Datum) 0;
}
