/*-------------------------------------------------------------------------
 *
 * keyhash.c
 *	  The 64-bit hash of an idempotency key: SipHash-2-4 of the consumer's
 *	  id and the key under a secret seed of the database.
 *
 * Keys come from producers, and so from every team that shares the
 * database: a hash that anyone can compute (an unseeded one, or a
 * non-cryptographic one with a seed, whose seed can be recovered or whose
 * collisions do not depend on it) lets a tenant choose a key whose hash
 * equals that of another team's key, and so meddle with the other team's
 * place in the key store.  SipHash (Aumasson and Bernstein, 2012) is a
 * pseudorandom function keyed by 128 bits: without the seed, which never
 * leaves the server, its values cannot be predicted and colliding keys
 * cannot be found, other than by chance, at about n^2 / 2^65 pairs among n
 * keys.  SipHash-2-4 (2 compression rounds per 8-byte word, 4 rounds of
 * finalization) is the variant its authors recommend.
 *
 * The input is the consumer's id as 4 bytes, little-endian whatever the
 * host, followed by the key's bytes.  The id's fixed width makes the
 * encoding unambiguous without a separator (SipHash itself tells inputs
 * of different lengths apart: its last word carries the length), and the
 * value of a key does not depend on the machine that computes it (a
 * logical replica or a restore on another architecture finds the same
 * hashes under the same seed, read with idem_hash_seed_from_bytes()).
 *
 * This file only computes; the seed is made and kept by the key store.
 * Its test vectors are test/keyhash/; with IDEM_KEYHASH_STANDALONE it
 * compiles without the server's headers (keyhash.h).
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keyhash.c
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYHASH_STANDALONE
#include "postgres.h"
#endif

#include "keyhash.h"

#define SIP_ROTL(x, b) (uint64) (((x) << (b)) | ((x) >> (64 - (b))))

/* SipHash's state while its input is fed in pieces. */
typedef struct SipState
{
	uint64		v0;
	uint64		v1;
	uint64		v2;
	uint64		v3;
	uint64		tail;			/* bytes of an unfinished word, LSB first */
	int			ntail;			/* how many */
	size_t		len;			/* bytes fed so far */
} SipState;

/* Reads 8 bytes as a little-endian integer, at any alignment. */
static inline uint64
load_le64(const unsigned char *p)
{
	return (uint64) p[0] |
		((uint64) p[1] << 8) |
		((uint64) p[2] << 16) |
		((uint64) p[3] << 24) |
		((uint64) p[4] << 32) |
		((uint64) p[5] << 40) |
		((uint64) p[6] << 48) |
		((uint64) p[7] << 56);
}

static inline void
sip_round(SipState *s)
{
	s->v0 += s->v1;
	s->v1 = SIP_ROTL(s->v1, 13);
	s->v1 ^= s->v0;
	s->v0 = SIP_ROTL(s->v0, 32);
	s->v2 += s->v3;
	s->v3 = SIP_ROTL(s->v3, 16);
	s->v3 ^= s->v2;
	s->v0 += s->v3;
	s->v3 = SIP_ROTL(s->v3, 21);
	s->v3 ^= s->v0;
	s->v2 += s->v1;
	s->v1 = SIP_ROTL(s->v1, 17);
	s->v1 ^= s->v2;
	s->v2 = SIP_ROTL(s->v2, 32);
}

/* Absorbs one 8-byte word with the 2 compression rounds. */
static inline void
sip_compress(SipState *s, uint64 m)
{
	s->v3 ^= m;
	sip_round(s);
	sip_round(s);
	s->v0 ^= m;
}

static inline void
sip_init(SipState *s, const IdemHashSeed *seed)
{
	/* "somepseudorandomlygeneratedbytes", the paper's initial constants */
	s->v0 = seed->k0 ^ UINT64CONST(0x736f6d6570736575);
	s->v1 = seed->k1 ^ UINT64CONST(0x646f72616e646f6d);
	s->v2 = seed->k0 ^ UINT64CONST(0x6c7967656e657261);
	s->v3 = seed->k1 ^ UINT64CONST(0x7465646279746573);
	s->tail = 0;
	s->ntail = 0;
	s->len = 0;
}

static inline void
sip_update(SipState *s, const unsigned char *p, size_t n)
{
	s->len += n;
	if (s->ntail > 0)
	{
		while (s->ntail < 8 && n > 0)
		{
			s->tail |= (uint64) *p++ << (8 * s->ntail++);
			n--;
		}
		if (s->ntail < 8)
			return;
		sip_compress(s, s->tail);
		s->tail = 0;
		s->ntail = 0;
	}
	for (; n >= 8; p += 8, n -= 8)
		sip_compress(s, load_le64(p));
	while (n > 0)
	{
		s->tail |= (uint64) *p++ << (8 * s->ntail++);
		n--;
	}
}

/*
 * Absorbs the last word, which carries the input's length modulo 256 in
 * its top byte, and runs the 4 finalization rounds.
 */
static inline uint64
sip_final(SipState *s)
{
	sip_compress(s, s->tail | ((uint64) (s->len & 0xff) << 56));
	s->v2 ^= 0xff;
	sip_round(s);
	sip_round(s);
	sip_round(s);
	sip_round(s);
	return s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
}

/*
 * Makes a seed of IDEM_HASH_SEED_BYTES bytes (from pg_strong_random, say,
 * or as stored), so that stored bytes give the same seed on any host.
 */
void
idem_hash_seed_from_bytes(IdemHashSeed *seed, const unsigned char *bytes)
{
	seed->k0 = load_le64(bytes);
	seed->k1 = load_le64(bytes + 8);
}

/* SipHash-2-4 of len bytes, with 64 bits of output. */
void
idem_siphash24(const IdemHashSeed *seed, const void *data, size_t len,
			   uint64 *out)
{
	SipState	s;

	sip_init(&s, seed);
	sip_update(&s, (const unsigned char *) data, len);
	*out = sip_final(&s);
}

/*
 * The hash of a consumer's key: SipHash-2-4 of the id's 4 little-endian
 * bytes followed by the keylen (>= 0) bytes of the key, a text's
 * VARDATA_ANY and VARSIZE_ANY_EXHDR, say.
 */
uint64
idem_key_hash64(const IdemHashSeed *seed, int32 consumer_id,
				const char *key, int keylen)
{
	SipState	s;
	unsigned int id = (unsigned int) consumer_id;
	unsigned char prefix[4];

	prefix[0] = (unsigned char) id;
	prefix[1] = (unsigned char) (id >> 8);
	prefix[2] = (unsigned char) (id >> 16);
	prefix[3] = (unsigned char) (id >> 24);

	sip_init(&s, seed);
	sip_update(&s, prefix, sizeof(prefix));
	sip_update(&s, (const unsigned char *) key, (size_t) keylen);
	return sip_final(&s);
}
