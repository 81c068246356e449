/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Per-consumer counters in shared memory: what idem_apply() absorbed
 *	  and how fast, read through the idem_stats view and idem_metrics().
 *
 * Locking protocol, in the manner of pg_stat_statements:
 *	- the hash table's shape is protected by stats_state->lock: exclusive to
 *	  add an entry, shared to look one up or to iterate;
 *	- an entry's counters are protected by its own spinlock: writers add to
 *	  them, readers copy them out, under that spinlock only.
 * Entries are never removed while the server runs (a reset zeroes them),
 * so a backend caches the address of each consumer's entry after one
 * lookup and then touches no shared lock but that entry's spinlock.
 * Entries whose counters are all zero are dropped when the counters are
 * loaded at start-up, which is how reset consumers give their slots back.
 *
 * Outcomes count only once their transaction is over: each call is noted
 * in a backend-local list when it starts, and a transaction callback adds
 * the list to shared memory at commit (applied, duplicates, dead-lettered,
 * latency and lag) or counts every call as failed at abort.  A
 * subtransaction abort counts the calls made inside it as failed at once.
 * The calls of a transaction prepared for two-phase commit count as
 * untracked: its outcome is not known at PREPARE TRANSACTION.
 * The events of external effects (effects.c) are counted when they happen,
 * straight into the entry: the ones that matter most raise an error.
 *
 * Counters are written to pg_stat/idem_consumer.stat when the postmaster
 * exits and read back (and the file removed) at start-up only if pg_control
 * says the server was shut down cleanly, so they survive a restart but not
 * a crash or an immediate shutdown, both of which need crash recovery.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>

#include "access/xact.h"
#include "catalog/pg_control.h"
#include "common/controldata_utils.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "portability/instr_time.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

#define STATS_FILE				PGSTAT_STAT_PERMANENT_DIRECTORY "/idem_consumer.stat"
/*
 * The file's header: a format date, bumped with every change of what the
 * file holds (ConsumerCounters and IdemHistogram included), then the major
 * version and the size of the counters, so that a file of another layout
 * is ignored rather than read as garbage even if a change forgot the date.
 */
#define STATS_FILE_HEADER		0x20261203
#define STATS_TRANCHE_NAME		"idem_consumer"
#define IDEM_STATS_COLS			15
#define IDEM_STATS_COLS_1_1		(IDEM_STATS_COLS + EFFECT_NUM_EVENTS + 1)

/* What put_stats_row() needs: where the rows go, and which columns. */
typedef struct StatsRowsArg
{
	ReturnSetInfo *rsinfo;
	bool		effects;
} StatsRowsArg;

typedef struct ConsumerStatsEntry
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	slock_t		mutex;
	ConsumerCounters counters;
} ConsumerStatsEntry;

typedef struct StatsSharedState
{
	LWLock	   *lock;
	slock_t		mutex;			/* protects the fields below */
	int64		untracked_calls;	/* calls of consumers beyond max_consumers */
	TimestampTz stats_reset;	/* of the fields above */
} StatsSharedState;

/* A call noted by this backend, counted when its transaction ends. */
typedef struct PendingCall
{
	ConsumerStatsEntry *entry;
	int			nest_level;
	bool		finished;
	int			applied;
	int			duplicates;
	int			dead_lettered;
	int			key_reuse;		/* counted whether it commits or not */
	instr_time	start;
	int64		latency_us;
	TimestampTz event_time;		/* DT_NOBEGIN if not given */
} PendingCall;

typedef struct ConsumerEntryRef
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	ConsumerStatsEntry *entry;	/* NULL: not tracked, the table was full */
} ConsumerEntryRef;

/* GUCs */
static int	idem_max_consumers = 1000;
static bool idem_track = true;
static bool idem_save = true;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static StatsSharedState *stats_state = NULL;
static HTAB *stats_hash = NULL;

/* backend-local */
static HTAB *entry_refs = NULL;
static PendingCall *pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static bool callbacks_registered = false;

