/*-------------------------------------------------------------------------
 *
 * keygen_gate.h
 *	  The gate a delivery passes to record a key in a generation, what a
 *	  delivery waits for without it, and the settle of sealed generations
 *	  (keygen_gate.c).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_gate.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYGEN_GATE_H
#define KEYGEN_GATE_H

#include "storage.h"

extern KeyGenSlot keygen_lock_current(void);
extern bool keygen_gate_pass(KeyGenSlot slot);
extern KeyGenSlot keygen_gate_enter(void);
extern void keygen_gate_release(void);

/*
 * What a delivery must wait for, without the gate, before it probes again:
 * a transaction in progress (xid), or, where a generation cannot be probed
 * with a dirty snapshot, every transaction that may still record keys in
 * it (settle, the generation; 0: none).
 */
typedef struct GateWait
{
	TransactionId xid;
	KeyGenSlot	settle;
} GateWait;

#define GATE_WAIT_NEEDED(w) (TransactionIdIsValid((w)->xid) || (w)->settle != 0)
extern void keygen_gate_wait(GateWait *wait);
extern void keygen_mark_recording(KeyGenSlot slot);
extern bool keygen_settled_for_me(KeyGenSlot slot);
extern int	keygen_settle(void);

#endif							/* KEYGEN_GATE_H */
