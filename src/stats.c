/*-------------------------------------------------------------------------
 *
 * stats.c
 *	  Per-consumer counters in shared memory: what idem_apply() absorbed
 *	  and how fast, read through the idem_stats view and idem_metrics().
 *
 * A consumer is a name in one database, so its counters are keyed by the
 * database's OID and the name: "payments" in two databases has two sets.
 * The views show the counters of the database they are read in.
 *
 * Locking protocol, in the manner of pg_stat_statements:
 *	- the hash tables' shape is protected by stats_state->lock: exclusive to
 *	  add or remove an entry, shared to look one up, to iterate, or to touch
 *	  an entry's counters;
 *	- an entry's counters are protected by its own spinlock: writers add to
 *	  them, readers copy them out, under that spinlock only;
 *	- a database's own fields (untracked calls, reset time) are protected by
 *	  stats_state->mutex.
 * Every removal of entries bumps stats_state->generation, so that a
 * backend can keep the address of an entry it found for as long as the
 * generation it found it in lasts, and checks that under the shared lock
 * before it writes there.
 *
 * Slots.  idem_consumer.max_consumers entries exist at most, and only a
 * consumer that exists in the catalog, committed, takes one: a call whose
 * consumer is unknown (not created yet, created by its own transaction,
 * refused creation) is noted without a slot, and its counts reach shared
 * memory only when its transaction commits, which proves the consumer
 * exists; if the transaction rolls back, they are forgotten with the
 * consumer.  A call refused by the access check never reaches here.  When
 * the table is full, a reclaim pass (at most one a second per backend)
 * removes the entries of databases that were dropped, of consumers of this
 * database that no longer exist, and of counters that are all zero.
 *
 * Outcomes count only once their transaction is over: each call is added
 * to a backend-local aggregate of its consumer and subtransaction level
 * when it starts, and a transaction callback adds the aggregates to shared
 * memory at commit (applied, duplicates, dead-lettered, latency and lag)
 * or counts every call as failed at abort.  A subtransaction abort counts
 * the calls made inside it as failed at once; a subtransaction commit
 * merges its aggregates into its parent's.  An aggregate keeps the latency
 * and lag of its first few applied calls, then a histogram of each, so a
 * transaction's memory grows with the consumers it calls (at most
 * max_consumers of them), not with its calls.
 * The calls of a transaction prepared for two-phase commit count as
 * untracked: its outcome is not known at PREPARE TRANSACTION.
 * The events of external effects (effects.c) are counted with the calls,
 * at the end of the transaction; those of a transaction that rolls back
 * count too, for a consumer that existed before it, since the events that
 * matter most raise an error.
 *
 * Counters are written to pg_stat/idem_consumer.stat when the postmaster
 * exits and read back (and the file removed) at start-up only if pg_control
 * says the server was shut down cleanly, so they survive a restart but not
 * a crash or an immediate shutdown, both of which need crash recovery.  The
 * file ends with a CRC-32C of everything before it: a file cut short or
 * damaged is ignored with a log message, never read as counters.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>
#include <unistd.h>

#include "access/transam.h"
#include "access/xact.h"
#include "catalog/pg_control.h"
#include "common/controldata_utils.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "port/pg_crc32c.h"
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
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

#define STATS_FILE				PGSTAT_STAT_PERMANENT_DIRECTORY "/idem_consumer.stat"
/*
 * The file's header: a format date, bumped with every change of what the
 * file holds (ConsumerCounters and IdemHistogram included), then the major
 * version and the sizes of the counters and of their key, so that a file
 * of another layout is ignored rather than read as garbage even if a
 * change forgot the date.  The format of versions 1.0 and 1.1 had no
 * database in its keys and no checksum; its counters are not loaded.
 */
#define STATS_FILE_HEADER		0x20261215
#define STATS_FILE_HEADER_1_1	0x20261203
#define STATS_TRANCHE_NAME		"idem_consumer"
#define IDEM_STATS_COLS			15
#define IDEM_STATS_COLS_1_1		(IDEM_STATS_COLS + EFFECT_NUM_EVENTS + 1)

/* Applied calls of an aggregate kept one by one before a histogram. */
#define PENDING_SAMPLES			8

/* Least time between two reclaim passes of one backend. */
#define RECLAIM_INTERVAL_MS		1000

/* What put_stats_row() needs: where the rows go, and which columns. */
typedef struct StatsRowsArg
{
	ReturnSetInfo *rsinfo;
	bool		effects;
} StatsRowsArg;

/* The key of a consumer's counters; zero-padded, hashed as bytes. */
typedef struct StatsKey
{
	Oid			dbid;
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];
} StatsKey;

typedef struct ConsumerStatsEntry
{
	StatsKey	key;			/* hash key */
	slock_t		mutex;
	ConsumerCounters counters;
} ConsumerStatsEntry;

/* What is counted per database rather than per consumer. */
typedef struct DatabaseStatsEntry
{
	Oid			dbid;			/* hash key */
	int64		untracked_calls;	/* calls not counted per consumer */
	TimestampTz stats_reset;	/* of untracked_calls */
} DatabaseStatsEntry;

typedef struct StatsSharedState
{
	LWLock	   *lock;
	slock_t		mutex;			/* protects the DatabaseStatsEntry fields */
	pg_atomic_uint64 generation;	/* bumped whenever entries are removed */
	TimestampTz started;		/* when counting began: the default reset time */
} StatsSharedState;

/* One applied call kept as it was, until a histogram replaces them. */
typedef struct PendingSample
{
	int64		latency_us;		/* per message */
	int			messages;
	TimestampTz event_time;		/* DT_NOBEGIN if not given */
} PendingSample;

/*
 * The calls of one consumer at one subtransaction level of this backend's
 * transaction, not counted yet.
 */