PG_FUNCTION_INFO_V1(idem_stats_internal);
PG_FUNCTION_INFO_V1(idem_stats_internal_1_1);
PG_FUNCTION_INFO_V1(idem_stats_info_internal);
PG_FUNCTION_INFO_V1(idem_stats_reset);

/*
 * Returns the size of the shared memory the counters need.
 */
static Size
stats_memsize(void)
{
	return add_size(MAXALIGN(sizeof(StatsSharedState)),
					hash_estimate_size(idem_max_consumers, sizeof(ConsumerStatsEntry)));
}

/*
 * Requests shared memory and the LWLock.
 */
static void
stats_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(stats_memsize());
	RequestNamedLWLockTranche(STATS_TRANCHE_NAME, 1);
}

/*
 * Writes the counters to the stats file at a clean postmaster shutdown.
 */
static void
stats_shmem_shutdown(int code, Datum arg)
{
	FILE	   *file;
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	uint32		header[3] = {STATS_FILE_HEADER, PG_VERSION_NUM / 100,
	(uint32) sizeof(ConsumerCounters)};
	int32		num_entries;

	/* not after a crash, nor when not asked to */
	if (code != 0 || stats_state == NULL || !idem_save)
		return;

	file = AllocateFile(STATS_FILE ".tmp", PG_BINARY_W);
	if (file == NULL)
		goto error;

	num_entries = (int32) hash_get_num_entries(stats_hash);
	if (fwrite(header, sizeof(header), 1, file) != 1 ||
		fwrite(&stats_state->untracked_calls, sizeof(int64), 1, file) != 1 ||
		fwrite(&stats_state->stats_reset, sizeof(TimestampTz), 1, file) != 1 ||
		fwrite(&num_entries, sizeof(int32), 1, file) != 1)
		goto error;

	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (fwrite(entry->consumer, sizeof(entry->consumer), 1, file) != 1 ||
			fwrite(&entry->counters, sizeof(ConsumerCounters), 1, file) != 1)
		{
			hash_seq_term(&hash_seq);
			goto error;
		}
	}

	if (FreeFile(file))
	{
		file = NULL;
		goto error;
	}
	(void) durable_rename(STATS_FILE ".tmp", STATS_FILE, LOG);
	return;

error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not write file \"%s\": %m", STATS_FILE ".tmp")));
	if (file)
		FreeFile(file);
	unlink(STATS_FILE ".tmp");
}

/*
 * Tells whether counters hold anything worth keeping across a restart.
 */
static bool
counters_are_empty(const ConsumerCounters *counters)
{
	for (int i = 0; i < EFFECT_NUM_EVENTS; i++)
		if (counters->effects[i] != 0)
			return false;
	return counters->applied == 0 && counters->duplicates == 0 &&
		counters->failed == 0 && counters->dead_lettered == 0 &&
		counters->key_reuse == 0;
}

/*
 * Tells whether pg_control records a clean shutdown, that is whether the
 * server will start without crash recovery.
 */
static bool
shut_down_cleanly(void)
{
	ControlFileData *control;
	bool		crc_ok;
	bool		clean;

	control = get_controlfile(DataDir, &crc_ok);
	clean = crc_ok && (control->state == DB_SHUTDOWNED ||
					   control->state == DB_SHUTDOWNED_IN_RECOVERY);
	pfree(control);
	return clean;
}

/*
 * Reads the counters saved at the last clean shutdown, then removes the
 * file so that a crash cannot bring back stale counters.
 */
