/*-------------------------------------------------------------------------
 *
 * effects_fastpath.c
 *	  The fast paths of the inline cycle: idem_effect_begin inserting a new
 *	  effect and idem_effect_complete storing the result of the current
 *	  lease, without the executor.
 *
 * The statements EF_INSERT_LEASED and EF_COMPLETE (effects_store_sql.c) are
 * the reference.  Each fast path does what its statement does in the one
 * plain case, and changes nothing otherwise, so that the caller runs the
 * statement, which waits, re-checks the newest version under its lock
 * (READ COMMITTED) or fails to serialize, and says why:
 *
 *	insert		the snapshot an SPI statement would take sees no row of the
 *				key, and the primary key takes the new row at once; the row
 *				is inserted as INSERT ... ON CONFLICT does it, with a
 *				speculative insertion of fastpath.c, as a key is inserted;
 *				anything in the key's place (a row of another transaction
 *				still running or committed since the snapshot) is the
 *				statement's to decide
 *	complete	the snapshot sees the effect in flight under the caller's
 *				fence, and the row's newest version is that one:
 *				table_tuple_update waits for a concurrent writer of the row
 *				as UPDATE does, and anything but success is the statement's
 *
 * So the fast paths never decide anything the statements would decide
 * otherwise: fences still rise only under the row's lock and a lease is
 * still handed out once; they skip the executor's start-up, most of the
 * cost of these one-row statements.  Serializable transactions get the
 * same predicate locks, taken by the index and table access methods.
 *
 * They are used only when idem_consumer.fast_path is on and the table is
 * exactly as the 1.1 script creates it (columns, NOT NULL and defaults,
 * the primary key and the outbox's index and no other, no triggers, no
 * row security, no check constraints, neither partitioned nor a
 * partition), so that nothing but built-in code runs; otherwise the
 * statements do the work.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects_fastpath.c
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
#include "catalog/index.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_opfamily.h"
#include "catalog/pg_type.h"
#include "executor/executor.h"
#include "nodes/execnodes.h"
#include "nodes/primnodes.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "idem_consumer.h"
#include "effects_fastpath.h"
#include "fastpath.h"

/* The columns of idem_consumer.effects the fast path reads or writes. */
#define ATT_CONSUMER_ID		1
#define ATT_KEY				2
#define ATT_REQUEST			3
#define ATT_DEFERRED		4
#define ATT_STATE			5
#define ATT_FENCE			6
#define ATT_ATTEMPTS		7
#define ATT_PROVIDER_KEY	8
#define ATT_OUTCOME_UNKNOWN	9
#define ATT_LEASE_UNTIL		10
#define ATT_RESULT			13
#define ATT_CREATED_AT		15
#define ATT_UPDATED_AT		16
#define ATT_COMPLETED_AT	17
#define EFFECTS_NATTS		17

/* btree's datetime_ops (pg_opfamily.dat), which has no macro of its own */
#define DATETIME_BTREE_FAM_OID	434

/*
 * The columns as the 1.1 script creates them, by attnum - 1; those the
 * fast path neither reads nor writes are compared for NOT NULL only.
 */
static const FastPathColumn effect_columns[EFFECTS_NATTS] = {
	[ATT_CONSUMER_ID - 1] = {"consumer_id", INT4OID, true, false},
	[ATT_KEY - 1] = {"key", TEXTOID, true, true},
	[ATT_REQUEST - 1] = {"request", JSONBOID, false, false},
	[ATT_DEFERRED - 1] = {"deferred", BOOLOID, true, false},
	[ATT_STATE - 1] = {"state", TEXTOID, true, false},
	[ATT_FENCE - 1] = {"fence", INT8OID, true, false},
	[ATT_ATTEMPTS - 1] = {"attempts", INT4OID, true, false},
	[ATT_PROVIDER_KEY - 1] = {"provider_key", TEXTOID, true, false},
	[ATT_OUTCOME_UNKNOWN - 1] = {"outcome_unknown", BOOLOID, true, false},
	[ATT_LEASE_UNTIL - 1] = {"lease_until", TIMESTAMPTZOID, false, false},
	[ATT_RESULT - 1] = {"result", JSONBOID, false, false},
	[ATT_CREATED_AT - 1] = {"created_at", TIMESTAMPTZOID, true, false},
	[ATT_UPDATED_AT - 1] = {"updated_at", TIMESTAMPTZOID, true, false},
	[ATT_COMPLETED_AT - 1] = {"completed_at", TIMESTAMPTZOID, false, false},
};

/*
 * The texts (pg_attrdef.adbin) of the defaults found plain, by column: a
 * string comparison spares parsing them at every insert.
 */
static char *plain_defaults[EFFECTS_NATTS + 1];

/*
 * Sets a column of a virtual slot to a non-null value.
 */
