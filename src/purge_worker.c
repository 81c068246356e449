/*-------------------------------------------------------------------------
 *
 * purge_worker.c
 *	  The background worker that purges expired keys on a schedule, one per
 *	  database listed in idem_consumer.purge_databases, and its GUCs.
 *
 * Off by default: purging deletes data, and before it may run unattended
 * the retention windows must cover everything the brokers can still
 * redeliver.  Listing a database is that decision.
 *
 * A worker runs a purge (retention.c) every purge_interval seconds,
 * counted from the end of the previous run.  Each chunk of the run is its
 * own transaction with a fresh snapshot, so the worker holds neither row
 * locks nor a snapshot for longer than one chunk, and after each chunk it
 * sleeps purge_delay milliseconds to leave the machine to consumers.
 * While the extension is not installed in its database the worker logs
 * that once and checks again at every interval.  An error ends the worker
 * and the postmaster starts it again PURGE_WORKER_RESTART_SECS later.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/purge_worker.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#ifdef __linux__
#include <sched.h>
#endif

#include "access/xact.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/varlena.h"

#include "idem_consumer.h"

#define PURGE_WORKER_RESTART_SECS	60

/*
 * After each chunk the worker sleeps this many times as long as the chunk
 * took, or purge_delay if longer: a sixth of a CPU at most, and less where
 * consumers keep the CPUs busy, since its chunks then take longer.  A
 * shorter pause takes a noticeable share of throughput from consumers that
 * saturate the CPUs; at a sixth the worker still purges faster than they
 * record keys (docs/retention-costs.md).
 */
#define PURGE_PAUSE_FACTOR			5

/* GUCs */
static char *purge_databases = "";
static int	purge_interval = 300;	/* seconds */
static int	purge_delay = 10;		/* milliseconds */
static int	purge_batch_size = 5000;

PGDLLEXPORT void idem_purge_worker_main(Datum main_arg);

/*
 * Accepts a comma-separated list of database names.
 */
static bool
check_purge_databases(char **newval, void **extra, GucSource source)
{
	char	   *rawstring = pstrdup(*newval);
	List	   *names;
	ListCell   *lc;
	bool		ok = true;

	if (!SplitGUCList(rawstring, ',', &names))
	{
		GUC_check_errdetail("List syntax is invalid.");
		ok = false;
	}
	else
	{
		foreach(lc, names)
		{
			if (strlen((char *) lfirst(lc)) >= NAMEDATALEN)
			{
				GUC_check_errdetail("Database name \"%s\" is too long.",
									(char *) lfirst(lc));
				ok = false;
				break;
			}
		}
		list_free(names);
	}
	pfree(rawstring);
	return ok;
}

/*
 * Registers one worker per database of idem_consumer.purge_databases.
 */
static void
register_purge_workers(void)
{
	char	   *rawstring = pstrdup(purge_databases);
	List	   *names;
	List	   *registered = NIL;
	ListCell   *lc;

	if (!SplitGUCList(rawstring, ',', &names))
		elog(ERROR, "invalid list syntax in idem_consumer.purge_databases");

	foreach(lc, names)
	{
		char	   *dbname = lfirst(lc);
		BackgroundWorker worker;

		if (list_member(registered, makeString(dbname)))
			continue;
		registered = lappend(registered, makeString(dbname));

		memset(&worker, 0, sizeof(worker));
		worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
		worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
		worker.bgw_restart_time = PURGE_WORKER_RESTART_SECS;
		strlcpy(worker.bgw_library_name, "idem_consumer", BGW_MAXLEN);
		strlcpy(worker.bgw_function_name, "idem_purge_worker_main", BGW_MAXLEN);
		snprintf(worker.bgw_name, BGW_MAXLEN,
				 "idem_consumer purge worker for database %s", dbname);
		strlcpy(worker.bgw_type, "idem_consumer purge worker", BGW_MAXLEN);
		strlcpy(worker.bgw_extra, dbname, BGW_EXTRALEN);
		RegisterBackgroundWorker(&worker);
	}
}

/*
 * When preloaded, defines the worker's GUCs and registers the workers.
 */
