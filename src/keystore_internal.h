/*-------------------------------------------------------------------------
 *
 * keystore_internal.h
 *	  Declarations shared by the files of the key store only: where the
 *	  storage is (storage.c), its fixed statements (keystore_sql.c) and the
 *	  fast path on the key index (keystore_fastpath.c), which keystore.c
 *	  puts together.  Nothing above the key store includes this file.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore_internal.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYSTORE_INTERNAL_H
#define KEYSTORE_INTERNAL_H

#include "idem_consumer.h"

#include "access/genam.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "nodes/execnodes.h"
#include "utils/rel.h"
#include "utils/snapshot.h"

#include "storage.h"
#include "keystore_fastpath.h"
#include "keygen_state.h"
#include "keygen_gate.h"

/*
 * keystore_sql.c: the statements of the key store, on keys, collisions
 * and the purge; see keystore_stmt_defs for their text and parameters.
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

/* keystore.c */
extern int32 keystore_processed_at_now(void);


/* keygen.c */
extern bool keygen_generation_empty(const KeyGeneration *gen);
extern void keygen_note_recording(int32 consumer_id, int32 processed_at);

/* keystore.c, for keygen_retire.c */
extern bool keystore_carry_key(KeyGenSlot slot, int32 consumer_id, int32 processed_at,
							   text *key, const int32 *fingerprint);

/* keystore.c, for keystore_batch.c: probing and recording one key */
extern bool recorded_before(const KeyGenState *st, int32 consumer_id, text *key,
							RecordedKey *recorded, bool for_recording,
							GateWait *wait);
extern bool record_current_sql(KeyGenSlot slot, int64 hash, int32 consumer_id,
							   int32 processed_at, text *key, const int32 *fingerprint,
							   RecordedKey *recorded, GateWait *wait);
extern bool fastpath_record(KeyFastPath *fp, const KeyGenState *st,
							KeyGenSlot slot, int64 hash, int32 consumer_id,
							int32 processed_at, text *key, const int32 *fingerprint,
							RecordedKey *recorded, bool *insert_first, KeyProbe probe,
							GateWait *wait);

/* keygen_holders.c */
extern void keygen_switch_held_back(KeyGenSlot sealing, bool quiet);

/* keygen_filter.c */
extern bool keygen_filter_may_hold(KeyGenSlot slot, int32 nchunks,
								   uint64 hash);
extern bool keygen_filter_all_may_hold(const KeyGenState *st, uint64 hash);

#endif							/* KEYSTORE_INTERNAL_H */
