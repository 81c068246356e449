/*-------------------------------------------------------------------------
 *
 * retention_windows.c
 *	  The retention windows: each consumer's own (retention_store.c), and
 *	  idem_consumer.retention for the others; the cutoff a window gives a
 *	  consumer by the rule of retention.c, and the longest window, which
 *	  the interval of key generations (keygen.c) is derived from.  The
 *	  purge of keys (retention.c), of generations (keygen_retire.c), of
 *	  routed keys and of effects read them.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/retention_windows.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/timestamp.h"

#include "duration.h"
#include "idem_consumer.h"

/* Default retention window, in seconds; -1 keeps keys forever. */
static int	default_retention = 7 * SECS_PER_DAY;

/*
 * Returns the first processed_at that is not older than retention counted
 * back from latest; 0 or less means no key is that old.  Months and days
 * count as calendar months and days (processed_at is UTC).
 */
static int32
interval_cutoff(int32 latest, Interval *retention)
{
	Timestamp	latest_ts = (Timestamp) latest * USECS_PER_SEC;
	Timestamp	cutoff_ts;

	cutoff_ts = DatumGetTimestamp(DirectFunctionCall2(timestamp_mi_interval,
													  TimestampGetDatum(latest_ts),
													  IntervalPGetDatum(retention)));
	if (cutoff_ts <= 0)
		return 0;
	/* a key of second s is older than the cutoff when s < cutoff */
	return (int32) ((cutoff_ts + USECS_PER_SEC - 1) / USECS_PER_SEC);
}

/* A consumer's own window: an interval, or NULL for forever. */
typedef struct OwnWindow
{
	int32		consumer_id;
	bool		forever;
	Interval	retention;
} OwnWindow;

/*
 * Reads every consumer's own window as the settings say now, for
 * retention_cutoff(); allocated in the current memory context.
 */
RetentionWindows *
retention_windows_load(void)
{
	HASHCTL		ctl;
	HTAB	   *windows;

	ctl.keysize = sizeof(int32);
	ctl.entrysize = sizeof(OwnWindow);
	ctl.hcxt = CurrentMemoryContext;
	windows = hash_create("idem_consumer own windows", 64, &ctl,
						  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	retention_store_read_windows();
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		bool		isnull;
		int32		consumer_id;
		Datum		retention;
		OwnWindow  *w;

		consumer_id = DatumGetInt32(SPI_getbinval(tuple, SPI_tuptable->tupdesc,
												  1, &isnull));
		retention = SPI_getbinval(tuple, SPI_tuptable->tupdesc, 2, &isnull);
		w = hash_search(windows, &consumer_id, HASH_ENTER, NULL);
		w->forever = isnull;
		if (!isnull)
			w->retention = *DatumGetIntervalP(retention);
	}
	SPI_freetuptable(SPI_tuptable);
	return (RetentionWindows *) windows;
}

/*
 * Returns the cutoff of a consumer whose latest activity is latest: its
 * keys with a processed_at before it are purgeable; 0 or less when none
 * is, or its window is forever.  The rule of retention.c: counted back
 * from the latest activity, capped at the current time.
 */
int32
retention_cutoff(RetentionWindows *windows, int32 consumer_id, int32 latest)
{
	OwnWindow  *w = hash_search((HTAB *) windows, &consumer_id, HASH_FIND, NULL);
	int32		now_secs = (int32) (GetCurrentTimestamp() / USECS_PER_SEC);
	int32		from = Min(latest, now_secs);

	if (w != NULL)
		return w->forever ? 0 : interval_cutoff(from, &w->retention);
	return default_retention > 0 ? from - default_retention : 0;
}

/*
 * Returns the longest finite retention window of the database's consumers,
 * their own and idem_consumer.retention, in seconds (a month counted as 30
 * days); 0 when every window is forever.  Needs an SPI connection.
 */
int32
retention_longest_window_secs(void)
{
	HTAB	   *windows = (HTAB *) retention_windows_load();
	HASH_SEQ_STATUS seq;
	OwnWindow  *w;
	int64		longest = Max(default_retention, 0);

	hash_seq_init(&seq, windows);
	while ((w = hash_seq_search(&seq)) != NULL)
		if (!w->forever)
			longest = Max(longest, interval_to_us(&w->retention) / USECS_PER_SEC);
	hash_destroy(windows);
	return (int32) Min(longest, PG_INT32_MAX);
}

/*
 * Returns idem_consumer.retention in seconds; -1 keeps keys forever.
 */
int
retention_default_secs(void)
{
	return default_retention;
}

/*
 * Refuses a retention of 0, which would read as "keep nothing".
 */
static bool
check_retention(int *newval, void **extra, GucSource source)
{
	if (*newval == 0)
	{
		GUC_check_errdetail("Use -1 to keep keys forever.");
		return false;
	}
	return true;
}

/*
 * Defines idem_consumer.retention; called once from _PG_init.
 */
void
retention_init(void)
{
	DefineCustomIntVariable("idem_consumer.retention",
							"Sets how long keys are kept, counted back from their consumer's latest activity.",
							"A key is purged when it is this much older than the newest key of its consumer. "
							"-1 keeps keys forever. idem_set_retention() overrides it per consumer.",
							&default_retention,
							7 * SECS_PER_DAY,
							-1,
							INT_MAX,
							PGC_SUSET,
							GUC_UNIT_S,
							check_retention,
							NULL,
							NULL);
}
