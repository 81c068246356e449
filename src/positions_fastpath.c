/*-------------------------------------------------------------------------
 *
 * positions_fastpath.c
 *	  The fast path of idem_position_advance: the row of a partition's
 *	  position, locked by the caller's PS_LOCK, moved forward without the
 *	  executor.
 *
 * The statement PS_ADVANCE (positions.c) is the reference.  A Kafka
 * consumer advances every partition of each batch, and most of that
 * statement's time is the executor's start-up: a scan of the primary key
 * for one row, the table's check constraints and the WHEN clause of the
 * positions_lowered trigger read back from their stored text.  None of
 * them can decide anything for an advance: the row is locked, the new
 * position is at least the stored one (so positions_lowered's WHEN is
 * false), the key does not change (so neither the foreign key's check nor
 * the checks of the topic and the partition can fail), and the position
 * and the log-end offset given were checked not negative.
 *
 * So the fast path updates the locked row itself, as UPDATE would, and
 * changes nothing when anything is not plain, leaving the work to the
 * statement: idem_consumer.fast_path off, a table that is not exactly as
 * the 1.2 script creates it (its columns, its checks and triggers, no row
 * security, not partitioned), or a row inserted by this transaction, whose
 * foreign key the statement checks again (as RI_FKey_fk_upd_check_required
 * says: the check queued by the insert finds that version dead).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/positions_fastpath.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/sysattr.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "idem_consumer.h"
#include "fastpath.h"
#include "positions.h"
#include "text_bytes.h"

/* The columns of idem_consumer.positions, as the 1.2 script creates them. */
static const FastPathColumn position_columns[PC_NUM_COLUMNS] = {
	[PC_CONSUMER_ID] = {"consumer_id", INT4OID, true, false},
	[PC_TOPIC] = {"topic", TEXTOID, true, true},
	[PC_PARTITION] = {"partition", INT4OID, true, false},
	[PC_POSITION] = {"position", INT8OID, true, false},
	[PC_ADVANCED_AT] = {"advanced_at", TIMESTAMPTZOID, true, false},
	[PC_LOG_END_OFFSET] = {"log_end_offset", INT8OID, false, false},
	[PC_LOG_END_AT] = {"log_end_at", TIMESTAMPTZOID, false, false},
	[PC_REWINDS] = {"rewinds", INT8OID, true, false},
	[PC_LAST_REWOUND_AT] = {"last_rewound_at", TIMESTAMPTZOID, false, false},
	[PC_LAST_REWOUND_BY] = {"last_rewound_by", NAMEOID, false, false},
	[PC_LAST_REWIND_REASON] = {"last_rewind_reason", TEXTOID, false, false},
};

/* The check constraints the script creates, which an advance keeps. */
static const char *const position_checks[] = {
	"positions_log_end_offset_check",
	"positions_partition_check",
	"positions_position_check",
	"positions_topic_check",
};

/*
 * Tells whether a trigger of the table does nothing on an advance: the
 * foreign key's checks (of a key that does not change), the script's
 * triggers of DELETE and TRUNCATE, and positions_lowered, an AFTER ROW
 * trigger whose WHEN needs a position lowered or a key changed.
 */
static bool
trigger_is_plain(const Trigger *t)
{
	if (t->tgisinternal)
		return t->tgfoid == F_RI_FKEY_CHECK_INS || t->tgfoid == F_RI_FKEY_CHECK_UPD;
	if (strcmp(t->tgname, "positions_deleted") == 0 ||
		strcmp(t->tgname, "positions_truncated") == 0)
		return !TRIGGER_FOR_UPDATE(t->tgtype);
	if (strcmp(t->tgname, "positions_lowered") == 0)
		return TRIGGER_FOR_ROW(t->tgtype) && TRIGGER_FOR_AFTER(t->tgtype) &&
			t->tgqual != NULL;
	return false;
}

/*
 * The table as the 1.2 script creates it, with nothing that UPDATE would
 * run or enforce on an advance beyond what the header says cannot fail or
 * fire; an advance gives no column its default.
 */
