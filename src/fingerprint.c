/*-------------------------------------------------------------------------
 *
 * fingerprint.c
 *	  Fingerprints of messages, and the error of a key reused by another
 *	  message.
 *
 * A producer that gives two different messages one key (a bug, or a key
 * built without one of the fields that tell messages apart) would have the
 * second silently skipped as a duplicate.  So every recorded key keeps a
 * 32-bit fingerprint of its message, and a redelivery whose fingerprint
 * differs is refused with SQLSTATE IK001 instead.  By default the
 * fingerprint is a hash of the business SQL text and its parameter values,
 * which a redelivery repeats exactly; a caller whose parameters vary
 * between deliveries of one message (a timestamp taken at delivery, say)
 * passes its own fingerprint text instead.  Two different messages share a
 * fingerprint with a chance of one in 2^32, so the check misses about one
 * reused key in four billion and never refuses a true redelivery.
 *
 * From 1.2 on, idem_apply() hashes the parameters as the typed values they
 * are bound to, through each type's own equality (its extended hash
 * support function, else its binary send form), so that a redelivery
 * that writes a value another way (10.0 and 10.00, a timestamptz with
 * another offset, json or jsonb with keys in another order) is still the
 * same message.  Keys recorded by 1.1 hold the hash of the parameters' text;
 * fingerprint_admits() also accepts that one.  What the typed hash looks
 * up (the SQL text's hash, each parameter type's hash function) is kept
 * with the business plan and looked up again after an invalidation that
 * could change it, so that a call only runs the hash functions.
 *
 * This file only computes and compares; the key store keeps the values.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/fingerprint.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "nodes/params.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/typcache.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

/* SQLSTATE of a key reused by another message. */
#define ERRCODE_KEY_REUSED		MAKE_SQLSTATE('I','K','0','0','1')

/* Marks a NULL parameter, so that NULL and '' hash differently. */
#define NULL_PARAM_HASH			0x6e756c6cU

/* Seed of explicit fingerprints, so that they never equal a computed one by design. */
#define EXPLICIT_SEED			0x66707274U

/* Seed of fingerprints of bound (typed) parameters. */
#define TYPED_SEED				0x74797065U

/*
 * Returns the fingerprint of a message: its SQL text and parameter values
 * (NULL params as no parameters).
 */
int32
fingerprint_of_message(const char *sql, ArrayType *params)
{
	uint32		hash = hash_bytes((const unsigned char *) sql, strlen(sql));

	if (params != NULL && ARR_NDIM(params) > 0)
	{
		Datum	   *elems;
		bool	   *nulls;
		int			nelems;

		deconstruct_array(params, TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, &nulls, &nelems);
		hash = hash_combine(hash, hash_bytes_uint32((uint32) nelems));
		for (int i = 0; i < nelems; i++)
		{
			text	   *value;

			if (nulls[i])
			{
				hash = hash_combine(hash, NULL_PARAM_HASH);
				continue;
			}
			value = DatumGetTextPP(elems[i]);
			hash = hash_combine(hash, hash_bytes((const unsigned char *) VARDATA_ANY(value),
												 VARSIZE_ANY_EXHDR(value)));
		}
	}
	return (int32) hash;
}

/*
 * How the values of one parameter type are hashed (see param_hasher_prepare).
 */
typedef enum ParamHashMethod
{
	PARAM_HASH_EXTENDED,		/* the type's extended hash support function */
	PARAM_HASH_SEND,			/* hash of its binary send form */
	PARAM_HASH_OUTPUT,			/* hash of its output text */
	PARAM_HASH_JSON				/* json (or a domain over it) hashed as jsonb */
} ParamHashMethod;

typedef struct ParamHasher
{
	Oid			typid;
	uint64		generation;		/* hashers_generation when prepared; 0: never */
	ParamHashMethod method;
	Oid			collation;
	FmgrInfo	func;			/* fn_oid is InvalidOid until first set up */
} ParamHasher;

