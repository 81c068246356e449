/*-------------------------------------------------------------------------
 *
 * dead_letter.h
 *	  What try_apply.c, dead_letter.c, dead_letter_entry.c,
 *	  dead_letter_resolve.c, replay_locks.c and key_place_resolve.c
 *	  share, with the statements of dead_letter_sql.c (dead_letter_sql.h)
 *	  and the runner of business_run.c (business_run.h).
 *
 * Calls run downwards: try_apply.c uses dead_letter.c, the key places'
 * operations (key_place.h) and business_run.c; dead_letter_resolve.c
 * uses dead_letter.c, dead_letter_entry.c, replay_locks.c, which wraps
 * business_run.c, and the key places' operations, whose dead-letter ones
 * are dead_letter.c's and dead_letter_entry.c's, put in their tables by
 * key_place_resolve.c; those use dead_letter_sql.c and business_run.c,
 * which use none of the others.
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
 * One entry of idem_consumer.dead_letters, or of routed_dead_letters, as a
 * replay or discard needs it, read and locked by its place's lock_entry
 * (dead_letter_entry.c).  Its place is the node's queue, under the
 * consumer's id, or, where keys are routed (routed.c), beside the
 * message's key under the route and the consumer's name.
 */
struct DeadLetterEntry
{
	const char *name;			/* for messages: "entry 12" */
	KeyPlace	place;
	int64		id;				/* unless routed */
	text	   *key;
	char	   *sql;
	ArrayType  *params;			/* NULL if none */
	ArrayType  *settings;
	char	   *status;
	char	   *resolved_by;	/* NULL while pending */
	char	   *discard_reason; /* NULL unless discarded */
	char	   *dead_lettered_by;	/* if routed: the role its SQL runs as */
	bool		is_effect;		/* if routed: a dead external effect's */
	int64		expect_rows;	/* if routed: the rows its SQL demands, or 0 */
};

/* dead_letter.c */
extern Oid *dead_letter_outcome_oids(FmgrInfo *flinfo, Oid enumtypoid);
extern Datum dead_letter_outcome_result(FunctionCallInfo fcinfo, Outcome outcome);
extern Datum dead_letter_current_user(void);
extern void dead_letter_error_values(ErrorData *edata, Datum *values, char *nulls);
extern void dead_letter_park_local(const KeyPlace *place, text *key,
								   const char *sql, ArrayType *params,
								   NullableDatum event_time, ErrorData *edata,
								   int64 expect_rows);
extern void dead_letter_park_routed(const KeyPlace *place, text *key,
									const char *sql, ArrayType *params,
									NullableDatum event_time, ErrorData *edata,
									int64 expect_rows);
extern char *dead_letter_status_local(const KeyPlace *place, text *key);
extern char *dead_letter_status_routed(const KeyPlace *place, text *key);

/* dead_letter_entry.c */
extern void dead_letter_refuse_inside_business_sql(const char *function_name,
												   const char *action, int64 id);
extern void dead_letter_lock_id(int64 id, DeadLetterEntry *entry);
extern void dead_letter_entry_from_result(DeadLetterEntry *entry);
extern bool dead_letter_lock_local(const KeyPlace *place, text *key,
								   const char *function_name, const char *action,
								   DeadLetterEntry *entry);
extern bool dead_letter_lock_routed(const KeyPlace *place, text *key,
									const char *function_name, const char *action,
									DeadLetterEntry *entry);
extern bool dead_letter_rearm_local(const DeadLetterEntry *entry);
extern bool dead_letter_rearm_routed(const DeadLetterEntry *entry);
extern Oid	dead_letter_run_as_local(const DeadLetterEntry *entry, char **consumer);
extern Oid	dead_letter_run_as_routed(const DeadLetterEntry *entry, char **consumer);
extern int64 dead_letter_record_key_local(const DeadLetterEntry *entry,
										  const char *consumer);
extern int64 dead_letter_record_key_routed(const DeadLetterEntry *entry,
										   const char *consumer);
extern void dead_letter_mark_run_local(const DeadLetterEntry *entry, ErrorData *edata);
extern void dead_letter_mark_run_routed(const DeadLetterEntry *entry, ErrorData *edata);
extern void dead_letter_discard_local(const DeadLetterEntry *entry, text *reason);
extern void dead_letter_discard_routed(const DeadLetterEntry *entry, text *reason);

/* replay_locks.c */
extern ErrorData *replay_locks_business_run(int32 consumer_id, const char *consumer,
											text *key, const char *sql,
											ArrayType *params, ArrayType *settings,
											Oid run_as, int64 expect_rows,
											uint64 *rows);

#endif							/* IDEM_DEAD_LETTER_H */
