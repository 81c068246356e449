/*-------------------------------------------------------------------------
 *
 * idem_consumer.h
 *	  Declarations shared by the modules of the idem_consumer extension.
 *
 * Module map:
 *	  idem_consumer.c	library entry point and GUCs
 *	  keystore.c		the extension's storage: consumers and processed keys
 *	  plan_cache.c		validation, type inference and cached plans of
 *						business SQL, and binding its parameters
 *	  apply.c			the SQL-callable idem_apply() family
 *	  stats.c			per-consumer counters in shared memory, counted
 *						when the transaction ends, and the idem_stats view
 *	  histogram.c		log-scale duration histograms
 *	  metrics.c			the Prometheus text exposition
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CONSUMER_H
#define IDEM_CONSUMER_H

#include "postgres.h"

#include "executor/spi.h"
#include "nodes/params.h"
#include "utils/array.h"
#include "utils/timestamp.h"

/* Longest key and consumer name accepted, in bytes. */
#define IDEM_MAX_KEY_BYTES			1024
#define IDEM_MAX_CONSUMER_BYTES		128

/* GUCs */
extern int	idem_plan_cache_size;

/* keystore.c */
extern void keystore_init(void);
extern int32 keystore_consumer_id(const char *consumer, bool create);
extern bool keystore_record_key(int32 consumer_id, text *key);
extern bool keystore_key_exists(int32 consumer_id, text *key);
extern bool keystore_forget_key(int32 consumer_id, text *key);

typedef struct KeysStored
{
	char	   *consumer;
	int64		keys;
} KeysStored;

extern List *keystore_keys_stored(void);

/* histogram.c */
#define HIST_BUCKETS_PER_DECADE		24
#define HIST_DECADES				12	/* 1 us to 10^12 us */
#define HIST_NBUCKETS				(1 + HIST_DECADES * HIST_BUCKETS_PER_DECADE + 1)

typedef struct IdemHistogram
{
	uint64		counts[HIST_NBUCKETS];
	uint64		total;
	double		sum_us;
	int64		max_us;
} IdemHistogram;

extern void histogram_add(IdemHistogram *hist, int64 value_us);
extern void histogram_merge(IdemHistogram *into, const IdemHistogram *from);
extern double histogram_quantile_us(const IdemHistogram *hist, double q);
extern uint64 histogram_count_below(const IdemHistogram *hist, int boundary);

/* stats.c */
typedef struct ConsumerCounters
{
	int64		applied;
	int64		duplicates;
	int64		failed;
	int64		dead_lettered;
	TimestampTz last_applied_at;	/* 0 if never */
	TimestampTz last_duplicate_at;	/* 0 if never */
	int64		lag_last_us;
	bool		has_lag;
	IdemHistogram latency;		/* of applied calls */
	IdemHistogram lag;			/* of applied calls that passed event_time */
	TimestampTz stats_reset;
} ConsumerCounters;

typedef struct ConsumerStatsCopy
{
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];
	ConsumerCounters counters;
} ConsumerStatsCopy;

extern void stats_init(void);
extern int	stats_call_begin(const char *consumer);
extern void stats_call_end(int call, int applied, int duplicates,
						   int dead_lettered, TimestampTz event_time);
extern List *stats_snapshot(void);

/* plan_cache.c */
typedef struct BusinessPlan BusinessPlan;

extern BusinessPlan *business_plan_get(const char *sql);
extern ParamListInfo business_plan_bind(BusinessPlan *bplan, ArrayType *params);
extern void business_plan_execute(BusinessPlan *bplan, ParamListInfo params);

#endif							/* IDEM_CONSUMER_H */
