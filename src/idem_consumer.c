/*-------------------------------------------------------------------------
 *
 * idem_consumer.c
 *	  Library entry point of idem_consumer: defines the GUCs and lets each
 *	  module register what it needs.  Only the counters (stats.c) and the
 *	  purge worker (purge_worker.c) need shared_preload_libraries;
 *	  deduplication and idem_purge() work without it.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

PG_MODULE_MAGIC;

/* Number of distinct business SQL texts whose plans a backend keeps. */
int			idem_plan_cache_size = 256;

/* SQLSTATEs and classes idem_try_apply() treats as transient on top of its own. */
char	   *idem_transient_sqlstates = NULL;
/* Default retention window, in seconds; -1 keeps keys forever. */
int			idem_retention = 7 * SECS_PER_DAY;
/* Whether keys may be recorded and probed in C instead of SQL (keystore.c). */
bool		idem_fast_path = true;

void		_PG_init(void);

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
 * Defines the GUCs and initializes each module.
 */
void
_PG_init(void)
{
	DefineCustomIntVariable("idem_consumer.plan_cache_size",
							"Sets how many business SQL texts a session keeps prepared plans for.",
							"The least recently used plan is dropped when the limit is reached.",
							&idem_plan_cache_size,
							256,
							1,
							65536,
							PGC_USERSET,
							0,
							NULL,
							NULL,
							NULL);
	DefineCustomIntVariable("idem_consumer.retention",
							"Sets how long keys are kept, counted back from their consumer's latest activity.",
							"A key is purged when it is this much older than the newest key of its consumer. "
							"-1 keeps keys forever. idem_set_retention() overrides it per consumer.",
							&idem_retention,
							7 * SECS_PER_DAY,
							-1,
							INT_MAX,
							PGC_SUSET,
							GUC_UNIT_S,
							check_retention,
							NULL,
							NULL);

	DefineCustomBoolVariable("idem_consumer.fast_path",
							 "Records and looks up keys in C when the storage allows it.",
							 "Off runs every statement on the storage as SQL, the reference path: "
							 "for tests and for comparing the two.",
							 &idem_fast_path,
							 true,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);

	stats_init();
	DefineCustomStringVariable("idem_consumer.transient_sqlstates",
							   "Adds SQLSTATEs that idem_try_apply re-raises instead of dead-lettering.",
							   "A comma-separated list of five-character SQLSTATEs and two-character "
							   "SQLSTATE classes, on top of the built-in transient ones.",
							   &idem_transient_sqlstates,
							   "",
							   PGC_USERSET,
							   GUC_LIST_INPUT,
							   check_transient_sqlstates,
							   assign_transient_sqlstates,
							   NULL);
	purge_worker_init();

	MarkGUCPrefixReserved("idem_consumer");

	keystore_init();
}
