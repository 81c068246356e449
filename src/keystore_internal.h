/*-------------------------------------------------------------------------
 *
 * keystore_internal.h
 *	  Declarations shared by the files of the key store only: the headers
 *	  of where the storage is (storage.h), its fixed statements
 *	  (keystore_sql.h), the fast path on the key index
 *	  (keystore_fastpath.h), the generations as read (keygen_state.h), the
 *	  gate (keygen_gate.h), the switch (keygen.h), the filters
 *	  (keygen_filter.h) and who holds a switch back (keygen_holders.h),
 *	  which keystore.c puts together; and what keystore.c defines for the
 *	  other files of the key store.  Nothing above the key store includes
 *	  this file.
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
#include "keystore_sql.h"
#include "keystore_fastpath.h"
#include "keygen_state.h"
#include "keygen_gate.h"
#include "keygen.h"
#include "keygen_filter.h"
#include "keygen_holders.h"

/* keystore.c */
extern int32 keystore_processed_at_now(void);

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

#endif							/* KEYSTORE_INTERNAL_H */
