/*-------------------------------------------------------------------------
 *
 * storage_stmt.c
 *	  Running the fixed statements of every module on the storage tables
 *	  (StorageStmtSet) as the owner of those tables, with plans kept per
 *	  backend and forgotten when the storage is located anew.
 *
 * Every statement runs as the owner of the tables, the way ri_triggers.c
 * runs its checks as the owner of the referenced table: the caller needs
 * EXECUTE on the API functions, not privileges on the storage.  Nothing
 * the caller controls (business SQL, search_path) runs while the user id
 * is switched: the statements are fixed, fully schema-qualified text, with
 * every operator spelled OPERATOR(pg_catalog.x), and their parameters are
 * values.  Each module keeps the text of its statements in a set of its
 * own (keystore_sql.c, consumers_sql.c, dead_letter_sql.c,
 * retention_store.c, effects_store_sql.c, and others).
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/storage_stmt.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "miscadmin.h"

#include "storage.h"

/*
 * Prepares a fixed statement into *plan, kept for the session, unless it
 * is there already; the caller has switched to the owner of the storage.
 */
static void
prepare_as_owner(SPIPlanPtr *plan, const StorageStmt *def)
{
	SPIPlanPtr	prepared;

	if (*plan != NULL)
		return;
	prepared = SPI_prepare_cursor(def->sql, def->nargs, (Oid *) def->argtypes,
								  def->cursor_options);
	if (prepared == NULL)
		elog(ERROR, "SPI_prepare failed for \"%s\": %s",
			 def->sql, SPI_result_code_string(SPI_result));
	if (SPI_keepplan(prepared) != 0)
		elog(ERROR, "SPI_keepplan failed");
	*plan = prepared;
}

/*
 * Runs a fixed statement on the storage as the owner of the storage
 * tables, preparing it into *plan, kept for the session, on first use;
 * nulls is as for SPI_execute_plan.  The text must be fully qualified and
 * take values only as parameters: nothing the caller controls may run as
 * the owner.
 *
 * The caller's memory context is current again on return.  SPI_prepare
 * and SPI_execute_plan leave SPI's procedure context current, which
 * SPI_finish frees: a caller that switched to a longer-lived context to
 * copy a result into would otherwise copy it into SPI's and read it
 * after SPI_finish, and one that switched to a context it resets per
 * row would see its allocations pile up in SPI's until SPI_finish.
 */
static int
run_as_owner(const StorageInfo *si, SPIPlanPtr *plan, const StorageStmt *def,
			 Datum *values, const char *nulls, Snapshot snapshot, long tcount)
{
	MemoryContext callercxt = CurrentMemoryContext;
	Oid			save_userid;
	int			save_sec_context;
	int			rc;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(si->owner,
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);

	prepare_as_owner(plan, def);

	if (snapshot != NULL)
		rc = SPI_execute_snapshot(*plan, values, nulls, snapshot,
								  InvalidSnapshot, false, false, tcount);
	else
		rc = SPI_execute_plan(*plan, values, nulls, false, tcount);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 def->sql, SPI_result_code_string(rc));

	/* errors restore the user id through transaction abort */
	SetUserIdAndSecContext(save_userid, save_sec_context);
	MemoryContextSwitchTo(callercxt);

	return rc;
}

/*
 * Forgets the plans of a set that were made for tables located before the
 * current ones (after DROP and CREATE EXTENSION, say); returns where the
 * storage is now.
 */
static const StorageInfo *
current_storage(StorageStmtSet *set)
{
	const StorageInfo *si = storage_locate();

	if (set->generation != si->generation)
	{
		for (int i = 0; i < set->nstmts; i++)
		{
			if (set->plans[i] != NULL)
				SPI_freeplan(set->plans[i]);
			set->plans[i] = NULL;
		}
		set->generation = si->generation;
	}
	return si;
}

/*
 * Forgets the plans of a set that belong to storage located before the
 * current one, so that set->plans holds only plans of the current tables.
 */
void
storage_stmts_current(StorageStmtSet *set)
{
	(void) current_storage(set);
}

/*
 * Runs statement stmt of a set as the owner of the storage tables; nulls
 * is as for SPI_execute_plan.  Every module's fixed statements on the
 * storage run through here.
 */
int
storage_stmt_run(StorageStmtSet *set, int stmt, Datum *values,
				 const char *nulls, long tcount)
{
	return storage_stmt_run_snapshot(set, stmt, values, nulls, NULL, tcount);
}

/*
 * The same with a snapshot of the caller's choice (NULL: as
 * SPI_execute_plan takes one), for the key store's probes.
 */
int
storage_stmt_run_snapshot(StorageStmtSet *set, int stmt, Datum *values,
						  const char *nulls, Snapshot snapshot, long tcount)
{
	const StorageInfo *si = current_storage(set);

	Assert(stmt >= 0 && stmt < set->nstmts);
	return run_as_owner(si, &set->plans[stmt], &set->stmts[stmt],
						values, nulls, snapshot, tcount);
}

/*
 * Opens a cursor on statement stmt of a set, as the owner of the storage
 * tables, for a read too large to hold whole in SPI's memory; nulls is as
 * for SPI_execute_plan.  Read it with storage_stmt_fetch(), which runs
 * the rest of the statement as the owner too, and close it with
 * SPI_cursor_close().  The statement must be read-only.
 */
Portal
storage_stmt_open(StorageStmtSet *set, int stmt, Datum *values,
				  const char *nulls)
{
	const StorageInfo *si = current_storage(set);
	MemoryContext callercxt = CurrentMemoryContext;
	Oid			save_userid;
	int			save_sec_context;
	Portal		portal;

	Assert(stmt >= 0 && stmt < set->nstmts);
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(si->owner,
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	prepare_as_owner(&set->plans[stmt], &set->stmts[stmt]);
	portal = SPI_cursor_open(NULL, set->plans[stmt], values, nulls, true);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	MemoryContextSwitchTo(callercxt);
	return portal;
}

/*
 * Fetches up to count rows of a cursor of storage_stmt_open() into
 * SPI_tuptable.  The executor runs on here, not only at the open: a
 * distributed table's executor (Citus) connects to its workers as the
 * current user while it fetches, so the owner is the current user here
 * too.  The caller's memory context is current again on return.
 */
void
storage_stmt_fetch(Portal portal, long count)
{
	MemoryContext callercxt = CurrentMemoryContext;
	Oid			save_userid;
	int			save_sec_context;

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(storage_locate()->owner,
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	SPI_cursor_fetch(portal, true, count);
	SetUserIdAndSecContext(save_userid, save_sec_context);
	MemoryContextSwitchTo(callercxt);
}