static const FastPathTableShape positions_shape = {
	.columns = position_columns,
	.ncolumns = PC_NUM_COLUMNS,
	.checks = position_checks,
	.nchecks = lengthof(position_checks),
	.trigger_is_plain = trigger_is_plain,
	.defaults = FASTPATH_DEFAULTS_ANY,
};

/*
 * Moves the position of the row version at tid, which this transaction
 * locked (PS_LOCK) as the newest of the key (consumer_id, topic,
 * partition), to position (at least the stored one, not negative), as PS_ADVANCE does, with the log-end offset
 * log_end unless log_end_null.  Returns false, having changed nothing,
 * when PS_ADVANCE must do it.
 */
bool
positions_fast_advance(ItemPointer tid, int32 consumer_id, text *topic, int32 partition,
					   int64 position, Datum log_end, bool log_end_null)
{
	Oid			nspid;
	Relation	rel;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	Snapshot	snapshot;
	bool		isnull;
	bool		done = false;

	if (!fastpath_enabled() || XactReadOnly || IsInParallelMode())
		return false;
	nspid = get_namespace_oid(STORAGE_SCHEMA, false);
	rel = table_open(get_relname_relid("positions", nspid), RowExclusiveLock);
	if (!fastpath_table_matches(rel, &positions_shape))
	{
		table_close(rel, NoLock);
		return false;
	}
	/* what UPDATE checks of a table that a publication replicates */
	CheckCmdReplicaIdentity(rel, CMD_UPDATE);
	snapshot = fastpath_push_snapshot();
	oldslot = table_slot_create(rel, NULL);
	newslot = table_slot_create(rel, NULL);

	/* the version locked, whatever the snapshot: the lock keeps it newest */
	if (table_tuple_fetch_row_version(rel, tid, SnapshotAny, oldslot) &&
		DatumGetInt32(slot_getattr(oldslot, PC_CONSUMER_ID + 1, &isnull)) == consumer_id &&
		DatumGetInt32(slot_getattr(oldslot, PC_PARTITION + 1, &isnull)) == partition &&
		text_bytes_equal(DatumGetTextPP(slot_getattr(oldslot, PC_TOPIC + 1, &isnull)), topic) &&
		!TransactionIdIsCurrentTransactionId(
			DatumGetTransactionId(slot_getsysattr(oldslot, MinTransactionIdAttributeNumber,
												  &isnull))))
	{
		TimestampTz now = GetCurrentTransactionStartTimestamp();
		TM_FailureData tmfd;
		LockTupleMode lockmode;
		CompatIndexUpdate index_update;

		/* PS_ADVANCE's SET list */
		fastpath_slot_copy(newslot, oldslot);
		newslot->tts_values[PC_POSITION] = Int64GetDatum(position);
		newslot->tts_values[PC_ADVANCED_AT] = TimestampTzGetDatum(now);
		if (!log_end_null)
		{
			newslot->tts_values[PC_LOG_END_OFFSET] = log_end;
			newslot->tts_isnull[PC_LOG_END_OFFSET] = false;
			newslot->tts_values[PC_LOG_END_AT] = TimestampTzGetDatum(now);
			newslot->tts_isnull[PC_LOG_END_AT] = false;
		}
		ExecStoreVirtualTuple(newslot);
		/* the new version must not point into the old one's buffer */
		ExecMaterializeSlot(newslot);

		/* anything but TM_Ok left the row as it was */
		if (compat_table_tuple_update(rel, tid, newslot, GetCurrentCommandId(true),
									  snapshot, InvalidSnapshot, true, &tmfd,
									  &lockmode, &index_update) == TM_Ok)
		{
			if (index_update != COMPAT_INDEXES_NONE)
				fastpath_insert_index_entries(rel, newslot, index_update);
			done = true;
		}
	}

	ExecDropSingleTupleTableSlot(oldslot);
	ExecDropSingleTupleTableSlot(newslot);
	PopActiveSnapshot();
	/* later statements, and the next advance of this call, see it */
	if (done)
		CommandCounterIncrement();
	table_close(rel, NoLock);
	return done;
}