/*
 * What a business plan's typed fingerprint needs, kept with the plan so
 * that a call only runs the hash functions: the hash of its SQL text and,
 * per parameter, the function that hashes its values.  A plan's parameter
 * types never change (plan_cache.c), but the function a type is hashed by
 * can, with DDL on the type or its operator classes; so each parameter is
 * prepared again after any invalidation that could change what the type
 * cache and the catalogs say (see fingerprint_init).
 */
struct ParamHashers
{
	MemoryContext cxt;			/* the plan cache's, for the FmgrInfos */
	uint32		sql_hash;
	int			nargs;
	ParamHasher hashers[FLEXIBLE_ARRAY_MEMBER];
};

/*
 * Counts the invalidations that may change how a type is hashed; a
 * prepared parameter whose generation differs is prepared again.
 */
static uint64 hashers_generation = 1;

/*
 * Returns the hashers of a business plan's parameters, prepared at their
 * first non-NULL value, in cxt, where the plan cache keeps the plan.
 */
ParamHashers *
fingerprint_hashers_create(MemoryContext cxt, const char *sql, int nargs,
						   const Oid *argtypes)
{
	ParamHashers *hashers = MemoryContextAllocZero(cxt,
												   offsetof(ParamHashers, hashers) +
												   Max(nargs, 1) * sizeof(ParamHasher));

	hashers->cxt = cxt;
	hashers->sql_hash = hash_bytes((const unsigned char *) sql, strlen(sql));
	hashers->nargs = nargs;
	for (int i = 0; i < nargs; i++)
	{
		hashers->hashers[i].typid = argtypes[i];
		hashers->hashers[i].func.fn_oid = InvalidOid;
	}
	return hashers;
}

/*
 * Frees the hashers of an evicted plan.
 */
void
fingerprint_hashers_free(ParamHashers *hashers)
{
	pfree(hashers);
}

/*
 * Works out how the values of a parameter's type are hashed: by the type's
 * extended hash (values equal by the type's default equality hash alike),
 * else by its binary send form, else by its output text, which input
 * conversion has made canonical for most types.  Looked up at the first
 * non-NULL value, as before every one, so a type that cannot be hashed
 * raises the same error at the same call.  The function's FmgrInfo is set
 * up again only when the function changes, as the type cache does, so
 * that preparing again after an unrelated invalidation allocates nothing.
 */
static void
param_hasher_prepare(ParamHashers *hashers, ParamHasher *h)
{
	/* taken first: an invalidation the lookups accept prepares it again */
	uint64		generation = hashers_generation;
	TypeCacheEntry *typentry = lookup_type_cache(h->typid,
												 TYPECACHE_HASH_EXTENDED_PROC);
	ParamHashMethod method;
	Oid			func;
	Oid			collation = InvalidOid;
	bool		isvarlena;

	if (getBaseType(h->typid) == JSONOID)
	{
		/*
		 * json keeps its text as written, so two drivers writing one object
		 * (spacing, key order) would be two messages: it is compared as the
		 * jsonb it means, the type the documentation speaks of.
		 */
		method = PARAM_HASH_JSON;
		func = lookup_type_cache(JSONBOID, TYPECACHE_HASH_EXTENDED_PROC)->hash_extended_proc;
	}
	else if (OidIsValid(typentry->hash_extended_proc))
	{
		method = PARAM_HASH_EXTENDED;
		func = typentry->hash_extended_proc;
		collation = typentry->typcollation;
	}
	else
	{
		getTypeBinaryOutputInfo(h->typid, &func, &isvarlena);
		method = PARAM_HASH_SEND;
		if (!OidIsValid(func))
		{
			getTypeOutputInfo(h->typid, &func, &isvarlena);
			method = PARAM_HASH_OUTPUT;
		}
	}
	if (h->func.fn_oid != func)
		fmgr_info_cxt(func, &h->func, hashers->cxt);
	h->method = method;
	h->collation = collation;
	h->generation = generation;
}

