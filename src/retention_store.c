/*-------------------------------------------------------------------------
 *
 * retention_store.c
 *	  The statements of retention on idem_consumer.retention_settings, the
 *	  windows set per consumer, run as the owner of the storage.
 *
 * The purge's reads and removals of keys are the key store's
 * (keystore_remove.c); this file holds only the windows.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/retention_store.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"

#include "idem_consumer.h"

typedef enum RetentionStmt
{
	RS_WINDOWS,
	RS_SET_WINDOW,
	RS_RESET_WINDOW,
	RS_NUM_STMTS
} RetentionStmt;

static const StorageStmt retention_stmt_defs[RS_NUM_STMTS] = {
	[RS_WINDOWS] = {
		"SELECT consumer_id, retention FROM " STORAGE_SCHEMA ".retention_settings",
		0, {InvalidOid}
	},
	[RS_SET_WINDOW] = {
		"INSERT INTO " STORAGE_SCHEMA ".retention_settings (consumer_id, retention)"
		" VALUES ($1, $2) ON CONFLICT (consumer_id) DO UPDATE"
		" SET retention = excluded.retention, updated_at = pg_catalog.now()",
		2, {INT4OID, INTERVALOID}
	},
	[RS_RESET_WINDOW] = {
		"DELETE FROM " STORAGE_SCHEMA ".retention_settings"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1",
		1, {INT4OID}
	},
};

static SPIPlanPtr retention_plans[RS_NUM_STMTS];
static StorageStmtSet retention_stmts =
STORAGE_STMT_SET(retention_stmt_defs, retention_plans);

/*
 * Reads every consumer's own window, consumer_id and retention (an
 * interval, NULL for forever), into SPI_tuptable.
 */
void
retention_store_read_windows(void)
{
	storage_stmt_run(&retention_stmts, RS_WINDOWS, NULL, NULL, 0);
}

/*
 * Sets a consumer's own window; NULL (isnull) keeps its keys forever.
 */
void
retention_store_set_window(int32 consumer_id, Datum retention, bool isnull)
{
	Datum		args[2] = {Int32GetDatum(consumer_id), retention};
	char		nulls[2] = {' ', isnull ? 'n' : ' '};

	storage_stmt_run(&retention_stmts, RS_SET_WINDOW, args, nulls, 0);
}

/*
 * Removes a consumer's own window: it follows idem_consumer.retention.
 */
void
retention_store_reset_window(int32 consumer_id)
{
	Datum		arg = Int32GetDatum(consumer_id);

	storage_stmt_run(&retention_stmts, RS_RESET_WINDOW, &arg, NULL, 0);
}
