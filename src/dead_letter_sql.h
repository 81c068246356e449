/*-------------------------------------------------------------------------
 *
 * dead_letter_sql.h
 *	  The statements of the dead letters on idem_consumer.dead_letters,
 *	  which dead_letter_sql.c defines and runs for dead_letter.c and
 *	  dead_letter_resolve.c.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/dead_letter_sql.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DEAD_LETTER_SQL_H
#define IDEM_DEAD_LETTER_SQL_H

#include "idem_consumer.h"

typedef enum DeadLetterStmt
{
	DL_INSERT,
	DL_INSERT_ROLE,
	DL_ROLE,
	DL_KEY_STATUS,
	DL_LOCK,
	DL_ENTRY_KEY,
	DL_LOCK_NEXT_PENDING,
	DL_FAILED_AGAIN,
	DL_REPLAYED,
	DL_DISCARDED,
	DL_PENDING_SUMMARY,
	DL_INSERT_ROWS,
	DL_EXPECT_ROWS,
	DL_NUM_STMTS
} DeadLetterStmt;

extern int	dead_letter_execute(DeadLetterStmt stmt, Datum *values,
								const char *nulls, long tcount);

#endif							/* IDEM_DEAD_LETTER_SQL_H */
