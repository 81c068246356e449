/*-------------------------------------------------------------------------
 *
 * consumers_sql.h
 *	  The statements of the consumers module on idem_consumer.consumers,
 *	  which consumers_sql.c defines and runs for consumers.c.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/consumers_sql.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CONSUMERS_SQL_H
#define IDEM_CONSUMERS_SQL_H

#include "idem_consumer.h"

typedef enum ConsumerStmt
{
	CS_FIND,
	CS_CREATE,
	CS_FIND_OWNED,
	CS_CREATE_OWNED,
	CS_SET_OWNER,
	CS_BY_ID,
	CS_FOREIGN,
	CS_SET_CHECK_FINGERPRINT,
	CS_IDS_PAST_ROWS,
	CS_NUM_STMTS
} ConsumerStmt;

extern int	consumers_execute(ConsumerStmt stmt, Datum *values,
							  const char *nulls, long tcount);

#endif							/* IDEM_CONSUMERS_SQL_H */
