/*-------------------------------------------------------------------------
 *
 * keystore_fastpath.h
 *	  The fast path of the key store on a generation's key index
 *	  (keystore_fastpath.c), for keystore.c and keystore_batch.c.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore_fastpath.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYSTORE_FASTPATH_H
#define KEYSTORE_FASTPATH_H

#include "access/genam.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"
#include "utils/snapshot.h"

#include "storage.h"

/* What the fast path found in the place of a key's hash. */
typedef enum KeyProbe
{
	PROBE_EMPTY,				/* no row visible to the snapshot */
	PROBE_KEY,					/* the key itself: it is recorded */
	PROBE_OTHER,				/* another key: the key may be a collision */
	PROBE_IN_PROGRESS,			/* key_dirty_probe: a row of a transaction in progress */
	PROBE_UNKNOWN				/* key_dirty_probe: no index to probe */
} KeyProbe;

/* processed_keys and its unique index, opened for the fast path */
typedef struct KeyFastPath
{
	Relation	keys;
	Relation	hash_index;
	bool		hash64;			/* the index is on key_hash64 */
	IndexInfo  *index_info;		/* built by the first insert */
	Snapshot	snapshot;
	IndexScanDesc scan;			/* set up by the first probe */
	TupleTableSlot *slot;		/* the same */
	TransactionId found_xmin;	/* xmin of the key's row a probe found */
	MemoryContext cxt;			/* where these live */
} KeyFastPath;

extern bool key_fastpath_open(KeyFastPath *fp, KeyGenSlot slot, bool write);
extern void key_fastpath_close(KeyFastPath *fp);
extern KeyProbe key_fastpath_probe(KeyFastPath *fp, int64 hash,
								   int32 consumer_id, text *key,
								   RecordedKey *recorded);
extern bool key_fastpath_insert(KeyFastPath *fp, int64 hash, int32 consumer_id,
								int32 processed_at, text *key,
								const int32 *fingerprint);
extern KeyProbe key_dirty_probe(KeyGenSlot gen_slot, int64 hash, int32 consumer_id,
								text *key, RecordedKey *recorded,
								TransactionId *xmin, TransactionId *wait_xid);

#endif							/* KEYSTORE_FASTPATH_H */
