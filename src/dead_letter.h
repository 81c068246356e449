/*-------------------------------------------------------------------------
 *
 * dead_letter.h
 *	  What try_apply.c, dead_letter.c, dead_letter_resolve.c and
 *	  replay_locks.c share, with the statements of dead_letter_sql.c
 *	  (dead_letter_sql.h) and the runner of business_run.c
 *	  (business_run.h).
 *
 * Calls run downwards: try_apply.c uses dead_letter.c and business_run.c;
 * dead_letter_resolve.c uses dead_letter.c, dead_letter_sql.c and
 * replay_locks.c, which wraps business_run.c; dead_letter.c uses
 * dead_letter_sql.c and business_run.c, which use none of the others.
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
#include "dead_letter_sql.h"
#include "business_run.h"

/* The labels of the SQL enum type idem_outcome, in this order. */
typedef enum Outcome
{
	OUTCOME_APPLIED,
	OUTCOME_DUPLICATE,
	OUTCOME_DEAD_LETTERED
} Outcome;

/*
 * Where the entry of a message goes: the node's own queue, dead_letters,
 * under the consumer's id, or, where keys are routed (routed.c),
 * routed_dead_letters under the route and the consumer's name, beside the
 * message's key.
 */
typedef struct DeadLetterPlace
{
	int32		consumer_id;
	const char *consumer;
	bool		routed;
	Datum		route;			/* if routed */
	Oid			route_type;		/* if routed */
} DeadLetterPlace;

/* dead_letter.c */
extern Oid *dead_letter_outcome_oids(FmgrInfo *flinfo, Oid enumtypoid);
extern Datum dead_letter_outcome_result(FunctionCallInfo fcinfo, Outcome outcome);
extern void dead_letter_insert(const DeadLetterPlace *place, text *key,
							   const char *sql, ArrayType *params,
							   NullableDatum event_time, ErrorData *edata,
							   int64 expect_rows);
extern char *dead_letter_status(const DeadLetterPlace *place, text *key);
extern Datum dead_letter_current_user(void);
extern void dead_letter_error_values(ErrorData *edata, Datum *values, char *nulls);

/* replay_locks.c */
extern ErrorData *replay_locks_business_run(int32 consumer_id, const char *consumer,
											text *key, const char *sql,
											ArrayType *params, ArrayType *settings,
											Oid run_as, int64 expect_rows,
											uint64 *rows);

#endif							/* IDEM_DEAD_LETTER_H */
