/*-------------------------------------------------------------------------
 *
 * metrics.c
 *	  idem_metrics(): the counters in the Prometheus text exposition format,
 *	  version 0.0.4, one sample per consumer in each family.
 *
 * Histogram buckets are the half-decade boundaries of the log-scale
 * histograms of histogram.c, so each cumulative bucket count is exact.
 *
 * A scrape is one pass over the counters in shared memory that copies one
 * consumer at a time (stats_foreach_readable), and reads no stored key (the
 * dead-letter gauges read the pending entries only, through their partial
 * index): its time and memory are those of the text it returns, about
 * 4 kB per consumer, whatever the number of keys.
 *
 * A scrape shows the consumers the caller may read, by stats.c's rule:
 * every consumer of every database to pg_read_all_stats (pg_monitor, the
 * usual scraping role), and to any other role with EXECUTE the consumers
 * of its database whose owner's privileges it has; the dead-letter gauges
 * follow the same rule.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/metrics.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_authid.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/memutils.h"
#include "utils/builtins.h"

#include "idem_consumer.h"

/* histogram boundaries exported, in units of 1/24 decade of microseconds */
#define LATENCY_FIRST_BOUNDARY	24	/* 10 us */
#define LATENCY_LAST_BOUNDARY	216 /* 1000 s */
#define LAG_FIRST_BOUNDARY		72	/* 1 ms */
#define LAG_LAST_BOUNDARY		288 /* 10^6 s, 11.6 days */
#define BOUNDARY_STEP			12	/* half a decade */

PG_FUNCTION_INFO_V1(idem_metrics);
PG_FUNCTION_INFO_V1(idem_metrics_1_2);

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
 * Appends "name{database="...",consumer="..."" (without the database
 * label when database is NULL) and no closing brace, so that the caller
 * can add more labels.
 */
