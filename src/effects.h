/*-------------------------------------------------------------------------
 *
 * effects.h
 *	  The state machine of external effects (effects.c), as its SQL
 *	  functions (effects_api.c) use it.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_EFFECTS_H
#define IDEM_EFFECTS_H

#include "utils/jsonb.h"

#include "idem_consumer.h"
#include "effects_store.h"

/* The labels of the SQL enum idem_effect_action, in this order. */
typedef enum EffectAction
{
	ACTION_EXECUTE,
	ACTION_REPLAY,
	ACTION_BUSY,
	ACTION_WAIT,
	ACTION_DEAD
} EffectAction;

extern Datum effect_interval(int64 us);
extern void effect_check_request(const char *consumer, text *key,
								 const EffectRow *row, Jsonb *request);
extern void effect_check_fence(const char *consumer, text *key,
							   const EffectRow *row, int64 fence);
extern void effect_consumer_id(EffectPlace *place);
extern void effect_lock(const EffectPlace *place, EffectRow *row);
extern EffectPolicy effect_policy(int32 consumer_id);
extern int64 effect_backoff_us(const EffectPolicy *policy, int32 attempts);
extern void effect_kill(const EffectPlace *place, const char *message,
						const char *detail, bool unknown);
extern EffectAction effect_take_lease(const EffectPlace *place, EffectRow *row,
									  int64 lease_us);
extern Datum effect_action_datum(EffectAction action, Oid enumtypoid);

#endif							/* IDEM_EFFECTS_H */
