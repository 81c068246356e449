/*-------------------------------------------------------------------------
 *
 * keyhash.h
 *	  The 64-bit hash of an idempotency key under a per-database secret
 *	  seed: SipHash-2-4 (keyhash.c).
 *
 * The file also compiles outside the server, for the test vectors and the
 * collision count under test/: with IDEM_KEYHASH_STANDALONE defined, the
 * few PostgreSQL types it uses come from <stdint.h> instead of postgres.h.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keyhash.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYHASH_H
#define IDEM_KEYHASH_H

#ifdef IDEM_KEYHASH_STANDALONE
#include <stddef.h>
#include <stdint.h>
typedef int32_t int32;
typedef uint64_t uint64;
#define UINT64CONST(x) UINT64_C(x)
#endif

/* The length of a seed as bytes (idem_hash_seed_from_bytes). */
#define IDEM_HASH_SEED_BYTES 16

/*
 * SipHash's 128-bit key: k0 is its first 8 bytes read as a little-endian
 * integer, k1 its last 8, so that the key 00 01 .. 0f of the SipHash paper
 * is k0 = 0x0706050403020100, k1 = 0x0f0e0d0c0b0a0908.
 */
typedef struct IdemHashSeed
{
	uint64		k0;
	uint64		k1;
} IdemHashSeed;

extern void idem_hash_seed_from_bytes(IdemHashSeed *seed,
									  const unsigned char *bytes);
extern void idem_siphash24(const IdemHashSeed *seed, const void *data,
						   size_t len, uint64 *out);
extern uint64 idem_key_hash64(const IdemHashSeed *seed, int32 consumer_id,
							  const char *key, int keylen);

#endif							/* IDEM_KEYHASH_H */