typedef struct PendingCounts
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];
	int			nest_level;
	struct PendingCounts *outer;	/* the same consumer, a shallower level */

	/* the consumer's slot as found when the aggregate was made */
	ConsumerStatsEntry *entry;	/* NULL: no slot then */
	uint64		generation;		/* of entry */
	bool		exists;			/* committed in the catalog before the call */
	bool		resolved;		/* a call reached the consumer's row */

	int64		calls;
	int64		unfinished;		/* calls that never returned */
	int64		applied;
	int64		duplicates;
	int64		dead_lettered;
	int64		key_reuse;		/* counted whether it commits or not */
	int64		effects[EFFECT_NUM_EVENTS];
	TimestampTz last_event_time;	/* of the last applied call with one */
	int			nsamples;
	PendingSample samples[PENDING_SAMPLES];
	IdemHistogram *latency;		/* once the samples overflow */
	IdemHistogram *lag;			/* the same; measured at the call's end */
} PendingCounts;

/* A call between stats_call_begin() and stats_call_end(). */
typedef struct OpenCall
{
	PendingCounts *counts;
	int			nest_level;
	bool		open;
	instr_time	start;
} OpenCall;

/* The deepest aggregate of a consumer in this transaction. */
typedef struct PendingIndexEntry
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	PendingCounts *deepest;
} PendingIndexEntry;

/* A consumer of this database known to be committed, and its slot. */
typedef struct SlotRef
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	ConsumerStatsEntry *entry;	/* NULL: no room for it */
} SlotRef;

/* GUCs */
static int	idem_max_consumers = 1000;
static bool idem_track = true;
static bool idem_save = true;

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static StatsSharedState *stats_state = NULL;
static HTAB *stats_hash = NULL;
static HTAB *db_hash = NULL;

/*
 * Backend-local.  slot_refs holds at most 2 * max_consumers names (the
 * slots of this database, and consumers that found no room), warned at
 * most max_consumers; the pending aggregates live in pending_cxt, emptied
 * when each transaction ends, at most max_consumers of them.
 */
static HTAB *slot_refs = NULL;
static uint64 slot_refs_generation = 0;
static HTAB *warned = NULL;
static TimestampTz next_reclaim = 0;

static MemoryContext pending_cxt = NULL;
static HTAB *pending_index = NULL;
static PendingCounts **pending = NULL;
static int	npending = 0;
static int	maxpending = 0;
static OpenCall *open_calls = NULL;
static int	nopen = 0;
static int	maxopen = 0;
static bool callbacks_registered = false;

static void stats_xact_callback(XactEvent event, void *arg);
static void stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								   SubTransactionId parentSubid, void *arg);

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
	Size		size = MAXALIGN(sizeof(StatsSharedState));

	size = add_size(size, hash_estimate_size(idem_max_consumers,
											 sizeof(ConsumerStatsEntry)));
	return add_size(size, hash_estimate_size(idem_max_consumers,
											 sizeof(DatabaseStatsEntry)));
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
 * Fills a key: the name zero-padded, since keys are hashed as bytes.
 */
static void
make_key(StatsKey *key, Oid dbid, const char *consumer)
{
	memset(key, 0, sizeof(StatsKey));
	key->dbid = dbid;
	strlcpy(key->consumer, consumer, sizeof(key->consumer));
}

/*
 * Writes len bytes to the counters file and adds them to its checksum.
 */
static bool
write_checked(FILE *file, pg_crc32c *crc, const void *data, size_t len)
{
	COMP_CRC32C(*crc, data, len);
	return fwrite(data, len, 1, file) == 1;
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
	DatabaseStatsEntry *db;
	uint32		header[4] = {STATS_FILE_HEADER, PG_VERSION_NUM / 100,
		(uint32) sizeof(ConsumerCounters), (uint32) sizeof(StatsKey)};
	int32		count;
	pg_crc32c	crc;

	/* not after a crash, nor when not asked to */
	if (code != 0 || stats_state == NULL || !idem_save)
		return;

	file = AllocateFile(STATS_FILE ".tmp", PG_BINARY_W);
	if (file == NULL)
		goto error;

	INIT_CRC32C(crc);
	count = (int32) hash_get_num_entries(db_hash);
	if (!write_checked(file, &crc, header, sizeof(header)) ||
		!write_checked(file, &crc, &count, sizeof(count)))
		goto error;
	hash_seq_init(&hash_seq, db_hash);
	while ((db = hash_seq_search(&hash_seq)) != NULL)
	{
		if (!write_checked(file, &crc, db, sizeof(DatabaseStatsEntry)))
		{
			hash_seq_term(&hash_seq);
			goto error;
		}
	}

	count = (int32) hash_get_num_entries(stats_hash);
	if (!write_checked(file, &crc, &count, sizeof(count)))
		goto error;
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (!write_checked(file, &crc, &entry->key, sizeof(StatsKey)) ||
			!write_checked(file, &crc, &entry->counters, sizeof(ConsumerCounters)))
		{
			hash_seq_term(&hash_seq);
			goto error;
		}
	}
	FIN_CRC32C(crc);
	if (fwrite(&crc, sizeof(crc), 1, file) != 1)
		goto error;

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
 * Reads the whole counters file into memory; NULL (after a log message if
 * it exists) when it cannot.
 */
static char *
read_stats_file(size_t *len)
{
	FILE	   *file;
	struct stat st;
	char	   *data = NULL;

	file = AllocateFile(STATS_FILE, PG_BINARY_R);
	if (file == NULL)
	{
		if (errno != ENOENT)
			ereport(LOG,
					(errcode_for_file_access(),
					 errmsg("could not read file \"%s\": %m", STATS_FILE)));
		return NULL;
	}
	if (fstat(fileno(file), &st) < 0 || st.st_size > (off_t) MaxAllocSize)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not read file \"%s\": %m", STATS_FILE)));
		FreeFile(file);
		return NULL;
	}
	*len = (size_t) st.st_size;
	data = palloc(Max(*len, 1));
	if (*len > 0 && fread(data, *len, 1, file) != 1)
	{
		ereport(LOG,
				(errcode_for_file_access(),
				 errmsg("could not read file \"%s\": %m", STATS_FILE)));
		pfree(data);
		data = NULL;
	}
	FreeFile(file);
	return data;
}