static void
stats_load_file(void)
{
	FILE	   *file;
	uint32		header[3];
	int32		num_entries;

	file = AllocateFile(STATS_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		if (errno != ENOENT)
			goto read_error;
		return;
	}
	if (!shut_down_cleanly())
		goto fail;

	if (fread(header, sizeof(header), 1, file) != 1 ||
		fread(&stats_state->untracked_calls, sizeof(int64), 1, file) != 1 ||
		fread(&stats_state->stats_reset, sizeof(TimestampTz), 1, file) != 1 ||
		fread(&num_entries, sizeof(int32), 1, file) != 1)
		goto read_error;
	if (header[0] != STATS_FILE_HEADER || header[1] != PG_VERSION_NUM / 100 ||
		header[2] != (uint32) sizeof(ConsumerCounters))
		goto data_error;

	for (int i = 0; i < num_entries; i++)
	{
		ConsumerStatsEntry loaded;
		ConsumerStatsEntry *entry;

		if (fread(loaded.consumer, sizeof(loaded.consumer), 1, file) != 1 ||
			fread(&loaded.counters, sizeof(ConsumerCounters), 1, file) != 1)
			goto read_error;
		loaded.consumer[IDEM_MAX_CONSUMER_BYTES] = '\0';
		if (counters_are_empty(&loaded.counters))
			continue;
		if (hash_get_num_entries(stats_hash) >= idem_max_consumers)
			break;				/* max_consumers was lowered */
		entry = hash_search(stats_hash, loaded.consumer, HASH_ENTER_NULL, NULL);
		if (entry == NULL)
			break;
		SpinLockInit(&entry->mutex);
		entry->counters = loaded.counters;
	}

	FreeFile(file);
	unlink(STATS_FILE);
	return;

read_error:
	ereport(LOG,
			(errcode_for_file_access(),
			 errmsg("could not read file \"%s\": %m", STATS_FILE)));
	goto fail;
data_error:
	ereport(LOG,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("ignoring invalid data in file \"%s\"", STATS_FILE)));
fail:
	if (file)
		FreeFile(file);
	unlink(STATS_FILE);
}

/*
 * Creates or attaches to the shared counters.
 */
static void
stats_shmem_startup(void)
{
	bool		found;
	HASHCTL		info;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	stats_state = NULL;
	stats_hash = NULL;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);

	stats_state = ShmemInitStruct("idem_consumer stats", sizeof(StatsSharedState), &found);
	if (!found)
	{
		stats_state->lock = &(GetNamedLWLockTranche(STATS_TRANCHE_NAME))->lock;
		SpinLockInit(&stats_state->mutex);
		stats_state->untracked_calls = 0;
		stats_state->stats_reset = GetCurrentTimestamp();
	}

	info.keysize = sizeof(((ConsumerStatsEntry *) NULL)->consumer);
	info.entrysize = sizeof(ConsumerStatsEntry);
	stats_hash = ShmemInitHash("idem_consumer stats hash",
							   idem_max_consumers, idem_max_consumers,
							   &info, HASH_ELEM | HASH_STRINGS);

	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster)
		on_shmem_exit(stats_shmem_shutdown, (Datum) 0);

	if (!found)
		stats_load_file();
}

/*
 * When preloaded, defines the counters' GUCs and hooks shared memory.
 */
void
stats_init(void)
{
	/* a PGC_POSTMASTER variable can only be defined while preloading */
	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomIntVariable("idem_consumer.max_consumers",
							"Sets how many consumers have counters in shared memory.",
							"Calls of further consumers are counted in idem_stats_info.untracked_calls only.",
							&idem_max_consumers,
							1000,
							16,
							100000,
							PGC_POSTMASTER,
							0,
							NULL, NULL, NULL);
	DefineCustomBoolVariable("idem_consumer.track",
							 "Counts idem_apply() outcomes in idem_stats.",
							 NULL,
							 &idem_track,
							 true,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
	DefineCustomBoolVariable("idem_consumer.save",
							 "Saves the counters across server shutdowns.",
							 NULL,
							 &idem_save,
							 true,
							 PGC_SIGHUP,
							 0,
							 NULL, NULL, NULL);

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_shmem_startup;
}

/*
 * Raises an error unless the counters are in shared memory.
 */
static void
stats_require_shmem(void)
{
	if (stats_state == NULL || stats_hash == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("idem_consumer must be loaded via shared_preload_libraries"),
				 errdetail("The counters of idem_consumer live in shared memory; deduplication works without them."),
				 errhint("Add idem_consumer to shared_preload_libraries in postgresql.conf and restart the server.")));
}

