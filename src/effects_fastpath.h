/*-------------------------------------------------------------------------
 *
 * effects_fastpath.h
 *	  The fast path of external effects (effects_fastpath.c): the leased
 *	  insert and the completion of an effect without SQL, for the state
 *	  machine (effects.c) and the store (effects_store.c).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects_fastpath.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_EFFECTS_FASTPATH_H
#define IDEM_EFFECTS_FASTPATH_H

#include "postgres.h"

#include "utils/jsonb.h"

extern bool effects_fast_complete(Oid relid, int32 consumer_id, text *key,
								  int64 fence, Jsonb *result);
extern text *effects_fast_insert_leased(Oid relid, int32 consumer_id, text *key,
										Jsonb *request, int64 lease_us);

#endif							/* IDEM_EFFECTS_FASTPATH_H */
