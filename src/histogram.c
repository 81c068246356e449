/*-------------------------------------------------------------------------
 *
 * histogram.c
 *	  Fixed-size log-scale histograms of durations, for latency and lag
 *	  quantiles and the Prometheus histograms.
 *
 * Bucket 0 holds zero; bucket i >= 1 holds values in
 * [10^((i-1)/24), 10^(i/24)) microseconds, up to 10^12 us (11.6 days);
 * the last bucket holds everything larger.  A quantile is reported as the
 * geometric middle of its bucket, so its relative error is at most
 * 10^(1/48) - 1 = 4.9%.  Adding a value costs one log10() and no
 * allocation: the histogram is a plain struct that lives in shared memory.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/histogram.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "idem_consumer.h"

/*
 * Returns the bucket of a duration in microseconds.
 */
static int
histogram_bucket(int64 value_us)
{
	int			bucket;

	if (value_us <= 0)
		return 0;
	bucket = 1 + (int) floor(log10((double) value_us) * HIST_BUCKETS_PER_DECADE);
	return Min(bucket, HIST_NBUCKETS - 1);
}

/*
 * Finds the bucket of n times one duration in microseconds: the math of
 * adding a value, done before taking the lock that histogram_add_sample()
 * needs.
 */
void
histogram_sample(HistogramSample *sample, int64 value_us, int n)
{
	sample->value_us = Max(value_us, 0);
	sample->bucket = histogram_bucket(sample->value_us);
	sample->n = n;
}

/*
 * Adds a sample whose bucket histogram_sample() found.
 */
void
histogram_add_sample(IdemHistogram *hist, const HistogramSample *sample)
{
	hist->counts[sample->bucket] += sample->n;
	hist->total += sample->n;
	hist->sum_us += (double) sample->value_us * sample->n;
	if (sample->value_us > hist->max_us)
		hist->max_us = sample->value_us;
}

/*
 * Adds n times one duration in microseconds.
 */
void
histogram_add_n(IdemHistogram *hist, int64 value_us, int n)
{
	HistogramSample sample;

	histogram_sample(&sample, value_us, n);
	histogram_add_sample(hist, &sample);
}

/*
 * Adds one duration in microseconds.
 */
void
histogram_add(IdemHistogram *hist, int64 value_us)
{
	histogram_add_n(hist, value_us, 1);
}

/*
 * Adds every value of one histogram to another.
 */
void
histogram_merge(IdemHistogram *into, const IdemHistogram *from)
{
	for (int i = 0; i < HIST_NBUCKETS; i++)
		into->counts[i] += from->counts[i];
	into->total += from->total;
	into->sum_us += from->sum_us;
	into->max_us = Max(into->max_us, from->max_us);
}

/*
 * Returns the q-quantile (0 < q <= 1) in microseconds, or -1 if empty.
 */
double
histogram_quantile_us(const IdemHistogram *hist, double q)
{
	uint64		rank;
	uint64		seen = 0;

	if (hist->total == 0)
		return -1;

	rank = (uint64) ceil(q * (double) hist->total);
	rank = Max(rank, 1);
	for (int i = 0; i < HIST_NBUCKETS; i++)
	{
		seen += hist->counts[i];
		if (seen >= rank)
		{
			double		middle;

			if (i == 0)
				return 0;
			if (i == HIST_NBUCKETS - 1)
				return (double) hist->max_us;
			middle = pow(10.0, (i - 0.5) / HIST_BUCKETS_PER_DECADE);
			return Min(middle, (double) hist->max_us);
		}
	}
	return (double) hist->max_us;
}

/*
 * Returns how many values are below 10^(boundary/24) microseconds, where
 * boundary is a bucket boundary: 0 <= boundary < HIST_NBUCKETS - 1.
 */
uint64
histogram_count_below(const IdemHistogram *hist, int boundary)
{
	uint64		count = 0;

	for (int i = 0; i <= boundary; i++)
		count += hist->counts[i];
	return count;
}