/*
 * Returns the shared entry of a consumer, creating it if there is room;
 * NULL if the table is full.  Cached per backend.
 */
static ConsumerStatsEntry *
consumer_entry(const char *consumer)
{
	ConsumerEntryRef *ref;
	ConsumerStatsEntry *entry;
	bool		found;

	if (entry_refs == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(((ConsumerEntryRef *) NULL)->consumer);
		ctl.entrysize = sizeof(ConsumerEntryRef);
		ctl.hcxt = TopMemoryContext;
		entry_refs = hash_create("idem_consumer stats entries", 16, &ctl,
								 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}

	ref = hash_search(entry_refs, consumer, HASH_FIND, NULL);
	if (ref != NULL)
		return ref->entry;

	LWLockAcquire(stats_state->lock, LW_SHARED);
	entry = hash_search(stats_hash, consumer, HASH_FIND, NULL);
	LWLockRelease(stats_state->lock);
	if (entry == NULL)
	{
		LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
		/* a shared hash table can outgrow its size: hold it to the GUC */
		if (hash_get_num_entries(stats_hash) < idem_max_consumers)
			entry = hash_search(stats_hash, consumer, HASH_ENTER_NULL, &found);
		else
			entry = hash_search(stats_hash, consumer, HASH_FIND, &found);
		if (entry != NULL && !found)
		{
			SpinLockInit(&entry->mutex);
			memset(&entry->counters, 0, sizeof(ConsumerCounters));
			entry->counters.stats_reset = GetCurrentTimestamp();
		}
		LWLockRelease(stats_state->lock);
		if (entry == NULL)
			ereport(WARNING,
					(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
					 errmsg("counters of consumer \"%s\" are not tracked", consumer),
					 errdetail("idem_consumer.max_consumers consumers (%d) have counters already; "
							   "the calls of this one count in idem_stats_info.untracked_calls only.",
							   idem_max_consumers),
					 errhint("Raise idem_consumer.max_consumers (it takes a restart), and keep roles "
							 "from creating consumers with idem_consumer.create_consumers = off.")));
	}

	ref = hash_search(entry_refs, consumer, HASH_ENTER, NULL);
	ref->entry = entry;
	return entry;
}

/*
 * Adds the finished calls of a committed transaction to shared memory.
 */
static void
count_committed(void)
{
	TimestampTz now = GetCurrentTimestamp();

	for (int i = 0; i < npending; i++)
	{
		PendingCall *call = &pending[i];
		ConsumerCounters *counters = &call->entry->counters;
		bool		failed = !call->finished;

		SpinLockAcquire(&call->entry->mutex);
		counters->key_reuse += call->key_reuse;
		if (failed)
			counters->failed++;
		else
		{
			counters->applied += call->applied;
			counters->duplicates += call->duplicates;
			counters->dead_lettered += call->dead_lettered;
			if (call->applied > 0)
			{
				counters->last_applied_at = now;
				/* a batch's messages share its time equally */
				histogram_add_n(&counters->latency, call->latency_us / call->applied,
								call->applied);
				if (!TIMESTAMP_IS_NOBEGIN(call->event_time))
				{
					counters->lag_last_us = now - call->event_time;
					counters->has_lag = true;
					histogram_add(&counters->lag, now - call->event_time);
				}
			}
			if (call->duplicates > 0)
				counters->last_duplicate_at = now;
		}
		SpinLockRelease(&call->entry->mutex);
	}
	npending = 0;
}

/*
 * Counts the calls from index first on as failed and forgets them.
 */
static void
count_failed_from(int first)
{
	for (int i = first; i < npending; i++)
	{
		SpinLockAcquire(&pending[i].entry->mutex);
		pending[i].entry->counters.failed++;
		pending[i].entry->counters.key_reuse += pending[i].key_reuse;
		SpinLockRelease(&pending[i].entry->mutex);
	}
	npending = Min(npending, first);
}

/*
 * Counts the calls of a transaction prepared for two-phase commit as
 * untracked.  Whether it commits is decided later, by COMMIT PREPARED or
 * ROLLBACK PREPARED, possibly in another session or after a restart, when
 * the calls noted here are gone; counting them as applied now would show
 * messages whose transaction is then rolled back.
 */
static void
count_prepared(void)
{
	SpinLockAcquire(&stats_state->mutex);
	stats_state->untracked_calls += npending;
	SpinLockRelease(&stats_state->mutex);
	npending = 0;
}

/*
 * Counts the noted calls when the top-level transaction ends.
 */
static void
stats_xact_callback(XactEvent event, void *arg)
{
	if (npending == 0)
		return;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
			count_committed();
			break;
		case XACT_EVENT_PREPARE:
			count_prepared();
			break;
		case XACT_EVENT_ABORT:
			count_failed_from(0);
			break;
		default:
			break;
	}
}

