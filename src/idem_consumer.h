/*-------------------------------------------------------------------------
 *
 * idem_consumer.h
 *	  Declarations shared by the modules of the idem_consumer extension.
 *
 * docs/architecture.md maps the modules, what each owns and which may
 * call which; this header holds only what they call of each other.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/idem_consumer.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CONSUMER_H
#define IDEM_CONSUMER_H

#include "postgres.h"

#include "fmgr.h"
#include "nodes/params.h"
#include "storage/block.h"
#include "storage/itemptr.h"
#include "utils/array.h"
#include "utils/inval.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "key_place.h"

/* The schema of the storage tables, fixed by the install script. */
#define STORAGE_SCHEMA "idem_consumer"

/*
 * The schema of what belongs to this database alone, never published with
 * the storage: the seed of the key hash and the filters of the keys.
 */
#define LOCAL_SCHEMA "idem_consumer_local"

/* Longest key and consumer name accepted, in bytes. */
#define IDEM_MAX_KEY_BYTES			1024
#define IDEM_MAX_CONSUMER_BYTES		128

/* storage_stmt.h: the statement sets, run as the owner of the storage */
#include "storage_stmt.h"

/*
 * Moves the identity sequence of a storage table's column past the largest
 * id the table holds, if it is behind it.  Rows that logical replication
 * applied took their ids from the publisher's sequence, and sequences are
 * not replicated: on a subscriber that takes over, the sequence would hand
 * out those ids again.  setval() is not undone by a rollback, and need not
 * be: an id skipped is harmless.  Only a sequence strictly behind is set:
 * one that stands at the largest id (every sequence in normal operation)
 * is left alone, since a concurrent nextval() between this statement's
 * read of the sequence and its setval() would otherwise be handed out
 * again.
 */
#define IDS_PAST_ROWS(table, column) \
	"SELECT pg_catalog.setval(s.seq, m.id)" \
	" FROM (SELECT pg_catalog.pg_get_serial_sequence('" STORAGE_SCHEMA "." table "', '" column "')" \
	"::pg_catalog.regclass) AS s (seq)," \
	" (SELECT pg_catalog.max(" column ") FROM " STORAGE_SCHEMA "." table ") AS m (id)" \
	" WHERE m.id OPERATOR(pg_catalog.>)" \
	" COALESCE(pg_catalog.pg_sequence_last_value(s.seq), 0)"

/*
 * The tables that hold keys, in the order a purge walks them: the
 * collisions, then the keys, of each generation in turn
 * (keystore_remove.c); those of a generation the database does not have
 * count as empty.
 */
typedef int KeystoreTable;

#define KS_NUM_TABLES (2 * 17)

extern void storage_init(void);
extern void storage_relcache_subscribe(RelcacheCallbackFunction callback);

/*
 * storage.c: what versions after 1.0 of the SQL objects add to the
 * storage, probed with the storage tables and invalidated with them.
 */
typedef struct StorageParts
{
	Oid			effects_relid;	/* InvalidOid before 1.1 */
	bool		dead_letters_have_role; /* 1.1 on: the parking role */
	bool		dead_letters_have_expect_rows;	/* 1.2 on */
} StorageParts;

extern const StorageParts *storage_parts(void);
extern bool keystore_record_key(int32 consumer_id, text *key);

/* What the storage holds of a key found recorded. */
typedef struct RecordedKey
{
	bool		has_fingerprint;	/* false: recorded without one */
	int32		fingerprint;
	int32		processed_at;	/* seconds since 2000-01-01 */
} RecordedKey;

extern bool keystore_record_key_fp(int32 consumer_id, text *key,
								   const int32 *fingerprint,
								   RecordedKey *recorded);
extern bool keystore_record_keys(int32 consumer_id, text **keys, int nkeys,
								 const int32 *fingerprints,
								 const bool *has_fingerprint,
								 bool require_fastpath, bool *isnew,
								 RecordedKey *recorded);
extern bool keystore_key_exists(int32 consumer_id, text *key);
extern bool keystore_forget_key(int32 consumer_id, text *key);
extern void keystore_dead_letter_ids_past_rows(void);

extern uint64 keystore_insert_batch(int32 consumer_id, ArrayType *keys);
extern uint64 keystore_unresolved_batch(int32 consumer_id, ArrayType *keys,
										ArrayType *inserted);
extern uint64 keystore_storage_version(void);
extern bool keystore_sealed_live(void);
extern void keygen_init(void);
extern int	keygen_switch_if_due(int64 wait_ms);
extern bool keygen_retention_by_generation(void);
extern int	keygen_retire(void);
extern void keygen_registered_activity(void (*note) (int32 consumer_id, int32 latest, void *arg),
									   void *arg);
