/*-------------------------------------------------------------------------
 *
 * key_place_resolve.c
 *	  Where a message's key lives, resolved once per call from the call's
 *	  arguments, and the two implementations of the key store's interface
 *	  (KeyPlaceOps, key_place.h): the local keys of keystore.c, under
 *	  this node's consumer id, with the node's dead-letter queue, and the
 *	  routed keys of routed.c, under the route, for Citus, with the routed
 *	  dead letters.  Owns the choice between them and the refusal of a
 *	  call without its route where keys are routed; the SQL functions above
 *	  call the place's operations and never ask which store it is.
 *
 * The operations themselves are the key store's (keystore.c,
 * keystore_batch.c, keystore_remove.c, routed.c) and the dead letters'
 * (dead_letter.c, dead_letter_entry.c); this file only puts each under
 * its place.  Whether keys are routed is routing.c's to say.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/key_place_resolve.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"

#include "dead_letter.h"
#include "effects_store.h"

/* Business SQL of any role may run beside a local key. */
static void
local_admit_role(const KeyPlace *place, const char *function_name, Oid role)
{
}

static void
routed_admit_role(const KeyPlace *place, const char *function_name, Oid role)
{
	routed_refuse_two_roles(function_name, place->consumer, role);
}

static bool
local_record(const KeyPlace *place, text *key, const int32 *fingerprint,
			 RecordedKey *recorded)
{
	return keystore_record_key_fp(place->consumer_id, key, fingerprint, recorded);
}

static bool
routed_record(const KeyPlace *place, text *key, const int32 *fingerprint,
			  RecordedKey *recorded)
{
	return routed_record_key(place->route, place->route_type, place->consumer,
							 key, fingerprint, recorded);
}

/*
 * Records the keys of a batch in the order of the unique index
 * (keystore_batch.c); routes are not used.  No key is marked repeated
 * here: the key store handles a key repeated in the batch itself
 * (keystore_record_keys).
 */
static void
local_record_batch(const KeyPlace *place, Datum *keys, Datum *routes, int nkeys,
				   const int32 *fingerprints, const bool *has_fingerprint,
				   bool *isnew, bool *repeated, RecordedKey *recorded)
{
	text	  **key_texts = palloc(nkeys * sizeof(text *));

	for (int i = 0; i < nkeys; i++)
		key_texts[i] = DatumGetTextPP(keys[i]);
	keystore_record_keys(place->consumer_id, key_texts, nkeys, fingerprints,
						 has_fingerprint, false, isnew, recorded);
}

static void
routed_record_batch(const KeyPlace *place, Datum *keys, Datum *routes, int nkeys,
					const int32 *fingerprints, const bool *has_fingerprint,
					bool *isnew, bool *repeated, RecordedKey *recorded)
{
	routed_record_keys(place->consumer, keys, routes, place->route_type, nkeys,
					   fingerprints, has_fingerprint, isnew, repeated, recorded);
}

static bool
local_exists(const KeyPlace *place, text *key)
{
	return keystore_key_exists(place->consumer_id, key);
}

static bool
routed_exists(const KeyPlace *place, text *key)
{
	return routed_key_exists(place->route, place->route_type, place->consumer, key);
}

static bool
local_forget(const KeyPlace *place, text *key)
{
	return keystore_forget_key(place->consumer_id, key);
}

static bool
routed_forget(const KeyPlace *place, text *key)
{
	return routed_forget_key(place->route, place->route_type, place->consumer, key);
}

static const KeyPlaceOps local_ops = {
	.routed = false,
	.dead_letters_view = "idem_dead_letters",
	.admit_role = local_admit_role,
	.record = local_record,
	.record_batch = local_record_batch,
	.exists = local_exists,
	.forget = local_forget,
	.park = dead_letter_park_local,
	.entry_status = dead_letter_status_local,
	.lock_entry = dead_letter_lock_local,
	.entry_rearm = dead_letter_rearm_local,
	.entry_run_as = dead_letter_run_as_local,
	.entry_record_key = dead_letter_record_key_local,
	.entry_mark_run = dead_letter_mark_run_local,
	.entry_discard = dead_letter_discard_local,
	.effect_execute = effects_execute_local,
	.effect_fast_insert = effects_fast_insert_local,
	.effect_fast_complete = effects_fast_complete_local,
	.effect_park = effects_park_local,
};

