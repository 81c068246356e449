/*-------------------------------------------------------------------------
 *
 * plan_cache.c
 *	  Business SQL: what may run, the types of its parameters, its prepared
 *	  plans, and binding the caller's text parameters to them.
 *
 * Each backend keeps a plan per distinct SQL text, bounded by
 * idem_consumer.plan_cache_size texts and idem_consumer.plan_cache_memory
 * bytes, with least-recently-used eviction.  The plans are SPI plans, so
 * the plan cache of PostgreSQL replans them when a table they use changes,
 * and checks permissions as the current user at every execution.
 *
 * The bytes are what the memory contexts of the cache hold: its own (the
 * texts, the hash table, the parameters' input and hash functions) and
 * each plan's (the plan source with its parse and query trees, and its
 * generic plan).
 * A plan's bytes are measured when it is made and again when it is used
 * after PostgreSQL replanned it or built its generic plan, so the total is
 * kept without walking every plan at each call; it may run over by what
 * the plan last executed built since.  The text being applied is never
 * evicted, so one plan larger than the bound is kept until the next call.
 * The count is each session's to set; the bytes only a superuser's, which
 * bounds what a session of any role can make its backend hold: business
 * SQL texts are the caller's, and 200 texts of a megabyte held 400 MB.
 *
 * Parameter types are inferred once, the way a driver's unnamed prepared
 * statement infers them (parse analysis with variable parameters), then
 * fixed in the plan like PREPARE does: a later replan keeps the types.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/plan_cache.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/tupmacs.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "lib/ilist.h"
#include "nodes/parsenodes.h"
#include "parser/analyze.h"
#include "tcop/dest.h"
#include "tcop/tcopprot.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/plancache.h"

#include "idem_consumer.h"

struct BusinessPlan
{
	const char *sql;			/* hash key; points into plan_cache_cxt */
	SPIPlanPtr	plan;
	int			nargs;
	Oid		   *argtypes;
	FmgrInfo   *input_funcs;
	Oid		   *input_ioparams;
	ParamHashers *hashers;		/* for the message's fingerprint */
	dlist_node	lru_node;		/* most recently used first */
	Size		plan_bytes;		/* the plan's contexts when last measured */
	const void *measured_query; /* its query trees and generic plan then */
	const void *measured_gplan;
};

/* Number of distinct business SQL texts whose plans a backend keeps. */
static int	plan_cache_size = 256;

/* Bytes the plans a backend keeps may hold, in kB. */
static int	plan_cache_memory = 32 * 1024;

/* The plan_bytes of every entry together. */
static Size plan_cache_plan_bytes = 0;

static HTAB *plan_cache = NULL;
static MemoryContext plan_cache_cxt = NULL;
static dlist_head plan_lru = DLIST_STATIC_INIT(plan_lru);

/*
 * Depth of business SQL executions in progress.  Business SQL may itself
 * call idem_apply(); plans are only evicted at depth zero so that no plan
 * is freed while an outer call still runs it.
 */
static int	executing_depth = 0;

/* Error context for parameter conversion. */
typedef struct BindErrorContext
{
	int			paramno;
	Oid			paramtype;
} BindErrorContext;

/*
 * Hashes an SQL text; the hash key is a pointer to the text.
 */
static uint32
sql_text_hash(const void *key, Size keysize)
{
	const char *sql = *(const char *const *) key;

	return hash_bytes((const unsigned char *) sql, strlen(sql));
}

/*
 * Compares two SQL texts for the hash table.
 */
static int
sql_text_match(const void *key1, const void *key2, Size keysize)
{
	return strcmp(*(const char *const *) key1, *(const char *const *) key2);
}

/*
 * Creates the per-backend plan table on first use.
 */