/*
 * Logs why the counters file is ignored.
 */
static void
ignore_stats_file(const char *why)
{
	ereport(LOG,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("ignoring invalid data in file \"%s\"", STATS_FILE),
			 errdetail("%s", why),
			 errhint("The counters of idem_consumer start from zero.")));
}

/*
 * Reads the counters saved at the last clean shutdown, then removes the
 * file so that a crash cannot bring back stale counters.  The file is
 * checked whole (its checksum, then every size) before anything is loaded.
 */
static void
stats_load_file(void)
{
	char	   *data;
	size_t		len;
	size_t		pos;
	uint32		header[4];
	pg_crc32c	crc;
	pg_crc32c	stored_crc;
	int32		ndbs;
	int32		nentries;

	data = read_stats_file(&len);
	if (data == NULL)
		goto done;
	if (!shut_down_cleanly())
		goto done;

	if (len >= sizeof(uint32) && *(uint32 *) data == STATS_FILE_HEADER_1_1)
	{
		ereport(LOG,
				(errmsg("not loading the counters of file \"%s\", saved by idem_consumer 1.1 or earlier",
						STATS_FILE),
				 errdetail("Counters are now kept per database and consumer; the file kept them per consumer only."),
				 errhint("The counters of idem_consumer start from zero, once.")));
		goto done;
	}
	if (len < sizeof(header) + 2 * sizeof(int32) + sizeof(pg_crc32c))
	{
		ignore_stats_file("The file is too short: it was cut short.");
		goto done;
	}
	memcpy(header, data, sizeof(header));
	if (header[0] != STATS_FILE_HEADER || header[1] != PG_VERSION_NUM / 100 ||
		header[2] != (uint32) sizeof(ConsumerCounters) ||
		header[3] != (uint32) sizeof(StatsKey))
	{
		ignore_stats_file("Its header is not that of this version.");
		goto done;
	}
	INIT_CRC32C(crc);
	COMP_CRC32C(crc, data, len - sizeof(pg_crc32c));
	FIN_CRC32C(crc);
	memcpy(&stored_crc, data + len - sizeof(pg_crc32c), sizeof(pg_crc32c));
	if (!EQ_CRC32C(crc, stored_crc))
	{
		ereport(LOG,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("ignoring file \"%s\": checksum mismatch", STATS_FILE),
				 errdetail("The file was cut short or damaged after it was written."),
				 errhint("The counters of idem_consumer start from zero.")));
		goto done;
	}

	/* the sizes agree with the length, so the reads below stay inside */
	pos = sizeof(header);
	memcpy(&ndbs, data + pos, sizeof(int32));
	pos += sizeof(int32);
	if (ndbs < 0 || ndbs > (len - pos) / sizeof(DatabaseStatsEntry))
	{
		ignore_stats_file("Its count of databases is wrong.");
		goto done;
	}
	pos += (size_t) ndbs * sizeof(DatabaseStatsEntry);
	if (len - pos < sizeof(int32) + sizeof(pg_crc32c))
	{
		ignore_stats_file("Its count of databases is wrong.");
		goto done;
	}
	memcpy(&nentries, data + pos, sizeof(int32));
	pos += sizeof(int32);
	if (nentries < 0 ||
		len - sizeof(pg_crc32c) - pos !=
		(size_t) nentries * (sizeof(StatsKey) + sizeof(ConsumerCounters)))
	{
		ignore_stats_file("Its count of consumers is wrong.");
		goto done;
	}

	pos = sizeof(header) + sizeof(int32);
	for (int i = 0; i < ndbs; i++)
	{
		DatabaseStatsEntry loaded;
		DatabaseStatsEntry *db;

		memcpy(&loaded, data + pos, sizeof(loaded));
		pos += sizeof(loaded);
		if (hash_get_num_entries(db_hash) >= idem_max_consumers)
			continue;
		db = hash_search(db_hash, &loaded.dbid, HASH_ENTER_NULL, NULL);
		if (db != NULL)
			*db = loaded;
	}
	pos += sizeof(int32);
	for (int i = 0; i < nentries; i++)
	{
		StatsKey	key;
		ConsumerCounters counters;
		ConsumerStatsEntry *entry;

		memcpy(&key, data + pos, sizeof(key));
		pos += sizeof(key);
		memcpy(&counters, data + pos, sizeof(counters));
		pos += sizeof(counters);
		key.consumer[IDEM_MAX_CONSUMER_BYTES] = '\0';
		if (counters_are_empty(&counters))
			continue;
		if (hash_get_num_entries(stats_hash) >= idem_max_consumers)
			break;				/* max_consumers was lowered */
		entry = hash_search(stats_hash, &key, HASH_ENTER_NULL, NULL);
		if (entry == NULL)
			break;
		SpinLockInit(&entry->mutex);
		entry->counters = counters;
	}

