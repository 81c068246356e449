/*-------------------------------------------------------------------------
 *
 * business_run.h
 *	  The subtransaction runner of business SQL and its transient
 *	  SQLSTATEs (business_run.c), for try_apply.c, dead_letter.c,
 *	  dead_letter_resolve.c and replay_locks.c, which include it through
 *	  dead_letter.h.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/business_run.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_BUSINESS_RUN_H
#define IDEM_BUSINESS_RUN_H

#include "idem_consumer.h"

extern ErrorData *business_run(int32 consumer_id, const char *consumer, text *key,
							   const char *sql, ArrayType *params,
							   ArrayType *settings, Oid run_as,
							   int64 expect_rows, uint64 *rows);
extern bool business_run_error_is_transient(int sqlerrcode);
extern ArrayType *business_run_capture_settings(void);

#endif							/* IDEM_BUSINESS_RUN_H */