static inline void
set_column(TupleTableSlot *slot, AttrNumber attnum, Datum value)
{
	slot->tts_values[attnum - 1] = value;
	slot->tts_isnull[attnum - 1] = false;
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
 * Tells whether the default of a column is one the 1.1 script gives and an
 * insert of a new inline effect computes itself, as the statement would
 * have it computed.
 */
static bool
default_is_plain(AttrNumber attnum, const char *adbin)
{
	Node	   *expr;
	bool		plain;

	/* the text of a default found plain before is the same expression */
	if (attnum >= 1 && attnum <= EFFECTS_NATTS && plain_defaults[attnum] != NULL &&
		strcmp(plain_defaults[attnum], adbin) == 0)
		return true;
	expr = stringToNode(adbin);
	switch (attnum)
	{
		case ATT_FENCE:
		case ATT_ATTEMPTS:
			plain = true;		/* the insert gives both */
			break;
		case ATT_PROVIDER_KEY:
			plain = IsA(expr, CoerceViaIO) &&
				((CoerceViaIO *) expr)->resulttype == TEXTOID &&
				IsA(((CoerceViaIO *) expr)->arg, FuncExpr) &&
				((FuncExpr *) ((CoerceViaIO *) expr)->arg)->funcid == F_GEN_RANDOM_UUID;
			break;
		case ATT_OUTCOME_UNKNOWN:
			plain = IsA(expr, Const) && !((Const *) expr)->constisnull &&
				((Const *) expr)->consttype == BOOLOID &&
				!DatumGetBool(((Const *) expr)->constvalue);
			break;
		case ATT_CREATED_AT:
		case ATT_UPDATED_AT:
			plain = IsA(expr, FuncExpr) && ((FuncExpr *) expr)->funcid == F_NOW;
			break;
		default:
			plain = false;
			break;
	}
	if (!plain)
		return false;
	if (plain_defaults[attnum] != NULL)
		pfree(plain_defaults[attnum]);
	plain_defaults[attnum] = MemoryContextStrdup(TopMemoryContext, adbin);
	return true;
}

/*
 * The table as the 1.1 script creates it, with nothing (a trigger, a
 * policy, a check, a changed column, partitions to route rows to, the
 * constraint of a partition) that the executor would have to run or
 * enforce on an insert or update; an insert also computes the defaults it
 * relies on, which no other column may have.
 */
static const FastPathTableShape effects_shape_update = {
	.columns = effect_columns,
	.ncolumns = EFFECTS_NATTS,
	.defaults = FASTPATH_DEFAULTS_ANY,
};
static const FastPathTableShape effects_shape_insert = {
	.columns = effect_columns,
	.ncolumns = EFFECTS_NATTS,
	.defaults = FASTPATH_DEFAULTS_PLAIN,
	.default_is_plain = default_is_plain,
};

/*
 * Opens the effects table (relid, as effects_table_oid() found it; the
 * callers pass it so that this file needs nothing from effects_store_sql.c)
 * and its primary key for the fast path; returns false when the SQL
 * statements must do the work: the table is missing, the table or its indexes
 * are not as created, or the transaction cannot write (the statement then
 * raises the usual error).
 */
static bool
open_effects(Oid relid, Relation *relp, Relation *pkp, bool insert)
{
	Relation	rel;
	Relation	pk = NULL;
	List	   *indexes;
	ListCell   *lc;
	bool		plain;

	if (!fastpath_enabled() || !OidIsValid(relid) || XactReadOnly || IsInParallelMode())
		return false;

	rel = table_open(relid, RowExclusiveLock);
	if (!fastpath_table_matches(rel, insert ? &effects_shape_insert : &effects_shape_update))
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
	if (!insert)
		CheckCmdReplicaIdentity(rel, CMD_UPDATE);

	(void) fastpath_push_snapshot();

	*relp = rel;
	*pkp = pk;
	return true;
}

/*
 * Ends the fast path; the locks are kept until the end of the transaction,
 * as the executor keeps them, and later statements see what it wrote.
 */
static void
close_effects(Relation rel, Relation pk, bool wrote)
{
	PopActiveSnapshot();
	if (wrote)
		CommandCounterIncrement();
	index_close(pk, NoLock);
	table_close(rel, NoLock);
}

/*
 * Starts a scan of the primary key for (consumer_id, key).
 */
static IndexScanDesc
begin_key_scan(Relation rel, Relation pk, int32 consumer_id, text *key)
{
	ScanKeyData skeys[2];
	IndexScanDesc scan;

	ScanKeyInit(&skeys[0], 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(consumer_id));
	ScanKeyEntryInitialize(&skeys[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   C_COLLATION_OID, F_TEXTEQ, PointerGetDatum(key));
	scan = compat_index_beginscan(rel, pk, GetActiveSnapshot(), 2, 0);
	index_rescan(scan, skeys, 2, NULL, 0);
	return scan;
}

/*
 * Completes the effect (consumer_id, key) if the snapshot sees it in
 * flight under fence and its row can be updated at once or after waiting
 * for a writer that rolled back; stores result.  Returns false, having
 * changed nothing, when EF_COMPLETE must decide.
 */
bool
effects_fast_complete(Oid relid, int32 consumer_id, text *key, int64 fence,
					  Jsonb *result)
{
	Relation	rel;
	Relation	pk;
	IndexScanDesc scan;
	TupleTableSlot *oldslot;
	TupleTableSlot *newslot;
	bool		isnull;
	bool		done = false;

	if (!open_effects(relid, &rel, &pk, false))
		return false;
	scan = begin_key_scan(rel, pk, consumer_id, key);
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
			CompatIndexUpdate index_update;
			TM_Result	res;

			/* EF_COMPLETE's SET list */
			fastpath_slot_copy(newslot, oldslot);
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

			res = compat_table_tuple_update(rel, &oldslot->tts_tid, newslot,
											GetCurrentCommandId(true), GetActiveSnapshot(),
											InvalidSnapshot, true, &tmfd, &lockmode,
											&index_update);
			/* anything but TM_Ok left the row as it was */
			if (res == TM_Ok)
			{
				if (index_update != COMPAT_INDEXES_NONE)
					fastpath_insert_index_entries(rel, newslot, index_update);
				done = true;
			}
		}
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(oldslot);
	ExecDropSingleTupleTableSlot(newslot);
	close_effects(rel, pk, done);
	return done;
}

/*
 * Inserts a new inline effect leased to fence 1 until now + lease_us, as
 * EF_INSERT_LEASED does, when the snapshot sees no row of the key and the
 * primary key takes the new one at once; returns its provider key, or
 * NULL, having changed nothing, when the statement must decide (a row of
 * the key exists or is being inserted, the table is not as created).
 * The row is inserted the way INSERT ... ON CONFLICT does it, with a
 * speculative insertion, as keystore_fastpath.c inserts a key.
 */
text *
effects_fast_insert_leased(Oid relid, int32 consumer_id, text *key, Jsonb *request,
						   int64 lease_us)
{
	Relation	rel;
	Relation	pk;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		seen;
	text	   *provider_key = NULL;

	if (!open_effects(relid, &rel, &pk, true))
		return NULL;
	scan = begin_key_scan(rel, pk, consumer_id, key);
	slot = table_slot_create(rel, NULL);
	seen = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);

	if (!seen)
	{
		TimestampTz now = GetCurrentTransactionStartTimestamp();
		IndexInfo  *index_info = BuildIndexInfo(pk);
		Datum		index_values[INDEX_MAX_KEYS];
		bool		index_isnull[INDEX_MAX_KEYS];
		bool		inserted;

		/* what the statement's VALUES and the columns' defaults give */
		provider_key = cstring_to_text(DatumGetCString(
			DirectFunctionCall1(uuid_out, DirectFunctionCall1(gen_random_uuid, (Datum) 0))));
		slot = table_slot_create(rel, NULL);
		memset(slot->tts_isnull, true, EFFECTS_NATTS * sizeof(bool));
		set_column(slot, ATT_CONSUMER_ID, Int32GetDatum(consumer_id));
		set_column(slot, ATT_KEY, PointerGetDatum(key));
		if (request != NULL)
			set_column(slot, ATT_REQUEST, PointerGetDatum(request));
		set_column(slot, ATT_DEFERRED, BoolGetDatum(false));
		set_column(slot, ATT_STATE, CStringGetTextDatum("in_flight"));
		set_column(slot, ATT_FENCE, Int64GetDatum(1));
		set_column(slot, ATT_ATTEMPTS, Int32GetDatum(1));
		set_column(slot, ATT_PROVIDER_KEY, PointerGetDatum(provider_key));
		set_column(slot, ATT_OUTCOME_UNKNOWN, BoolGetDatum(false));
		set_column(slot, ATT_LEASE_UNTIL, TimestampTzGetDatum(now + lease_us));
		set_column(slot, ATT_CREATED_AT, TimestampTzGetDatum(now));
		set_column(slot, ATT_UPDATED_AT, TimestampTzGetDatum(now));
		ExecStoreVirtualTuple(slot);

		/* an inline effect is not deferred: the outbox's index takes no entry */
		FormIndexDatum(index_info, slot, NULL, index_values, index_isnull);
		inserted = fastpath_insert_speculative(rel, slot, pk, index_info,
											   index_values, index_isnull);
		ExecDropSingleTupleTableSlot(slot);
		if (!inserted)
			provider_key = NULL;
	}

	close_effects(rel, pk, provider_key != NULL);
	return provider_key;
}