done:
	if (data != NULL)
		pfree(data);
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
	db_hash = NULL;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);

	stats_state = ShmemInitStruct("idem_consumer stats", sizeof(StatsSharedState), &found);
	if (!found)
	{
		stats_state->lock = &(GetNamedLWLockTranche(STATS_TRANCHE_NAME))->lock;
		SpinLockInit(&stats_state->mutex);
		pg_atomic_init_u64(&stats_state->generation, 1);
		stats_state->started = GetCurrentTimestamp();
	}

	info.keysize = sizeof(StatsKey);
	info.entrysize = sizeof(ConsumerStatsEntry);
	stats_hash = ShmemInitHash("idem_consumer stats hash",
							   idem_max_consumers, idem_max_consumers,
							   &info, HASH_ELEM | HASH_BLOBS);
	info.keysize = sizeof(Oid);
	info.entrysize = sizeof(DatabaseStatsEntry);
	db_hash = ShmemInitHash("idem_consumer database stats hash",
							idem_max_consumers, idem_max_consumers,
							&info, HASH_ELEM | HASH_BLOBS);

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
 * Adds calls to the untracked calls of this database.  The entry is made
 * if there is room; the caller holds no lock.
 */
static void
count_untracked(int64 calls)
{
	DatabaseStatsEntry *db;

	if (calls == 0)
		return;
	LWLockAcquire(stats_state->lock, LW_SHARED);
	db = hash_search(db_hash, &MyDatabaseId, HASH_FIND, NULL);
	if (db == NULL)
	{
		bool		found;

		LWLockRelease(stats_state->lock);
		LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
		db = NULL;
		if (hash_get_num_entries(db_hash) < idem_max_consumers)
			db = hash_search(db_hash, &MyDatabaseId, HASH_ENTER_NULL, &found);
		else
			db = hash_search(db_hash, &MyDatabaseId, HASH_FIND, &found);
		if (db != NULL && !found)
		{
			db->untracked_calls = 0;
			db->stats_reset = GetCurrentTimestamp();
		}
	}
	if (db != NULL)
	{
		SpinLockAcquire(&stats_state->mutex);
		db->untracked_calls += calls;
		SpinLockRelease(&stats_state->mutex);
	}
	LWLockRelease(stats_state->lock);
}

/*
 * Returns this backend's cache of slots, emptied if entries were removed
 * since it was filled.
 */
static HTAB *
slot_ref_cache(void)
{
	uint64		generation = pg_atomic_read_u64(&stats_state->generation);

	if (slot_refs != NULL && slot_refs_generation != generation)
	{
		hash_destroy(slot_refs);
		slot_refs = NULL;
	}
	if (slot_refs == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.entrysize = sizeof(SlotRef);
		ctl.hcxt = TopMemoryContext;
		slot_refs = hash_create("idem_consumer slots", 16, &ctl,
								HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		slot_refs_generation = generation;
	}
	return slot_refs;
}

/*
 * Remembers a consumer known to be committed and its slot (NULL: none),
 * as of generation, unless the cache is at its bound.
 */
static void
remember_slot(const char *consumer, ConsumerStatsEntry *entry, uint64 generation)
{
	HTAB	   *cache = slot_ref_cache();
	SlotRef    *ref;

	if (generation != slot_refs_generation ||
		hash_get_num_entries(cache) >= 2 * (long) idem_max_consumers)
		return;
	ref = hash_search(cache, consumer, HASH_ENTER, NULL);
	ref->entry = entry;
}

/*
 * Warns, once per consumer and session (for at most max_consumers
 * consumers), that a consumer's calls are not counted per consumer.
 */
static void
warn_untracked(const char *consumer, bool transaction_full)
{
	bool		found;

	if (warned == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.entrysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.hcxt = TopMemoryContext;
		warned = hash_create("idem_consumer untracked consumers", 16, &ctl,
							 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	if (hash_get_num_entries(warned) >= idem_max_consumers)
		return;
	(void) hash_search(warned, consumer, HASH_ENTER, &found);
	if (found)
		return;
	if (transaction_full)
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("counters of consumer \"%s\" are not tracked", consumer),
				 errdetail("This transaction called idem_consumer.max_consumers consumers (%d) already; "
						   "the calls of further ones count in idem_stats_info.untracked_calls only.",
						   idem_max_consumers),
				 errhint("Call fewer consumers in one transaction, or raise idem_consumer.max_consumers (it takes a restart).")));
	else
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("counters of consumer \"%s\" are not tracked", consumer),
				 errdetail("idem_consumer.max_consumers consumers (%d) have counters already; "
						   "the calls of this one count in idem_stats_info.untracked_calls only.",
						   idem_max_consumers),
				 errhint("Raise idem_consumer.max_consumers (it takes a restart), and keep roles "
						 "from creating consumers with idem_consumer.create_consumers = off.")));
}

/*
 * Tells whether the consumer's row exists in this database's catalog,
 * committed by an earlier transaction.  Needs a transaction, not an SPI
 * connection of the caller's: it makes its own, which restores the
 * caller's SPI_tuptable when it ends.
 */
static bool
consumer_committed(const char *consumer)
{
	Datum		name = CStringGetTextDatum(consumer);
	bool		committed = false;

	SPI_connect();
	keystore_execute(KS_FIND_CONSUMER, &name, NULL, 1);
	if (SPI_processed > 0)
	{
		bool		isnull;
		TransactionId xmin;

		xmin = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[0],
												   SPI_tuptable->tupdesc, 2, &isnull));
		committed = !TransactionIdIsCurrentTransactionId(xmin);
	}
	SPI_finish();
	return committed;
}

/*
 * Tells whether a consumer's row is visible in this database's catalog;
 * for the reclaim pass, which must not remove a slot its creator just
 * committed.
 */
static bool
consumer_visible(const char *consumer)
{
	Datum		name = CStringGetTextDatum(consumer);
	bool		visible;

	SPI_connect();
	keystore_execute(KS_FIND_CONSUMER, &name, NULL, 1);
	visible = SPI_processed > 0;
	SPI_finish();
	return visible;
}

/*
 * Tells whether the table of slots is full.
 */
static bool
slots_full(void)
{
	bool		full;

	LWLockAcquire(stats_state->lock, LW_SHARED);
	full = hash_get_num_entries(stats_hash) >= idem_max_consumers;
	LWLockRelease(stats_state->lock);
	return full;
}

