/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  idem_metrics(): the counters in the Prometheus text exposition format,
 *	  version 0.0.4, one sample per consumer in each family.
 *
 * Histogram buckets are the half-decade boundaries of the log-scale
 * histograms of histogram.c, so each cumulative bucket count is exact.
 * The gauges of stored keys and pending dead letters are read from the
 * tables at each scrape.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"

#include "idem_consumer.h"

/* histogram boundaries exported, in units of 1/24 decade of microseconds */
#define LATENCY_FIRST_BOUNDARY	24	/* 10 us */
#define LATENCY_LAST_BOUNDARY	216 /* 1000 s */
#define LAG_FIRST_BOUNDARY		72	/* 1 ms */
#define LAG_LAST_BOUNDARY		288 /* 10^6 s, 11.6 days */
#define BOUNDARY_STEP			12	/* half a decade */

PG_FUNCTION_INFO_V1(idem_metrics);

/*
 * Appends a label value escaped as the exposition format requires.
 */
static void
append_label_value(StringInfo buf, const char *value)
{
	for (const char *p = value; *p; p++)
	{
		switch (*p)
		{
			case '\\':
				appendStringInfoString(buf, "\\\\");
				break;
			case '"':
				appendStringInfoString(buf, "\\\"");
				break;
			case '\n':
				appendStringInfoString(buf, "\\n");
				break;
			default:
				appendStringInfoChar(buf, *p);
				break;
		}
	}
}

/*
 * Appends "name{consumer="..."" without the closing brace, so that the
 * caller can add more labels.
 */
static void
append_series_start(StringInfo buf, const char *name, const char *consumer)
{
	appendStringInfo(buf, "%s{consumer=\"", name);
	append_label_value(buf, consumer);
	appendStringInfoChar(buf, '"');
}

/*
 * Appends the HELP and TYPE lines of a family.
 */
