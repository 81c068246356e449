/*-------------------------------------------------------------------------
 *
 * compat.h
 *	  The differences between the PostgreSQL major versions idem_consumer
 *	  builds against (15 to 18), and the only place that tests
 *	  PG_VERSION_NUM for them.
 *
 * Each wrapper takes the arguments of the newest server and drops or
 * supplies what an older one lacks, so that the code that calls it reads
 * the same on every version.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/compat.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

#include "access/genam.h"
#include "access/tableam.h"
#include "catalog/pg_proc.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "pgstat.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/guc.h"

#if PG_VERSION_NUM < 150000
#error "idem_consumer needs PostgreSQL 15 or later"
#endif

/*
 * Every symbol of the library is hidden (-fvisibility=hidden, Makefile) but
 * those the server looks up by name: the server loads the library with
 * RTLD_GLOBAL, where any other global name could bind to another library's
 * symbol of the same name.  From 16 PGDLLEXPORT means default visibility and
 * fmgr.h marks with it _PG_init, Pg_magic_func and both functions of
 * PG_FUNCTION_INFO_V1.  15's PGDLLEXPORT is empty outside Windows and its
 * PG_FUNCTION_INFO_V1 leaves the function itself unmarked, so both are
 * defined here as 16 defines them, and _PG_init declared.  The purge
 * worker's main function, which the postmaster finds by name, is declared
 * PGDLLEXPORT in purge_worker.c.
 */
#if PG_VERSION_NUM < 160000 && defined(__GNUC__) && !defined(WIN32)
#undef PGDLLEXPORT
#define PGDLLEXPORT __attribute__((visibility("default")))

#undef PG_FUNCTION_INFO_V1
#define PG_FUNCTION_INFO_V1(funcname) \
extern PGDLLEXPORT Datum funcname(PG_FUNCTION_ARGS); \
extern PGDLLEXPORT const Pg_finfo_record * CppConcat(pg_finfo_,funcname)(void); \
const Pg_finfo_record * \
CppConcat(pg_finfo_,funcname) (void) \
{ \
	static const Pg_finfo_record my_finfo = { 1 }; \
	return &my_finfo; \
} \
extern int no_such_variable

extern PGDLLEXPORT void _PG_init(void);
#endif

/*
 * Whether member may SET ROLE to role.  From 16 a grant can give the
 * privileges of a role without the right to become it; 15 grants both
 * together, so membership is the test there.
 */
static inline bool
compat_member_can_set_role(Oid member, Oid role)
{
#if PG_VERSION_NUM >= 160000
	return member_can_set_role(member, role);
#else
	return is_member_of_role(member, role);
#endif
}

/* Whether roleid may execute function funcoid. */
static inline bool
compat_function_executable(Oid funcoid, Oid roleid)
{
#if PG_VERSION_NUM >= 160000
	return object_aclcheck(ProcedureRelationId, funcoid, roleid, ACL_EXECUTE) == ACLCHECK_OK;
#else
	return pg_proc_aclcheck(funcoid, roleid, ACL_EXECUTE) == ACLCHECK_OK;
#endif
}

/* An index scan without instrumentation (18 added the argument). */
static inline IndexScanDesc
compat_index_beginscan(Relation heap, Relation index, Snapshot snapshot,
					   int nkeys, int norderbys)
{
#if PG_VERSION_NUM >= 180000
	return index_beginscan(heap, index, snapshot, NULL, nkeys, norderbys);
#else
	return index_beginscan(heap, index, snapshot, nkeys, norderbys);
#endif
}

/* The live tuples the statistics system counts for a table. */
static inline PgStat_Counter
compat_live_tuples(const PgStat_StatTabEntry *tabentry)
{
#if PG_VERSION_NUM >= 160000
	return tabentry->live_tuples;
#else
	return tabentry->n_live_tuples;
#endif
}

/*
 * Which index entries a row version written by table_tuple_update needs:
 * none (a HOT update), all, or from 16 only those of summarizing indexes
 * (BRIN), which a HOT update must still maintain.
 */
typedef enum CompatIndexUpdate
{
	COMPAT_INDEXES_NONE,
	COMPAT_INDEXES_ALL,
	COMPAT_INDEXES_SUMMARIZING
} CompatIndexUpdate;