static void
plan_cache_create(void)
{
	HASHCTL		ctl;

	plan_cache_cxt = AllocSetContextCreate(CacheMemoryContext,
										   "idem_consumer business plans",
										   ALLOCSET_DEFAULT_SIZES);
	ctl.keysize = sizeof(const char *);
	ctl.entrysize = sizeof(BusinessPlan);
	ctl.hash = sql_text_hash;
	ctl.match = sql_text_match;
	ctl.hcxt = plan_cache_cxt;
	plan_cache = hash_create("idem_consumer business plans", 64, &ctl,
							 HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

/*
 * Raises an error unless the statement can run inside idem_apply().
 */
static void
check_statement_kind(RawStmt *raw)
{
	Node	   *stmt = raw->stmt;

	switch (nodeTag(stmt))
	{
		case T_SelectStmt:
			if (((SelectStmt *) stmt)->intoClause == NULL)
				return;
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("business SQL cannot be a SELECT INTO statement"),
					 errhint("Use one SELECT, INSERT, UPDATE, DELETE, MERGE or CALL statement.")));
			break;
		case T_InsertStmt:
		case T_UpdateStmt:
		case T_DeleteStmt:
		case T_MergeStmt:
		case T_CallStmt:
			return;
		case T_TransactionStmt:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
					 errmsg("business SQL cannot contain transaction control"),
					 errdetail("The statement is %s.", CreateCommandName(stmt)),
					 errhint("The business SQL runs inside the caller's transaction, "
							 "together with the recording of the key: commit or roll back "
							 "from the client after idem_apply returns.")));
			break;
		default:
			break;
	}
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("business SQL cannot be a %s statement", CreateCommandName(stmt)),
			 errhint("Use one SELECT, INSERT, UPDATE, DELETE, MERGE or CALL statement.")));
}

/*
 * Reports a parse error's position inside the business SQL rather than
 * inside the caller's query, as SPI does.
 */
static void
business_sql_error_callback(void *arg)
{
	const char *sql = (const char *) arg;
	int			position = geterrposition();

	if (position > 0)
	{
		errposition(0);
		internalerrposition(position);
		internalerrquery(sql);
	}
	else
		errcontext("business SQL \"%s\"", sql);
}

/*
 * Parses a business SQL text and checks that it is one statement of an
 * accepted kind.  The caller has set up business_sql_error_callback.
 */
static RawStmt *
parse_business_sql(const char *sql)
{
	List	   *raw_list;
	RawStmt    *raw;

	raw_list = pg_parse_query(sql);
	if (raw_list == NIL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sql must contain a statement"),
				 errdetail("The text holds only white space, comments or semicolons.")));
	if (list_length(raw_list) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("sql must contain exactly one statement"),
				 errdetail("The text holds %d statements.", list_length(raw_list)),
				 errhint("Combine the changes in one statement, for example with "
						 "data-modifying WITH queries, or call idem_apply once per statement "
						 "in the same transaction with different consumers.")));

	raw = linitial_node(RawStmt, raw_list);
	check_statement_kind(raw);
	return raw;
}

/*
 * Parses and validates a business SQL text and infers its parameter types.
 */
static void
analyze_business_sql(const char *sql, Oid **argtypes, int *nargs)
{
	RawStmt    *raw;
	ErrorContextCallback errcallback;

	errcallback.callback = business_sql_error_callback;
	errcallback.arg = unconstify(char *, sql);
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	raw = parse_business_sql(sql);

	*argtypes = NULL;
	*nargs = 0;
	(void) parse_analyze_varparams(raw, sql, argtypes, nargs, NULL);

	for (int i = 0; i < *nargs; i++)
	{
		Oid			argtype = (*argtypes)[i];

		if (argtype == InvalidOid || argtype == UNKNOWNOID)
			ereport(ERROR,
					(errcode(ERRCODE_INDETERMINATE_DATATYPE),
					 errmsg("could not determine data type of parameter $%d", i + 1),
					 errhint("Use $%d where its type follows from the context, or add a cast such as $%d::integer.",
							 i + 1, i + 1)));
	}

	error_context_stack = errcallback.previous;
}

/*
 * Measures the memory of bplan's plan again if PostgreSQL has replanned it
 * or built its generic plan since it was last measured, and keeps the
 * cache's total up to date.
 */
