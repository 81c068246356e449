/*-------------------------------------------------------------------------
 *
 * fastpath.h
 *	  What the fast paths of keys (keystore_fastpath.c), of external
 *	  effects (effects_fastpath.c) and of positions (positions_fastpath.c)
 *	  share.
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
#include "utils/reltrigger.h"
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

/* What a fast path allows of the defaults of its table's columns. */
typedef enum FastPathDefaults
{
	FASTPATH_DEFAULTS_ANY,		/* not looked at: they give no value here */
	FASTPATH_DEFAULTS_NONE,		/* no column may have one */
	FASTPATH_DEFAULTS_PLAIN		/* each passes default_is_plain */
} FastPathDefaults;

/*
 * A table as the install script creates it, as far as a fast path that
 * writes it without the executor depends on it: its columns, the names of
 * its check constraints (all of them, which the fast path's writes cannot
 * break), its triggers and its defaults.  Its indexes are each fast path's
 * own to check.
 */
typedef struct FastPathTableShape
{
	const FastPathColumn *columns;
	int			ncolumns;
	const char *const *checks;
	int			nchecks;
	/* whether a trigger does nothing on the fast path's writes; NULL: none may */
	bool		(*trigger_is_plain) (const Trigger *trigger);
	FastPathDefaults defaults;
	/* whether the default of a column (pg_attrdef.adbin) is one the fast path gives */
	bool		(*default_is_plain) (AttrNumber attnum, const char *adbin);
} FastPathTableShape;

extern bool fastpath_table_matches(Relation rel, const FastPathTableShape *shape);
extern Snapshot fastpath_push_snapshot(void);
extern bool fastpath_insert_speculative(Relation rel, TupleTableSlot *slot,
										Relation index, IndexInfo *index_info,
										Datum *index_values, bool *index_isnull);
extern void fastpath_slot_copy(TupleTableSlot *dst, TupleTableSlot *src);
extern void fastpath_insert_index_entries(Relation rel, TupleTableSlot *slot,
										  CompatIndexUpdate index_update);

#endif							/* IDEM_FASTPATH_H */
