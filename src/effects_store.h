/*-------------------------------------------------------------------------
 *
 * effects_store.h
 *	  The storage of external effects (effects_store.c, and its statements
 *	  in effects_store_sql.c, declared in effects_store_sql.h): an
 *	  effect's row, its states and their SQLSTATEs, used by the state
 *	  machine and the SQL functions of effects.c.  What other modules call
 *	  is declared in idem_consumer.h.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects_store.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_EFFECTS_STORE_H
#define IDEM_EFFECTS_STORE_H

#include "postgres.h"

#include "datatype/timestamp.h"
#include "utils/jsonb.h"

#include "idem_consumer.h"
#include "effects_store_sql.h"

/*
 * SQLSTATEs of class IE, implementation-defined: the caller's lease was
 * taken over (fenced off), the request differs from the stored one, and
 * the code of an effect's dead-letter entry.
 */
#define ERRCODE_EFFECT_FENCED_OFF		MAKE_SQLSTATE('I','E','0','0','1')
#define ERRCODE_EFFECT_REQUEST_MISMATCH	MAKE_SQLSTATE('I','E','0','0','2')
#define ERRCODE_EFFECT_FAILED			MAKE_SQLSTATE('I','E','0','0','3')

/* The values of effects.state. */
typedef enum EffectState
{
	ES_PENDING,
	ES_IN_FLIGHT,
	ES_WAITING,
	ES_COMPLETED,
	ES_DEAD
} EffectState;

/* One effect row, as EFFECT_COLUMNS return it. */
typedef struct EffectRow
{
	MemoryContext cxt;			/* where the row's values are copied */
	EffectState state;
	int64		fence;
	int32		attempts;
	text	   *provider_key;
	bool		outcome_unknown;
	TimestampTz lease_until;
	TimestampTz retry_at;
	bool		has_retry_at;
	text	   *last_error;		/* NULL if none */
	Jsonb	   *result;			/* NULL if none */
	Jsonb	   *request;		/* NULL if none */
	text	   *key;
	bool		lease_live;		/* in flight and the lease not expired */
	bool		due;			/* retry_at has come */
	int64		dead_letter_id; /* 0 if none */
} EffectRow;

/*
 * Where an effect is: its key, and the place of its key (key_place.h): its
 * consumer, with this node's id of it for its retry policy, and, where
 * keys are routed (routed.c), its route, which puts it in
 * idem_consumer.routed_effects beside the business rows of the route.
 */
typedef struct EffectPlace
{
	KeyPlace	at;				/* its key's (key_place.h) */
	text	   *key;
} EffectPlace;

typedef struct EffectPolicy
{
	int32		max_attempts;
	int64		base_delay_us;
	int64		max_delay_us;
} EffectPolicy;

/* effects_store.c */
extern bool effects_fetch(EffectStmt stmt, const EffectPlace *place,
						  Datum *args, const char *argnulls, int nargs,
						  EffectRow *row);
extern void effect_row_read(uint64 i, EffectRow *row);
extern bool effects_complete(const EffectPlace *place, int64 fence, Jsonb *result);
extern bool effects_insert_leased(const EffectPlace *place, Jsonb *request,
								  Interval *lease, EffectRow *row);
extern const char *effect_state_name(EffectState state);
extern bool effects_policy(int32 consumer_id, EffectPolicy *policy);
extern bool effects_park(const EffectPlace *place, const char *message,
						 const char *detail, int64 *entry_id);
extern void effects_lock_due(const EffectPlace *place, int32 max_count);

/* effects_store.c: the local and the routed place's operations (key_place.h) */
extern void effects_execute_local(int stmt, const KeyPlace *at, text *key,
								  Datum *args, const char *argnulls, int nargs);
extern void effects_execute_routed_at(int stmt, const KeyPlace *at, text *key,
									  Datum *args, const char *argnulls, int nargs);
extern text *effects_fast_insert_local(const KeyPlace *at, text *key,
									   Jsonb *request, int64 lease_us);
extern text *effects_fast_insert_none(const KeyPlace *at, text *key,
									  Jsonb *request, int64 lease_us);
extern bool effects_fast_complete_local(const KeyPlace *at, text *key, int64 fence,
										Jsonb *result);
extern bool effects_fast_complete_none(const KeyPlace *at, text *key, int64 fence,
									   Jsonb *result);
extern bool effects_park_local(const KeyPlace *at, text *key, Datum *values,
							   int64 *entry_id);
extern bool effects_park_routed(const KeyPlace *at, text *key, Datum *values,
								int64 *entry_id);
extern uint64 effects_routed_due(const char *consumer, int32 max_count,
								 Datum **routes, text ***keys);

#endif							/* IDEM_EFFECTS_STORE_H */
