/*-------------------------------------------------------------------------
 *
 * keyhash_test.c
 *	  Known answers for src/keyhash.c, printed as TAP lines with the
 *	  "# pass N" and "# fail N" summary that test/run-tests counts.
 *
 * The expected values were not computed by keyhash.c: the 15-byte
 * message is the worked example of the SipHash paper's Appendix A, and
 * the 64 values of the reference implementation's table (key 00 01 .. 0f,
 * messages 00 01 .. of length 0 to 63) were computed by two other
 * implementations, OpenSSL 3.0's SIPHASH MAC (size 8) and Rust's
 * core::hash::SipHasher, which agree on all of them.  The known answer of
 * idem_key_hash64() and that of a 1000-byte message (bytes 00 01 .. ff
 * 00 01 .., whose length is not its length modulo 256) were computed the
 * same way, the first on the bytes 07 00 00 00 "order-paid:42".
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  test/keyhash/keyhash_test.c
 *
 *-------------------------------------------------------------------------
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "keyhash.h"

/*
 * SipHash-2-4 with the key 00 01 .. 0f of the first n bytes of
 * 00 01 02 .., n = 0 .. 63, as the reference implementation's vector
 * table has them (there as the output's 8 little-endian bytes).
 */
static const uint64 reference_vectors[64] = {
	UINT64_C(0x726fdb47dd0e0e31), UINT64_C(0x74f839c593dc67fd),
	UINT64_C(0x0d6c8009d9a94f5a), UINT64_C(0x85676696d7fb7e2d),
	UINT64_C(0xcf2794e0277187b7), UINT64_C(0x18765564cd99a68d),
	UINT64_C(0xcbc9466e58fee3ce), UINT64_C(0xab0200f58b01d137),
	UINT64_C(0x93f5f5799a932462), UINT64_C(0x9e0082df0ba9e4b0),
	UINT64_C(0x7a5dbbc594ddb9f3), UINT64_C(0xf4b32f46226bada7),
	UINT64_C(0x751e8fbc860ee5fb), UINT64_C(0x14ea5627c0843d90),
	UINT64_C(0xf723ca908e7af2ee), UINT64_C(0xa129ca6149be45e5),
	UINT64_C(0x3f2acc7f57c29bdb), UINT64_C(0x699ae9f52cbe4794),
	UINT64_C(0x4bc1b3f0968dd39c), UINT64_C(0xbb6dc91da77961bd),
	UINT64_C(0xbed65cf21aa2ee98), UINT64_C(0xd0f2cbb02e3b67c7),
	UINT64_C(0x93536795e3a33e88), UINT64_C(0xa80c038ccd5ccec8),
	UINT64_C(0xb8ad50c6f649af94), UINT64_C(0xbce192de8a85b8ea),
	UINT64_C(0x17d835b85bbb15f3), UINT64_C(0x2f2e6163076bcfad),
	UINT64_C(0xde4daaaca71dc9a5), UINT64_C(0xa6a2506687956571),
	UINT64_C(0xad87a3535c49ef28), UINT64_C(0x32d892fad841c342),
	UINT64_C(0x7127512f72f27cce), UINT64_C(0xa7f32346f95978e3),
	UINT64_C(0x12e0b01abb051238), UINT64_C(0x15e034d40fa197ae),
	UINT64_C(0x314dffbe0815a3b4), UINT64_C(0x027990f029623981),
	UINT64_C(0xcadcd4e59ef40c4d), UINT64_C(0x9abfd8766a33735c),
	UINT64_C(0x0e3ea96b5304a7d0), UINT64_C(0xad0c42d6fc585992),
	UINT64_C(0x187306c89bc215a9), UINT64_C(0xd4a60abcf3792b95),
	UINT64_C(0xf935451de4f21df2), UINT64_C(0xa9538f0419755787),
	UINT64_C(0xdb9acddff56ca510), UINT64_C(0xd06c98cd5c0975eb),
	UINT64_C(0xe612a3cb9ecba951), UINT64_C(0xc766e62cfcadaf96),
	UINT64_C(0xee64435a9752fe72), UINT64_C(0xa192d576b245165a),
	UINT64_C(0x0a8787bf8ecb74b2), UINT64_C(0x81b3e73d20b49b6f),
	UINT64_C(0x7fa8220ba3b2ecea), UINT64_C(0x245731c13ca42499),
	UINT64_C(0xb78dbfaf3a8d83bd), UINT64_C(0xea1ad565322a1a0b),
	UINT64_C(0x60e61c23a3795013), UINT64_C(0x6606d7e446282b93),
	UINT64_C(0x6ca4ecb15c5f91e1), UINT64_C(0x9f626da15c9625f3),
	UINT64_C(0xe51b38608ef25f57), UINT64_C(0x958a324ceb064572),
};

static int	ntests = 0;
static int	nfailed = 0;

static void
report(bool ok, const char *what)
{
	ntests++;
	if (!ok)
		nfailed++;
	printf("%sok %d - %s\n", ok ? "" : "not ", ntests, what);
}

