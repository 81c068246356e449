/*-------------------------------------------------------------------------
 *
 * fastpath.c
 *	  What the fast paths of keys, of external effects and of positions
 *	  share: idem_consumer.fast_path, the check that a table is as the
 *	  install script creates it, the snapshot an SPI statement would take,
 *	  the speculative insertion through a unique index, and the index
 *	  entries of an updated row.
 *
 * A fast path forms its tuples from the values it is given and runs none
 * of the executor's checks, so it may write only to a table that is
 * exactly as created: fastpath_table_matches checks what the three share
 * (the kind of table, row security, columns, check constraints, triggers
 * and defaults), each against its own FastPathTableShape; each fast path
 * checks its table's indexes itself.  The insertion is the one ExecInsert
 * makes for INSERT ... ON CONFLICT: a heap tuple with a speculative token,
 * then the index entry with UNIQUE_CHECK_PARTIAL, then the token resolved,
 * so that a tuple whose index entry conflicts is dead to everyone at once
 * and a concurrent inserter of the same key waits for this transaction
 * exactly as it would for the statement.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/fastpath.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "executor/executor.h"
#include "storage/lmgr.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"

#include "idem_consumer.h"
#include "fastpath.h"

/* Whether keys and effects may be written and read in C. */
static bool idem_fast_path = true;

/*
 * Defines idem_consumer.fast_path; called once from _PG_init.
 */
void
fastpath_init(void)
{
	DefineCustomBoolVariable("idem_consumer.fast_path",
							 "Records and looks up keys in C when the storage allows it.",
							 "Off runs every statement on the storage as SQL, the reference path: "
							 "for tests and for comparing the two.",
							 &idem_fast_path,
							 true,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);
}

/*
 * Tells whether idem_consumer.fast_path lets statements on the storage
 * run in C.
 */
bool
fastpath_enabled(void)
{
	return idem_fast_path;
}

/*
 * Tells whether a table has exactly ncolumns columns, none dropped (a
 * dropped column still takes a slot, which the fast path would fill with
 * garbage), each with the type, NOT NULL, name and collation of columns.
 */
static bool
fastpath_columns_match(TupleDesc tupdesc, const FastPathColumn *columns,
					   int ncolumns)
{
	if (tupdesc->natts != ncolumns)
		return false;
	for (int i = 0; i < ncolumns; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);

		if (att->attisdropped ||
			att->attnotnull != columns[i].not_null ||
			(OidIsValid(columns[i].type) && att->atttypid != columns[i].type) ||
			(columns[i].name != NULL &&
			 strcmp(NameStr(att->attname), columns[i].name) != 0) ||
			(columns[i].collate_c && att->attcollation != C_COLLATION_OID))
			return false;
	}
	return true;
}

/* whether name is one of the nnames names */
static bool
name_listed(const char *name, const char *const *names, int nnames)
{
	for (int i = 0; i < nnames; i++)
		if (strcmp(name, names[i]) == 0)
			return true;
	return false;
}

/*
 * Tells whether a table is as shape describes it, with nothing the
 * executor would run or enforce on the fast path's writes: a plain table,
 * no partition (only the executor routes rows and checks partition
 * constraints), no row security, no stored generated column, exactly the
 * check constraints shape names (a constraint's name is unique in its
 * table), only triggers shape finds plain, shape's columns, and defaults
 * as shape allows.
 */
bool
fastpath_table_matches(Relation rel, const FastPathTableShape *shape)
{
	TupleDesc	tupdesc = RelationGetDescr(rel);
	TupleConstr *constr = tupdesc->constr;
	int			num_check = constr != NULL ? constr->num_check : 0;

	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->rd_rel->relispartition ||
		rel->rd_rel->relrowsecurity ||
		(constr != NULL && constr->has_generated_stored) ||
		num_check != shape->nchecks)
		return false;
	for (int i = 0; i < num_check; i++)
		if (!name_listed(constr->check[i].ccname, shape->checks, shape->nchecks))
			return false;
	/* the relcache keeps no trigger descriptor for a table without one */
	if (rel->trigdesc != NULL)
		for (int i = 0; i < rel->trigdesc->numtriggers; i++)
			if (shape->trigger_is_plain == NULL ||
				!shape->trigger_is_plain(&rel->trigdesc->triggers[i]))
				return false;
	if (!fastpath_columns_match(tupdesc, shape->columns, shape->ncolumns))
		return false;
	if (shape->defaults != FASTPATH_DEFAULTS_ANY && constr != NULL)
		for (int i = 0; i < constr->num_defval; i++)
			if (shape->defaults == FASTPATH_DEFAULTS_NONE ||
				!shape->default_is_plain(constr->defval[i].adnum,
										 constr->defval[i].adbin))
				return false;
	return true;
}

/*
 * Pushes the snapshot an SPI statement would take, which sees what this
 * transaction did so far, even earlier in the calling statement; returns
 * it.  The caller pops it.
 */
Snapshot
fastpath_push_snapshot(void)
{
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	return GetActiveSnapshot();
}

/*
 * Inserts the tuple in slot into rel and its entry into the unique index,
 * as ExecInsert does for INSERT ... ON CONFLICT; returns false, killing
 * the speculative tuple, if the index already has an entry of the same key
 * that may be live.
 */
bool
fastpath_insert_speculative(Relation rel, TupleTableSlot *slot,
							Relation index, IndexInfo *index_info,
							Datum *index_values, bool *index_isnull)
{
	TransactionId xid = GetCurrentTransactionId();
	uint32		token;
	bool		inserted;

	token = SpeculativeInsertionLockAcquire(xid);
	table_tuple_insert_speculative(rel, slot, GetCurrentCommandId(true),
								   0, NULL, token);
	inserted = index_insert(index, index_values, index_isnull, &slot->tts_tid,
							rel, UNIQUE_CHECK_PARTIAL, false, index_info);
	table_tuple_complete_speculative(rel, slot, token, inserted);
	SpeculativeInsertionLockRelease(xid);
	return inserted;
}

/*
 * Inserts the index entries a new row version needs, as ExecUpdate does:
 * all of them after an update that was not HOT, and from 16 those of the
 * summarizing indexes after a HOT one.
 */
void
fastpath_insert_index_entries(Relation rel, TupleTableSlot *slot,
							  CompatIndexUpdate index_update)
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
	compat_insert_index_entries(rinfo, slot, estate, index_update);
	ExecCloseIndices(rinfo);
	FreeExecutorState(estate);
}

/*
 * Makes the empty slot dst hold the values of the row in src, to be
 * changed before ExecStoreVirtualTuple: the new version of an update.
 */
void
fastpath_slot_copy(TupleTableSlot *dst, TupleTableSlot *src)
{
	int			natts = src->tts_tupleDescriptor->natts;

	slot_getallattrs(src);
	ExecClearTuple(dst);
	memcpy(dst->tts_values, src->tts_values, natts * sizeof(Datum));
	memcpy(dst->tts_isnull, src->tts_isnull, natts * sizeof(bool));
}