extern int	keygen_build_filters(void);
extern int	keygen_interval_seconds(void);

/* keygen_holders.c: the ring's gauges of idem_metrics() */
typedef struct KeyRingGauges
{
	double		current_age;	/* seconds; negative before the first switch */
	int			sealed;			/* sealed generations not yet dropped */
	double		key_bytes;		/* key tables and their indexes */
	double		filter_bytes;	/* filters of the sealed generations */
	double		settling_age;	/* seconds since the oldest settling one was sealed; 0: none */
} KeyRingGauges;

extern bool keygen_ring_gauges(KeyRingGauges *gauges);
extern void keystore_table_blocks(BlockNumber *blocks);
extern uint64 keystore_remove_rows(KeystoreTable table, ItemPointer tids,
								   int ntids, Datum consumer_ids, Datum cutoffs);
extern double keystore_keys_estimate(void);
extern void keystore_read_latest(KeystoreTable table, Datum lo, Datum hi);
extern void keystore_read_purgeable(KeystoreTable table, Datum consumer_ids,
									Datum cutoffs, Datum lo, Datum hi);

/* consumers.c */
extern void consumers_init(void);
extern int32 keystore_consumer_id(const char *consumer, bool create);
extern bool keystore_cached_consumer_id(const char *consumer, int32 *consumer_id);
extern int32 keystore_consumer_id_and_fp_check(const char *consumer,
												bool create,
												bool *check_fingerprint);
extern bool keystore_may_act_on_consumer_id(int32 consumer_id);
extern bool keystore_may_read_consumer(const char *consumer);
extern void keystore_check_every_consumer(const char *what);
extern bool role_can_become(Oid roleid);
extern bool consumer_row_visible(const char *consumer, TransactionId *xmin);

/* consumer_names.c */
extern void consumer_name_check_new(const char *name);

/* fingerprint.c */
typedef struct ParamHashers ParamHashers;

extern void fingerprint_init(void);
extern int32 fingerprint_of_message(const char *sql, ArrayType *params);
extern int32 fingerprint_of_text(text *fingerprint);
extern ParamHashers *fingerprint_hashers_create(MemoryContext cxt, const char *sql,
												int nargs, const Oid *argtypes);
extern void fingerprint_hashers_free(ParamHashers *hashers);
extern int32 fingerprint_of_bound(ParamHashers *hashers, ParamListInfo params);
extern int32 fingerprint_of_bound_call(text *explicit_fingerprint,
									   ParamHashers *hashers, ParamListInfo params);
extern bool fingerprint_admits(text *explicit_fingerprint, int32 fingerprint,
							   const RecordedKey *recorded, const char *sql,
							   ArrayType *params);
extern bool fingerprint_differs(int32 fingerprint, const RecordedKey *recorded);
extern void fingerprint_raise_key_reuse(const char *consumer, text *key,
										int32 fingerprint,
										const RecordedKey *recorded);
extern ErrorData *fingerprint_key_reuse_error(const char *consumer, text *key,
											  int32 fingerprint,
											  const RecordedKey *recorded);

/* retention_windows.c */
extern void retention_init(void);
extern int	retention_default_secs(void);
extern int32 retention_longest_window_secs(void);

typedef struct RetentionWindows RetentionWindows;

extern RetentionWindows *retention_windows_load(void);
extern int32 retention_cutoff(RetentionWindows *windows, int32 consumer_id,
							  int32 latest);

/* retention_store.c */
extern void retention_store_read_windows(void);
extern void retention_store_set_window(int32 consumer_id, Datum retention,
									   bool isnull);
extern void retention_store_reset_window(int32 consumer_id);

/* retention.c */
typedef enum PurgeProgress
{
	PURGE_CONTINUES,			/* the run goes on */
	PURGE_BATCH_FULL,			/* a consumer removed batch_size keys */
	PURGE_RUN_DONE				/* the run is complete */
} PurgeProgress;

extern void purge_begin_batch(int32 only_consumer, int64 batch_size);
extern PurgeProgress purge_step(uint64 *removed);

/* purge_worker.c */
extern void purge_worker_init(void);

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

/* A value whose bucket is found, to be added later (histogram_add_sample). */
typedef struct HistogramSample
{
	int64		value_us;
	int			bucket;
	int			n;
} HistogramSample;

extern void histogram_sample(HistogramSample *sample, int64 value_us, int n);
extern void histogram_add_sample(IdemHistogram *hist, const HistogramSample *sample);
extern void histogram_add(IdemHistogram *hist, int64 value_us);
extern void histogram_add_n(IdemHistogram *hist, int64 value_us, int n);
extern void histogram_merge(IdemHistogram *into, const IdemHistogram *from);
extern double histogram_quantile_us(const IdemHistogram *hist, double q);
extern uint64 histogram_count_below(const IdemHistogram *hist, int boundary);

