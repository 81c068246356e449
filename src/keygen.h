/*-------------------------------------------------------------------------
 *
 * keygen.h
 *	  What keygen.c defines for the key store: the emptiness of a
 *	  generation's tables, and the registration of a consumer in the
 *	  current generation.  What other modules call of it is declared in
 *	  idem_consumer.h.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYGEN_H
#define KEYGEN_H

#include "storage.h"

extern bool keygen_generation_empty(const KeyGeneration *gen);
extern void keygen_note_recording(int32 consumer_id, int32 processed_at);

#endif							/* KEYGEN_H */
