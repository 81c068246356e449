/*-------------------------------------------------------------------------
 *
 * collisions.c
 *	  Counts equal values of the 64-bit key hash (src/keyhash.c) among N
 *	  keys under a random seed, beside the number the birthday bound
 *	  expects, n(n-1)/2 / 2^64, about n^2 / 2^65.
 *
 * The keys are what consumers send, "order-paid:" and an event's id, for
 * four consumers (ids 1 to 4) in turn: consumers 1 and 2 have sequential
 * ids (the same texts for both), consumers 3 and 4 uuid-like ones, 32 hex
 * digits of a bijective mix of a counter.  So every (consumer, key) pair
 * is different and every equal value counted is a collision of the hash.
 *
 * The N values are sorted in place (an in-place MSD radix sort, 8 bits a
 * pass, as no second array of N values need fit in memory) and equal
 * neighbours counted.  When there are any, the keys behind them are found
 * again by hashing every key a second time, and printed.
 *
 * Usage: collisions [N]   (N as 100000000 or 1e8; the default is 1e8)
 * test/bench/collisions compiles and runs it.  COLLISION_BITS=b in the
 * environment keeps only the top b bits of each value (64 by default), to
 * see the count meet the bound where collisions are plenty: 1e6 keys at
 * 32 bits expect 116 pairs; COLLISION_SORT=qsort sorts with the C
 * library's qsort() instead, for comparison.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  test/bench/collisions.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "keyhash.h"

#define NCONSUMERS 4
#define MAX_REPORTED 16

static const char hexdigits[] = "0123456789abcdef";

/* A bijection of 64-bit integers (splitmix64's finalizer). */
static uint64_t
mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

static char *
put_hex(char *p, uint64_t v, int ndigits)
{
	for (int i = ndigits - 1; i >= 0; i--)
		*p++ = hexdigits[(v >> (4 * i)) & 0xf];
	return p;
}

/*
 * Writes the i-th key into buf (at least 64 bytes), returns its length,
 * and sets its consumer's id.
 */
static int
make_key(uint64_t i, char *buf, int32 *consumer_id)
{
	uint64_t	c = i % NCONSUMERS;
	uint64_t	j = i / NCONSUMERS;
	char	   *p = buf;

	memcpy(p, "order-paid:", 11);
	p += 11;
	*consumer_id = (int32) c + 1;
	if (c < 2)
	{
		char		digits[24];
		int			n = 0;

		do
		{
			digits[n++] = (char) ('0' + j % 10);
			j /= 10;
		} while (j > 0);
		while (n > 0)
			*p++ = digits[--n];
	}
	else
	{
		/* 8-4-4-4-12 hex digits; the first 16 alone tell keys apart */
		uint64_t	hi = mix64(j);
		uint64_t	lo = mix64(j ^ UINT64_C(0x9e3779b97f4a7c15));

		p = put_hex(p, hi >> 32, 8);
		*p++ = '-';
		p = put_hex(p, hi >> 16, 4);
		*p++ = '-';
		p = put_hex(p, hi, 4);
		*p++ = '-';
		p = put_hex(p, lo >> 48, 4);
		*p++ = '-';
		p = put_hex(p, lo, 12);
	}
	return (int) (p - buf);
}

static void
insertion_sort(uint64_t *a, size_t n)
{
	for (size_t i = 1; i < n; i++)
	{
		uint64_t	v = a[i];
		size_t		j = i;

		for (; j > 0 && a[j - 1] > v; j--)
			a[j] = a[j - 1];
		a[j] = v;
	}
}

/*
 * Sorts a[0..n) in place by the bits at shift and below, a byte at a time
 * from the top (American flag sort).
 */
static void
radix_sort(uint64_t *a, size_t n, int shift)
{
	size_t		count[256] = {0};
	size_t		next[256];
	size_t		end[256];
	size_t		pos = 0;

	if (n <= 32)
	{
		insertion_sort(a, n);
		return;
	}
	for (size_t i = 0; i < n; i++)
		count[(a[i] >> shift) & 0xff]++;
	for (int b = 0; b < 256; b++)
	{
		next[b] = pos;
		pos += count[b];
		end[b] = pos;
	}
	for (int b = 0; b < 256; b++)
	{
		while (next[b] < end[b])
		{
			uint64_t	v = a[next[b]];
			int			d = (int) ((v >> shift) & 0xff);

			/* carry v to its bucket, taking the value that was there */
			while (d != b)
			{
				uint64_t	t = a[next[d]];

				a[next[d]++] = v;
				v = t;
				d = (int) ((v >> shift) & 0xff);
			}
			a[next[b]++] = v;
		}
	}
	if (shift == 0)
		return;
	pos = 0;
	for (int b = 0; b < 256; b++)
	{
		if (count[b] > 1)
			radix_sort(a + pos, count[b], shift - 8);
		pos += count[b];
	}
}

static int
cmp_uint64(const void *a, const void *b)
{
	uint64_t	x = *(const uint64_t *) a;
	uint64_t	y = *(const uint64_t *) b;

	return (x > y) - (x < y);
}

static double
wall_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double
cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* MemAvailable of /proc/meminfo in bytes, 0 if unknown. */
static uint64_t
mem_available(void)
{
	FILE	   *f = fopen("/proc/meminfo", "r");
	char		line[256];
	unsigned long long kb = 0;

	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t) kb * 1024;
}