/*
 * Returns the hash of one non-NULL bound value of a prepared parameter.
 */
static uint32
typed_value_hash(ParamHasher *h, Datum value)
{
	switch (h->method)
	{
		case PARAM_HASH_EXTENDED:
			return (uint32) DatumGetUInt64(FunctionCall2Coll(&h->func, h->collation,
															 value, Int64GetDatum(0)));
		case PARAM_HASH_SEND:
			{
				bytea	   *bytes = SendFunctionCall(&h->func, value);

				return hash_bytes((const unsigned char *) VARDATA(bytes),
								  VARSIZE(bytes) - VARHDRSZ);
			}
		case PARAM_HASH_OUTPUT:
			{
				char	   *str = OutputFunctionCall(&h->func, value);

				return hash_bytes((const unsigned char *) str, strlen(str));
			}
		case PARAM_HASH_JSON:
			{
				char	   *str = TextDatumGetCString(value);

				/*
				 * Some \u escapes json takes are refused by jsonb (\u0000,
				 * lone surrogates, non-ASCII in another server encoding):
				 * such a value is compared as written rather than fail.
				 */
				if (strstr(str, "\\u") != NULL)
					return hash_bytes((const unsigned char *) str, strlen(str));
				return (uint32) DatumGetUInt64(FunctionCall2(&h->func,
															 DirectFunctionCall1(jsonb_in, CStringGetDatum(str)),
															 Int64GetDatum(0)));
			}
	}
	pg_unreachable();
}

/*
 * Returns the fingerprint of a message from its plan's hashers (its SQL
 * text and parameter types) and its bound parameters (see
 * business_plan_bind): the parameter types go in with the values, so that
 * a hash is always of a value of a known type.
 */
int32
fingerprint_of_bound(ParamHashers *hashers, ParamListInfo params)
{
	/* a seed of its own, so that a bound hash is not a text one by design */
	uint32		hash = hash_combine(TYPED_SEED, hashers->sql_hash);
	int			nparams = params != NULL ? params->numParams : 0;

	if (nparams != hashers->nargs)
		elog(ERROR, "bound parameters (%d) do not match the plan's (%d)",
			 nparams, hashers->nargs);
	hash = hash_combine(hash, hash_bytes_uint32((uint32) nparams));
	for (int i = 0; i < nparams; i++)
	{
		ParamExternData *param = &params->params[i];
		ParamHasher *h = &hashers->hashers[i];

		if (param->ptype != h->typid)
			elog(ERROR, "bound parameter $%d is of type %u, the plan's of type %u",
				 i + 1, param->ptype, h->typid);
		hash = hash_combine(hash, hash_bytes_uint32((uint32) param->ptype));
		if (param->isnull)
			hash = hash_combine(hash, NULL_PARAM_HASH);
		else
		{
			if (h->generation != hashers_generation)
				param_hasher_prepare(hashers, h);
			hash = hash_combine(hash, typed_value_hash(h, param->value));
		}
	}
	return (int32) hash;
}

/*
 * Makes every prepared parameter be prepared again: called for every
 * invalidation of pg_type (a type's send function, collation) and of
 * pg_opclass (a default hash operator class), where the type cache forgets
 * what it knows of hash functions, and of pg_attribute (the columns of a
 * composite type, which decide whether it has an extended hash).
 *
 * The columns are followed through pg_attribute's cache rather than by a
 * relcache callback: a process has room for ten of those, and in a
 * walsender the logical decoding plugin and Citus need theirs beside this
 * library's (a shard move's replication failed with "out of
 * relcache_callback_list slots" when this was one).
 */
static void
hashers_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	hashers_generation++;
}

/*
 * Registers the invalidation callbacks; called once from _PG_init.
 */
