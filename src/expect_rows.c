/*-------------------------------------------------------------------------
 *
 * expect_rows.c
 *	  The rows a message's business SQL must affect: the expect_rows
 *	  argument of idem_apply() and idem_try_apply(), the error
 *	  of a statement that affected fewer (SQLSTATE IK002), and whether the
 *	  dead-letter queue can keep the demand for a replay.
 *
 * An UPDATE that finds no row succeeds: a payment for an order that has
 * not arrived yet (brokers deliver out of order) would be recorded as
 * applied, and its redeliveries skipped as duplicates, with nothing paid.
 * A caller that knows how many rows its message must change says so, and
 * a statement that changes fewer raises an error instead: the error
 * aborts the transaction (or, for idem_try_apply, the subtransaction
 * of the business SQL), so the key is not recorded and a redelivery runs
 * the message again.  Whether idem_try_apply re-raises the error or
 * parks the message follows the transient SQLSTATEs of dead_letter.c,
 * whose default setting lists IK002: the usual cause is a row that comes
 * later.
 *
 * "Affected" is what the statement's command tag counts (SPI_processed):
 * rows inserted, updated or deleted by INSERT, UPDATE, DELETE and MERGE,
 * with or without RETURNING; rows returned by a SELECT, including one
 * whose data-modifying WITH queries change other rows.  A CALL counts
 * none, so a demand on one is refused before anything is recorded.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/expect_rows.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "idem_consumer.h"

/* SQLSTATE of business SQL that affected fewer rows than expected. */
#define ERRCODE_TOO_FEW_ROWS	MAKE_SQLSTATE('I','K','0','0','2')

/*
 * Raises an error if business SQL cannot meet a demand for rows because
 * it is a CALL, whose count is always zero.
 */
void
expect_rows_check_sql(int64 expect_rows, const char *sql)
{
	if (expect_rows == 0 || !business_sql_is_call(sql))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("expect_rows cannot be used with a CALL statement"),
			 errdetail("A procedure call reports no affected rows."),
			 errhint("Check the rows inside the procedure and raise an error there, or pass expect_rows => 0.")));
}

/*
 * Raises IK002 if business SQL of (consumer, key) affected fewer than
 * expect_rows rows.
 */
void
expect_rows_demand(int64 expect_rows, uint64 rows, const char *consumer,
				   text *key)
{
	if (rows >= (uint64) expect_rows)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_TOO_FEW_ROWS),
			 errmsg("business SQL of key \"%s\" of consumer \"%s\" affected too few rows",
					text_to_cstring(key), consumer),
			 errdetail_plural("The statement affected " UINT64_FORMAT " row; expect_rows demands at least " INT64_FORMAT ".",
							  "The statement affected " UINT64_FORMAT " rows; expect_rows demands at least " INT64_FORMAT ".",
							  rows, rows, expect_rows),
			 errhint("The rows the message changes may not exist yet, when it arrives before the message that creates them.")));
}

/*
 * Returns whether the dead-letter queue keeps the rows a message demands:
 * from version 1.2 of the SQL objects on.
 */
bool
expect_rows_stored(void)
{
	return storage_parts()->dead_letters_have_expect_rows;
}