/*
 * When the table of slots is full, removes the entries of databases that
 * were dropped, of this database's consumers that no longer exist, and of
 * counters that are all zero.  At most once a second per backend (less
 * often when a pass takes more than a tenth of that), and only
 * where a fresh snapshot sees every consumer committed before the pass: a
 * transaction-snapshot isolation level could miss a consumer created since
 * and remove a slot its creator has just taken.
 */
static void
reclaim_slots(void)
{
	TimestampTz now = GetCurrentTimestamp();
	MemoryContext cxt;
	MemoryContext old;
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	DatabaseStatsEntry *db;
	StatsKey   *keys;
	int			nkeys = 0;
	bool	   *dead;
	List	   *other_dbs = NIL;
	List	   *dead_dbs = NIL;
	ListCell   *lc;
	int			removed = 0;

	if (!IsTransactionState() || IsolationUsesXactSnapshot() ||
		now < next_reclaim || !slots_full())
		return;

	cxt = AllocSetContextCreate(CurrentMemoryContext, "idem_consumer reclaim",
								ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);

	/* the keys to judge, and the other databases, copied under the lock */
	keys = palloc(sizeof(StatsKey) * idem_max_consumers);
	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (nkeys >= idem_max_consumers)
		{
			hash_seq_term(&hash_seq);
			break;
		}
		keys[nkeys++] = entry->key;
		if (entry->key.dbid != MyDatabaseId)
			other_dbs = list_append_unique_oid(other_dbs, entry->key.dbid);
	}
	hash_seq_init(&hash_seq, db_hash);
	while ((db = hash_seq_search(&hash_seq)) != NULL)
	{
		if (db->dbid != MyDatabaseId)
			other_dbs = list_append_unique_oid(other_dbs, db->dbid);
	}
	LWLockRelease(stats_state->lock);

	/* pg_database is shared: any database can tell which ones are gone */
	foreach(lc, other_dbs)
	{
		Oid			dbid = lfirst_oid(lc);

		if (!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbid)))
			dead_dbs = lappend_oid(dead_dbs, dbid);
	}

	/* this database's consumers are judged by its own catalog */
	dead = palloc0(sizeof(bool) * Max(nkeys, 1));
	for (int i = 0; i < nkeys; i++)
	{
		if (keys[i].dbid == MyDatabaseId)
			dead[i] = !consumer_visible(keys[i].consumer);
		else
			dead[i] = list_member_oid(dead_dbs, keys[i].dbid);
	}

	LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
	for (int i = 0; i < nkeys; i++)
	{
		entry = hash_search(stats_hash, &keys[i], HASH_FIND, NULL);
		if (entry == NULL)
			continue;
		/* no backend adds to an entry without the shared lock */
		if (dead[i] || counters_are_empty(&entry->counters))
		{
			hash_search(stats_hash, &keys[i], HASH_REMOVE, NULL);
			removed++;
		}
	}
	foreach(lc, dead_dbs)
	{
		Oid			dbid = lfirst_oid(lc);

		hash_search(db_hash, &dbid, HASH_REMOVE, NULL);
	}
	if (removed > 0)
		pg_atomic_fetch_add_u64(&stats_state->generation, 1);
	LWLockRelease(stats_state->lock);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);

	/* a pass costs a lookup per slot of this database: keep it under 10% */
	{
		TimestampTz end = GetCurrentTimestamp();

		next_reclaim = end + Max((int64) RECLAIM_INTERVAL_MS * 1000, 10 * (end - now));
	}
}

/*
 * Returns the slot of a consumer of this database, making one if there is
 * room; NULL if there is none.  The caller knows the consumer exists.
 * Sets *generation to the generation the address is valid for.
 */
static ConsumerStatsEntry *
find_or_make_slot(const char *consumer, uint64 *generation)
{
	StatsKey	key;
	ConsumerStatsEntry *entry;
	bool		found;

	make_key(&key, MyDatabaseId, consumer);
	LWLockAcquire(stats_state->lock, LW_SHARED);
	entry = hash_search(stats_hash, &key, HASH_FIND, NULL);
	*generation = pg_atomic_read_u64(&stats_state->generation);
	LWLockRelease(stats_state->lock);
	if (entry != NULL)
		return entry;

	LWLockAcquire(stats_state->lock, LW_EXCLUSIVE);
	/* a shared hash table can outgrow its size: hold it to the GUC */
	if (hash_get_num_entries(stats_hash) < idem_max_consumers)
		entry = hash_search(stats_hash, &key, HASH_ENTER_NULL, &found);
	else
		entry = hash_search(stats_hash, &key, HASH_FIND, &found);
	if (entry != NULL && !found)
	{
		SpinLockInit(&entry->mutex);
		memset(&entry->counters, 0, sizeof(ConsumerCounters));
		entry->counters.stats_reset = GetCurrentTimestamp();
	}
	*generation = pg_atomic_read_u64(&stats_state->generation);
	LWLockRelease(stats_state->lock);
	return entry;
}

/*
 * Finds what is known of a consumer's slot when its first aggregate of a
 * transaction is made: a slot this backend found before, one in shared
 * memory, or the catalog's word that the consumer exists.  A consumer that
 * exists gets a slot at once if there is room (after a reclaim pass if the
 * table is full); one that does not yet exist gets none here.  Returns
 * false when the consumer exists and there is no room for it.
 */