static void
append_series_start(StringInfo buf, const char *name, const char *database,
					const char *consumer)
{
	appendStringInfo(buf, "%s{", name);
	if (database != NULL)
	{
		appendStringInfoString(buf, "database=\"");
		append_label_value(buf, database);
		appendStringInfoString(buf, "\",");
	}
	appendStringInfoString(buf, "consumer=\"");
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

/* The families with one or more samples per consumer, in output order. */
typedef enum MetricFamily
{
	FAMILY_APPLIED,
	FAMILY_DUPLICATES,
	FAMILY_FAILED,
	FAMILY_DLQ_ENQUEUE,
	FAMILY_KEY_REUSE,
	FAMILY_EFFECTS,				/* EFFECT_NUM_EVENTS families, one per event */
	FAMILY_LATENCY = FAMILY_EFFECTS + EFFECT_NUM_EVENTS,
	FAMILY_LAG,
	FAMILY_LAG_OBSERVED,
	NUM_FAMILIES
} MetricFamily;

typedef struct MetricFamilyDef
{
	const char *name;
	const char *type;
	const char *help;
} MetricFamilyDef;

static const MetricFamilyDef family_defs[NUM_FAMILIES] = {
	[FAMILY_APPLIED] = {"idem_applied_total", "counter",
	"Messages whose business SQL ran and committed."},
	[FAMILY_DUPLICATES] = {"idem_duplicate_detected_total", "counter",
	"Redelivered messages skipped, in committed transactions."},
	[FAMILY_FAILED] = {"idem_failed_total", "counter",
	"Calls that raised or whose transaction rolled back."},
	[FAMILY_DLQ_ENQUEUE] = {"idem_dlq_enqueue_total", "counter",
	"Messages moved to the dead-letter queue, in committed transactions."},
	[FAMILY_KEY_REUSE] = {"idem_key_reuse_total", "counter",
	"Deliveries whose key was recorded for another message (IK001)."},
	[FAMILY_EFFECTS + EFFECT_EXECUTED] = {"idem_effect_executed_total", "counter",
	"Leases handed out to call the provider (begin returned execute, or a claim)."},
	[FAMILY_EFFECTS + EFFECT_REPLAYED] = {"idem_effect_replayed_total", "counter",
	"Begins of completed effects, answered with the stored result."},
	[FAMILY_EFFECTS + EFFECT_BUSY] = {"idem_effect_busy_total", "counter",
	"Begins refused because another worker held a live lease."},
	[FAMILY_EFFECTS + EFFECT_FENCED_OFF] = {"idem_effect_fenced_off_total", "counter",
	"Completions and failures refused because their fence was no longer current."},
	[FAMILY_EFFECTS + EFFECT_REQUEST_MISMATCH] = {"idem_effect_request_mismatch_total", "counter",
	"Calls that reused an effect key with a different request."},
	[FAMILY_EFFECTS + EFFECT_UNKNOWN_OUTCOME] = {"idem_effect_unknown_outcome_total", "counter",
	"Leases that expired in flight, leaving the provider's outcome unknown."},
	[FAMILY_EFFECTS + EFFECT_DEAD] = {"idem_effect_dead_total", "counter",
	"Effects moved to the dead-letter queue."},
	[FAMILY_LATENCY] = {"idem_processing_latency_seconds", "histogram",
	"Time spent in idem_apply for applied messages."},
	[FAMILY_LAG] = {"idem_consumer_lag_seconds", "gauge",
	"Commit time minus event_time of the last applied message that had one."},
	[FAMILY_LAG_OBSERVED] = {"idem_consumer_lag_observed_seconds", "histogram",
	"Commit time minus event_time of applied messages that had one."},
};

/*
 * Appends one counter sample.
 */
static void
append_counter(StringInfo buf, MetricFamily family, const char *database,
			   const char *consumer, int64 value)
{
	append_series_start(buf, family_defs[family].name, database, consumer);
	appendStringInfo(buf, "} " INT64_FORMAT "\n", value);
}

/*
 * Appends the samples of one histogram, from durations in microseconds.
 */
static void
append_histogram(StringInfo buf, MetricFamily family, const char *database,
				 const char *consumer, const IdemHistogram *hist,
				 int first_boundary, int last_boundary)
{
	const char *name = family_defs[family].name;
	char		series[NAMEDATALEN];

	snprintf(series, sizeof(series), "%s_bucket", name);
	for (int b = first_boundary; b <= last_boundary; b += BOUNDARY_STEP)
	{
		double		le_seconds = pow(10.0, (double) b / HIST_BUCKETS_PER_DECADE - 6.0);

		append_series_start(buf, series, database, consumer);
		appendStringInfo(buf, ",le=\"%.6g\"} " UINT64_FORMAT "\n",
						 le_seconds, histogram_count_below(hist, b));
	}
	append_series_start(buf, series, database, consumer);
	appendStringInfo(buf, ",le=\"+Inf\"} " UINT64_FORMAT "\n", hist->total);

	snprintf(series, sizeof(series), "%s_sum", name);
	append_series_start(buf, series, database, consumer);
	appendStringInfo(buf, "} %.9g\n", hist->sum_us / 1e6);

	snprintf(series, sizeof(series), "%s_count", name);
	append_series_start(buf, series, database, consumer);
	appendStringInfo(buf, "} " UINT64_FORMAT "\n", hist->total);
}

/* A database named in a scrape. */
typedef struct NamedDatabase
{
	Oid			dbid;
	char	   *name;			/* NULL: the database was dropped */
} NamedDatabase;

/* What append_consumer() needs: the buffers, and the databases' names. */
typedef struct MetricsPass
{
	StringInfoData families[NUM_FAMILIES];
	bool		labelled;		/* with a database label */
	NamedDatabase *databases;
	int			ndatabases;
	int			maxdatabases;
} MetricsPass;

/*
 * Returns the name of a database, remembered for the rest of the pass, or
 * NULL for one that was dropped (whose slots wait for a reclaim pass).
 */
static const char *
database_name(MetricsPass *pass, Oid dbid)
{
	NamedDatabase *named;

	for (int i = 0; i < pass->ndatabases; i++)
		if (pass->databases[i].dbid == dbid)
			return pass->databases[i].name;
	if (pass->ndatabases == pass->maxdatabases)
	{
		pass->maxdatabases = Max(8, pass->maxdatabases * 2);
		pass->databases = pass->databases == NULL ?
			palloc(pass->maxdatabases * sizeof(NamedDatabase)) :
			repalloc(pass->databases, pass->maxdatabases * sizeof(NamedDatabase));
	}
	named = &pass->databases[pass->ndatabases++];
	named->dbid = dbid;
	named->name = get_database_name(dbid);
	return named->name;
}

/*
 * Appends one consumer's samples to the buffer of each family; called by
 * stats_foreach_readable() with the consumer's counters copied.
 */
static void
append_consumer(const ConsumerStatsCopy *copy, void *arg)
{
	MetricsPass *pass = (MetricsPass *) arg;
	StringInfo	families = pass->families;
	const ConsumerCounters *c = &copy->counters;
	const char *consumer = copy->consumer;
	const char *db = NULL;

	if (pass->labelled)
	{
		db = database_name(pass, copy->dbid);
		if (db == NULL)
			return;
	}

	append_counter(&families[FAMILY_APPLIED], FAMILY_APPLIED, db, consumer, c->applied);
	append_counter(&families[FAMILY_DUPLICATES], FAMILY_DUPLICATES, db, consumer,
				   c->duplicates);
	append_counter(&families[FAMILY_FAILED], FAMILY_FAILED, db, consumer, c->failed);
	append_counter(&families[FAMILY_DLQ_ENQUEUE], FAMILY_DLQ_ENQUEUE, db, consumer,
				   c->dead_lettered);
	append_counter(&families[FAMILY_KEY_REUSE], FAMILY_KEY_REUSE, db, consumer,
				   c->key_reuse);
	for (int e = 0; e < EFFECT_NUM_EVENTS; e++)
		append_counter(&families[FAMILY_EFFECTS + e], FAMILY_EFFECTS + e, db, consumer,
					   c->effects[e]);
	append_histogram(&families[FAMILY_LATENCY], FAMILY_LATENCY, db, consumer,
					 &c->latency, LATENCY_FIRST_BOUNDARY, LATENCY_LAST_BOUNDARY);
	if (c->has_lag)
	{
		append_series_start(&families[FAMILY_LAG], family_defs[FAMILY_LAG].name,
							db, consumer);
		appendStringInfo(&families[FAMILY_LAG], "} %.6f\n", c->lag_last_us / 1e6);
	}
	append_histogram(&families[FAMILY_LAG_OBSERVED], FAMILY_LAG_OBSERVED, db, consumer,
					 &c->lag, LAG_FIRST_BOUNDARY, LAG_LAST_BOUNDARY);
}

/*
 * Appends the depth of each consumer's dead-letter queue and the age of its
 * oldest pending entry, read from the tables (the counters only know what
 * was enqueued, not what is still waiting), labelled with database unless
 * it is NULL.  Needs an SPI connection.
 */
static void
append_dead_letter_gauges(StringInfo buf, const char *database)
{
	StringInfoData ages;
	SPITupleTable *summary;
	uint64		nrows = dead_letter_pending_summary();
	bool		all = stats_read_all();

	/* the summary's rows are judged one by one, each judgement a query */
	summary = SPI_tuptable;
	SPI_tuptable = NULL;

	initStringInfo(&ages);
	append_family(buf, "idem_dlq_pending", "gauge",
				  "Dead letters waiting for a replay or a discard, per consumer.");
	append_family(&ages, "idem_dlq_oldest_pending_age_seconds", "gauge",
				  "Time since the first failure of the oldest pending dead letter.");
	for (uint64 i = 0; i < nrows; i++)
	{
		HeapTuple	row = summary->vals[i];
		TupleDesc	desc = summary->tupdesc;
		char	   *consumer = SPI_getvalue(row, desc, 1);
		bool		isnull;
		Datum		age;

		if (!all && !keystore_may_read_consumer(consumer))
			continue;
		append_series_start(buf, "idem_dlq_pending", database, consumer);
		appendStringInfo(buf, "} %s\n", SPI_getvalue(row, desc, 2));

		age = SPI_getbinval(row, desc, 3, &isnull);
		if (isnull)
			continue;			/* nothing pending: no age */
		append_series_start(&ages, "idem_dlq_oldest_pending_age_seconds", database,
							consumer);
		appendStringInfo(&ages, "} %.3f\n", DatumGetFloat8(age));
	}
	SPI_freetuptable(summary);
	appendBinaryStringInfo(buf, ages.data, ages.len);
}

/*
 * Appends the lag of each consumer's position on each partition: the
 * log-end offset it last reported minus its position (positions.c), as
 * Kafka's tools show a group's lag, labelled with the topic and partition.
 * Needs an SPI connection.
 */
static void
append_position_lags(StringInfo buf, const char *database)
{
	SPITupleTable *lags;
	uint64		nrows = positions_lag_summary();
	bool		all = stats_read_all();
	bool		any = false;

	lags = SPI_tuptable;
	SPI_tuptable = NULL;
	for (uint64 i = 0; i < nrows; i++)
	{
		HeapTuple	row = lags->vals[i];
		TupleDesc	desc = lags->tupdesc;
		char	   *consumer = SPI_getvalue(row, desc, 1);

		if (!all && !keystore_may_read_consumer(consumer))
			continue;
		/* a database without Kafka consumers shows no family */
		if (!any)
			append_family(buf, "idem_position_lag", "gauge",
						  "Messages of a partition not yet applied by a consumer: the log-end offset it last reported minus its position.");
		any = true;
		append_series_start(buf, "idem_position_lag", database, consumer);
		appendStringInfoString(buf, ",topic=\"");
		append_label_value(buf, SPI_getvalue(row, desc, 2));
		appendStringInfo(buf, "\",partition=\"%s\"} %s\n",
						 SPI_getvalue(row, desc, 3), SPI_getvalue(row, desc, 4));
	}
	if (lags != NULL)
		SPI_freetuptable(lags);
}

/*
 * Appends one sample of a family of the database, labelled with database
 * unless it is NULL, with the given decimals.
 */
static void
append_database_gauge(StringInfo buf, const char *name, const char *help,
					  const char *database, double value, int decimals)
{
	append_family(buf, name, "gauge", help);
	appendStringInfoString(buf, name);
	if (database != NULL)
	{
		appendStringInfoString(buf, "{database=\"");
		append_label_value(buf, database);
		appendStringInfoString(buf, "\"}");
	}
	appendStringInfo(buf, " %.*f\n", decimals, value);
}

/*
 * Appends the gauges of the ring of key generations, where the key store
 * has one: the interval of the switches, the age of the current
 * generation (once a switch has opened one), the sealed generations, the
 * bytes on disk of the keys and of the filters, and how long the oldest
 * generation still settling has been sealed.  A current generation much
 * older than the interval is a switch held back (the purge worker's log
 * names who by); a generation settling for as long, a transaction that
 * recorded keys there and stays open.  Needs an SPI connection.
 */
static void
append_generation_gauges(StringInfo buf, const char *database)
{
	KeyRingGauges gauges;

	if (!keygen_ring_gauges(&gauges))
		return;
	append_database_gauge(buf, "idem_key_generation_interval_seconds",
						  "idem_consumer.key_generation_interval: how often the purge worker switches generations of keys; 0 when it does not.",
						  database, keygen_interval_seconds(), 3);
	if (gauges.current_age >= 0)
		append_database_gauge(buf, "idem_key_generation_current_age_seconds",
							  "Time since the current generation of keys was opened.",
							  database, gauges.current_age, 3);
	append_database_gauge(buf, "idem_key_generations_sealed",
						  "Sealed generations of keys not yet dropped; the ring has 16 places.",
						  database, gauges.sealed, 3);
	append_database_gauge(buf, "idem_key_store_bytes",
						  "Bytes on disk of the tables of processed keys and key collisions, every generation, with their indexes.",
						  database, gauges.key_bytes, 0);
	append_database_gauge(buf, "idem_key_filter_bytes",
						  "Bytes on disk of the filters of the sealed generations of keys.",
						  database, gauges.filter_bytes, 0);
	append_database_gauge(buf, "idem_key_generation_settling_age_seconds",
						  "Time since the oldest generation of keys still settling was sealed; 0 when none is.",
						  database, gauges.settling_age, 3);
}

/*
 * Returns every family as one text, ready for a scraper: the counters of
 * database dbid (of every database if InvalidOid), with a database label
 * if labelled.  Each consumer's samples go to a buffer per family, which
 * are then joined.
 */
static text *
metrics_text(Oid dbid, bool labelled)
{
	MetricsPass pass = {0};
	StringInfoData tail;
	Size		total;
	text	   *result;
	char	   *out;
	const char *current = NULL;

	pass.labelled = labelled;
	for (int f = 0; f < NUM_FAMILIES; f++)
	{
		initStringInfo(&pass.families[f]);
		append_family(&pass.families[f], family_defs[f].name, family_defs[f].type,
					  family_defs[f].help);
	}
	if (labelled)
		current = database_name(&pass, MyDatabaseId);
	stats_foreach_readable(dbid, append_consumer, &pass);

	initStringInfo(&tail);
	append_database_gauge(&tail, "idem_keys_stored",
						  "Processed keys stored, all consumers, from the tables' statistics.",
						  current, keystore_keys_estimate(), 0);
	SPI_connect();
	append_dead_letter_gauges(&tail, current);
	append_generation_gauges(&tail, current);
	append_position_lags(&tail, current);
	SPI_finish();

	/* join the families into the result, freeing each as it is copied */
	total = tail.len;
	for (int f = 0; f < NUM_FAMILIES; f++)
		total += pass.families[f].len;
	if (total > MaxAllocSize - VARHDRSZ)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("idem_metrics() output would exceed 1 GB"),
				 errhint("Lower idem_consumer.max_consumers.")));
	result = (text *) palloc(VARHDRSZ + total);
	SET_VARSIZE(result, VARHDRSZ + total);
	out = VARDATA(result);
	for (int f = 0; f < NUM_FAMILIES; f++)
	{
		memcpy(out, pass.families[f].data, pass.families[f].len);
		out += pass.families[f].len;
		pfree(pass.families[f].data);
	}
	memcpy(out, tail.data, tail.len);
	pfree(tail.data);

	return result;
}

/*
 * idem_metrics() of versions 1.0 and 1.1: the counters of the database
 * connected to, labelled by consumer only.
 */
Datum
idem_metrics(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(metrics_text(MyDatabaseId, false));
}

/*
 * idem_metrics() of version 1.2: labelled by database and consumer; every
 * database for a role with the privileges of pg_read_all_stats, the
 * database connected to for any other.
 */
Datum
idem_metrics_1_2(PG_FUNCTION_ARGS)
{
	PG_RETURN_TEXT_P(metrics_text(stats_read_all() ? InvalidOid : MyDatabaseId, true));
}