void
purge_worker_init(void)
{
	/* a PGC_POSTMASTER variable can only be defined while preloading */
	if (!process_shared_preload_libraries_in_progress)
		return;

	DefineCustomStringVariable("idem_consumer.purge_databases",
							   "Lists the databases whose expired keys a background worker purges.",
							   "Comma-separated; one worker per database. Empty (the default) starts no worker.",
							   &purge_databases,
							   "",
							   PGC_POSTMASTER,
							   GUC_LIST_INPUT,
							   check_purge_databases,
							   NULL,
							   NULL);
	DefineCustomIntVariable("idem_consumer.purge_interval",
							"Sets the time between the end of a purge run and the start of the next.",
							NULL,
							&purge_interval,
							300,
							1,
							INT_MAX / 1000,
							PGC_SIGHUP,
							GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomIntVariable("idem_consumer.purge_delay",
							"Sets how long the purge worker sleeps after each chunk, at least.",
							"It also sleeps five times as long as the chunk took. Longer delays leave more of the machine to consumers and make a run take longer.",
							&purge_delay,
							10,
							0,
							60000,
							PGC_SIGHUP,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	DefineCustomIntVariable("idem_consumer.purge_batch_size",
							"Sets how many keys the purge worker removes per transaction, at most.",
							NULL,
							&purge_batch_size,
							5000,
							1,
							1000000,
							PGC_SIGHUP,
							0,
							NULL, NULL, NULL);

	register_purge_workers();
}

/*
 * Sleeps up to ms milliseconds, or until signalled; reloads the
 * configuration after a SIGHUP and exits on SIGTERM.
 */
static void
purge_worker_sleep(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
					 ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();

	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/*
 * Runs step(arg) in a transaction of its own, connected to SPI, reported as
 * activity; returns what it returns, 0 when the extension is not installed
 * in the worker's database.
 */
static uint64
purge_worker_in_transaction(const char *activity, uint64 (*step) (int), int arg)
{
	uint64		done = 0;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
	if (OidIsValid(get_extension_oid("idem_consumer", true)))
		done = step(arg);
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_activity(STATE_IDLE, NULL);
	return done;
}

/*
 * Step step of purge_worker_generations, when keys expire by generation.
 */
static uint64
generation_step(int step)
{
	if (!keygen_retention_by_generation())
		return 0;
	return step == 0 ? keygen_switch_if_due(1000) :
		step == 2 ? keygen_build_filters() : keygen_retire();
}

/*
 * Switches generations of keys, drops the expired ones and builds the
 * filters of the sealed ones left when keys expire by generation
 * (idem_consumer.key_generation_interval), each in a transaction of its
 * own, before a purge of the legacy keys.  A switch waits at most a second
 * for the gate (keygen.c); one that cannot be done now is tried again at
 * the next run.  The retirement and the build settle first what they can.
 */
static void
purge_worker_generations(const char *dbname)
{
	/*
	 * switch, drop, build the filters of the generations left (so that the
	 * filter of all sealed generations is built once, without the dropped
	 * ones), and truncate what the drop dropped
	 */
	for (int step = 0; step < 4; step++)
	{
		int			done = (int) purge_worker_in_transaction("idem_consumer key generations",
															 generation_step, step);

		if (done > 0 && step == 0)
			ereport(LOG,
					(errmsg("idem_consumer opened generation %d of keys in database \"%s\"",
							done, dbname)));
		else if (done > 0 && step == 2)
			ereport(LOG,
					(errmsg("idem_consumer built %d filters of sealed generations of keys in database \"%s\"",
							done, dbname)));
		else if (done > 0)
			ereport(LOG,
					(errmsg("idem_consumer dropped %d expired generations of keys in database \"%s\"",
							done, dbname)));
	}
}

/* purge_worker_routed's step: the expired routed keys of every consumer */
static uint64
routed_step(int unused)
{
	return routed_purge(NULL);
}

/*
 * Removes the expired routed keys (routed.c) in a transaction of its own,
 * where this node is the one that purges them.
 */
static void
purge_worker_routed(const char *dbname)
{
	uint64		removed = purge_worker_in_transaction("idem_consumer purge of routed keys",
													  routed_step, 0);

	if (removed > 0)
		ereport(LOG,
				(errmsg("idem_consumer purged " UINT64_FORMAT " routed keys in database \"%s\"",
						removed, dbname)));
}

/*
 * Runs one purge of the worker's database, a transaction per chunk.
 */
static void
purge_worker_run(MemoryContext loop_cxt, const char *dbname)
{
	static bool reported_missing = false;
	TimestampTz start = GetCurrentTimestamp();
	uint64		total = 0;
	PurgeProgress progress = PURGE_CONTINUES;

	purge_worker_generations(dbname);
	purge_worker_routed(dbname);

	while (progress != PURGE_RUN_DONE)
	{
		uint64		removed = 0;
		TimestampTz chunk_start = GetCurrentTimestamp();
		long		pause;

		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		SPI_connect();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, "idem_consumer purge");

		if (!OidIsValid(get_extension_oid("idem_consumer", true)))
		{
			if (!reported_missing)
				ereport(LOG,
						(errmsg("idem_consumer purge worker: extension \"idem_consumer\" is not installed in database \"%s\"",
								dbname),
						 errdetail("The worker checks again every idem_consumer.purge_interval.")));
			reported_missing = true;
			progress = PURGE_RUN_DONE;
		}
		else
		{
			reported_missing = false;
			purge_begin_batch(0, purge_batch_size);
			progress = purge_step(&removed);
		}

		SPI_finish();
		PopActiveSnapshot();

		/*
		 * Commits as synchronous_commit says; turning it off here would not
		 * spare consumers anything: a chunk writes up to megabytes of WAL (a
		 * delete record per key, a full-page image per page first touched
		 * after a checkpoint), and the next consumer to commit would have to
		 * write it out first, in its own latency.
		 */
		CommitTransactionCommand();
		pgstat_report_stat(false);
		pgstat_report_activity(STATE_IDLE, NULL);
		MemoryContextSwitchTo(loop_cxt);

		total += removed;
		if (progress != PURGE_RUN_DONE)
		{
			/* busy at most 1 / (1 + PURGE_PAUSE_FACTOR) of the time */
			pause = TimestampDifferenceMilliseconds(chunk_start, GetCurrentTimestamp());
			purge_worker_sleep(Max(purge_delay, PURGE_PAUSE_FACTOR * pause));
		}
	}

	if (total > 0)
	{
		long		secs;
		int			usecs;

		TimestampDifference(start, GetCurrentTimestamp(), &secs, &usecs);
		ereport(LOG,
				(errmsg("idem_consumer purged " UINT64_FORMAT " expired keys in database \"%s\" in %ld.%03d s",
						total, dbname, secs, usecs / 1000)));
	}
}

/*
 * On Linux, makes the worker a batch process for the scheduler: it keeps
 * its fair share of a CPU, at the same priority as the backends (a lower
 * priority could leave a lock it holds waiting behind busy consumers), but
 * waking from its pause after a chunk it no longer preempts a running
 * process.  Such a preemption, a few times a second, can keep a consumer
 * off its CPU for milliseconds, which shows in the tail latency of
 * consumers that saturate the CPUs (docs/retention-costs.md).
 */
static void
purge_worker_set_batch_policy(void)
{
#if defined(__linux__) && defined(SCHED_BATCH)
	struct sched_param param;

	memset(&param, 0, sizeof(param));
	if (sched_setscheduler(0, SCHED_BATCH, &param) != 0)
		ereport(LOG,
				(errmsg("idem_consumer purge worker could not make itself a batch process: %m")));
#endif
}

/*
 * Main function of a purge worker; bgw_extra names its database.
 */
void
idem_purge_worker_main(Datum main_arg)
{
	char		dbname[NAMEDATALEN];
	MemoryContext loop_cxt;

	strlcpy(dbname, MyBgworkerEntry->bgw_extra, sizeof(dbname));

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();

	BackgroundWorkerInitializeConnection(dbname, NULL, 0);
	pgstat_report_appname("idem_consumer purge worker");
	purge_worker_set_batch_policy();

	loop_cxt = AllocSetContextCreate(TopMemoryContext, "idem_consumer purge worker",
									 ALLOCSET_DEFAULT_SIZES);

	for (;;)
	{
		TimestampTz run_ended;

		MemoryContextSwitchTo(loop_cxt);
		purge_worker_run(loop_cxt, dbname);
		MemoryContextReset(loop_cxt);

		/* the interval may change while we wait */
		run_ended = GetCurrentTimestamp();
		for (;;)
		{
			long		ms;

			ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(),
												 TimestampTzPlusMilliseconds(run_ended,
																			 (int64) purge_interval * 1000));
			if (ms <= 0)
				break;
			purge_worker_sleep(ms);
		}
	}
}
