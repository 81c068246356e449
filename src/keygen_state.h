/*-------------------------------------------------------------------------
 *
 * keygen_state.h
 *	  The generations of the key store as this backend last read them
 *	  (keygen_state.c).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_state.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYGEN_STATE_H
#define KEYGEN_STATE_H

#include "utils/snapshot.h"

#include "storage.h"

/*
 * Which generation takes new keys and which are sealed,
 * as key_generations says; before 1.2, the legacy pair is the current one.
 */
typedef struct KeyGenState
{
	KeyGenSlot	current;
	int64		current_epoch;
	int			nsealed;
	KeyGenSlot	sealed[KEYGEN_RING];	/* newest first */
	TransactionId sealed_by[KEYGEN_NUM];	/* the switch that sealed it */
	bool		unsettled[KEYGEN_NUM];	/* sealed, but not settled yet */
	int32		filter_chunks[KEYGEN_NUM];	/* of a filter usable now; 0: none */
	/* the filter of all sealed generations, usable now; chunks 0: none */
	int			filter_all_place;
	int32		filter_all_chunks;
	bool		in_filter_all[KEYGEN_NUM];	/* the generations it holds */
} KeyGenState;

extern void keygen_state_init(void);
extern const KeyGenState *keygen_state(void);
extern const KeyGenState *keygen_state_latest(void);
extern void keygen_state_forget(void);
extern bool keygen_state_is_current(void);
extern bool keygen_seal_visible(KeyGenSlot slot, Snapshot snapshot);
extern int32 keygen_filter_usable(KeyGenSlot slot, int32 nchunks,
								  TransactionId row_xmin);
extern int32 keygen_filter_all_usable(int place, int32 nchunks);
extern bool keygen_filter_all_holds(ArrayType *epochs, int64 epoch);

#endif							/* KEYGEN_STATE_H */