void
fingerprint_init(void)
{
	CacheRegisterSyscacheCallback(TYPEOID, hashers_syscache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(CLAOID, hashers_syscache_callback, (Datum) 0);
	CacheRegisterSyscacheCallback(ATTNUM, hashers_syscache_callback, (Datum) 0);
}

/*
 * Returns whether a recorded key's fingerprint admits this message, whose
 * typed fingerprint is fingerprint: a key recorded without a fingerprint
 * admits any.  A key recorded by 1.1 holds the hash of the parameters'
 * text, so on a mismatch the text hash is tried too.  That is safe for
 * keys recorded from 1.2 on as well: an exact redelivery matches the typed
 * hash first, and another message passes the text hash check only by the
 * same one in 2^32 chance that lets it pass the typed one, so the check is
 * no weaker; and it costs nothing on the paths that find no mismatch.
 */
bool
fingerprint_admits(text *explicit_fingerprint, int32 fingerprint,
				   const RecordedKey *recorded, const char *sql,
				   ArrayType *params)
{
	if (!fingerprint_differs(fingerprint, recorded))
		return true;
	return explicit_fingerprint == NULL &&
		fingerprint_of_message(sql, params) == recorded->fingerprint;
}

/*
 * Returns the fingerprint of a call whose parameters are bound: of the
 * caller's fingerprint text when it gave one, else of the typed message.
 */
int32
fingerprint_of_bound_call(text *explicit_fingerprint, ParamHashers *hashers,
						  ParamListInfo params)
{
	return explicit_fingerprint != NULL ?
		fingerprint_of_text(explicit_fingerprint) :
		fingerprint_of_bound(hashers, params);
}

/*
 * Returns the fingerprint of a caller's fingerprint text.
 */
int32
fingerprint_of_text(text *fingerprint)
{
	return (int32) hash_combine(EXPLICIT_SEED,
								hash_bytes((const unsigned char *) VARDATA_ANY(fingerprint),
										   VARSIZE_ANY_EXHDR(fingerprint)));
}

/*
 * Returns whether a recorded key was recorded for another message.  A key
 * recorded without a fingerprint is never said to differ.
 */
bool
fingerprint_differs(int32 fingerprint, const RecordedKey *recorded)
{
	return recorded->has_fingerprint && recorded->fingerprint != fingerprint;
}

/*
 * Returns the key-reuse error as ErrorData, built without raising it: for
 * idem_try_apply() to park the message with it, and for
 * fingerprint_raise_key_reuse() to throw.  Catching a raised error instead
 * would take a subtransaction to clean up after it, on every parked key.
 */
ErrorData *
fingerprint_key_reuse_error(const char *consumer, text *key, int32 fingerprint,
							const RecordedKey *recorded)
{
	ErrorData  *edata = palloc0(sizeof(ErrorData));
	TimestampTz recorded_at =
		(TimestampTz) recorded->processed_at * USECS_PER_SEC;

	edata->elevel = ERROR;
	edata->output_to_server = false;
	edata->output_to_client = true;
	edata->filename = __FILE__;
	edata->lineno = __LINE__;
	edata->funcname = __func__;
	edata->sqlerrcode = ERRCODE_KEY_REUSED;
	edata->message = psprintf("key \"%s\" of consumer \"%s\" was recorded for another message",
							  text_to_cstring(key), consumer);
	edata->detail = psprintf("The key was recorded at %s with message fingerprint %08x; this message's fingerprint is %08x.",
							 timestamptz_to_str(recorded_at),
							 (uint32) recorded->fingerprint, (uint32) fingerprint);
	edata->hint = pstrdup("Give every message a key of its own; pass the fingerprint argument if the parameters of one message vary between deliveries, "
						  "or turn the check off with idem_set_fingerprint().");
	edata->assoc_context = CurrentMemoryContext;
	return edata;
}

/*
 * Raises the key-reuse error.
 */
void
fingerprint_raise_key_reuse(const char *consumer, text *key, int32 fingerprint,
							const RecordedKey *recorded)
{
	ThrowErrorData(fingerprint_key_reuse_error(consumer, key, fingerprint, recorded));
	pg_unreachable();
}