static bool
resolve_slot(PendingCounts *counts)
{
	HTAB	   *cache = slot_ref_cache();
	SlotRef    *ref;
	StatsKey	key;
	ConsumerStatsEntry *entry;

	counts->generation = slot_refs_generation;
	ref = hash_search(cache, counts->consumer, HASH_FIND, NULL);
	if (ref != NULL)
	{
		counts->entry = ref->entry;
		counts->exists = true;
		return ref->entry != NULL;
	}

	make_key(&key, MyDatabaseId, counts->consumer);
	LWLockAcquire(stats_state->lock, LW_SHARED);
	entry = hash_search(stats_hash, &key, HASH_FIND, NULL);
	counts->generation = pg_atomic_read_u64(&stats_state->generation);
	LWLockRelease(stats_state->lock);
	if (entry != NULL)
	{
		counts->entry = entry;
		counts->exists = true;
		remember_slot(counts->consumer, entry, counts->generation);
		return true;
	}

	counts->exists = consumer_committed(counts->consumer);
	if (!counts->exists)
	{
		/* its commit will want a slot: make room while a pass can run */
		reclaim_slots();
		return true;
	}
	entry = find_or_make_slot(counts->consumer, &counts->generation);
	if (entry == NULL)
	{
		reclaim_slots();
		entry = find_or_make_slot(counts->consumer, &counts->generation);
	}
	counts->entry = entry;
	remember_slot(counts->consumer, entry, counts->generation);
	return entry != NULL;
}

/*
 * Returns the index of aggregates by consumer.
 */
