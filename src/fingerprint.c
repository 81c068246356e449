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
 * This file only computes and compares; the key store keeps the values.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

/* SQLSTATE of a key reused by another message. */
#define ERRCODE_KEY_REUSED		MAKE_SQLSTATE('I','K','0','0','1')

/* Marks a NULL parameter, so that NULL and '' hash differently. */
#define NULL_PARAM_HASH			0x6e756c6cU

/* Seed of explicit fingerprints, so that they never equal a computed one by design. */
#define EXPLICIT_SEED			0x66707274U

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
 * Returns the fingerprint of a call of idem_apply or idem_try_apply: of
 * the caller's fingerprint text when it gave one, else of the message.
 */
int32
fingerprint_of_call(text *explicit_fingerprint, const char *sql,
					ArrayType *params)
{
	return explicit_fingerprint != NULL ?
		fingerprint_of_text(explicit_fingerprint) :
		fingerprint_of_message(sql, params);
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
 * Raises the key-reuse error.
 */
void
fingerprint_refuse(const char *consumer, text *key, int32 fingerprint,
				   const RecordedKey *recorded)
{
	TimestampTz recorded_at =
		(TimestampTz) recorded->processed_at * USECS_PER_SEC;

	ereport(ERROR,
			(errcode(ERRCODE_KEY_REUSED),
			 errmsg("key \"%s\" of consumer \"%s\" was recorded for another message",
					text_to_cstring(key), consumer),
			 errdetail("The key was recorded at %s with message fingerprint %08x; this message's fingerprint is %08x.",
					   timestamptz_to_str(recorded_at),
					   (uint32) recorded->fingerprint, (uint32) fingerprint),
			 errhint("Give every message a key of its own; pass the fingerprint argument if the parameters of one message vary between deliveries, "
					 "or turn the check off with idem_set_fingerprint().")));
}

/*
 * Returns the key-reuse error as ErrorData, for idem_try_apply() to park
 * the message with it.  Nothing runs between raising and catching it, so
 * no subtransaction is needed to clean up after it.
 */
ErrorData *
fingerprint_refusal(const char *consumer, text *key, int32 fingerprint,
					const RecordedKey *recorded)
{
	MemoryContext cxt = CurrentMemoryContext;
	ErrorData  *volatile edata = NULL;

	PG_TRY();
	{
		fingerprint_refuse(consumer, key, fingerprint, recorded);
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
	}
	PG_END_TRY();
	return edata;
}
