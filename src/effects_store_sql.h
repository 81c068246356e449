/*-------------------------------------------------------------------------
 *
 * effects_store_sql.h
 *	  The statements on external effects, in idem_consumer.effects and,
 *	  where keys are routed, idem_consumer.routed_effects, which
 *	  effects_store_sql.c defines and runs for effects_store.c, effects.c
 *	  and effects_api.c.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects_store_sql.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_EFFECTS_STORE_SQL_H
#define IDEM_EFFECTS_STORE_SQL_H

#include "postgres.h"

typedef enum EffectStmt
{
	EF_INSERT_LEASED,
	EF_ENQUEUE,
	EF_READ,
	EF_LOCK,
	EF_LOCK_DUE,
	EF_LEASE,
	EF_COMPLETE,
	EF_WAIT,
	EF_DEAD,
	EF_HEARTBEAT,
	EF_PARK,
	EF_REARM,
	EF_POLICY,
	EF_SET_POLICY,
	EF_PURGE,
	EF_LOCK_DUE_ONE,			/* routed only: one due effect, if not held */
	EF_NUM_STMTS
} EffectStmt;

/* The statements on routed effects of every route. */
typedef enum RoutedEffectsStmt
{
	RE_DUE,
	RE_LATEST,
	RE_PURGE,
	RE_PURGE_ENTRIES,
	RE_NUM_STMTS
} RoutedEffectsStmt;

extern Oid	effects_table_oid(void);
extern int	effects_execute(EffectStmt stmt, Datum *values, const char *nulls,
							long tcount);
extern void effects_execute_routed(EffectStmt stmt, Oid route_type,
								   Datum *values, const char *nulls);
extern void effects_execute_every_route(RoutedEffectsStmt stmt, Datum *values,
										const char *nulls);

#endif							/* IDEM_EFFECTS_STORE_SQL_H */
