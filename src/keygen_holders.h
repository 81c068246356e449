/*-------------------------------------------------------------------------
 *
 * keygen_holders.h
 *	  Who holds a switch of generations back (keygen_holders.c), for
 *	  keygen.c.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_holders.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef KEYGEN_HOLDERS_H
#define KEYGEN_HOLDERS_H

#include "storage.h"

extern void keygen_switch_held_back(KeyGenSlot sealing, bool quiet);

#endif							/* KEYGEN_HOLDERS_H */