static HTAB *
pending_index_table(void)
{
	if (pending_index == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = IDEM_MAX_CONSUMER_BYTES + 1;
		ctl.entrysize = sizeof(PendingIndexEntry);
		ctl.hcxt = TopMemoryContext;
		pending_index = hash_create("idem_consumer pending counts", 16, &ctl,
									HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	}
	return pending_index;
}

/*
 * Returns the aggregate of a consumer at the current subtransaction level,
 * making it if needed; NULL when the call cannot be counted per consumer:
 * the consumer exists but has no slot, or the transaction has calls of
 * max_consumers consumers already.
 */
static PendingCounts *
pending_counts(const char *consumer)
{
	int			level = GetCurrentTransactionNestLevel();
	PendingIndexEntry *index;
	PendingCounts *counts;
	PendingCounts *outer;
	bool		found;

	index = hash_search(pending_index_table(), consumer, HASH_FIND, NULL);
	outer = index != NULL ? index->deepest : NULL;
	if (outer != NULL && outer->nest_level == level)
		return outer;
	if (npending >= idem_max_consumers)
	{
		warn_untracked(consumer, true);
		return NULL;
	}

	if (!callbacks_registered)
	{
		RegisterXactCallback(stats_xact_callback, NULL);
		RegisterSubXactCallback(stats_subxact_callback, NULL);
		callbacks_registered = true;
	}
	if (pending_cxt == NULL)
		pending_cxt = AllocSetContextCreate(TopMemoryContext,
											"idem_consumer pending counts",
											ALLOCSET_DEFAULT_SIZES);

	counts = MemoryContextAllocZero(pending_cxt, sizeof(PendingCounts));
	strlcpy(counts->consumer, consumer, sizeof(counts->consumer));
	counts->nest_level = level;
	counts->outer = outer;
	counts->last_event_time = DT_NOBEGIN;
	if (outer != NULL)
	{
		counts->entry = outer->entry;
		counts->generation = outer->generation;
		counts->exists = outer->exists;
	}
	else if (!resolve_slot(counts))
	{
		pfree(counts);
		warn_untracked(consumer, false);
		return NULL;
	}

	if (npending == maxpending)
	{
		int			newmax = Max(16, maxpending * 2);

		if (pending == NULL)
			pending = MemoryContextAlloc(pending_cxt, newmax * sizeof(PendingCounts *));
		else
			pending = repalloc(pending, newmax * sizeof(PendingCounts *));
		maxpending = newmax;
	}
	pending[npending++] = counts;
	index = hash_search(pending_index, consumer, HASH_ENTER, &found);
	index->deepest = counts;
	return counts;
}

/*
 * Folds an aggregate's applied calls kept one by one into its histograms,
 * measuring their lag now.
 */
static void
fold_samples(PendingCounts *counts)
{
	TimestampTz now = GetCurrentTimestamp();

	if (counts->latency == NULL)
	{
		counts->latency = MemoryContextAllocZero(pending_cxt, sizeof(IdemHistogram));
		counts->lag = MemoryContextAllocZero(pending_cxt, sizeof(IdemHistogram));
	}
	for (int i = 0; i < counts->nsamples; i++)
	{
		PendingSample *sample = &counts->samples[i];

		histogram_add_n(counts->latency, sample->latency_us, sample->messages);
		if (!TIMESTAMP_IS_NOBEGIN(sample->event_time))
			histogram_add(counts->lag, now - sample->event_time);
	}
	counts->nsamples = 0;
}

/*
 * Adds one aggregate to another of the same consumer (a committed
 * subtransaction's to its parent's).
 */
static void
merge_counts(PendingCounts *into, PendingCounts *from)
{
	into->calls += from->calls;
	into->unfinished += from->unfinished;
	into->applied += from->applied;
	into->duplicates += from->duplicates;
	into->dead_lettered += from->dead_lettered;
	into->key_reuse += from->key_reuse;
	into->resolved |= from->resolved;
	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		into->effects[e] += from->effects[e];
	if (!TIMESTAMP_IS_NOBEGIN(from->last_event_time))
		into->last_event_time = from->last_event_time;
	if (from->latency != NULL || into->nsamples + from->nsamples > PENDING_SAMPLES)
	{
		fold_samples(into);
		fold_samples(from);
		histogram_merge(into->latency, from->latency);
		histogram_merge(into->lag, from->lag);
	}
	else
	{
		memcpy(&into->samples[into->nsamples], from->samples,
			   from->nsamples * sizeof(PendingSample));
		into->nsamples += from->nsamples;
	}
}

/*
 * Frees an aggregate that was counted or merged, so that a transaction
 * of many subtransactions keeps only the aggregates alive.
 */
static void
free_counts(PendingCounts *counts)
{
	if (counts->latency != NULL)
	{
		pfree(counts->latency);
		pfree(counts->lag);
	}
	pfree(counts);
}

/*
 * Returns the slot an aggregate's counts go to, with the shared lock held
 * (the caller releases it), or NULL without the lock.  A consumer without
 * a slot gets one if make is true and there is room.
 */
static ConsumerStatsEntry *
lock_slot(PendingCounts *counts, bool make)
{
	ConsumerStatsEntry *entry = NULL;
	uint64		generation;

	LWLockAcquire(stats_state->lock, LW_SHARED);
	if (counts->entry != NULL &&
		counts->generation == pg_atomic_read_u64(&stats_state->generation))
		return counts->entry;
	{
		StatsKey	key;

		make_key(&key, MyDatabaseId, counts->consumer);
		entry = hash_search(stats_hash, &key, HASH_FIND, NULL);
	}
	if (entry != NULL)
		return entry;
	LWLockRelease(stats_state->lock);
	if (!make)
		return NULL;

	/* made under the exclusive lock, then written under the shared one */
	do
	{
		entry = find_or_make_slot(counts->consumer, &generation);
		if (entry == NULL)
			return NULL;
		LWLockAcquire(stats_state->lock, LW_SHARED);
		if (generation == pg_atomic_read_u64(&stats_state->generation))
			return entry;
		LWLockRelease(stats_state->lock);
	} while (true);
}

/*
 * Adds an aggregate's counts to its consumer's slot; committed tells
 * whether its calls committed (else they failed).  Counts of a consumer
 * that is not known to exist are forgotten: its creation rolled back, or
 * was refused.
 */
static void
flush_counts(PendingCounts *counts, bool committed, TimestampTz now)
{
	ConsumerStatsEntry *entry;
	ConsumerCounters *c;
	bool		known;
	bool		any = counts->calls > 0 || counts->key_reuse > 0;

	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		any |= counts->effects[e] > 0;
	if (!any)
		return;

	/* a call that returned, or an effect counted, found or made its row */
	known = counts->exists ||
		(committed && (counts->resolved || counts->calls > counts->unfinished));
	if (!known)
		return;

	entry = lock_slot(counts, true);
	if (entry == NULL)
	{
		count_untracked(counts->calls);
		if (committed)
		{
			/* the consumer exists now, and will find no room next time */
			remember_slot(counts->consumer, NULL, counts->generation);
			warn_untracked(counts->consumer, false);
		}
		return;
	}

	c = &entry->counters;
	SpinLockAcquire(&entry->mutex);
	c->key_reuse += counts->key_reuse;
	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		c->effects[e] += counts->effects[e];
	if (!committed)
		c->failed += counts->calls;
	else
	{
		c->failed += counts->unfinished;
		c->applied += counts->applied;
		c->duplicates += counts->duplicates;
		c->dead_lettered += counts->dead_lettered;
		if (counts->applied > 0)
		{
			c->last_applied_at = now;
			for (int i = 0; i < counts->nsamples; i++)
			{
				PendingSample *sample = &counts->samples[i];

				histogram_add_n(&c->latency, sample->latency_us, sample->messages);
				if (!TIMESTAMP_IS_NOBEGIN(sample->event_time))
					histogram_add(&c->lag, now - sample->event_time);
			}
			if (counts->latency != NULL)
			{
				histogram_merge(&c->latency, counts->latency);
				histogram_merge(&c->lag, counts->lag);
			}
			if (!TIMESTAMP_IS_NOBEGIN(counts->last_event_time))
			{
				c->lag_last_us = now - counts->last_event_time;
				c->has_lag = true;
			}
		}
		if (counts->duplicates > 0)
			c->last_duplicate_at = now;
	}
	SpinLockRelease(&entry->mutex);
	LWLockRelease(stats_state->lock);
}

/*
 * Forgets every aggregate and call of the transaction.
 */
static void
pending_reset(void)
{
	for (int i = 0; i < npending; i++)
		(void) hash_search(pending_index, pending[i]->consumer, HASH_REMOVE, NULL);
	npending = 0;
	maxpending = 0;
	pending = NULL;
	nopen = 0;
	if (pending_cxt != NULL)
		MemoryContextReset(pending_cxt);
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
	int64		calls = 0;

	for (int i = 0; i < npending; i++)
		calls += pending[i]->calls;
	count_untracked(calls);
}

/*
 * Counts the aggregates when the top-level transaction ends.
 */
static void
stats_xact_callback(XactEvent event, void *arg)
{
	TimestampTz now;

	if (npending == 0 && nopen == 0)
		return;

	switch (event)
	{
		case XACT_EVENT_COMMIT:
			now = GetCurrentTimestamp();
			for (int i = 0; i < npending; i++)
				flush_counts(pending[i], true, now);
			pending_reset();
			break;
		case XACT_EVENT_PREPARE:
			count_prepared();
			pending_reset();
			break;
		case XACT_EVENT_ABORT:
			now = GetCurrentTimestamp();
			for (int i = 0; i < npending; i++)
				flush_counts(pending[i], false, now);
			pending_reset();
			break;
		default:
			break;
	}
}

/*
 * Merges the aggregates of a committed subtransaction into its parent's,
 * and counts those of an aborted one as failed.  The aggregates of a level
 * are a suffix of the list, since levels only deepen along it.
 */
static void
stats_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	int			level;
	int			first;
	int			kept;
	TimestampTz now;

	if (npending == 0 && nopen == 0)
		return;
	if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB)
		return;

	level = GetCurrentTransactionNestLevel();
	for (first = npending; first > 0 && pending[first - 1]->nest_level >= level; first--)
		;
	/* a call still open at the end of its level never returned */
	while (nopen > 0 && open_calls[nopen - 1].nest_level >= level)
		nopen--;

	now = GetCurrentTimestamp();
	kept = first;
	for (int i = first; i < npending; i++)
	{
		PendingCounts *counts = pending[i];
		PendingCounts *outer = counts->outer;
		PendingIndexEntry *index;

		index = hash_search(pending_index, counts->consumer, HASH_FIND, NULL);
		if (event == SUBXACT_EVENT_ABORT_SUB)
		{
			flush_counts(counts, false, now);
			if (outer != NULL)
				index->deepest = outer;
			else
				(void) hash_search(pending_index, counts->consumer, HASH_REMOVE, NULL);
			free_counts(counts);
			continue;
		}
		if (outer != NULL && outer->nest_level == level - 1)
		{
			merge_counts(outer, counts);
			index->deepest = outer;
			free_counts(counts);
			continue;
		}
		counts->nest_level = level - 1;
		pending[kept++] = counts;
	}
	npending = kept;
}