/*
 * Hands calls of a committed subtransaction to its parent, and counts the
 * calls of an aborted one as failed.
 */
static void
stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			level;
	int			first;

	if (npending == 0)
		return;

	level = GetCurrentTransactionNestLevel();

	/* calls made inside this subtransaction are a suffix of the list */
	for (first = npending; first > 0 && pending[first - 1].nest_level >= level; first--)
		;

	switch (event)
	{
		case SUBXACT_EVENT_COMMIT_SUB:
			for (int i = first; i < npending; i++)
				pending[i].nest_level = level - 1;
			break;
		case SUBXACT_EVENT_ABORT_SUB:
			count_failed_from(first);
			break;
		default:
			break;
	}
}

/*
 * Notes the start of a call; returns a handle for stats_call_end(), or -1
 * when the call is not counted.
 */
int
stats_call_begin(const char *consumer)
{
	ConsumerStatsEntry *entry;
	PendingCall *call;

	if (stats_state == NULL || !idem_track)
		return -1;

	entry = consumer_entry(consumer);
	if (entry == NULL)
	{
		SpinLockAcquire(&stats_state->mutex);
		stats_state->untracked_calls++;
		SpinLockRelease(&stats_state->mutex);
		return -1;
	}

	if (!callbacks_registered)
	{
		RegisterXactCallback(stats_xact_callback, NULL);
		RegisterSubXactCallback(stats_subxact_callback, NULL);
		callbacks_registered = true;
	}

	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(TopMemoryContext, newmax * sizeof(PendingCall));
		else
			pending = repalloc(pending, newmax * sizeof(PendingCall));
		maxpending = newmax;
	}

	call = &pending[npending];
	call->entry = entry;
	call->nest_level = GetCurrentTransactionNestLevel();
	call->finished = false;
	call->applied = call->duplicates = call->dead_lettered = 0;
	call->key_reuse = 0;
	call->latency_us = 0;
	call->event_time = DT_NOBEGIN;
	INSTR_TIME_SET_CURRENT(call->start);
	return npending++;
}

/*
 * Notes the outcome of a call that returned normally; event_time is
 * DT_NOBEGIN when the caller passed none.
 */
void
stats_call_end(int call_id, int applied, int duplicates, int dead_lettered,
			   TimestampTz event_time)
{
	PendingCall *call;
	instr_time	elapsed;

	if (call_id < 0 || call_id >= npending)
		return;

	call = &pending[call_id];
	INSTR_TIME_SET_CURRENT(elapsed);
	INSTR_TIME_SUBTRACT(elapsed, call->start);
	call->latency_us = (int64) INSTR_TIME_GET_MICROSEC(elapsed);
	call->applied = applied;
	call->duplicates = duplicates;
	call->dead_lettered = dead_lettered;
	call->event_time = event_time;
	call->finished = true;
}

/*

 * Notes that a call found its key recorded for another message; counted
 * when the transaction ends, whether the call then fails or parks it.
 */
