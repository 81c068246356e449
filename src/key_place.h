/*-------------------------------------------------------------------------
 *
 * key_place.h
 *	  Where a message's key lives, and the one interface over the key
 *	  store: the local store (keystore.c: the consumer's id and the seeded
 *	  hash, in generations; dead_letters) or the routed one (routed.c: the
 *	  route, the consumer's name and the key; routed_dead_letters).  A call
 *	  resolves its KeyPlace once, from its arguments (key_place_resolve.c),
 *	  and then calls the operations of the place's ops, the local or the
 *	  routed ones, through the functions below: nothing above the key
 *	  store asks which it is.
 *
 * Only types and calls through the ops, so that the files below the
 * resolution (the effects' storage among them) can carry a place.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/key_place.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEY_PLACE_H
#define IDEM_KEY_PLACE_H

#include "postgres.h"

#include "fmgr.h"
#include "utils/array.h"
#include "utils/jsonb.h"

struct RecordedKey;

typedef struct KeyPlace KeyPlace;
typedef struct DeadLetterEntry DeadLetterEntry;

typedef struct KeyPlaceOps
{
	bool		routed;			/* the routed keys' */
	const char *dead_letters_view;	/* where an operator finds the entries */
	/* refuses business SQL run as role where the place cannot have it */
	void		(*admit_role) (const KeyPlace *place, const char *function_name,
							   Oid role);
	bool		(*record) (const KeyPlace *place, text *key,
						   const int32 *fingerprint, struct RecordedKey *recorded);
	void		(*record_batch) (const KeyPlace *place, Datum *keys, Datum *routes,
								 int nkeys, const int32 *fingerprints,
								 const bool *has_fingerprint, bool *isnew,
								 bool *repeated, struct RecordedKey *recorded);
	bool		(*exists) (const KeyPlace *place, text *key);
	bool		(*forget) (const KeyPlace *place, text *key);
	/* the dead letters (dead_letter.c, dead_letter_entry.c) */
	void		(*park) (const KeyPlace *place, text *key, const char *sql,
						 ArrayType *params, NullableDatum event_time,
						 ErrorData *edata, int64 expect_rows);
	char	   *(*entry_status) (const KeyPlace *place, text *key);
	bool		(*lock_entry) (const KeyPlace *place, text *key,
							   const char *function_name, const char *action,
							   DeadLetterEntry *entry);
	bool		(*entry_rearm) (const DeadLetterEntry *entry);
	Oid			(*entry_run_as) (const DeadLetterEntry *entry, char **consumer);
	int64		(*entry_record_key) (const DeadLetterEntry *entry,
									 const char *consumer);
	void		(*entry_mark_run) (const DeadLetterEntry *entry, ErrorData *edata);
	void		(*entry_discard) (const DeadLetterEntry *entry, text *reason);
	/* the effects of the place's keys (effects_store.c) */
	void		(*effect_execute) (int stmt, const KeyPlace *place, text *key,
								   Datum *args, const char *argnulls, int nargs);
	text	   *(*effect_fast_insert) (const KeyPlace *place, text *key,
									   Jsonb *request, int64 lease_us);
	bool		(*effect_fast_complete) (const KeyPlace *place, text *key,
										 int64 fence, Jsonb *result);
	bool		(*effect_park) (const KeyPlace *place, text *key, Datum *args,
								int64 *entry_id);
} KeyPlaceOps;

struct KeyPlace
{
	const KeyPlaceOps *ops;
	const char *consumer;
	int32		consumer_id;	/* this node's id; 0 until looked up */
	Datum		route;			/* where keys are routed */
	Oid			route_type;		/* where keys are routed */
};

/* What a call without its route is where keys are routed. */
typedef enum KeyPlaceUnrouted
{
	UNROUTED_REFUSED,			/* refused: a key without its route */
	UNROUTED_LOCAL				/* the node's own: the dead letters of a key */
} KeyPlaceUnrouted;

extern void key_place_resolve(FunctionCallInfo fcinfo, int route_argno,
							  const char *consumer, KeyPlaceUnrouted unrouted,
							  KeyPlace *place);
extern void key_place_resolve_routes(FunctionCallInfo fcinfo, int routes_argno,
									 int nkeys, const char *consumer,
									 Datum **routes, KeyPlace *place);
extern void key_place_resolve_effect(FunctionCallInfo fcinfo, int route_argno,
									 const char *consumer, const char *function_name,
									 KeyPlace *place);
extern bool key_place_every_route(const char *consumer, KeyPlace *place);
extern int32 key_place_consumer_id(const KeyPlace *place);
extern void key_place_local(int32 consumer_id, const char *consumer,
							KeyPlace *place);

static inline bool
key_place_routed(const KeyPlace *place)
{
	return place->ops->routed;
}

static inline void
key_place_admit_role(const KeyPlace *place, const char *function_name, Oid role)
{
	place->ops->admit_role(place, function_name, role);
}

static inline bool
key_place_record(const KeyPlace *place, text *key, const int32 *fingerprint,
				 struct RecordedKey *recorded)
{
	return place->ops->record(place, key, fingerprint, recorded);
}

static inline bool
key_place_exists(const KeyPlace *place, text *key)
{
	return place->ops->exists(place, key);
}

static inline bool
key_place_forget(const KeyPlace *place, text *key)
{
	return place->ops->forget(place, key);
}

static inline void
key_place_park(const KeyPlace *place, text *key, const char *sql,
			   ArrayType *params, NullableDatum event_time, ErrorData *edata,
			   int64 expect_rows)
{
	place->ops->park(place, key, sql, params, event_time, edata, expect_rows);
}

static inline char *
key_place_entry_status(const KeyPlace *place, text *key)
{
	return place->ops->entry_status(place, key);
}

#endif							/* IDEM_KEY_PLACE_H */
