/*-------------------------------------------------------------------------
 *
 * effects_store.c
 *	  Storage of external effects: reading an effect row into an
 *	  EffectRow, and the operations on the rows through the statements of
 *	  effects_store_sql.c, in effects or, where keys are routed (routed.c),
 *	  in routed_effects: an inline effect's insert, the due effects of the
 *	  outbox, retry policies, and parking a dead effect in the dead-letter
 *	  queue and re-arming it.
 *
 * Each statement on one effect runs at the place of its key (key_place.h):
 * the local and the routed place's operations here name the effect by its
 * consumer's id or by its route and consumer's name, and a local effect's
 * insert and completion try the fast path first (effects_fastpath.c); the
 * callers never ask which it is.  The rest of the rows go through the
 * executor as the storage's owner.  What the states mean is effects.c's
 * business.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/effects_store.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "idem_consumer.h"
#include "duration.h"
#include "effects_store.h"
#include "effects_fastpath.h"

static const char *const state_names[] = {
	[ES_PENDING] = "pending",
	[ES_IN_FLIGHT] = "in_flight",
	[ES_WAITING] = "waiting",
	[ES_COMPLETED] = "completed",
	[ES_DEAD] = "dead",
};

/*
 * Returns the name of a state, as stored.
 */
const char *
effect_state_name(EffectState state)
{
	return state_names[state];
}

/*
 * Copies a column of row i of the last result into cxt; NULL for an SQL
 * NULL.  SPI_execute_plan leaves SPI's own context current, which
 * SPI_finish frees, so the context is always named.
 */
static Pointer
column_copy(MemoryContext cxt, uint64 i, int colno)
{
	bool		isnull;
	Datum		value = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
									  colno, &isnull);
	MemoryContext oldcxt;
	Pointer		copy;

	if (isnull)
		return NULL;
	oldcxt = MemoryContextSwitchTo(cxt);
	copy = (Pointer) PG_DETOAST_DATUM_COPY(value);
	MemoryContextSwitchTo(oldcxt);
	return copy;
}

/*
 * Reads a scalar column of row i of the last result; *isnull as given.
 */
static Datum
column_value(uint64 i, int colno, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, colno, isnull);
}

/*
 * Reads row i of the last result, in EFFECT_COLUMNS order, its values
 * copied into row->cxt, which outlives the caller's SPI connection.
 */
void
effect_row_read(uint64 i, EffectRow *row)
{
	bool		isnull;
	text	   *state = DatumGetTextPP(column_value(i, 1, &isnull));

	row->state = ES_PENDING;
	for (int s = 0; s < lengthof(state_names); s++)
		if (VARSIZE_ANY_EXHDR(state) == strlen(state_names[s]) &&
			memcmp(VARDATA_ANY(state), state_names[s], VARSIZE_ANY_EXHDR(state)) == 0)
			row->state = (EffectState) s;
	row->fence = DatumGetInt64(column_value(i, 2, &isnull));
	row->attempts = DatumGetInt32(column_value(i, 3, &isnull));
	row->provider_key = (text *) column_copy(row->cxt, i, 4);
	row->outcome_unknown = DatumGetBool(column_value(i, 5, &isnull));
	row->lease_until = DatumGetTimestampTz(column_value(i, 6, &isnull));
	row->retry_at = DatumGetTimestampTz(column_value(i, 7, &isnull));
	row->has_retry_at = !isnull;
	row->last_error = (text *) column_copy(row->cxt, i, 8);
	row->result = (Jsonb *) column_copy(row->cxt, i, 9);
	row->request = (Jsonb *) column_copy(row->cxt, i, 10);
	row->key = (text *) column_copy(row->cxt, i, 11);
	row->lease_live = DatumGetBool(column_value(i, 12, &isnull)) && !isnull;
	row->due = DatumGetBool(column_value(i, 13, &isnull)) && !isnull;
	row->dead_letter_id = DatumGetInt64(column_value(i, 14, &isnull));
	if (isnull)
		row->dead_letter_id = 0;
}

/*
 * Runs an effect statement with values, whose first nplace name the
 * place, then the key unless it is NULL (EF_LOCK_DUE names none), then
 * args, on the node's effects or, with a route type, on the routed ones.
 */
static void
execute_at(int stmt, Datum *values, int nplace, Oid route_type, text *key,
		   Datum *args, const char *argnulls, int nargs)
{
	char		nulls[STORAGE_MAX_ARGS];
	int			n = nplace;

	Assert(nplace + 1 + nargs <= STORAGE_MAX_ARGS);
	if (key != NULL)
		values[n++] = PointerGetDatum(key);
	memset(nulls, ' ', sizeof(nulls));
	for (int i = 0; i < nargs; i++)
	{
		values[n + i] = args[i];
		if (argnulls != NULL)
			nulls[n + i] = argnulls[i];
	}
	if (OidIsValid(route_type))
		effects_execute_routed((EffectStmt) stmt, route_type, values, nulls);
	else
		effects_execute((EffectStmt) stmt, values, nulls, 0);
}