static void
business_plan_measure(BusinessPlan *bplan)
{
	List	   *sources = SPI_plan_get_plan_sources(bplan->plan);
	CachedPlanSource *source;
	Size		bytes;

	if (sources == NIL)
		return;
	/* business SQL is one statement: one plan source */
	source = (CachedPlanSource *) linitial(sources);
	if (bplan->plan_bytes > 0 &&
		bplan->measured_query == (const void *) source->query_context &&
		bplan->measured_gplan == (const void *) source->gplan)
		return;

	/* the query trees' context is a child of the source's */
	bytes = MemoryContextMemAllocated(source->context, true);
	if (source->gplan != NULL)
		bytes += MemoryContextMemAllocated(source->gplan->context, true);
	plan_cache_plan_bytes -= bplan->plan_bytes;
	plan_cache_plan_bytes += bytes;
	bplan->plan_bytes = bytes;
	bplan->measured_query = source->query_context;
	bplan->measured_gplan = source->gplan;
}

/*
 * The bytes the cache holds, as far as it has measured them.
 */
static Size
plan_cache_bytes(void)
{
	return MemoryContextMemAllocated(plan_cache_cxt, true) + plan_cache_plan_bytes;
}

/*
 * Prepares a business SQL text and stores its plan in the cache.
 *
 * Everything the entry needs is allocated before the entry is made: an
 * error (out of memory, say) must not leave in the table an entry that is
 * half filled in or missing from the LRU list, which eviction walks.
 */
static BusinessPlan *
business_plan_create(const char *sql)
{
	Oid		   *argtypes;
	int			nargs;
	SPIPlanPtr	plan;
	BusinessPlan *bplan;
	BusinessPlan entry;
	bool		found;

	analyze_business_sql(sql, &argtypes, &nargs);

	plan = SPI_prepare(sql, nargs, argtypes);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");

	PG_TRY();
	{
		entry.sql = MemoryContextStrdup(plan_cache_cxt, sql);
		entry.plan = plan;
		entry.nargs = nargs;
		entry.argtypes = MemoryContextAlloc(plan_cache_cxt, Max(nargs, 1) * sizeof(Oid));
		entry.input_funcs = MemoryContextAlloc(plan_cache_cxt, Max(nargs, 1) * sizeof(FmgrInfo));
		entry.input_ioparams = MemoryContextAlloc(plan_cache_cxt, Max(nargs, 1) * sizeof(Oid));
		for (int i = 0; i < nargs; i++)
		{
			Oid			typinput;

			entry.argtypes[i] = argtypes[i];
			getTypeInputInfo(argtypes[i], &typinput, &entry.input_ioparams[i]);
			fmgr_info_cxt(typinput, &entry.input_funcs[i], plan_cache_cxt);
		}
		entry.hashers = fingerprint_hashers_create(plan_cache_cxt, entry.sql,
												   nargs, entry.argtypes);

		/* the last step that can fail; it enters nothing if it does */
		bplan = hash_search(plan_cache, &entry.sql, HASH_ENTER, &found);
	}
	PG_CATCH();
	{
		SPI_freeplan(plan);
		PG_RE_THROW();
	}
	PG_END_TRY();

	Assert(!found);
	entry.plan_bytes = 0;
	*bplan = entry;
	dlist_push_head(&plan_lru, &bplan->lru_node);
	business_plan_measure(bplan);
	return bplan;
}

/*
 * Drops least recently used plans until the cache fits its limits, the
 * most recently used one excepted.
 */
static void
plan_cache_evict(void)
{
	while (executing_depth == 0 &&
		   (hash_get_num_entries(plan_cache) > plan_cache_size ||
			(hash_get_num_entries(plan_cache) > 1 &&
			 plan_cache_bytes() > (Size) plan_cache_memory * 1024)))
	{
		BusinessPlan *victim = dlist_container(BusinessPlan, lru_node,
											   dlist_tail_node(&plan_lru));
		const char *sql = victim->sql;

		dlist_delete(&victim->lru_node);
		plan_cache_plan_bytes -= victim->plan_bytes;
		SPI_freeplan(victim->plan);
		pfree(victim->argtypes);
		pfree(victim->input_funcs);
		pfree(victim->input_ioparams);
		fingerprint_hashers_free(victim->hashers);
		hash_search(plan_cache, &sql, HASH_REMOVE, NULL);
		pfree((char *) sql);
	}
}

/*
 * Raises an error unless a business SQL text parses as one statement of an
 * accepted kind: the checks that depend on the text alone, not on the
 * schema.  A cached text passed them already; any other is parsed here and
 * again when it is prepared.
 */
