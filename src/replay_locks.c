/*-------------------------------------------------------------------------
 *
 * replay_locks.c
 *	  The session-level advisory locks of the operator who replays a dead
 *	  letter: what the replayed SQL takes is released when the replay ends,
 *	  and what the operator held before is held again.
 *
 * A replay runs another role's SQL in the operator's session
 * (replay_role.c).  The security-restricted operation it runs in undoes
 * settings and refuses temporary tables, prepared statements, LISTEN and
 * cursors WITH HOLD, but pg_advisory_lock() is allowed there, and a
 * session-level advisory lock outlives the transaction: the operator's
 * session would go on holding a lock that the team's own workers wait
 * for, and pg_advisory_unlock_all() in the SQL would drop the operator's
 * own.  So the session-level holds of every advisory lock the backend
 * holds are counted before the replay and after it, and the difference is
 * undone: the extra holds released, the lost ones taken again.  Locks
 * taken at transaction level (pg_advisory_xact_lock) belong to the
 * operator's transaction, as every other lock the replay takes, and end
 * with it.
 *
 * Which advisory locks this backend holds is read from its own PROCLOCKs
 * in the shared lock table (the list pg_locks reads, without copying the
 * whole table: two reads per replay cost a few microseconds), not how
 * many of the holds are at session level; the backend's own LOCALLOCK
 * entry tells that, and taking one more session-level hold of a lock
 * already held (never a wait) returns it, after which that hold is
 * released again.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/replay_locks.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "storage/lock.h"

#include "compat.h"
#include "dead_letter.h"

/* One advisory lock in one mode, and this backend's session-level holds. */
typedef struct AdvisoryHold
{
	LOCKTAG		tag;
	LOCKMODE	mode;
	int			session_holds;
} AdvisoryHold;

/* The advisory locks a backend holds at some moment. */
typedef struct ReplayLocks
{
	int			nholds;
	AdvisoryHold *holds;
} ReplayLocks;

/*
 * Returns how many of this backend's holds of a lock it holds are at
 * session level.
 */
static int
session_holds(const LOCKTAG *tag, LOCKMODE mode)
{
	LOCALLOCK  *locallock = NULL;
	int			holds = 0;

	if (compat_lock_acquire(tag, mode, true, true, &locallock) == LOCKACQUIRE_NOT_AVAIL)
		return 0;
	for (int i = 0; i < locallock->numLockOwners; i++)
		if (locallock->lockOwners[i].owner == NULL)
			holds = (int) locallock->lockOwners[i].nLocks;
	(void) LockRelease(tag, mode, true);
	return holds - 1;
}

/*
 * Returns the advisory locks this backend holds, each mode apart, with
 * their session-level holds.  Its own PROCLOCKs are read under each
 * partition's lock in turn; the holds are counted after, without them.
 */
static ReplayLocks *
advisory_holds(void)
{
	ReplayLocks *held = palloc(sizeof(ReplayLocks));
	int			allocated = 4;

	held->nholds = 0;
	held->holds = palloc(allocated * sizeof(AdvisoryHold));
	for (int partition = 0; partition < NUM_LOCK_PARTITIONS; partition++)
	{
		LWLock	   *partition_lock = LockHashPartitionLockByIndex(partition);

		LWLockAcquire(partition_lock, LW_SHARED);
		for (PROCLOCK *proclock = compat_my_proclock_next(partition, NULL);
			 proclock != NULL;
			 proclock = compat_my_proclock_next(partition, proclock))
		{
			const LOCK *lock = proclock->tag.myLock;

			if (lock->tag.locktag_type != LOCKTAG_ADVISORY)
				continue;
			for (LOCKMODE mode = 1; mode <= MaxLockMode; mode++)
			{
				if ((proclock->holdMask & LOCKBIT_ON(mode)) == 0)
					continue;
				if (held->nholds == allocated)
				{
					allocated *= 2;
					held->holds = repalloc(held->holds, allocated * sizeof(AdvisoryHold));
				}
				held->holds[held->nholds].tag = lock->tag;
				held->holds[held->nholds].mode = mode;
				held->nholds++;
			}
		}
		LWLockRelease(partition_lock);
	}
	for (int i = 0; i < held->nholds; i++)
		held->holds[i].session_holds = session_holds(&held->holds[i].tag,
													 held->holds[i].mode);
	return held;
}

/*
 * Returns the session-level holds of a lock in a list of them.
 */
static int
holds_of(const ReplayLocks *held, const AdvisoryHold *lock)
{
	for (int i = 0; i < held->nholds; i++)
		if (held->holds[i].mode == lock->mode &&
			memcmp(&held->holds[i].tag, &lock->tag, sizeof(LOCKTAG)) == 0)
			return held->holds[i].session_holds;
	return 0;
}

/*
 * Releases the session-level advisory lock holds taken since saved was
 * made and, with retake, takes again those released since (waiting for
 * them, as pg_advisory_lock() does).  Without retake it only releases and
 * never waits: for a replay whose error is on its way to the operator.
 */
static void
replay_locks_restore(ReplayLocks *saved, bool retake)
{
	ReplayLocks *now = advisory_holds();

	for (int i = 0; i < now->nholds; i++)
	{
		AdvisoryHold *lock = &now->holds[i];

		for (int n = holds_of(saved, lock); n < lock->session_holds; n++)
			(void) LockRelease(&lock->tag, lock->mode, true);
	}
	if (retake)
	{
		for (int i = 0; i < saved->nholds; i++)
		{
			AdvisoryHold *lock = &saved->holds[i];

			for (int n = holds_of(now, lock); n < lock->session_holds; n++)
				(void) LockAcquire(&lock->tag, lock->mode, true, false);
		}
	}
	pfree(now->holds);
	pfree(now);
}

/*
 * business_run() for a replay: runs an entry's SQL as run_as, and puts the
 * session-level advisory locks back as the operator held them before,
 * whether the SQL succeeds, fails or raises.
 */
ErrorData *
replay_locks_business_run(int32 consumer_id, const char *consumer, text *key,
						  const char *sql, ArrayType *params, ArrayType *settings,
						  Oid run_as, int64 expect_rows, uint64 *rows)
{
	ReplayLocks *saved = advisory_holds();
	ErrorData  *volatile edata = NULL;

	PG_TRY();
	{
		edata = business_run(consumer_id, consumer, key, sql, params, settings,
							 run_as, expect_rows, rows);
	}
	PG_CATCH();
	{
		replay_locks_restore(saved, false);
		PG_RE_THROW();
	}
	PG_END_TRY();
	replay_locks_restore(saved, true);
	return edata;
}