static void
append_family(StringInfo buf, const char *name, const char *type, const char *help)
{
	appendStringInfo(buf, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/*
 * Appends one counter family.
 */
static void
append_counter(StringInfo buf, List *snapshot, const char *name, const char *help,
			   size_t offset)
{
	ListCell   *lc;

	append_family(buf, name, "counter", help);
	foreach(lc, snapshot)
	{
		ConsumerStatsCopy *copy = lfirst(lc);
		int64		value = *(int64 *) ((char *) &copy->counters + offset);

		append_series_start(buf, name, copy->consumer);
		appendStringInfo(buf, "} " INT64_FORMAT "\n", value);
	}
}

/*
 * Appends one histogram family, from durations in microseconds.
 */
static void
append_histogram(StringInfo buf, List *snapshot, const char *name, const char *help,
				 size_t offset, int first_boundary, int last_boundary)
{
	ListCell   *lc;

	append_family(buf, name, "histogram", help);
	foreach(lc, snapshot)
	{
		ConsumerStatsCopy *copy = lfirst(lc);
		IdemHistogram *hist = (IdemHistogram *) ((char *) &copy->counters + offset);
		char		bucket_name[NAMEDATALEN];

		snprintf(bucket_name, sizeof(bucket_name), "%s_bucket", name);
		for (int b = first_boundary; b <= last_boundary; b += BOUNDARY_STEP)
		{
			double		le_seconds = pow(10.0, (double) b / HIST_BUCKETS_PER_DECADE - 6.0);

			append_series_start(buf, bucket_name, copy->consumer);
			appendStringInfo(buf, ",le=\"%.6g\"} " UINT64_FORMAT "\n",
							 le_seconds, histogram_count_below(hist, b));
		}
		append_series_start(buf, bucket_name, copy->consumer);
		appendStringInfo(buf, ",le=\"+Inf\"} " UINT64_FORMAT "\n", hist->total);

		snprintf(bucket_name, sizeof(bucket_name), "%s_sum", name);
		append_series_start(buf, bucket_name, copy->consumer);
		appendStringInfo(buf, "} %.9g\n", hist->sum_us / 1e6);

		snprintf(bucket_name, sizeof(bucket_name), "%s_count", name);
		append_series_start(buf, bucket_name, copy->consumer);
		appendStringInfo(buf, "} " UINT64_FORMAT "\n", hist->total);
	}
}

/*
 * Appends the counter families of external effects, one per EffectEvent.
 */
static void
append_effect_counters(StringInfo buf, List *snapshot)
{
	static const struct
	{
		const char *name;
		const char *help;
	}			families[EFFECT_NUM_EVENTS] = {
		[EFFECT_EXECUTED] = {"idem_effect_executed_total",
		"Leases handed out to call the provider (begin returned execute, or a claim)."},
		[EFFECT_REPLAYED] = {"idem_effect_replayed_total",
		"Begins of completed effects, answered with the stored result."},
		[EFFECT_BUSY] = {"idem_effect_busy_total",
		"Begins refused because another worker held a live lease."},
		[EFFECT_FENCED_OFF] = {"idem_effect_fenced_off_total",
		"Completions and failures refused because their fence was no longer current."},
		[EFFECT_REQUEST_MISMATCH] = {"idem_effect_request_mismatch_total",
		"Calls that reused an effect key with a different request."},
		[EFFECT_UNKNOWN_OUTCOME] = {"idem_effect_unknown_outcome_total",
		"Leases that expired in flight, leaving the provider's outcome unknown."},
		[EFFECT_DEAD] = {"idem_effect_dead_total",
		"Effects moved to the dead-letter queue."},
	};

	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		append_counter(buf, snapshot, families[e].name, families[e].help,
					   offsetof(ConsumerCounters, effects) + e * sizeof(int64));
}

/*
 * Appends the depth of each consumer's dead-letter queue and the age of its
 * oldest pending entry, read from the tables (the counters only know what
 * was enqueued, not what is still waiting).  Needs an SPI connection.
 */
static void
append_dead_letter_gauges(StringInfo buf)
{
	StringInfoData ages;

	keystore_execute(KS_DL_PENDING_SUMMARY, NULL, NULL, 0);

	initStringInfo(&ages);
	append_family(buf, "idem_dlq_pending", "gauge",
				  "Dead letters waiting for a replay or a discard, per consumer.");
	append_family(&ages, "idem_dlq_oldest_pending_age_seconds", "gauge",
				  "Time since the first failure of the oldest pending dead letter.");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *consumer = SPI_getvalue(row, desc, 1);
		bool		isnull;
		Datum		age;

		append_series_start(buf, "idem_dlq_pending", consumer);
		appendStringInfo(buf, "} %s\n", SPI_getvalue(row, desc, 2));

		age = SPI_getbinval(row, desc, 3, &isnull);
		if (isnull)
			continue;			/* nothing pending: no age */
		append_series_start(&ages, "idem_dlq_oldest_pending_age_seconds", consumer);
		appendStringInfo(&ages, "} %.3f\n", DatumGetFloat8(age));
	}
	appendBinaryStringInfo(buf, ages.data, ages.len);
}

/*
 * idem_metrics(): every family as one text, ready for a scraper.
 */
Datum
idem_metrics(PG_FUNCTION_ARGS)
{
	List	   *snapshot = stats_snapshot();
	StringInfoData buf;
	ListCell   *lc;
	List	   *keys_stored;

	initStringInfo(&buf);

	append_counter(&buf, snapshot, "idem_applied_total",
				   "Messages whose business SQL ran and committed.",
				   offsetof(ConsumerCounters, applied));
	append_counter(&buf, snapshot, "idem_duplicate_detected_total",
				   "Redelivered messages skipped, in committed transactions.",
				   offsetof(ConsumerCounters, duplicates));
	append_counter(&buf, snapshot, "idem_failed_total",
				   "Calls that raised or whose transaction rolled back.",
				   offsetof(ConsumerCounters, failed));
	append_counter(&buf, snapshot, "idem_dlq_enqueue_total",
				   "Messages moved to the dead-letter queue, in committed transactions.",
				   offsetof(ConsumerCounters, dead_lettered));
	append_counter(&buf, snapshot, "idem_key_reuse_total",
				   "Deliveries whose key was recorded for another message (IK001).",
				   offsetof(ConsumerCounters, key_reuse));

	append_effect_counters(&buf, snapshot);

	append_histogram(&buf, snapshot, "idem_processing_latency_seconds",
					 "Time spent in idem_apply for applied messages.",
					 offsetof(ConsumerCounters, latency),
					 LATENCY_FIRST_BOUNDARY, LATENCY_LAST_BOUNDARY);

	append_family(&buf, "idem_consumer_lag_seconds", "gauge",
				  "Commit time minus event_time of the last applied message that had one.");
	foreach(lc, snapshot)
	{
		ConsumerStatsCopy *copy = lfirst(lc);

		if (!copy->counters.has_lag)
			continue;
		append_series_start(&buf, "idem_consumer_lag_seconds", copy->consumer);
		appendStringInfo(&buf, "} %.6f\n", copy->counters.lag_last_us / 1e6);
	}

	append_histogram(&buf, snapshot, "idem_consumer_lag_observed_seconds",
					 "Commit time minus event_time of applied messages that had one.",
					 offsetof(ConsumerCounters, lag),
					 LAG_FIRST_BOUNDARY, LAG_LAST_BOUNDARY);

	SPI_connect();
	keys_stored = keystore_keys_stored();
	append_family(&buf, "idem_keys_stored", "gauge",
				  "Processed keys currently stored, per consumer.");
	foreach(lc, keys_stored)
	{
		KeysStored *ks = lfirst(lc);

		append_series_start(&buf, "idem_keys_stored", ks->consumer);
		appendStringInfo(&buf, "} " INT64_FORMAT "\n", ks->keys);
	}
	append_dead_letter_gauges(&buf);
	SPI_finish();

	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}