int
main(int argc, char **argv)
{
	double		nd = argc > 1 ? strtod(argv[1], NULL) : 1e8;
	size_t		n;
	unsigned char seed_bytes[IDEM_HASH_SEED_BYTES];
	IdemHashSeed seed;
	uint64_t   *values;
	uint64_t	avail;
	uint64_t	distinct = 0,
				pairs = 0,
				multi = 0;
	uint64_t	reported[MAX_REPORTED];
	int			nreported = 0;
	char		key[64];
	int32		consumer_id;
	double		w0,
				c0,
				w_hash,
				c_hash,
				w_sort,
				c_sort,
				w_count;
	double		expected;
	const char *bits_env = getenv("COLLISION_BITS");
	int			bits = bits_env != NULL ? atoi(bits_env) : 64;
	const char *sort_env = getenv("COLLISION_SORT");

	if (argc > 2 || !(nd >= 2 && nd <= 1e12) || nd != (double) (size_t) nd)
	{
		fprintf(stderr, "usage: %s [N]   (a whole number of keys, 2 or more, "
				"as 1e8 or 100000000)\n", argv[0]);
		return 2;
	}
	n = (size_t) nd;
	if (bits < 1 || bits > 64)
	{
		fprintf(stderr, "COLLISION_BITS must be 1 to 64\n");
		return 2;
	}
	avail = mem_available();
	if (avail != 0 && (uint64_t) n * 8 + (UINT64_C(1) << 30) > avail)
	{
		fprintf(stderr, "%zu values need %.1f GB; "
				"%.1f GB of memory are available\n",
				n, n * 8 / 1e9, avail / 1e9);
		return 1;
	}
	values = malloc(n * sizeof(uint64_t));
	if (values == NULL)
	{
		fprintf(stderr, "cannot allocate %zu bytes\n", n * sizeof(uint64_t));
		return 1;
	}
	if (getrandom(seed_bytes, sizeof(seed_bytes), 0) != sizeof(seed_bytes))
	{
		perror("getrandom");
		return 1;
	}
	idem_hash_seed_from_bytes(&seed, seed_bytes);

	printf("seed            %016" PRIx64 "%016" PRIx64 "\n",
		   (uint64_t) seed.k0, (uint64_t) seed.k1);
	for (uint64_t i = 0; i < 5; i++)
	{
		int			len = make_key(i + 4 * 123456, key, &consumer_id);

		printf("example key     consumer %d, %.*s\n", (int) consumer_id,
			   len, key);
	}
	fflush(stdout);

	w0 = wall_now();
	c0 = cpu_now();
	for (size_t i = 0; i < n; i++)
	{
		int			len = make_key(i, key, &consumer_id);

		values[i] = idem_key_hash64(&seed, consumer_id, key, len);
		if (bits < 64)
			values[i] >>= 64 - bits;
	}
	w_hash = wall_now() - w0;
	c_hash = cpu_now() - c0;

	w0 = wall_now();
	c0 = cpu_now();
	if (sort_env != NULL && strcmp(sort_env, "qsort") == 0)
		qsort(values, n, sizeof(uint64_t), cmp_uint64);
	else
		radix_sort(values, n, 56);
	w_sort = wall_now() - w0;
	c_sort = cpu_now() - c0;

	w0 = wall_now();
	for (size_t i = 0; i < n;)
	{
		size_t		k = 1;

		while (i + k < n && values[i + k] == values[i])
			k++;
		if (i + k < n && values[i + k] < values[i])
		{
			fprintf(stderr, "values not sorted at %zu\n", i + k);
			return 1;
		}
		distinct++;
		if (k > 1)
		{
			multi++;
			pairs += (uint64_t) k * (k - 1) / 2;
			if (nreported < MAX_REPORTED)
				reported[nreported++] = values[i];
		}
		i += k;
	}
	w_count = wall_now() - w0;

	expected = (double) n * (double) (n - 1) / 2 / ldexp(1.0, bits);
	printf("keys            %zu\n", n);
	printf("bits            %d\n", bits);
	printf("distinct        %" PRIu64 "\n", distinct);
	printf("collisions      %" PRIu64 " (pairs of keys with equal values; %"
		   PRIu64 " values shared)\n", pairs, multi);
	printf("expected pairs  %.6g (n(n-1)/2 / 2^%d)\n", expected, bits);
	printf("hash            %.1f s wall, %.1f s cpu, "
		   "%.1f ns a key (key text included)\n",
		   w_hash, c_hash, c_hash * 1e9 / n);
	printf("sort            %.1f s wall, %.1f s cpu (%s)\n", w_sort, c_sort,
		   sort_env != NULL && strcmp(sort_env, "qsort") == 0 ?
		   "qsort" : "radix sort");
	printf("count           %.1f s wall\n", w_count);
	printf("total           %.1f s wall\n", w_hash + w_sort + w_count);
	fflush(stdout);

	/* the keys behind the equal values, found again */
	if (nreported > 0)
	{
		for (size_t i = 0; i < n; i++)
		{
			int			len = make_key(i, key, &consumer_id);
			uint64		h = idem_key_hash64(&seed, consumer_id, key, len);

			if (bits < 64)
				h >>= 64 - bits;

			for (int r = 0; r < nreported; r++)
				if (h == reported[r])
					printf("collision       %016" PRIx64
						   ": consumer %d, %.*s\n",
						   (uint64_t) h, (int) consumer_id, len, key);
		}
	}
	free(values);
	return 0;
}
