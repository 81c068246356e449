/*-------------------------------------------------------------------------
 *
 * keystore_sql.h
 *	  The statements of the key store on the tables of each generation,
 *	  and the functions of keystore_sql.c that run them as the owner of
 *	  the storage.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore_sql.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYSTORE_SQL_H
#define KEYSTORE_SQL_H

#include "utils/snapshot.h"

#include "storage.h"

/*
 * The statements of the key store, on keys, collisions and the purge; see
 * keystore_stmt_defs for their text and parameters.
 */
typedef enum KeystoreStmt
{
	KS_INSERT_KEY_FP,
	KS_PROBE_KEY_FP,
	KS_INSERT_COLLISION_FP,
	KS_DELETE_COLLISION_FP,
	KS_INSERT_KEY,
	KS_PROBE_KEY,
	KS_CLAIM_OCCUPANT,
	KS_INSERT_COLLISION,
	KS_KEY_WRITES,
	KS_DELETE_KEY,
	KS_DELETE_COLLISION,
	KS_FIND_COLLISION,
	KS_ENTRY_STATUS,
	KS_DELETE_RESOLVED_ENTRY,
	KS_LATEST_COLLISIONS,
	KS_LATEST_KEYS,
	KS_PURGEABLE_COLLISIONS,
	KS_PURGEABLE_KEYS,
	KS_REMOVE_COLLISIONS,
	KS_REMOVE_KEYS,
	KS_COLLIDING_HASHES,
	KS_INSERT_BATCH,
	KS_UNRESOLVED_BATCH,
	KS_DEAD_LETTER_IDS_PAST_ROWS,
	KS_PENDING_IN_GENERATION,
	KS_EXPIRE_RESOLVED_IN_GENERATION,
	KS_TRUNCATE_GENERATION,
	KS_CARRY_KEYS,
	KS_CARRY_COLLISIONS,
	KS_NUM_STMTS
} KeystoreStmt;

extern int	keystore_execute(KeystoreStmt stmt, Datum *values, const char *nulls,
							 long tcount);
extern int	keystore_execute_in(KeyGenSlot slot, KeystoreStmt stmt, Datum *values,
								const char *nulls, long tcount);
extern int	keystore_execute_snapshot(KeyGenSlot slot, KeystoreStmt stmt,
									  Datum *values, Snapshot snapshot,
									  long tcount);

#endif							/* KEYSTORE_SQL_H */
