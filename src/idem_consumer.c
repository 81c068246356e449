/*-------------------------------------------------------------------------
 *
 * idem_consumer.c
 *	  Library entry point of idem_consumer: lets each module define its GUCs
 *	  and register what it needs.  Only the counters (stats.c) and the
 *	  purge worker (purge_worker.c) need shared_preload_libraries;
 *	  deduplication and idem_purge() work without it.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/idem_consumer.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "idem_consumer.h"
#include "positions.h"

PG_MODULE_MAGIC;

/*
 * Initializes each module, then reserves the GUC prefix.
 */
void
_PG_init(void)
{
	plan_cache_init();
	consumers_init();
	fastpath_init();
	retention_init();
	stats_init();
	stats_file_init();
	business_run_init();
	purge_worker_init();
	effects_init();
	keygen_init();
	routed_init();
	fingerprint_init();
	position_check_init();

	MarkGUCPrefixReserved("idem_consumer");

	storage_init();
}
