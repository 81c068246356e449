/*-------------------------------------------------------------------------
 *
 * stats_views.c
 *	  The SQL functions behind the idem_stats and idem_stats_info views,
 *	  and idem_stats_reset().
 *
 * They read the counters of the database they are called in, under the
 * locking protocol of stats.c, and return the rows of the consumers the
 * caller may read (stats.c says whose).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/stats_views.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"

#include "stats_internal.h"

#define IDEM_STATS_COLS			15
#define IDEM_STATS_COLS_1_1		(IDEM_STATS_COLS + EFFECT_NUM_EVENTS + 1)

/* What put_stats_row() needs: where the rows go, and which columns. */
typedef struct StatsRowsArg
{
	ReturnSetInfo *rsinfo;
	bool		effects;
} StatsRowsArg;

PG_FUNCTION_INFO_V1(idem_stats_internal);
PG_FUNCTION_INFO_V1(idem_stats_internal_1_1);
PG_FUNCTION_INFO_V1(idem_stats_info_internal);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/*
 * Returns a duration in microseconds as milliseconds, or NULL if negative.
 */
static Datum
ms_datum(double us, bool *isnull)
{
	*isnull = us < 0;
	return Float8GetDatum(us / 1000.0);
}

/*
 * Returns a timestamp, or NULL if it is zero (never happened).
 */
static Datum
timestamp_datum(TimestampTz ts, bool *isnull)
{
	*isnull = ts == 0;
	return TimestampTzGetDatum(ts);
}

/*
 * Adds one consumer's row to stats_rows()'s result: the columns of
 * version 1.0, and with effects those of 1.1 after them; called by
 * stats_foreach() with the consumer's counters copied.
 */
static void
put_stats_row(const ConsumerStatsCopy *copy, void *arg)
{
	const StatsRowsArg *rows = (const StatsRowsArg *) arg;
	const ConsumerCounters *c = &copy->counters;
	Datum		values[IDEM_STATS_COLS_1_1];
	bool		nulls[IDEM_STATS_COLS_1_1] = {0};
	int64		deliveries = c->applied + c->duplicates + c->dead_lettered;
	int			i = 0;

	values[i++] = CStringGetTextDatum(copy->consumer);
	values[i++] = Int64GetDatum(c->applied);
	values[i++] = Int64GetDatum(c->duplicates);
	values[i++] = Int64GetDatum(c->failed);
	values[i++] = Int64GetDatum(c->dead_lettered);
	nulls[i] = deliveries == 0;
	values[i++] = Float8GetDatum(deliveries == 0 ? 0 : (double) c->duplicates / deliveries);
	values[i] = ms_datum(histogram_quantile_us(&c->latency, 0.50), &nulls[i]);
	i++;
	values[i] = ms_datum(histogram_quantile_us(&c->latency, 0.95), &nulls[i]);
	i++;
	values[i] = ms_datum(histogram_quantile_us(&c->latency, 0.99), &nulls[i]);
	i++;
	values[i] = ms_datum(c->latency.total == 0 ? -1 : (double) c->latency.max_us, &nulls[i]);
	i++;
	nulls[i] = !c->has_lag;
	values[i++] = Float8GetDatum(c->lag_last_us / 1000.0);
	values[i] = ms_datum(histogram_quantile_us(&c->lag, 0.95), &nulls[i]);
	i++;
	values[i] = timestamp_datum(c->last_applied_at, &nulls[i]);
	i++;
	values[i] = timestamp_datum(c->last_duplicate_at, &nulls[i]);
	i++;
	values[i] = timestamp_datum(c->stats_reset, &nulls[i]);
	i++;
	Assert(i == IDEM_STATS_COLS);
	if (rows->effects)
	{
		for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
			values[i++] = Int64GetDatum(c->effects[e]);
		values[i++] = Int64GetDatum(c->key_reuse);
		Assert(i == IDEM_STATS_COLS_1_1);
	}

	tuplestore_putvalues(rows->rsinfo->setResult, rows->rsinfo->setDesc, values, nulls);
}

/*
 * Returns one row per consumer the caller may read: the columns of
 * version 1.0, and with effects those of 1.1 after them.
 */
static void
stats_rows(FunctionCallInfo fcinfo, bool effects)
{
	StatsRowsArg rows;

	stats_require_shmem();
	InitMaterializedSRF(fcinfo, 0);
	rows.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	rows.effects = effects;
	stats_foreach_readable(MyDatabaseId, put_stats_row, &rows);
}

/*
 * idem_stats_internal(): behind the idem_stats view of version 1.0.
 */
Datum
idem_stats_internal(PG_FUNCTION_ARGS)
{
	stats_rows(fcinfo, false);
	return (Datum) 0;
}

/*
 * idem_stats_internal_1_1(): behind the idem_stats view of version 1.1,
 * which adds the counters of external effects.
 */
Datum
idem_stats_internal_1_1(PG_FUNCTION_ARGS)
{
	stats_rows(fcinfo, true);
	return (Datum) 0;
}

/*
 * idem_stats_info_internal(): the counters of this database that are not
 * per consumer.
 */
Datum
idem_stats_info_internal(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {0};
	int64		consumers = 0;
	int64		untracked_calls = 0;
	TimestampTz stats_reset;
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	DatabaseStatsEntry *db;

	stats_require_shmem();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
		if (entry->key.dbid == MyDatabaseId)
			consumers++;
	stats_reset = stats_state->started;
	db = hash_search(db_hash, &MyDatabaseId, HASH_FIND, NULL);
	if (db != NULL)
	{
		SpinLockAcquire(&stats_state->mutex);
		untracked_calls = db->untracked_calls;
		stats_reset = db->stats_reset;
		SpinLockRelease(&stats_state->mutex);
	}
	LWLockRelease(stats_state->lock);

	values[0] = Int64GetDatum(consumers);
	values[1] = Int32GetDatum(idem_max_consumers);
	values[2] = Int64GetDatum(untracked_calls);
	values[3] = TimestampTzGetDatum(stats_reset);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * idem_stats_reset(consumer): zeroes the counters of one consumer of this
 * database, or all of this database's counters when consumer is NULL.
 * A reset slot stays taken until a reclaim pass or a restart drops it.
 *
 * EXECUTE on the function is the permission, as for
 * pg_stat_statements_reset(): it is revoked from PUBLIC, and a role the
 * DBA grants it to resets every consumer of the database, whoever owns
 * it.  A reset loses counts, never a stored key or message, and the
 * grant then does what it reads.
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	char	   *consumer = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;

	stats_require_shmem();

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (entry->key.dbid != MyDatabaseId ||
			(consumer != NULL && strcmp(consumer, entry->key.consumer) != 0))
			continue;
		LWLockAcquire(&entry->lock, LW_EXCLUSIVE);
		memset(&entry->counters, 0, sizeof(ConsumerCounters));
		entry->counters.stats_reset = now;
		LWLockRelease(&entry->lock);
	}
	LWLockRelease(stats_state->lock);

	if (consumer == NULL)
	{
		DatabaseStatsEntry *db;

		LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
		db = hash_search(db_hash, &MyDatabaseId, HASH_FIND, NULL);
		if (db == NULL && hash_get_num_entries(db_hash) < idem_max_consumers)
			db = hash_search(db_hash, &MyDatabaseId, HASH_ENTER_NULL, NULL);
		if (db != NULL)
		{
			db->untracked_calls = 0;
			db->stats_reset = now;
		}
		LWLockRelease(stats_state->lock);
	}

	PG_RETURN_VOID();
}
