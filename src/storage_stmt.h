/*-------------------------------------------------------------------------
 *
 * storage_stmt.h
 *	  The statement sets of the modules on the storage tables, which
 *	  storage_stmt.c runs as the owner of the tables.  Each module keeps
 *	  the text of its statements in a StorageStmtSet of its own, indexed by
 *	  an enum of its own; their plans are prepared on first use and
 *	  forgotten when the storage is located anew.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/storage_stmt.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef STORAGE_STMT_H
#define STORAGE_STMT_H

#include "executor/spi.h"
#include "utils/snapshot.h"

#define STORAGE_MAX_ARGS 14

typedef struct StorageStmt
{
	const char *sql;
	int			nargs;
	Oid			argtypes[STORAGE_MAX_ARGS];
	int			cursor_options; /* as for SPI_prepare_cursor */
} StorageStmt;

typedef struct StorageStmtSet
{
	const StorageStmt *stmts;
	int			nstmts;
	struct _SPI_plan **plans;	/* nstmts of them, NULL until prepared */
	uint64		generation;		/* of the storage the plans were made for */
} StorageStmtSet;

#define STORAGE_STMT_SET(stmts, plans) {(stmts), lengthof(stmts), (plans), 0}

extern void storage_stmts_current(StorageStmtSet *set);
extern int	storage_stmt_run(StorageStmtSet *set, int stmt, Datum *values,
							 const char *nulls, long tcount);
extern int	storage_stmt_run_snapshot(StorageStmtSet *set, int stmt, Datum *values,
									  const char *nulls, Snapshot snapshot,
									  long tcount);
extern struct PortalData *storage_stmt_open(StorageStmtSet *set, int stmt,
											Datum *values, const char *nulls);
extern void storage_stmt_fetch(struct PortalData *portal, long count);

/*
 * Fetches a column of the first row an SPI statement returned.
 */
static inline Datum
result_column(int colno)
{
	bool		isnull;

	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
						 colno, &isnull);
}

#endif							/* STORAGE_STMT_H */