/*
 * Runs an effect statement on the node's effects: $1 the consumer's id,
 * then the key and args; the local place's effect_execute.
 */
void
effects_execute_local(int stmt, const KeyPlace *at, text *key, Datum *args,
					  const char *argnulls, int nargs)
{
	Datum		values[STORAGE_MAX_ARGS];

	values[0] = Int32GetDatum(at->consumer_id);
	execute_at(stmt, values, 1, InvalidOid, key, args, argnulls, nargs);
}

/*
 * Runs an effect statement on the routed effects: $1 the route, $2 the
 * consumer's name, then the key and args; the routed place's.
 */
void
effects_execute_routed_at(int stmt, const KeyPlace *at, text *key, Datum *args,
						  const char *argnulls, int nargs)
{
	Datum		values[STORAGE_MAX_ARGS];

	values[0] = at->route;
	values[1] = CStringGetTextDatum(at->consumer);
	execute_at(stmt, values, 2, at->route_type, key, args, argnulls, nargs);
}

/*
 * Runs a statement on one effect (its place, then args) and reads the row
 * it returned, if any; returns whether there was one.
 */
bool
effects_fetch(EffectStmt stmt, const EffectPlace *place, Datum *args,
			  const char *argnulls, int nargs, EffectRow *row)
{
	place->at.ops->effect_execute(stmt, &place->at, place->key, args, argnulls, nargs);
	if (SPI_processed == 0)
		return false;
	if (row != NULL)
		effect_row_read(0, row);
	return true;
}

/*
 * The fast paths of the node's effects, without the executor in the plain
 * case (effects_fastpath.c); the routed effects have none.
 */
text *
effects_fast_insert_local(const KeyPlace *at, text *key, Jsonb *request,
						  int64 lease_us)
{
	return effects_fast_insert_leased(effects_table_oid(), at->consumer_id, key,
									  request, lease_us);
}

text *
effects_fast_insert_none(const KeyPlace *at, text *key, Jsonb *request,
						 int64 lease_us)
{
	return NULL;
}

bool
effects_fast_complete_local(const KeyPlace *at, text *key, int64 fence,
							Jsonb *result)
{
	return effects_fast_complete(effects_table_oid(), at->consumer_id, key,
								 fence, result);
}

bool
effects_fast_complete_none(const KeyPlace *at, text *key, int64 fence,
						   Jsonb *result)
{
	return false;
}

/*
 * Stores result as the outcome of the lease under fence; returns false if
 * fence is not the effect's current lease, changing nothing.  A local
 * effect is completed without the executor in the plain case; EF_COMPLETE
 * decides the rest.
 */
bool
effects_complete(const EffectPlace *place, int64 fence, Jsonb *result)
{
	Datum		args[2] = {PointerGetDatum(result), Int64GetDatum(fence)};
	char		argnulls[2] = {result == NULL ? 'n' : ' ', ' '};

	if (place->at.ops->effect_fast_complete(&place->at, place->key, fence, result))
		return true;
	return effects_fetch(EF_COMPLETE, place, args, argnulls, 2, NULL);
}

/*
 * Inserts a new inline effect leased to fence 1 for lease, and fills row
 * as EFFECT_COLUMNS would read it; returns false, row untouched, when the
 * key has a row already.  Only the provider key is read back: reading the
 * whole row would cost a fifth of begin for values known here.
 */
bool
effects_insert_leased(const EffectPlace *place, Jsonb *request,
					  Interval *lease, EffectRow *row)
{
	text	   *provider_key = NULL;
	MemoryContext oldcxt;

	/* the plain case without the executor; the statement decides the rest */
	oldcxt = MemoryContextSwitchTo(row->cxt);
	provider_key = place->at.ops->effect_fast_insert(&place->at, place->key, request,
													 interval_to_us(lease));
	MemoryContextSwitchTo(oldcxt);
	if (provider_key == NULL)
	{
		Datum		args[2] = {PointerGetDatum(request), IntervalPGetDatum(lease)};
		char		nulls[2] = {request == NULL ? 'n' : ' ', ' '};

		if (!effects_fetch(EF_INSERT_LEASED, place, args, nulls, 2, NULL))
			return false;
		provider_key = (text *) column_copy(row->cxt, 0, 1);
	}

	row->state = ES_IN_FLIGHT;
	row->fence = 1;
	row->attempts = 1;
	row->provider_key = provider_key;
	row->outcome_unknown = false;
	row->lease_until = GetCurrentTransactionStartTimestamp() + interval_to_us(lease);
	row->retry_at = 0;
	row->has_retry_at = false;
	row->last_error = NULL;
	row->result = NULL;
	row->request = request;
	row->key = place->key;
	row->lease_live = true;
	row->due = false;
	row->dead_letter_id = 0;
	return true;
}

/*
 * Locks up to max_count due outbox effects of the consumer of place (of
 * its route, if routed), oldest first, skipping those another transaction
 * holds; the rows are SPI's result, to be read by effect_row_read.
 */