void
business_sql_check(const char *sql)
{
	ErrorContextCallback errcallback;

	if (plan_cache != NULL && hash_search(plan_cache, &sql, HASH_FIND, NULL) != NULL)
		return;

	errcallback.callback = business_sql_error_callback;
	errcallback.arg = unconstify(char *, sql);
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	(void) parse_business_sql(sql);

	error_context_stack = errcallback.previous;
}

/*
 * Returns the cached plan of a business SQL text, preparing it if needed.
 * Raises an error, caching nothing, if the text is not acceptable.
 */
BusinessPlan *
business_plan_get(const char *sql)
{
	BusinessPlan *bplan;

	if (plan_cache == NULL)
		plan_cache_create();

	/*
	 * A consumer mostly applies one SQL text call after call: comparing it
	 * with the most recently used plan's spares hashing the whole text.
	 */
	bplan = dlist_is_empty(&plan_lru) ? NULL :
		dlist_head_element(BusinessPlan, lru_node, &plan_lru);
	if (bplan == NULL || strcmp(bplan->sql, sql) != 0)
		bplan = hash_search(plan_cache, &sql, HASH_FIND, NULL);
	if (bplan != NULL)
	{
		dlist_move_head(&plan_lru, &bplan->lru_node);
		business_plan_measure(bplan);
	}
	else
		bplan = business_plan_create(sql);
	plan_cache_evict();
	return bplan;
}

/*
 * Adds the parameter being converted to an error's context.
 */
static void
bind_error_callback(void *arg)
{
	BindErrorContext *ctx = (BindErrorContext *) arg;

	errcontext("idem_apply parameter $%d of type %s",
			   ctx->paramno, format_type_be(ctx->paramtype));
}

/*
 * Raises an error unless a params array has at most one dimension.
 */
void
business_params_check(ArrayType *params)
{
	if (ARR_NDIM(params) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("params must be a one-dimensional array"),
				 errdetail("The array has %d dimensions.", ARR_NDIM(params))));
}

/*
 * Returns a text parameter as a C string for its input function: in buf
 * when it fits there.  The elements of a flat array are never compressed
 * or out of line, but may have a short header.
 */
static char *
param_cstring(const text *value, char *buf, Size bufsize)
{
	Size		len = VARSIZE_ANY_EXHDR(value);
	char	   *str = len < bufsize ? buf : palloc(len + 1);

	Assert(!VARATT_IS_EXTENDED(value) || VARATT_IS_SHORT(value));
	memcpy(str, VARDATA_ANY(value), len);
	str[len] = '\0';
	return str;
}

/*
 * Converts the caller's text parameters to the plan's parameter types.
 *
 * The array is walked in place and each value copied to a buffer on the
 * stack for its input function, as COPY reuses one buffer for every
 * field (an input function does not keep its string): no array of
 * elements and no string is allocated per call (test/bench/instructions).
 */
ParamListInfo
business_plan_bind(BusinessPlan *bplan, ArrayType *params)
{
	int			nelems = 0;
	char	   *elem = NULL;
	bits8	   *nulls = NULL;
	char		buf[128];
	ParamListInfo param_list;
	BindErrorContext bind_ctx;
	ErrorContextCallback errcallback;

	if (params != NULL)
	{
		business_params_check(params);
		Assert(ARR_ELEMTYPE(params) == TEXTOID);
		nelems = ArrayGetNItems(ARR_NDIM(params), ARR_DIMS(params));
		elem = ARR_DATA_PTR(params);
		nulls = ARR_NULLBITMAP(params);
	}

	if (nelems != bplan->nargs)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("number of params (%d) does not match the number of parameters in sql (%d)",
						nelems, bplan->nargs),
				 bplan->nargs > 0 ?
				 errhint("Pass one element for each of $1 to $%d; a NULL element is an SQL NULL.",
						 bplan->nargs) :
				 errhint("The sql has no parameters: pass params => NULL.")));

	param_list = makeParamList(nelems);

	errcallback.callback = bind_error_callback;
	errcallback.arg = &bind_ctx;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	for (int i = 0; i < nelems; i++)
	{
		ParamExternData *param = &param_list->params[i];
		bool		isnull = nulls != NULL && att_isnull(i, nulls);
		char	   *value = NULL;

		if (!isnull)
		{
			value = param_cstring((const text *) elem, buf, sizeof(buf));
			elem = att_addlength_pointer(elem, -1, elem);
			elem = (char *) att_align_nominal(elem, TYPALIGN_INT);
		}

		bind_ctx.paramno = i + 1;
		bind_ctx.paramtype = bplan->argtypes[i];

		/* called for NULL too, so that domain constraints are checked */
		param->value = InputFunctionCall(&bplan->input_funcs[i], value,
										 bplan->input_ioparams[i], -1);
		param->isnull = isnull;
		param->pflags = PARAM_FLAG_CONST;
		param->ptype = bplan->argtypes[i];
		if (value != NULL && value != buf)
			pfree(value);
	}

	error_context_stack = errcallback.previous;

	return param_list;
}