/*
 * Notes the start of a call; returns a handle for stats_call_end(), or -1
 * when the call is not counted.  The caller has resolved the consumer,
 * which checks that the current role may act on it, or found that it does
 * not exist yet.
 */
int
stats_call_begin(const char *consumer)
{
	PendingCounts *counts;
	OpenCall   *call;

	if (stats_state == NULL || !idem_track)
		return -1;

	counts = pending_counts(consumer);
	if (counts == NULL)
	{
		count_untracked(1);
		return -1;
	}

	if (nopen == maxopen)
	{
		int			newmax = Max(8, maxopen * 2);

		if (open_calls == NULL)
			open_calls = MemoryContextAlloc(TopMemoryContext, newmax * sizeof(OpenCall));
		else
			open_calls = repalloc(open_calls, newmax * sizeof(OpenCall));
		maxopen = newmax;
	}
	counts->calls++;
	counts->unfinished++;
	call = &open_calls[nopen];
	call->counts = counts;
	call->nest_level = counts->nest_level;
	call->open = true;
	INSTR_TIME_SET_CURRENT(call->start);
	return nopen++;
}

/*
 * Notes the outcome of a call that returned normally; event_time is
 * DT_NOBEGIN when the caller passed none.
 */
void
stats_call_end(int call_id, int applied, int duplicates, int dead_lettered,
			   TimestampTz event_time)
{
	OpenCall   *call;
	PendingCounts *counts;
	instr_time	elapsed;

	if (call_id < 0 || call_id >= nopen || !open_calls[call_id].open)
		return;

	call = &open_calls[call_id];
	counts = call->counts;
	INSTR_TIME_SET_CURRENT(elapsed);
	INSTR_TIME_SUBTRACT(elapsed, call->start);
	counts->unfinished--;
	counts->resolved = true;
	counts->applied += applied;
	counts->duplicates += duplicates;
	counts->dead_lettered += dead_lettered;
	if (applied > 0)
	{
		PendingSample *sample;

		if (counts->latency != NULL || counts->nsamples == PENDING_SAMPLES)
			fold_samples(counts);
		sample = &counts->samples[counts->nsamples++];
		/* a batch's messages share its time equally */
		sample->latency_us = (int64) INSTR_TIME_GET_MICROSEC(elapsed) / applied;
		sample->messages = applied;
		sample->event_time = event_time;
		if (!TIMESTAMP_IS_NOBEGIN(event_time))
			counts->last_event_time = event_time;
	}

	call->open = false;
	while (nopen > 0 && !open_calls[nopen - 1].open)
		nopen--;
}

/*
 * Notes that a call found its key recorded for another message; counted
 * when the transaction ends, whether the call then fails or parks it.
 */
void
stats_call_key_reuse(int call_id)
{
	if (call_id >= 0 && call_id < nopen && open_calls[call_id].open)
		open_calls[call_id].counts->key_reuse++;
}

/*
 * Counts an event of an external effect, when the transaction ends.  The
 * events that matter most (a fenced-off completion, a request mismatch)
 * raise an error, so they count at abort too, for a consumer that existed
 * before the transaction.
 */
void
stats_count_effect(const char *consumer, EffectEvent event)
{
	PendingCounts *counts;

	if (stats_state == NULL || !idem_track)
		return;
	counts = pending_counts(consumer);
	if (counts == NULL)
	{
		count_untracked(1);
		return;
	}
	counts->effects[event]++;
	counts->resolved = true;
}

/*
 * Calls fn with a copy of the counters of each consumer of one database
 * (of every database if dbid is InvalidOid) in turn, copied under that
 * consumer's spinlock into one buffer: the memory a pass takes does not
 * grow with the number of consumers.  The shared lock on the table is
 * held throughout, so fn should be quick and must not call back here.
 */
void
stats_foreach(Oid dbid, void (*fn) (const ConsumerStatsCopy *copy, void *arg), void *arg)
{
	HASH_SEQ_STATUS hash_seq;
	ConsumerStatsEntry *entry;
	ConsumerStatsCopy *copy = palloc(sizeof(ConsumerStatsCopy));

	stats_require_shmem();

	LWLockAcquire(stats_state->lock, LW_SHARED);
	hash_seq_init(&hash_seq, stats_hash);
	while ((entry = hash_seq_search(&hash_seq)) != NULL)
	{
		if (OidIsValid(dbid) && entry->key.dbid != dbid)
			continue;
		copy->dbid = entry->key.dbid;
		strlcpy(copy->consumer, entry->key.consumer, sizeof(copy->consumer));
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
	stats_foreach(MyDatabaseId, put_stats_row, &rows);
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
		if (entry->key.dbid != MyDatabaseId ||
			(consumer != NULL && strcmp(consumer, entry->key.consumer) != 0))
			continue;
		SpinLockAcquire(&entry->mutex);
		memset(&entry->counters, 0, sizeof(ConsumerCounters));
		entry->counters.stats_reset = now;
		SpinLockRelease(&entry->mutex);
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
