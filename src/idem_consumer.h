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
 *	  batch.c			idem_record_batch(): recording a batch of keys
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CONSUMER_H
#define IDEM_CONSUMER_H

#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "nodes/params.h"
#include "utils/array.h"

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
extern bool keystore_record_keys(int32 consumer_id, text **keys, int nkeys,
								 bool *isnew);
extern uint64 keystore_insert_batch(int32 consumer_id, ArrayType *keys);
extern uint64 keystore_unresolved_batch(int32 consumer_id, ArrayType *keys,
										ArrayType *inserted);

/* apply.c */
extern text *idem_name_arg(FunctionCallInfo fcinfo, int argno,
						   const char *argname, int max_bytes);

/* plan_cache.c */
typedef struct BusinessPlan BusinessPlan;

extern BusinessPlan *business_plan_get(const char *sql);
extern ParamListInfo business_plan_bind(BusinessPlan *bplan, ArrayType *params);
extern void business_plan_execute(BusinessPlan *bplan, ParamListInfo params);

#endif							/* IDEM_CONSUMER_H */