void
effects_lock_due(const EffectPlace *place, int32 max_count)
{
	Datum		arg = Int32GetDatum(max_count);

	place->at.ops->effect_execute(EF_LOCK_DUE, &place->at, NULL, &arg, NULL, 1);
}

/*
 * Reads the route and key of the due outbox effects of a consumer on
 * every shard, oldest first, at most max_count, into *routes and *keys
 * (allocated in the current memory context); returns how many.  They are
 * only candidates: each is locked and checked again before a lease.
 */
uint64
effects_routed_due(const char *consumer, int32 max_count, Datum **routes, text ***keys)
{
	Datum		args[2] = {CStringGetTextDatum(consumer), Int32GetDatum(max_count)};
	MemoryContext cxt = CurrentMemoryContext;
	uint64		n;
	int16		typlen;
	bool		typbyval;

	effects_execute_every_route(RE_DUE, args, NULL);
	n = SPI_processed;
	*routes = MemoryContextAlloc(cxt, sizeof(Datum) * Max(n, 1));
	*keys = MemoryContextAlloc(cxt, sizeof(text *) * Max(n, 1));
	get_typlenbyval(SPI_gettypeid(SPI_tuptable->tupdesc, 1), &typlen, &typbyval);
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;
		MemoryContext oldcxt;

		oldcxt = MemoryContextSwitchTo(cxt);
		(*routes)[i] = datumCopy(column_value(i, 1, &isnull), typbyval, typlen);
		MemoryContextSwitchTo(oldcxt);
		(*keys)[i] = (text *) column_copy(cxt, i, 2);
	}
	return n;
}

/*
 * Reads a stored delay in microseconds, between 1 and MAX_DELAY_US: a
 * policy written into the table by hand may hold anything its checks let
 * through.
 */
static int64
policy_delay_us(int colno)
{
	bool		isnull;
	int64		us = interval_to_us(DatumGetIntervalP(column_value(0, colno, &isnull)));

	return Min(Max(us, 1), MAX_DELAY_US);
}

/*
 * Reads a consumer's retry policy; false if it has none of its own.
 */
bool
effects_policy(int32 consumer_id, EffectPolicy *policy)
{
	Datum		arg = Int32GetDatum(consumer_id);
	bool		isnull;

	effects_execute(EF_POLICY, &arg, NULL, 1);
	if (SPI_processed == 0)
		return false;
	policy->max_attempts = DatumGetInt32(column_value(0, 1, &isnull));
	policy->base_delay_us = policy_delay_us(2);
	policy->max_delay_us = Max(policy_delay_us(3), policy->base_delay_us);
	return true;
}

/*
 * Parks a dead effect in the dead-letter queue, or makes its earlier
 * entry pending again, and sets *entry_id to the entry's id (0 for the
 * entry of a routed effect, named by its key); returns false when a
 * message's entry holds the same key.
 */
bool
effects_park(const EffectPlace *place, const char *message, const char *detail,
			 int64 *entry_id)
{
	Datum		values[4];

	values[0] = CStringGetTextDatum(unpack_sql_state(ERRCODE_EFFECT_FAILED));
	values[1] = CStringGetTextDatum(message);
	values[2] = CStringGetTextDatum(detail);
	values[3] = CStringGetTextDatum(GetUserNameFromId(GetUserId(), false));
	return place->at.ops->effect_park(&place->at, place->key, values, entry_id);
}

/*
 * Parks a dead effect in the node's queue; the local place's effect_park.
 */
bool
effects_park_local(const KeyPlace *at, text *key, Datum *values, int64 *entry_id)
{
	bool		isnull;

	*entry_id = 0;
	/* ids past replicated entries, as for a message's (dead_letter.c) */
	keystore_dead_letter_ids_past_rows();
	effects_execute_local(EF_PARK, at, key, values, NULL, 4);
	if (SPI_processed == 0)
		return false;
	*entry_id = DatumGetInt64(column_value(0, 1, &isnull));
	return true;
}

/*
 * Parks a dead routed effect beside its key, its entry named by the key;
 * the routed place's effect_park.
 */
bool
effects_park_routed(const KeyPlace *at, text *key, Datum *values, int64 *entry_id)
{
	*entry_id = 0;
	effects_execute_routed_at(EF_PARK, at, key, values, NULL, 4);
	return SPI_processed > 0;
}

/*
 * Re-arms the dead effect of a dead-letter entry; returns false when the
 * entry is not an effect's (or this database has no effects).
 */
bool
effects_rearm(int64 dead_letter_id)
{
	Datum		arg = Int64GetDatum(dead_letter_id);

	if (!effects_storage_exists())
		return false;
	effects_execute(EF_REARM, &arg, NULL, 0);
	return SPI_processed > 0;
}

/*
 * Re-arms the dead routed effect of key at place, an effect's entry;
 * returns false if the effect is not dead.
 */
bool
effects_rearm_routed(const KeyPlace *at, text *key)
{
	EffectPlace place = {.at = *at, .key = key};

	return effects_fetch(EF_REARM, &place, NULL, NULL, 0, NULL);
}