static const KeyPlaceOps routed_ops = {
	.routed = true,
	.dead_letters_view = "idem_routed_dead_letters",
	.admit_role = routed_admit_role,
	.record = routed_record,
	.record_batch = routed_record_batch,
	.exists = routed_exists,
	.forget = routed_forget,
	.park = dead_letter_park_routed,
	.entry_status = dead_letter_status_routed,
	.lock_entry = dead_letter_lock_routed,
	.entry_rearm = dead_letter_rearm_routed,
	.entry_run_as = dead_letter_run_as_routed,
	.entry_record_key = dead_letter_record_key_routed,
	.entry_mark_run = dead_letter_mark_run_routed,
	.entry_discard = dead_letter_discard_routed,
	.effect_execute = effects_execute_routed_at,
	.effect_fast_insert = effects_fast_insert_none,
	.effect_fast_complete = effects_fast_complete_none,
	.effect_park = effects_park_routed,
};

/*
 * Sets place to the local place of a consumer, the node's own keys and
 * dead letters (consumer_id 0: not looked up yet; consumer NULL: not
 * known yet, for an entry read by its id).
 */
void
key_place_local(int32 consumer_id, const char *consumer, KeyPlace *place)
{
	place->ops = &local_ops;
	place->consumer = consumer;
	place->consumer_id = consumer_id;
	place->route = (Datum) 0;
	place->route_type = InvalidOid;
}

/*
 * Resolves where the key of a call on consumer lives, from the route at
 * route_argno (the last argument of the 1.2 functions; past the end for
 * the older ones): beside its route where the call gives one and keys are
 * routed in this database, else the node's own.  A route of a type the
 * keys' route cannot take is refused (routed_get_route_arg).  Returns
 * whether the call gave a route that is used.
 */
static bool
resolve_route(FunctionCallInfo fcinfo, int route_argno, const char *consumer,
			  KeyPlace *place)
{
	key_place_local(0, consumer, place);
	/* the usual call has no route: it costs no call (test/bench/instructions) */
	if (route_argno < PG_NARGS() && !PG_ARGISNULL(route_argno) &&
		routed_get_route_arg(fcinfo, route_argno, &place->route, &place->route_type))
	{
		place->ops = &routed_ops;
		return true;
	}
	return false;
}

/*
 * Resolves where the key of a call on consumer lives (resolve_route),
 * refusing a call without its route where keys are routed, unless
 * unrouted says that such a call is the node's own.
 */
void
key_place_resolve(FunctionCallInfo fcinfo, int route_argno, const char *consumer,
				  KeyPlaceUnrouted unrouted, KeyPlace *place)
{
	if (!resolve_route(fcinfo, route_argno, consumer, place) &&
		unrouted == UNROUTED_REFUSED)
		routed_refuse_unrouted(NULL);
}

/*
 * Resolves where the effect of a call of function_name on consumer lives,
 * beside its key: refuses an effect without its route where keys are
 * routed.
 */
void
key_place_resolve_effect(FunctionCallInfo fcinfo, int route_argno,
						 const char *consumer, const char *function_name,
						 KeyPlace *place)
{
	if (!resolve_route(fcinfo, route_argno, consumer, place))
		routed_refuse_unrouted(function_name);
}

/*
 * Sets place to every route of consumer, with the routes' type and no
 * route, where keys are routed, and returns true; else to the node's own
 * place, returning false.
 */
bool
key_place_every_route(const char *consumer, KeyPlace *place)
{
	key_place_local(0, consumer, place);
	place->route_type = routed_route_type();
	if (!OidIsValid(place->route_type))
		return false;
	place->ops = &routed_ops;
	return true;
}

/*
 * Resolves where the keys of a batch on consumer live, from the routes at
 * routes_argno, one per key of the nkeys (routed_get_routes_arg), set in
 * *routes where keys are routed (else NULL); the place's route type is
 * then theirs.
 * A batch without its routes is refused where keys are routed, but for
 * an empty one, which records nothing.
 */
void
key_place_resolve_routes(FunctionCallInfo fcinfo, int routes_argno, int nkeys,
						 const char *consumer, Datum **routes, KeyPlace *place)
{
	key_place_local(0, consumer, place);
	if (routed_get_routes_arg(fcinfo, routes_argno, nkeys, routes, &place->route_type))
		place->ops = &routed_ops;
	else
	{
		/* read only to be checked: where keys are not routed, ignored */
		*routes = NULL;
		if (nkeys > 0)
			routed_refuse_unrouted(NULL);
	}
}

/*
 * This node's id of the place's consumer, 0 if it has none; where keys are
 * routed the consumer is registered here if this node has not seen it:
 * routed keys, entries and effects are in their shards whatever node
 * registered their consumer.
 */
int32
key_place_consumer_id(const KeyPlace *place)
{
	return keystore_consumer_id(place->consumer, place->ops->routed);
}
