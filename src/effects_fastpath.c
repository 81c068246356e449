/*-------------------------------------------------------------------------
 *
 * effects_fastpath.c
 *	  The fast path of idem_effect_complete: storing the result of the
 *	  current lease without the executor.
 *
 * The statement EF_COMPLETE (effects_store.c) is the reference.  The fast
 * path does what it does in the one plain case: the snapshot an SPI
 * statement would take sees the effect in flight under the caller's fence,
 * and the row's newest version is that one (no concurrent or earlier
 * update of it in this transaction).  It finds the row through the primary
 * key, checks state and fence, and updates it with table_tuple_update,
 * which waits for a concurrent writer of the row as UPDATE does.  In every
 * other case it changes nothing and returns false, and the caller runs the
 * SQL statement, which re-checks the newest version under its lock (READ
 * COMMITTED) or fails to serialize, and says why a fence is refused.  So
 * the fast path never decides anything the statement would decide
 * otherwise: it only skips the executor's start-up, most of the cost of
 * the update.
 *
 * It is used only when the table is exactly as the 1.1 script creates it
 * (columns, the primary key and the outbox's index and no other, no
 * triggers, no row security, no check constraints), so that nothing but
 * the built-in btree code runs; otherwise the statement does the work.  Serializable
 * transactions get the same predicate locks, taken by the index and table
 * access methods themselves.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "nodes/execnodes.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "idem_consumer.h"
#include "effects.h"

/* The columns of idem_consumer.effects the fast path reads or writes. */
#define ATT_CONSUMER_ID		1
#define ATT_KEY				2
#define ATT_DEFERRED		4
#define ATT_STATE			5
#define ATT_FENCE			6
#define ATT_LEASE_UNTIL		10
#define ATT_RESULT			13
#define ATT_CREATED_AT		15
#define ATT_UPDATED_AT		16
#define ATT_COMPLETED_AT	17
#define EFFECTS_NATTS		17

/* btree's datetime_ops (pg_opfamily.dat), which has no macro of its own */
#define DATETIME_BTREE_FAM_OID	434

typedef struct ExpectedColumn
{
	AttrNumber	attnum;
	const char *name;
	Oid			type;
} ExpectedColumn;

static const ExpectedColumn expected_columns[] = {
	{ATT_CONSUMER_ID, "consumer_id", INT4OID},
	{ATT_KEY, "key", TEXTOID},
	{ATT_DEFERRED, "deferred", BOOLOID},
	{ATT_STATE, "state", TEXTOID},
	{ATT_FENCE, "fence", INT8OID},
	{ATT_LEASE_UNTIL, "lease_until", TIMESTAMPTZOID},
	{ATT_RESULT, "result", JSONBOID},
	{ATT_CREATED_AT, "created_at", TIMESTAMPTZOID},
	{ATT_UPDATED_AT, "updated_at", TIMESTAMPTZOID},
	{ATT_COMPLETED_AT, "completed_at", TIMESTAMPTZOID},
};

/*
 * Tells whether the table is as the extension creates it, with nothing
 * (a trigger, a policy, a check, a changed column) that the executor would
 * have to run or enforce on an update.
 */
static bool
table_is_plain(Relation rel)
{
	TupleDesc	tupdesc = RelationGetDescr(rel);

	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->trigdesc != NULL ||
		rel->rd_rel->relrowsecurity ||
		tupdesc->natts != EFFECTS_NATTS ||
		(tupdesc->constr != NULL &&
		 (tupdesc->constr->num_check > 0 || tupdesc->constr->has_generated_stored)))
		return false;
	for (int i = 0; i < EFFECTS_NATTS; i++)
		if (TupleDescAttr(tupdesc, i)->attisdropped)
			return false;
	for (int i = 0; i < lengthof(expected_columns); i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, expected_columns[i].attnum - 1);

		if (att->atttypid != expected_columns[i].type ||
			strcmp(NameStr(att->attname), expected_columns[i].name) != 0)
			return false;
	}
	return true;
}

/*
 * Tells whether an index is the primary key on (consumer_id, key) that the
 * extension creates, compared as = on integers and on "C" text.
 */
static bool
index_is_primary_key(Relation index)
{
	Form_pg_index form = index->rd_index;

	return form->indisprimary && form->indisvalid && form->indisready &&
		form->indnkeyatts == 2 &&
		form->indkey.values[0] == ATT_CONSUMER_ID &&
		form->indkey.values[1] == ATT_KEY &&
		RelationGetIndexExpressions(index) == NIL &&
		RelationGetIndexPredicate(index) == NIL &&
		index->rd_rel->relam == BTREE_AM_OID &&
		index->rd_opfamily[0] == INTEGER_BTREE_FAM_OID &&
		index->rd_opfamily[1] == TEXT_BTREE_FAM_OID &&
		index->rd_indcollation[1] == C_COLLATION_OID;
}

/*
 * Tells whether an index is the outbox's, on (consumer_id, created_at)
 * WHERE deferred, so that inserting its entries runs no code of anyone's.
 */
static bool
index_is_outbox(Relation index)
{
	Form_pg_index form = index->rd_index;
	List	   *pred;

	if (form->indisprimary || form->indisunique || form->indnkeyatts != 2 ||
		form->indnatts != 2 ||
		form->indkey.values[0] != ATT_CONSUMER_ID ||
		form->indkey.values[1] != ATT_CREATED_AT ||
		index->rd_rel->relam != BTREE_AM_OID ||
		index->rd_opfamily[0] != INTEGER_BTREE_FAM_OID ||
		index->rd_opfamily[1] != DATETIME_BTREE_FAM_OID ||
		RelationGetIndexExpressions(index) != NIL)
		return false;
	pred = RelationGetIndexPredicate(index);
	return list_length(pred) == 1 && IsA(linitial(pred), Var) &&
		((Var *) linitial(pred))->varattno == ATT_DEFERRED;
}