/*
 * Returns the hashers of a business plan's message fingerprint.
 */
ParamHashers *
business_plan_hashers(BusinessPlan *bplan)
{
	return bplan->hashers;
}

/*
 * Runs a business plan as the current user, discarding any result rows;
 * returns the rows it affected, as its command tag counts them.
 *
 * Every caller runs business SQL through here, at a GUC nesting level of
 * its own: whatever it sets with set_config(), for the session or for the
 * transaction, ends with it, as a maintenance command undoes what the
 * functions it runs set.  Business SQL could otherwise leave the caller's
 * session with another search_path.  An error leaves the level to the
 * abort of the (sub)transaction that catches it, which undoes it too.
 */
uint64
business_plan_execute(BusinessPlan *bplan, ParamListInfo params)
{
	SPIExecuteOptions options;
	int			save_nestlevel;
	uint64		processed;

	memset(&options, 0, sizeof(options));
	options.params = params;
	options.read_only = false;
	options.dest = None_Receiver;

	executing_depth++;
	save_nestlevel = NewGUCNestLevel();
	PG_TRY();
	{
		int			rc = SPI_execute_plan_extended(bplan->plan, &options);

		if (rc < 0)
			elog(ERROR, "SPI_execute_plan_extended failed: %s",
				 SPI_result_code_string(rc));
	}
	PG_FINALLY();
	{
		executing_depth--;
	}
	PG_END_TRY();
	processed = SPI_processed;
	AtEOXact_GUC(false, save_nestlevel);
	return processed;
}

/*
 * Returns whether a business SQL text is a CALL statement.  The text has
 * passed business_sql_check(); a cached one is not parsed again.
 */
bool
business_sql_is_call(const char *sql)
{
	BusinessPlan *bplan = NULL;
	ErrorContextCallback errcallback;
	RawStmt    *raw;

	if (plan_cache != NULL)
		bplan = hash_search(plan_cache, &sql, HASH_FIND, NULL);
	if (bplan != NULL)
	{
		List	   *sources = SPI_plan_get_plan_sources(bplan->plan);

		return sources != NIL &&
			((CachedPlanSource *) linitial(sources))->commandTag == CMDTAG_CALL;
	}

	errcallback.callback = business_sql_error_callback;
	errcallback.arg = unconstify(char *, sql);
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;

	raw = parse_business_sql(sql);

	error_context_stack = errcallback.previous;
	return IsA(raw->stmt, CallStmt);
}

/*
 * Defines idem_consumer.plan_cache_size; called once from _PG_init.
 */
void
plan_cache_init(void)
{
	DefineCustomIntVariable("idem_consumer.plan_cache_size",
							"Sets how many business SQL texts a session keeps prepared plans for.",
							"The least recently used plan is dropped when the limit is reached.",
							&plan_cache_size,
							256,
							1,
							65536,
							PGC_USERSET,
							0,
							NULL,
							NULL,
							NULL);
	DefineCustomIntVariable("idem_consumer.plan_cache_memory",
							"Sets how much memory the prepared plans of business SQL may hold in a session.",
							"The least recently used plans are dropped when the limit is reached; "
							"the plan in use is kept.",
							&plan_cache_memory,
							32 * 1024,
							64,
							MAX_KILOBYTES,
							PGC_SUSET,
							GUC_UNIT_KB,
							NULL,
							NULL,
							NULL);
}
