/*-------------------------------------------------------------------------
 *
 * dead_letter.h
 *	  What try_apply.c, dead_letter.c and business_run.c share.
 *
 * Calls run downwards: try_apply.c uses dead_letter.c and business_run.c,
 * dead_letter.c uses business_run.c, which uses neither.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/dead_letter.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DEAD_LETTER_H
#define IDEM_DEAD_LETTER_H

#include "idem_consumer.h"

/* The labels of the SQL enum type idem_outcome, in this order. */
typedef enum Outcome
{
	OUTCOME_APPLIED,
	OUTCOME_DUPLICATE,
	OUTCOME_DEAD_LETTERED
} Outcome;

/* dead_letter.c */
extern Oid *dead_letter_outcome_oids(FmgrInfo *flinfo, Oid enumtypoid);
extern Datum dead_letter_outcome_result(FunctionCallInfo fcinfo, Outcome outcome);
extern void dead_letter_insert(int32 consumer_id, text *key, const char *sql,
							   ArrayType *params, NullableDatum event_time,
							   ErrorData *edata, int64 expect_rows);
extern char *dead_letter_status(int32 consumer_id, text *key);

/* business_run.c */
extern ErrorData *business_run(int32 consumer_id, const char *consumer, text *key,
							   const char *sql, ArrayType *params,
							   ArrayType *settings, Oid run_as,
							   int64 expect_rows, uint64 *rows);
extern bool business_run_error_is_transient(int sqlerrcode);
extern ArrayType *business_run_capture_settings(void);

#endif							/* IDEM_DEAD_LETTER_H */