/* stats.c */

/* What happened to external effects, counted per consumer (effects.c). */
typedef enum EffectEvent
{
	EFFECT_EXECUTED,			/* a lease handed out to call the provider */
	EFFECT_REPLAYED,			/* a stored result returned instead */
	EFFECT_BUSY,				/* another worker held a live lease */
	EFFECT_FENCED_OFF,			/* a stale fence refused */
	EFFECT_REQUEST_MISMATCH,	/* a key reused with another request */
	EFFECT_UNKNOWN_OUTCOME,		/* a lease taken over after it expired */
	EFFECT_DEAD,				/* an effect moved to the dead-letter queue */
	EFFECT_NUM_EVENTS
} EffectEvent;

typedef struct ConsumerCounters
{
	int64		applied;
	int64		duplicates;
	int64		failed;
	int64		dead_lettered;
	int64		key_reuse;		/* keys found recorded for another message */
	TimestampTz last_applied_at;	/* 0 if never */
	TimestampTz last_duplicate_at;	/* 0 if never */
	int64		lag_last_us;
	bool		has_lag;
	IdemHistogram latency;		/* of applied calls */
	IdemHistogram lag;			/* of applied calls that passed event_time */
	TimestampTz stats_reset;
	int64		effects[EFFECT_NUM_EVENTS];
} ConsumerCounters;

typedef struct ConsumerStatsCopy
{
	Oid			dbid;			/* the database the consumer belongs to */
	char		consumer[IDEM_MAX_CONSUMER_BYTES + 1];
	ConsumerCounters counters;
} ConsumerStatsCopy;

extern void stats_init(void);
extern void stats_foreach(Oid dbid,
						  void (*fn) (const ConsumerStatsCopy *copy, void *arg),
						  void *arg);
extern void stats_foreach_readable(Oid dbid,
								   void (*fn) (const ConsumerStatsCopy *copy, void *arg),
								   void *arg);
extern bool stats_read_all(void);

/* stats_file.c */
extern void stats_file_init(void);

/* stats_xact.c */
extern int	stats_call_begin(const char *consumer);
extern void stats_call_end(int call, int applied, int duplicates,
						   int dead_lettered, TimestampTz event_time);
extern void stats_call_key_reuse(int call);
extern void stats_count_effect(const char *consumer, EffectEvent event);

/* plan_cache.c */
typedef struct BusinessPlan BusinessPlan;

extern void plan_cache_init(void);
extern void business_sql_check(const char *sql);
extern void business_params_check(ArrayType *params);
extern BusinessPlan *business_plan_get(const char *sql);
extern ParamListInfo business_plan_bind(BusinessPlan *bplan, ArrayType *params);
extern ParamHashers *business_plan_hashers(BusinessPlan *bplan);
extern uint64 business_plan_execute(BusinessPlan *bplan, ParamListInfo params);
extern bool business_sql_is_call(const char *sql);

/* routed.c */
typedef enum RoutedStmt
{
	RK_INSERT,
	RK_PROBE,
	RK_FORGET,
	RK_DL_INSERT,
	RK_DL_STATUS,
	RK_DL_LOCK,
	RK_DL_FAILED_AGAIN,
	RK_DL_REPLAYED,
	RK_DL_DISCARDED,
	RK_DL_DELETE_RESOLVED,
	RK_NUM_STMTS
} RoutedStmt;

extern void routed_execute(RoutedStmt stmt, Oid route_type, Datum *args,
						   const char *nulls);
extern void routed_refuse_two_roles(const char *function_name,
									const char *consumer, Oid business_role);
extern bool routed_record_key(Datum route, Oid route_type, const char *consumer,
							  text *key, const int32 *fingerprint,
							  RecordedKey *recorded);
extern void routed_record_keys(const char *consumer, Datum *elems, Datum *routes,
							   Oid route_type, int nkeys, const int32 *fingerprints,
							   const bool *has_fingerprint, bool *isnew,
							   bool *repeated, RecordedKey *recorded);
extern bool routed_key_exists(Datum route, Oid route_type, const char *consumer,
							  text *key);
extern bool routed_forget_key(Datum route, Oid route_type, const char *consumer,
							  text *key);
extern uint64 routed_purge(const char *consumer);

/* routing.c */
extern void routed_init(void);
extern Oid	routed_keys_relid(void);
extern Oid	routed_route_type(void);
extern void routed_refuse_unrouted(const char *effect_function);
extern bool routed_get_route_arg(FunctionCallInfo fcinfo, int argno, Datum *route,
								 Oid *route_type);
