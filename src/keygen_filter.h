/*-------------------------------------------------------------------------
 *
 * keygen_filter.h
 *	  The tests of the filters of the sealed generations
 *	  (keygen_filter.c), for keystore.c.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_filter.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYGEN_FILTER_H
#define KEYGEN_FILTER_H

#include "keygen_state.h"

extern bool keygen_filter_may_hold(KeyGenSlot slot, int32 nchunks,
								   uint64 hash);
extern bool keygen_filter_all_may_hold(const KeyGenState *st, uint64 hash);

#endif							/* KEYGEN_FILTER_H */