/*
 * Inserts the index entries of a new row version that was not a HOT
 * update, as ExecUpdate does.
 */
static void
insert_index_entries(Relation rel, TupleTableSlot *slot)
{
	EState	   *estate = CreateExecutorState();
	ResultRelInfo *rinfo = makeNode(ResultRelInfo);

	/*
	 * No range table: ExecInsertIndexTuples then takes the update for one
	 * that changed no indexed column, which is true, and hints so to the
	 * btree code as UPDATE would.
	 */
	InitResultRelInfo(rinfo, rel, 0, NULL, 0);
	ExecOpenIndices(rinfo, false);
	ExecInsertIndexTuples(rinfo, slot, estate, true, false, NULL, NIL);
	ExecCloseIndices(rinfo);
	FreeExecutorState(estate);
}

/*
 * Completes the effect (consumer_id, key) if the snapshot sees it in
 * flight under fence and its row can be updated at once or after waiting
 * for a writer that rolled back; stores result.  Returns false, having
 * changed nothing, when EF_COMPLETE must decide.
 */
bool
effects_fast_complete(int32 consumer_id, text *key, int64 fence, Jsonb *result)
{
	Oid			relid = effects_table_oid();
	Relation	rel;
	Relation	pk = NULL;
	List	   *indexes;
	ListCell   *lc;
	IndexScanDesc scan;
	ScanKeyData skeys[2];
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	Snapshot	snapshot;
	bool		isnull;
	bool		plain;
	bool		done = false;

	if (!OidIsValid(relid) || XactReadOnly || IsInParallelMode())
		return false;

	rel = table_open(relid, RowExclusiveLock);
	if (!table_is_plain(rel))
	{
		table_close(rel, NoLock);
		return false;
	}
	/* exactly the primary key and the outbox's index */
	indexes = RelationGetIndexList(rel);
	plain = list_length(indexes) == 2;
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), RowExclusiveLock);

		if (pk == NULL && index_is_primary_key(index))
			pk = index;
		else
		{
			plain = plain && index_is_outbox(index);
			index_close(index, NoLock);
		}
	}
	list_free(indexes);
	if (!plain || pk == NULL)
	{
		if (pk != NULL)
			index_close(pk, NoLock);
		table_close(rel, NoLock);
		return false;
	}
	/* what UPDATE checks of a table that a publication replicates */
	CheckCmdReplicaIdentity(rel, CMD_UPDATE);

	/* the snapshot an SPI statement would take, as keystore_fastpath.c */
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	snapshot = GetActiveSnapshot();

	ScanKeyInit(&skeys[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(consumer_id));
	ScanKeyEntryInitialize(&skeys[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   C_COLLATION_OID, F_TEXTEQ, PointerGetDatum(key));
	scan = index_beginscan(rel, pk, snapshot, 2, 0);
	index_rescan(scan, skeys, 2, NULL, 0);
	oldslot = table_slot_create(rel, NULL);
	newslot = table_slot_create(rel, NULL);

	if (index_getnext_slot(scan, ForwardScanDirection, oldslot))
	{
		text	   *state = DatumGetTextPP(slot_getattr(oldslot, ATT_STATE, &isnull));
		int64		row_fence = DatumGetInt64(slot_getattr(oldslot, ATT_FENCE, &isnull));

		if (row_fence == fence &&
			VARSIZE_ANY_EXHDR(state) == strlen("in_flight") &&
			memcmp(VARDATA_ANY(state), "in_flight", strlen("in_flight")) == 0)
		{
			TimestampTz now = GetCurrentTransactionStartTimestamp();
			TM_FailureData tmfd;
			LockTupleMode lockmode;
			bool		update_indexes;
			TM_Result	res;

			/* EF_COMPLETE's SET list */
			slot_getallattrs(oldslot);
			ExecClearTuple(newslot);
			memcpy(newslot->tts_values, oldslot->tts_values, EFFECTS_NATTS * sizeof(Datum));
			memcpy(newslot->tts_isnull, oldslot->tts_isnull, EFFECTS_NATTS * sizeof(bool));
			newslot->tts_values[ATT_STATE - 1] = CStringGetTextDatum("completed");
			newslot->tts_values[ATT_RESULT - 1] = PointerGetDatum(result);
			newslot->tts_isnull[ATT_RESULT - 1] = result == NULL;
			newslot->tts_isnull[ATT_LEASE_UNTIL - 1] = true;
			newslot->tts_values[ATT_COMPLETED_AT - 1] = TimestampTzGetDatum(now);
			newslot->tts_isnull[ATT_COMPLETED_AT - 1] = false;
			newslot->tts_values[ATT_UPDATED_AT - 1] = TimestampTzGetDatum(now);
			ExecStoreVirtualTuple(newslot);
			/* the new version must not point into the old one's buffer */
			ExecMaterializeSlot(newslot);

			res = table_tuple_update(rel, &oldslot->tts_tid, newslot,
									 GetCurrentCommandId(true), snapshot,
									 InvalidSnapshot, true, &tmfd, &lockmode,
									 &update_indexes);
			/* anything but TM_Ok left the row as it was */
			if (res == TM_Ok)
			{
				if (update_indexes)
					insert_index_entries(rel, newslot);
				done = true;
			}
		}
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(oldslot);
	ExecDropSingleTupleTableSlot(newslot);
	PopActiveSnapshot();
	/* later statements of the transaction see the new version */
	if (done)
		CommandCounterIncrement();
	index_close(pk, NoLock);
	table_close(rel, NoLock);
	return done;
}