extern bool routed_get_routes_arg(FunctionCallInfo fcinfo, int argno, int nkeys,
								  Datum **routes, Oid *route_type);
extern void routed_stmts_retype(StorageStmtSet *set, StorageStmt *defs,
								Oid *plans_type, Oid route_type);
extern bool routed_purge_cutoffs(RetentionWindows *windows, Datum *args);

/* args.c */
extern text *get_name_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
						  int max_bytes);
extern text *get_key_arg(FunctionCallInfo fcinfo, int argno);
extern char *get_consumer_arg(FunctionCallInfo fcinfo, int argno);
extern int32 get_count_arg(FunctionCallInfo fcinfo, int argno, const char *argname);
extern char *get_sql_arg(FunctionCallInfo fcinfo, int argno);
extern ArrayType *get_keys_arg(FunctionCallInfo fcinfo, int argno, Datum **elems,
							   int *nkeys);
extern void get_fingerprints_arg(FunctionCallInfo fcinfo, int argno, int nkeys,
								 int32 *fingerprints, bool *has_fingerprint);
extern int64 get_id_arg(FunctionCallInfo fcinfo, int argno);
extern int64 get_duration_arg(FunctionCallInfo fcinfo, int argno,
							  const char *argname, int64 max_us);
extern int64 get_fence_arg(FunctionCallInfo fcinfo, int argno);
extern bool get_bool_arg(FunctionCallInfo fcinfo, int argno, const char *argname);
extern void check_retention_arg(Interval *retention);
extern Oid	get_role_arg(FunctionCallInfo fcinfo, int argno, bool null_is_current);

/* apply.c */

/*
 * The arguments of idem_apply and idem_try_apply, in their order:
 * key, consumer, sql, params, event_time, then fingerprint (from 1.1 on),
 * expect_rows and route (from 1.2 on).
 */
typedef struct MessageArgs
{
	text	   *key;
	char	   *consumer;
	char	   *sql;
	ArrayType  *params;			/* NULL if none */
	NullableDatum event_time;
	text	   *fingerprint;	/* the caller's, NULL if none */
	int64		expect_rows;	/* 0: no demand */
	KeyPlace	place;			/* consumer_id left 0 */
} MessageArgs;

extern void get_message_args(FunctionCallInfo fcinfo, MessageArgs *args);

/* inflight.c */
extern int	inflight_push(int32 consumer_id, const char *consumer, text *key);
extern void inflight_pop(int depth);
extern uint64 inflight_execute(int32 consumer_id, const char *consumer, text *key,
							   BusinessPlan *bplan, ParamListInfo params);
extern bool inflight_any(void);
extern void inflight_check_key(int32 consumer_id, const char *consumer, text *key,
							   const char *action);
extern void inflight_check_keys(int32 consumer_id, const char *consumer, Datum *keys,
								int nkeys, const char *action);
extern void inflight_check_dead_letter(const char *function_name, const char *action,
									   const char *entry_name, int32 consumer_id,
									   text *key);
extern void inflight_check_none(const char *function_name);
extern void inflight_check_call(FunctionCallInfo fcinfo);
extern void inflight_note_recording(void);
extern void inflight_check_not_recording(const char *function_name);

/* positions.c */
extern uint64 positions_lag_summary(void);

/* replay_role.c */
typedef struct ReplayRoleState
{
	Oid			save_userid;
	int			save_sec_context;
} ReplayRoleState;

extern bool replay_role_supported(void);
extern void replay_role_require_supported(void);
extern char *replay_role_search_path(void);
extern Oid	replay_role_check(const char *entry_name, const char *consumer, Oid roleid,
							  const char *parked_by_name);
extern ReplayRoleState replay_role_begin(Oid roleid);
extern void replay_role_end(ReplayRoleState state);

/* business_run.c */
extern void business_run_init(void);

/* dead_letter_sql.c */
extern uint64 dead_letter_pending_summary(void);

/* expect_rows.c */
extern void expect_rows_check_sql(int64 expect_rows, const char *sql);
extern void expect_rows_demand(int64 expect_rows, uint64 rows,
							   const char *consumer, text *key);
extern bool expect_rows_stored(void);

/* fastpath.c: idem_consumer.fast_path, for the keys and the effects */
extern void fastpath_init(void);
extern bool fastpath_enabled(void);

/* effects.c, effects_store.c, effects_store_sql.c */
extern void effects_init(void);
extern bool effects_storage_exists(void);
extern bool effects_rearm(int64 dead_letter_id);
extern bool effects_rearm_routed(const KeyPlace *at, text *key);
extern uint64 effects_purge(int32 only_consumer, int default_retention_secs);
extern uint64 effects_purge_routed(const char *consumer, RetentionWindows *windows);

#endif							/* IDEM_CONSUMER_H */