/* Reports the comparison of a hash with the value it must have. */
static void
expect_hash(uint64 got, uint64 want, const char *what)
{
	report(got == want, what);
	if (got != want)
		printf("#   got 0x%016" PRIx64 ", want 0x%016" PRIx64 "\n",
			   (uint64_t) got, (uint64_t) want);
}

static void
seed_00_to_0f(IdemHashSeed *seed)
{
	unsigned char bytes[IDEM_HASH_SEED_BYTES];

	for (int i = 0; i < IDEM_HASH_SEED_BYTES; i++)
		bytes[i] = (unsigned char) i;
	idem_hash_seed_from_bytes(seed, bytes);
}

/* idem_key_hash64() against idem_siphash24() of the documented encoding */
static bool
matches_encoding(const IdemHashSeed *seed, int32 consumer_id,
				 const char *key, int keylen)
{
	unsigned char buf[4 + 64];
	unsigned int id = (unsigned int) consumer_id;
	uint64		want;

	buf[0] = (unsigned char) id;
	buf[1] = (unsigned char) (id >> 8);
	buf[2] = (unsigned char) (id >> 16);
	buf[3] = (unsigned char) (id >> 24);
	memcpy(buf + 4, key, keylen);
	idem_siphash24(seed, buf, 4 + (size_t) keylen, &want);
	return idem_key_hash64(seed, consumer_id, key, keylen) == want;
}

int
main(void)
{
	IdemHashSeed seed;
	unsigned char msg[64];
	uint64		h;

	for (int i = 0; i < 64; i++)
		msg[i] = (unsigned char) i;
	seed_00_to_0f(&seed);

	printf("1..15\n");

	report(seed.k0 == UINT64_C(0x0706050403020100) &&
		   seed.k1 == UINT64_C(0x0f0e0d0c0b0a0908),
		   "a seed's bytes are read as two little-endian halves");

	idem_siphash24(&seed, msg, 15, &h);
	expect_hash(h, UINT64_C(0xa129ca6149be45e5),
				"SipHash paper, Appendix A: 15 bytes 00 .. 0e");

	/* the table by 8 lengths at a time: every length of the last word */
	for (int first = 0; first < 64; first += 8)
	{
		int			bad = -1;
		char		what[80];

		for (int n = first; n < first + 8; n++)
		{
			idem_siphash24(&seed, msg, (size_t) n, &h);
			if (h != reference_vectors[n] && bad < 0)
				bad = n;
		}
		snprintf(what, sizeof(what),
				 "reference vectors, messages of %d to %d bytes",
				 first, first + 7);
		report(bad < 0, what);
		if (bad >= 0)
		{
			idem_siphash24(&seed, msg, (size_t) bad, &h);
			printf("#   length %d: got 0x%016" PRIx64
				   ", want 0x%016" PRIx64 "\n",
				   bad, (uint64_t) h, (uint64_t) reference_vectors[bad]);
		}
	}

	/* the length byte of the last word is the length modulo 256 */
	{
		unsigned char long_msg[1000];

		for (int i = 0; i < 1000; i++)
			long_msg[i] = (unsigned char) i;
		idem_siphash24(&seed, long_msg, sizeof(long_msg), &h);
		expect_hash(h, UINT64_C(0xdb9b3ed69e31c9a6),
					"a message of 1000 bytes");
	}

	/*
	 * The consumer's id is the first 4 bytes, little-endian: id 0x03020100
	 * with the key 04 .. 0e is the paper's message.
	 */
	expect_hash(idem_key_hash64(&seed, 0x03020100,
								(const char *) msg + 4, 11),
				UINT64_C(0xa129ca6149be45e5),
				"consumer id as 4 little-endian bytes before the key");

	expect_hash(idem_key_hash64(&seed, 7, "order-paid:42", 13),
				UINT64_C(0x9c3714350185af8e),
				"known answer: consumer 7, key order-paid:42");

	/*
	 * The id and the key fed in two pieces must give the hash of the
	 * whole, whatever the key's length and the id's sign.
	 */
	{
		static const int32 ids[] = {0, 1, -1, 7, 0x7fffffff, -0x7fffffff - 1};
		bool		ok = true;

		for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
			for (int n = 0; n <= 60; n++)
				ok = ok && matches_encoding(&seed, ids[i],
											(const char *) msg + 3, n);
		report(ok, "idem_key_hash64() is SipHash-2-4 of id || key, "
			   "keys of 0 to 60 bytes");
	}

	/* the same key of two consumers, and under two seeds, differs */
	{
		IdemHashSeed other = seed;

		other.k1 ^= 1;
		report(idem_key_hash64(&seed, 1, "order-paid:42", 13) !=
			   idem_key_hash64(&seed, 2, "order-paid:42", 13) &&
			   idem_key_hash64(&seed, 1, "order-paid:42", 13) !=
			   idem_key_hash64(&other, 1, "order-paid:42", 13),
			   "another consumer or another seed gives another hash");
	}

	printf("# pass %d\n", ntests - nfailed);
	printf("# fail %d\n", nfailed);
	return nfailed == 0 ? 0 : 1;
}