/* table_tuple_update, telling which index entries the new version needs. */
static inline TM_Result
compat_table_tuple_update(Relation rel, ItemPointer otid, TupleTableSlot *slot,
						  CommandId cid, Snapshot snapshot, Snapshot crosscheck,
						  bool wait, TM_FailureData *tmfd, LockTupleMode *lockmode,
						  CompatIndexUpdate *index_update)
{
	TM_Result	result;
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes = TU_None;

	result = table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck,
								wait, tmfd, lockmode, &update_indexes);
	*index_update = update_indexes == TU_All ? COMPAT_INDEXES_ALL :
		update_indexes == TU_Summarizing ? COMPAT_INDEXES_SUMMARIZING :
		COMPAT_INDEXES_NONE;
#else
	bool		update_indexes = false;

	result = table_tuple_update(rel, otid, slot, cid, snapshot, crosscheck,
								wait, tmfd, lockmode, &update_indexes);
	*index_update = update_indexes ? COMPAT_INDEXES_ALL : COMPAT_INDEXES_NONE;
#endif
	return result;
}

/*
 * ExecInsertIndexTuples for a new row version of an update, into the
 * indexes index_update names.  15 knows no summarizing-only update.
 */
static inline List *
compat_insert_index_entries(ResultRelInfo *rinfo, TupleTableSlot *slot,
							EState *estate, CompatIndexUpdate index_update)
{
#if PG_VERSION_NUM >= 160000
	return ExecInsertIndexTuples(rinfo, slot, estate, true, false, NULL, NIL,
								 index_update == COMPAT_INDEXES_SUMMARIZING);
#else
	Assert(index_update == COMPAT_INDEXES_ALL);
	return ExecInsertIndexTuples(rinfo, slot, estate, true, false, NULL, NIL);
#endif
}

/*
 * Memory for a GUC check hook's extra data, which the server frees: from 16
 * with guc_free, so it must come from guc_malloc; 15 frees it with free.
 * Returns NULL when out of memory, having reported nothing.
 */
static inline void *
compat_guc_extra_alloc(size_t size)
{
#if PG_VERSION_NUM >= 160000
	return guc_malloc(LOG, size);
#else
	return malloc(size);
#endif
}

/* Frees extra data allocated by compat_guc_extra_alloc and never handed over. */
static inline void
compat_guc_extra_free(void *extra)
{
#if PG_VERSION_NUM >= 160000
	guc_free(extra);
#else
	free(extra);
#endif
}

/*
 * Takes a lock, reporting running out of shared memory as an error, and
 * sets *locallockp to its local entry (18 added whether a failure to take
 * it without waiting is logged).
 */
static inline LockAcquireResult
compat_lock_acquire(const LOCKTAG *locktag, LOCKMODE lockmode, bool sessionLock,
					bool dontWait, LOCALLOCK **locallockp)
{
#if PG_VERSION_NUM >= 180000
	return LockAcquireExtended(locktag, lockmode, sessionLock, dontWait, true,
							   locallockp, false);
#else
	return LockAcquireExtended(locktag, lockmode, sessionLock, dontWait, true,
							   locallockp);
#endif
}

/*
 * Returns the PROCLOCK of this backend after prev (the first if prev is
 * NULL) in one lock partition, whose LWLock the caller holds; NULL after
 * the last (16 made the list a dlist).
 */
static inline PROCLOCK *
compat_my_proclock_next(int partition, PROCLOCK *prev)
{
#if PG_VERSION_NUM >= 160000
	dlist_head *head = &MyProc->myProcLocks[partition];

	if (prev == NULL)
		return dlist_is_empty(head) ? NULL :
			dlist_container(PROCLOCK, procLink, dlist_head_node(head));
	return dlist_has_next(head, &prev->procLink) ?
		dlist_container(PROCLOCK, procLink, dlist_next_node(head, &prev->procLink)) :
		NULL;
#else
	SHM_QUEUE  *head = &MyProc->myProcLocks[partition];

	return (PROCLOCK *) SHMQueueNext(head, prev == NULL ? head : &prev->procLink,
									 offsetof(PROCLOCK, procLink));
#endif
}

/*
 * The local id of this backend's transaction: PGPROC keeps it in vxid
 * from 17 on.
 */
static inline LocalTransactionId
compat_my_lxid(void)
{
#if PG_VERSION_NUM >= 170000
	return MyProc->vxid.lxid;
#else
	return MyProc->lxid;
#endif
}

#endif							/* IDEM_COMPAT_H */
