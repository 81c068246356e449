/*-------------------------------------------------------------------------
 *
 * dead_letter_sql.c
 *	  The statements of the dead-letter queue on idem_consumer.dead_letters,
 *	  run as the owner of the storage.
 *
 * The statements are fixed, schema-qualified text with values as
 * parameters, run through storage_stmt_run() (storage_stmt.c) as for the
 * key store.  The two locking reads return DEAD_LETTER_COLUMNS, in the
 * order dead_letter_resolve.c reads them.  The key store has statements of
 * its own on this table: the entries that expire with their keys, and the
 * ones idem_forget() looks at.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/dead_letter_sql.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"

#include "dead_letter_sql.h"

#define DEAD_LETTER_COLUMNS \
	"dead_letter_id, consumer_id, key, sql, params, settings, status," \
	" resolved_by, discard_reason"

#define DL_INSERT_COLUMNS \
	"consumer_id, key, sql, params, event_time, settings, sqlstate, message," \
	" detail, hint, context, dead_lettered_by"
#define DL_INSERT_VALUES "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12"
#define DL_INSERT_TYPES \
	INT4OID, TEXTOID, TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, TEXTARRAYOID, \
	TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID
#define DL_INSERT_CONFLICT \
	" ON CONFLICT (consumer_id, key) DO UPDATE SET sql = excluded.sql," \
	" params = excluded.params, event_time = excluded.event_time," \
	" settings = excluded.settings, sqlstate = excluded.sqlstate," \
	" message = excluded.message, detail = excluded.detail, hint = excluded.hint," \
	" context = excluded.context, first_failed_at = pg_catalog.now()," \
	" last_failed_at = pg_catalog.now(), attempts = 1," \
	" dead_lettered_by = excluded.dead_lettered_by, status = 'pending'," \
	" resolved_at = NULL, resolved_by = NULL, discard_reason = NULL"
#define DL_INSERT_UNLESS_PENDING \
	" WHERE dead_letters.status OPERATOR(pg_catalog.<>) 'pending'"


static const StorageStmt dead_letter_stmt_defs[DL_NUM_STMTS] = {
	/*
	 * A new entry, or a new failure in the place of a resolved entry that
	 * outlived its key (the purge removes resolved entries with their
	 * keys; a key removed by hand leaves its entry).  A pending entry
	 * stays as it is, and so does an external effect's entry.  The second
	 * form is for version 1.1 of the SQL objects, which records the
	 * parking role.
	 */
	[DL_INSERT] = {
		"INSERT INTO " STORAGE_SCHEMA ".dead_letters (" DL_INSERT_COLUMNS ")"
		" VALUES (" DL_INSERT_VALUES ")" DL_INSERT_CONFLICT DL_INSERT_UNLESS_PENDING,
		12, {DL_INSERT_TYPES}
	},
	[DL_INSERT_ROLE] = {
		"INSERT INTO " STORAGE_SCHEMA ".dead_letters (" DL_INSERT_COLUMNS ", dead_lettered_role)"
		" VALUES (" DL_INSERT_VALUES ", $13)" DL_INSERT_CONFLICT
		", dead_lettered_role = excluded.dead_lettered_role" DL_INSERT_UNLESS_PENDING
		" AND dead_letters.kind OPERATOR(pg_catalog.=) 'message'",
		13, {DL_INSERT_TYPES, REGROLEOID}
	},
	/* what a replay needs to know whose rights the entry's SQL runs with */
	[DL_ROLE] = {
		"SELECT d.dead_lettered_role, c.name, d.dead_lettered_by"
		" FROM " STORAGE_SCHEMA ".dead_letters AS d"
		" JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.consumer_id OPERATOR(pg_catalog.=) d.consumer_id"
		" WHERE d.dead_letter_id OPERATOR(pg_catalog.=) $1",
		1, {INT8OID}
	},
	[DL_KEY_STATUS] = {
		"SELECT status, dead_letter_id FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2",
		2, {INT4OID, TEXTOID}
	},
	[DL_LOCK] = {
		"SELECT " DEAD_LETTER_COLUMNS " FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE",
		1, {INT8OID}
	},
	/*
	 * an entry's consumer and key, read without a lock: before the caller's
	 * right to it is checked, and before a refusal inside business SQL, so
	 * that neither waits for a replay that holds the entry
	 */
	[DL_ENTRY_KEY] = {
		"SELECT consumer_id, key FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		1, {INT8OID}
	},
	/* the oldest pending entry of a consumer after $2 that nobody is replaying */
	[DL_LOCK_NEXT_PENDING] = {
		"SELECT " DEAD_LETTER_COLUMNS " FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1"
		" AND status OPERATOR(pg_catalog.=) 'pending'"
		" AND dead_letter_id OPERATOR(pg_catalog.>) $2"
		" ORDER BY dead_letter_id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED",
		2, {INT4OID, INT8OID}
	},
	[DL_FAILED_AGAIN] = {
		"UPDATE " STORAGE_SCHEMA ".dead_letters"
		" SET attempts = attempts OPERATOR(pg_catalog.+) 1, last_failed_at = pg_catalog.now(),"
		" sqlstate = $2, message = $3, detail = $4, hint = $5, context = $6"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		6, {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID}
	},
	[DL_REPLAYED] = {
		"UPDATE " STORAGE_SCHEMA ".dead_letters"
		" SET status = 'replayed', attempts = attempts OPERATOR(pg_catalog.+) 1,"
		" resolved_at = pg_catalog.now(), resolved_by = $2"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		2, {INT8OID, TEXTOID}
	},
	[DL_DISCARDED] = {
		"UPDATE " STORAGE_SCHEMA ".dead_letters"
		" SET status = 'discarded', resolved_at = pg_catalog.now(), resolved_by = $2,"
		" discard_reason = $3"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		3, {INT8OID, TEXTOID, TEXTOID}
	},
	/* per consumer: pending entries and age of the oldest (partial index) */
	[DL_PENDING_SUMMARY] = {
		"SELECT c.name, COALESCE(d.pending, 0),"
		" pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-) d.oldest)"
		" FROM " STORAGE_SCHEMA ".consumers AS c LEFT JOIN"
		" (SELECT consumer_id, pg_catalog.count(*) AS pending,"
		"  pg_catalog.min(first_failed_at) AS oldest"
		"  FROM " STORAGE_SCHEMA ".dead_letters"
		"  WHERE status OPERATOR(pg_catalog.=) 'pending' GROUP BY consumer_id) AS d"
		" ON d.consumer_id OPERATOR(pg_catalog.=) c.consumer_id"
		" ORDER BY c.name",
		0, {InvalidOid}
	},

	/*
	 * Version 1.2 of the SQL objects keeps the rows a message demands
	 * (expect_rows.c) for its replays: DL_INSERT_ROLE with the demand, NULL
	 * for none.
	 */
	[DL_INSERT_ROWS] = {
		"INSERT INTO " STORAGE_SCHEMA ".dead_letters (" DL_INSERT_COLUMNS ", dead_lettered_role, expect_rows)"
		" VALUES (" DL_INSERT_VALUES ", $13, $14)" DL_INSERT_CONFLICT
		", dead_lettered_role = excluded.dead_lettered_role, expect_rows = excluded.expect_rows"
		DL_INSERT_UNLESS_PENDING " AND dead_letters.kind OPERATOR(pg_catalog.=) 'message'",
		14, {DL_INSERT_TYPES, REGROLEOID, INT8OID}
	},
	[DL_EXPECT_ROWS] = {
		"SELECT expect_rows FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		1, {INT8OID}
	},
};

static SPIPlanPtr dead_letter_plans[DL_NUM_STMTS];
static StorageStmtSet dead_letter_stmts =
STORAGE_STMT_SET(dead_letter_stmt_defs, dead_letter_plans);

/*
 * Runs one statement of the dead-letter queue as the owner of the storage
 * tables; nulls is as for SPI_execute_plan.
 */
int
dead_letter_execute(DeadLetterStmt stmt, Datum *values, const char *nulls,
					long tcount)
{
	return storage_stmt_run(&dead_letter_stmts, stmt, values, nulls, tcount);
}

/*
 * Reads, per consumer, its name, its pending entries and the age in
 * seconds of the oldest, into SPI_tuptable; returns the number of rows.
 */
uint64
dead_letter_pending_summary(void)
{
	dead_letter_execute(DL_PENDING_SUMMARY, NULL, NULL, 0);
	return SPI_processed;
}
