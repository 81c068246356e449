/*-------------------------------------------------------------------------
 *
 * consumers_sql.c
 *	  The statements of the consumers module on idem_consumer.consumers,
 *	  run as the owner of the storage.
 *
 * The statements are fixed, schema-qualified text with values as
 * parameters, run through storage_stmt_run() (storage_stmt.c) as every
 * module's statements are.  The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/consumers_sql.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"

#include "consumers_sql.h"

static const StorageStmt consumer_stmt_defs[CS_NUM_STMTS] = {
	[CS_FIND] = {
		"SELECT consumer_id, xmin FROM " STORAGE_SCHEMA ".consumers"
		" WHERE name OPERATOR(pg_catalog.=) $1",
		1, {TEXTOID}
	},
	/*
	 * Any conflict, on the name or on the id, inserts nothing:
	 * insert_consumer() tells them apart and moves the ids on past a
	 * replicated row's (CS_IDS_PAST_ROWS).
	 */
	[CS_CREATE] = {
		"INSERT INTO " STORAGE_SCHEMA ".consumers (name) VALUES ($1)"
		" ON CONFLICT DO NOTHING RETURNING consumer_id",
		1, {TEXTOID}
	},
	/* from 1.1 on, consumers have owners */
	[CS_FIND_OWNED] = {
		"SELECT consumer_id, xmin, owner, check_fingerprint FROM " STORAGE_SCHEMA ".consumers"
		" WHERE name OPERATOR(pg_catalog.=) $1",
		1, {TEXTOID}
	},
	[CS_CREATE_OWNED] = {
		"INSERT INTO " STORAGE_SCHEMA ".consumers (name, owner) VALUES ($1, $2)"
		" ON CONFLICT DO NOTHING RETURNING consumer_id",
		2, {TEXTOID, REGROLEOID}
	},
	[CS_SET_OWNER] = {
		"UPDATE " STORAGE_SCHEMA ".consumers SET owner = $2"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1",
		2, {INT4OID, REGROLEOID}
	},
	[CS_BY_ID] = {
		"SELECT name, owner FROM " STORAGE_SCHEMA ".consumers"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1",
		1, {INT4OID}
	},
	/*
	 * a consumer the role $1 may not act on, if there is one: one whose
	 * owner's privileges it does not have (USAGE is has_privs_of_role)
	 */
	[CS_FOREIGN] = {
		"SELECT name, owner FROM " STORAGE_SCHEMA ".consumers"
		" WHERE owner IS NOT NULL"
		" AND NOT pg_catalog.pg_has_role($1, owner, 'USAGE')"
		" ORDER BY name LIMIT 1",
		1, {OIDOID}
	},
	[CS_SET_CHECK_FINGERPRINT] = {
		"UPDATE " STORAGE_SCHEMA ".consumers SET check_fingerprint = $2"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1",
		2, {INT4OID, BOOLOID}
	},

	/* the identity sequence behind replicated rows (IDS_PAST_ROWS) */
	[CS_IDS_PAST_ROWS] = {
		IDS_PAST_ROWS("consumers", "consumer_id"),
		0, {InvalidOid}
	},
};

static SPIPlanPtr consumer_plans[CS_NUM_STMTS];
static StorageStmtSet consumer_stmts =
STORAGE_STMT_SET(consumer_stmt_defs, consumer_plans);

/*
 * Runs one statement on the consumers table as the owner of the storage
 * tables; nulls is as for SPI_execute_plan.
 */
int
consumers_execute(ConsumerStmt stmt, Datum *values, const char *nulls,
				  long tcount)
{
	return storage_stmt_run(&consumer_stmts, stmt, values, nulls, tcount);
}