void
stats_call_key_reuse(int call_id)
{
	if (call_id >= 0 && call_id < npending)
		pending[call_id].key_reuse++;
}

/*
 * Counts an event of an external effect at once: the events that matter
 * most (a fenced-off completion, a request mismatch) raise an error, so
 * their transaction never commits.
 */
void
stats_count_effect(const char *consumer, EffectEvent event)
{
	ConsumerStatsEntry *entry;

	if (stats_state == NULL || !idem_track)
		return;
	entry = consumer_entry(consumer);
	if (entry == NULL)
	{
		SpinLockAcquire(&stats_state->mutex);
		stats_state->untracked_calls++;
		SpinLockRelease(&stats_state->mutex);
		return;
	}
	SpinLockAcquire(&entry->mutex);
	entry->counters.effects[event]++;
	SpinLockRelease(&entry->mutex);
}

/*
 * Calls fn with a copy of each consumer's counters in turn, copied under
 * that consumer's spinlock into one buffer: the memory a pass takes does
 * not grow with the number of consumers.  The shared lock on the table is
 * held throughout, so fn should be quick and must not call back here.
 */
void
stats_foreach(void (*fn) (const ConsumerStatsCopy *copy, void *arg), void *arg)
{
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	ConsumerStatsCopy *copy = palloc(sizeof(ConsumerStatsCopy));

	stats_require_shmem();

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		strlcpy(copy->consumer, entry->consumer, sizeof(copy->consumer));
		SpinLockAcquire(&entry->mutex);
		copy->counters = entry->counters;
		SpinLockRelease(&entry->mutex);
		fn(copy, arg);
	}
	LWLockRelease(stats_state->lock);

	pfree(copy);
}

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
 * Returns one row per consumer: the columns of version 1.0, and with
 * effects those of 1.1 after them.
 */
static void
stats_rows(FunctionCallInfo fcinfo, bool effects)
{
	StatsRowsArg rows;

	stats_require_shmem();
	InitMaterializedSRF(fcinfo, 0);
	rows.rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	rows.effects = effects;
	stats_foreach(put_stats_row, &rows);
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
 * idem_stats_info_internal(): the counters that are not per consumer.
 */
Datum
idem_stats_info_internal(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {0};
	int64		consumers;

	stats_require_shmem();
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	LWLockAcquire(stats_state->lock, LW_SHARED);
	consumers = hash_get_num_entries(stats_hash);
	LWLockRelease(stats_state->lock);

	SpinLockAcquire(&stats_state->mutex);
	values[0] = Int64GetDatum(consumers);
	values[1] = Int32GetDatum(idem_max_consumers);
	values[2] = Int64GetDatum(stats_state->untracked_calls);
	values[3] = TimestampTzGetDatum(stats_state->stats_reset);
	SpinLockRelease(&stats_state->mutex);

	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/*
 * idem_stats_reset(consumer): zeroes one consumer's counters, or all
 * counters when consumer is NULL.
 */
Datum
idem_stats_reset(PG_FUNCTION_ARGS)
{
	char	   *consumer = PG_ARGISNULL(0) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(0));
	TimestampTz now = GetCurrentTimestamp();
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;

	stats_require_shmem();

	SPI_connect();
	if (consumer != NULL)
		(void) keystore_consumer_id(consumer, false);
	else
		keystore_check_every_consumer("reset the counters");
	SPI_finish();

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (consumer != NULL && strcmp(consumer, entry->consumer) != 0)
			continue;
		SpinLockAcquire(&entry->mutex);
		memset(&entry->counters, 0, sizeof(ConsumerCounters));
		entry->counters.stats_reset = now;
		SpinLockRelease(&entry->mutex);
	}
	LWLockRelease(stats_state->lock);

	if (consumer == NULL)
	{
		SpinLockAcquire(&stats_state->mutex);
		stats_state->untracked_calls = 0;
		stats_state->stats_reset = now;
		SpinLockRelease(&stats_state->mutex);
	}

	PG_RETURN_VOID();
}
