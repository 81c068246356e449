/*-------------------------------------------------------------------------
 *
 * fastpath.h
 *	  What the fast paths of keys (keystore_fastpath.c) and of external
 *	  effects (effects_fastpath.c) share.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/fastpath.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_FASTPATH_H
#define IDEM_FASTPATH_H

#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"
#include "utils/snapshot.h"

#include "compat.h"

/*
 * A column as the install script creates it; name NULL and type
 * InvalidOid are not compared.
 */
typedef struct FastPathColumn
{
	const char *name;
	Oid			type;
	bool		not_null;
	bool		collate_c;		/* text compared bytewise */
} FastPathColumn;

extern bool fastpath_columns_match(TupleDesc tupdesc,
								   const FastPathColumn *columns, int ncolumns);
extern Snapshot fastpath_push_snapshot(void);
extern bool fastpath_insert_speculative(Relation rel, TupleTableSlot *slot,
										Relation index, IndexInfo *index_info,
										Datum *index_values, bool *index_isnull);
extern void fastpath_slot_copy(TupleTableSlot *dst, TupleTableSlot *src);
extern void fastpath_insert_index_entries(Relation rel, TupleTableSlot *slot,
										  CompatIndexUpdate index_update);

#endif							/* IDEM_FASTPATH_H */
