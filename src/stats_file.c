/*-------------------------------------------------------------------------
 *
 * stats_file.c
 *	  The counters' shared memory, made at start-up and filled from
 *	  pg_stat/idem_consumer.stat, and that file written again at exit.
 *
 * Counters are written to pg_stat/idem_consumer.stat when the postmaster
 * exits and read back (and the file removed) at start-up only if pg_control
 * says the server was shut down cleanly, so they survive a restart but not
 * a crash or an immediate shutdown, both of which need crash recovery.  The
 * file ends with a CRC-32C of everything before it: a file cut short or
 * damaged is ignored with a log message, never read as counters.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/stats_file.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/stat.h>
#include <unistd.h>

#include "catalog/pg_control.h"
#include "common/controldata_utils.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/pg_crc32c.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/memutils.h"

#include "stats_internal.h"

#define STATS_TRANCHE_NAME		"idem_consumer"
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

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

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
stats_file_save(int code, Datum arg)
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
 * Checks a counters file read whole: its format, checksum and counts.
 * Sets *ndbs and *nentries, the counts of its databases and consumers, and
 * returns true if it may be loaded; logs why not and returns false
 * otherwise.
 */
static bool
stats_file_check(const char *data, size_t len, int32 *ndbs, int32 *nentries)
{
	size_t		pos;
	uint32		header[4];
	pg_crc32c	crc;
	pg_crc32c	stored_crc;

	if (len >= sizeof(uint32) && *(const uint32 *) data == STATS_FILE_HEADER_1_1)
	{
		ereport(LOG,
				(errmsg("not loading the counters of file \"%s\", saved by idem_consumer 1.1 or earlier",
						STATS_FILE),
				 errdetail("Counters are now kept per database and consumer; the file kept them per consumer only."),
				 errhint("The counters of idem_consumer start from zero, once.")));
		return false;
	}
	if (len < sizeof(header) + 2 * sizeof(int32) + sizeof(pg_crc32c))
	{
		ignore_stats_file("The file is too short: it was cut short.");
		return false;
	}
	memcpy(header, data, sizeof(header));
	if (header[0] != STATS_FILE_HEADER || header[1] != PG_VERSION_NUM / 100 ||
		header[2] != (uint32) sizeof(ConsumerCounters) ||
		header[3] != (uint32) sizeof(StatsKey))
	{
		ignore_stats_file("Its header is not that of this version.");
		return false;
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
		return false;
	}

	/* the sizes agree with the length, so the reads of the caller stay inside */
	pos = sizeof(header);
	memcpy(ndbs, data + pos, sizeof(int32));
	pos += sizeof(int32);
	if (*ndbs < 0 || *ndbs > (len - pos) / sizeof(DatabaseStatsEntry))
	{
		ignore_stats_file("Its count of databases is wrong.");
		return false;
	}
	pos += (size_t) *ndbs * sizeof(DatabaseStatsEntry);
	if (len - pos < sizeof(int32) + sizeof(pg_crc32c))
	{
		ignore_stats_file("Its count of databases is wrong.");
		return false;
	}
	memcpy(nentries, data + pos, sizeof(int32));
	pos += sizeof(int32);
	if (*nentries < 0 ||
		len - sizeof(pg_crc32c) - pos !=
		(size_t) *nentries * (sizeof(StatsKey) + sizeof(ConsumerCounters)))
	{
		ignore_stats_file("Its count of consumers is wrong.");
		return false;
	}
	return true;
}

/*
 * Loads the ndbs databases and nentries consumers of a checked counters
 * file into shared memory, as many as max_consumers allows.
 */
static void
stats_file_fill(const char *data, int32 ndbs, int32 nentries)
{
	size_t		pos = 4 * sizeof(uint32) + sizeof(int32);

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
		if (stats_counters_empty(&counters))
			continue;
		if (hash_get_num_entries(stats_hash) >= idem_max_consumers)
			break;				/* max_consumers was lowered */
		entry = hash_search(stats_hash, &key, HASH_ENTER_NULL, NULL);
		if (entry == NULL)
			break;
		LWLockInitialize(&entry->lock, stats_state->lock->tranche);
		entry->counters = counters;
		stats_count_slot(key.dbid, 1);
	}
}

/*
 * Reads the counters saved at the last clean shutdown, then removes the
 * file so that a crash cannot bring back stale counters.  The file is
 * checked whole (its checksum, then every size) before anything is loaded.
 */
static void
stats_file_load(void)
{
	size_t		len;
	char	   *data = read_stats_file(&len);
	int32		ndbs;
	int32		nentries;

	if (data != NULL && shut_down_cleanly() &&
		stats_file_check(data, len, &ndbs, &nentries))
		stats_file_fill(data, ndbs, nentries);

	if (data != NULL)
		pfree(data);
	unlink(STATS_FILE);
}

/*
 * Returns the size of the shared memory the counters need.
 */
static Size
stats_memsize(void)
{
	Size		size = MAXALIGN(sizeof(StatsSharedState));

	size = add_size(size, hash_estimate_size(idem_max_consumers,
											 sizeof(ConsumerStatsEntry)));
	size = add_size(size, hash_estimate_size(idem_max_consumers,
											 sizeof(DatabaseSlots)));
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
	db_slots_hash = NULL;

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
	info.entrysize = sizeof(DatabaseSlots);
	db_slots_hash = ShmemInitHash("idem_consumer database slots hash",
								  idem_max_consumers, idem_max_consumers,
								  &info, HASH_ELEM | HASH_BLOBS);

	LWLockRelease(AddinShmemInitLock);

	if (!IsUnderPostmaster)
		on_shmem_exit(stats_file_save, (Datum) 0);

	if (!found)
		stats_file_load();
}

/*
 * When preloaded, hooks the making of the counters' shared memory; called
 * once from _PG_init, after stats_init() has defined its size.
 */
void
stats_file_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = stats_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = stats_shmem_startup;
}
