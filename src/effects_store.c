/*-------------------------------------------------------------------------
 *
 * effects_store.c
 *	  Storage of external effects: the statements on idem_consumer.effects,
 *	  effect_policies and the effect entries of dead_letters, run as the
 *	  owner of the tables, and reading an effect row into an EffectRow.
 *
 * As for the keys, the caller needs EXECUTE on the API functions and no
 * privilege on the tables: each statement here runs through
 * storage_stmt_run() (keystore_sql.c) with the user id of the storage's
 * owner.  The statements are fixed, schema-qualified text with
 * values as parameters; nothing the caller controls runs while the user id
 * is switched.  What the states mean is effects.c's business.
 *
 * The tables are created by the 1.1 update script.  The library also
 * serves databases still at 1.0, where the effect functions do not exist;
 * the two entry points reached from 1.0 functions (the dead-letter replay
 * and the purge) first ask effects_storage_exists().
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
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "idem_consumer.h"
#include "effects_store.h"
#include "effects_fastpath.h"

#define EFFECTS_TABLE STORAGE_SCHEMA ".effects"

/* The columns every statement that returns an effect row returns. */
#define EFFECT_COLUMNS \
	"state, fence, attempts, provider_key, outcome_unknown, lease_until," \
	" retry_at, last_error, result, request, key," \
	" lease_until OPERATOR(pg_catalog.>) pg_catalog.now()," \
	" retry_at OPERATOR(pg_catalog.<=) pg_catalog.now(), dead_letter_id"
#define THE_EFFECT \
	" WHERE consumer_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"

/*
 * The text of an effect's dead-letter entry.  It is only a comment, which
 * idem_try_apply refuses as business SQL, so no message entry can have it
 * and nothing ever runs it.
 */
#define EFFECT_ENTRY_SQL "/* external effect: idem_dlq_replay re-arms it */"

/* In every statement on one effect, $1 is the consumer id and $2 the key. */
static const StorageStmt effect_stmt_defs[EF_NUM_STMTS] = {
	/* only the default it chose: effects_insert_leased knows the rest */
	[EF_INSERT_LEASED] = {
		"INSERT INTO " EFFECTS_TABLE " (consumer_id, key, request, deferred, state,"
		" fence, attempts, lease_until)"
		" VALUES ($1, $2, $3, false, 'in_flight', 1, 1, pg_catalog.now() OPERATOR(pg_catalog.+) $4)"
		" ON CONFLICT DO NOTHING RETURNING provider_key",
		4, {INT4OID, TEXTOID, JSONBOID, INTERVALOID}
	},
	[EF_ENQUEUE] = {
		"INSERT INTO " EFFECTS_TABLE " (consumer_id, key, request, deferred, state, retry_at)"
		" VALUES ($1, $2, $3, true, 'pending', pg_catalog.now()) ON CONFLICT DO NOTHING",
		3, {INT4OID, TEXTOID, JSONBOID}
	},
	[EF_READ] = {
		"SELECT " EFFECT_COLUMNS " FROM " EFFECTS_TABLE THE_EFFECT,
		2, {INT4OID, TEXTOID}
	},
	[EF_LOCK] = {
		"SELECT " EFFECT_COLUMNS " FROM " EFFECTS_TABLE THE_EFFECT " FOR NO KEY UPDATE",
		2, {INT4OID, TEXTOID}
	},
	/* the outbox: due effects, and leases that expired, oldest first */
	[EF_LOCK_DUE] = {
		"SELECT " EFFECT_COLUMNS " FROM " EFFECTS_TABLE
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1 AND deferred"
		" AND state OPERATOR(pg_catalog.=) ANY ('{pending,waiting,in_flight}'::pg_catalog.text[])"
		" AND (retry_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
		"      OR lease_until OPERATOR(pg_catalog.<=) pg_catalog.now())"
		" ORDER BY created_at, key LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED",
		2, {INT4OID, INT4OID}
	},
	[EF_LEASE] = {
		"UPDATE " EFFECTS_TABLE " SET state = 'in_flight',"
		" fence = fence OPERATOR(pg_catalog.+) 1, attempts = $3, outcome_unknown = $4,"
		" lease_until = pg_catalog.now() OPERATOR(pg_catalog.+) $5, retry_at = NULL,"
		" updated_at = pg_catalog.now()" THE_EFFECT " RETURNING " EFFECT_COLUMNS,
		5, {INT4OID, TEXTOID, INT4OID, BOOLOID, INTERVALOID}
	},
	/* only under the current lease; nothing updated tells the caller to look why */
	[EF_COMPLETE] = {
		"UPDATE " EFFECTS_TABLE " SET state = 'completed', result = $3,"
		" lease_until = NULL, completed_at = pg_catalog.now(), updated_at = pg_catalog.now()"
		THE_EFFECT " AND state OPERATOR(pg_catalog.=) 'in_flight' AND fence OPERATOR(pg_catalog.=) $4",
		4, {INT4OID, TEXTOID, JSONBOID, INT8OID}
	},
	[EF_WAIT] = {
		"UPDATE " EFFECTS_TABLE " SET state = 'waiting', retry_at = $3, last_error = $4,"
		" lease_until = NULL, updated_at = pg_catalog.now()" THE_EFFECT,
		4, {INT4OID, TEXTOID, TIMESTAMPTZOID, TEXTOID}
	},
	[EF_DEAD] = {
		"UPDATE " EFFECTS_TABLE " SET state = 'dead', last_error = $3, dead_letter_id = $4,"
		" outcome_unknown = outcome_unknown OR $5,"
		" lease_until = NULL, retry_at = NULL, updated_at = pg_catalog.now()" THE_EFFECT,
		5, {INT4OID, TEXTOID, TEXTOID, INT8OID, BOOLOID}
	},
	[EF_HEARTBEAT] = {
		"UPDATE " EFFECTS_TABLE " SET lease_until = pg_catalog.now() OPERATOR(pg_catalog.+) $3,"
		" updated_at = pg_catalog.now()" THE_EFFECT,
		3, {INT4OID, TEXTOID, INTERVALOID}
	},

	/*
	 * The dead-letter entry of an effect: new, or the entry of an earlier
	 * death made pending again.  Returns nothing when the key is taken by
	 * a message's entry.
	 */
	[EF_PARK] = {
		"INSERT INTO " STORAGE_SCHEMA ".dead_letters AS d (consumer_id, key, sql, settings,"
		" sqlstate, message, detail, dead_lettered_by, kind)"
		" VALUES ($1, $2, '" EFFECT_ENTRY_SQL "', '{}', $3, $4, $5, $6, 'effect')"
		" ON CONFLICT (consumer_id, key) DO UPDATE SET status = 'pending',"
		" attempts = d.attempts OPERATOR(pg_catalog.+) 1, last_failed_at = pg_catalog.now(),"
		" sqlstate = excluded.sqlstate, message = excluded.message, detail = excluded.detail,"
		" dead_lettered_by = excluded.dead_lettered_by,"
		" resolved_at = NULL, resolved_by = NULL, discard_reason = NULL"
		" WHERE d.kind OPERATOR(pg_catalog.=) 'effect'"
		" RETURNING dead_letter_id",
		6, {INT4OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID}
	},
	/* re-arms the dead effect of an entry: due now, attempts from zero */
	[EF_REARM] = {
		"UPDATE " EFFECTS_TABLE " SET state = 'waiting', attempts = 0,"
		" retry_at = pg_catalog.now(), updated_at = pg_catalog.now()"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1 AND state OPERATOR(pg_catalog.=) 'dead'",
		1, {INT8OID}
	},

	[EF_POLICY] = {
		"SELECT max_attempts, base_delay, max_delay FROM " STORAGE_SCHEMA ".effect_policies"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1",
		1, {INT4OID}
	},
	[EF_SET_POLICY] = {
		"INSERT INTO " STORAGE_SCHEMA ".effect_policies (consumer_id, max_attempts,"
		" base_delay, max_delay) VALUES ($1, $2, $3, $4)"
		" ON CONFLICT (consumer_id) DO UPDATE SET max_attempts = excluded.max_attempts,"
		" base_delay = excluded.base_delay, max_delay = excluded.max_delay,"
		" updated_at = pg_catalog.now()",
		4, {INT4OID, INT4OID, INTERVALOID, INTERVALOID}
	},

	/*
	 * Completed effects older than their consumer's retention window,
	 * counted back from the consumer's newest completion (capped at now):
	 * the latest-activity rule of retention.c, applied to effects.  $1 is
	 * the default window, NULL for forever; a NULL window keeps all.  $2 is
	 * the only consumer to purge, or 0 for all.
	 */
	/*
	 * Completed effects older than their consumer's window; one that
	 * another transaction holds is left to a later run, so that no role can
	 * stall the purge (as for keys, keystore_sql.c's LOCK_REMOVABLE).
	 */
	[EF_PURGE] = {
		"DELETE FROM " EFFECTS_TABLE " AS e WHERE e.ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
		"SELECT x.ctid FROM " EFFECTS_TABLE " AS x,"
		" (SELECT l.consumer_id, LEAST(l.latest, pg_catalog.now()) OPERATOR(pg_catalog.-)"
		"   CASE WHEN s.consumer_id IS NULL THEN $1 ELSE s.retention END AS cutoff"
		"  FROM (SELECT consumer_id, pg_catalog.max(completed_at) AS latest FROM " EFFECTS_TABLE
		"        WHERE state OPERATOR(pg_catalog.=) 'completed'"
		"        AND $2 OPERATOR(pg_catalog.=) ANY (ARRAY[0, consumer_id]) GROUP BY consumer_id) AS l"
		"  LEFT JOIN " STORAGE_SCHEMA ".retention_settings AS s"
		"  ON s.consumer_id OPERATOR(pg_catalog.=) l.consumer_id) AS w"
		" WHERE x.consumer_id OPERATOR(pg_catalog.=) w.consumer_id"
		" AND x.state OPERATOR(pg_catalog.=) 'completed'"
		" AND x.completed_at OPERATOR(pg_catalog.<) w.cutoff"
		" FOR UPDATE OF x SKIP LOCKED))",
		2, {INTERVALOID, INT4OID}
	},
};

static SPIPlanPtr effect_plans[EF_NUM_STMTS];
static StorageStmtSet effect_stmts =
STORAGE_STMT_SET(effect_stmt_defs, effect_plans);

static const char *const state_names[] = {
	[ES_PENDING] = "pending",
	[ES_IN_FLIGHT] = "in_flight",
	[ES_WAITING] = "waiting",
	[ES_COMPLETED] = "completed",
	[ES_DEAD] = "dead",
};

/*
 * Returns the OID of idem_consumer.effects, or InvalidOid in a database
 * whose extension is still at version 1.0.
 */
Oid
effects_table_oid(void)
{
	return storage_parts()->effects_relid;
}

/*
 * Tells whether this database has the effect tables (version 1.1).
 */
bool
effects_storage_exists(void)
{
	return OidIsValid(effects_table_oid());
}

/*
 * Runs one effect statement as the owner of the storage, or raises the
 * error of a database whose extension needs updating; nulls is as for
 * SPI_execute_plan.
 */
int
effects_execute(EffectStmt stmt, Datum *values, const char *nulls, long tcount)
{
	/*
	 * A plan that is still valid proves that the table exists, and spares
	 * the catalog lookups of every call; an invalidated one is looked at
	 * again, so that a database at 1.0 gets the error below.
	 */
	storage_stmts_current(&effect_stmts);
	if ((effect_plans[stmt] == NULL || !SPI_plan_is_valid(effect_plans[stmt])) &&
		!effects_storage_exists())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("storage of external effects is missing"),
				 errdetail("Table %s was not found; it comes with version 1.1 of extension \"idem_consumer\".",
						   EFFECTS_TABLE),
				 errhint("ALTER EXTENSION idem_consumer UPDATE")));
	return storage_stmt_run(&effect_stmts, stmt, values, nulls, tcount);
}

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
 * Runs a statement on one effect ($1 consumer id, $2 key, then args) and
 * reads the row it returned, if any; returns whether there was one.
 */
bool
effects_fetch(EffectStmt stmt, int32 consumer_id, text *key, Datum *args,
			  const char *argnulls, int nargs, EffectRow *row)
{
	Datum		values[6];
	char		nulls[6];

	Assert(nargs + 2 <= lengthof(values));
	values[0] = Int32GetDatum(consumer_id);
	values[1] = PointerGetDatum(key);
	memset(nulls, ' ', sizeof(nulls));
	for (int i = 0; i < nargs; i++)
	{
		values[2 + i] = args[i];
		if (argnulls != NULL)
			nulls[2 + i] = argnulls[i];
	}
	effects_execute(stmt, values, nulls, 0);
	if (SPI_processed == 0)
		return false;
	if (row != NULL)
		effect_row_read(0, row);
	return true;
}

/*
 * Inserts a new inline effect leased to fence 1 for lease, and fills row
 * as EFFECT_COLUMNS would read it; returns false, row untouched, when the
 * key has a row already.  Only the provider key is read back: reading the
 * whole row would cost a fifth of begin for values known here.
 */
bool
effects_insert_leased(int32 consumer_id, text *key, Jsonb *request,
					  Interval *lease, EffectRow *row)
{
	text	   *provider_key;
	MemoryContext oldcxt;

	/* the plain case without the executor; the statement decides the rest */
	oldcxt = MemoryContextSwitchTo(row->cxt);
	provider_key = effects_fast_insert_leased(effects_table_oid(), consumer_id,
											  key, request, interval_to_us(lease));
	MemoryContextSwitchTo(oldcxt);
	if (provider_key == NULL)
	{
		Datum		values[4];
		char		nulls[4] = {' ', ' ', request == NULL ? 'n' : ' ', ' '};

		values[0] = Int32GetDatum(consumer_id);
		values[1] = PointerGetDatum(key);
		values[2] = PointerGetDatum(request);
		values[3] = IntervalPGetDatum(lease);
		effects_execute(EF_INSERT_LEASED, values, nulls, 0);
		if (SPI_processed == 0)
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
	row->key = key;
	row->lease_live = true;
	row->due = false;
	row->dead_letter_id = 0;
	return true;
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
 * entry pending again; returns the entry's id, or 0 when a message's
 * entry holds the same (consumer, key).
 */
int64
effects_park(int32 consumer_id, text *key, const char *message, const char *detail)
{
	Datum		values[6];
	bool		isnull;

	values[0] = Int32GetDatum(consumer_id);
	values[1] = PointerGetDatum(key);
	values[2] = CStringGetTextDatum(unpack_sql_state(ERRCODE_EFFECT_FAILED));
	values[3] = CStringGetTextDatum(message);
	values[4] = CStringGetTextDatum(detail);
	values[5] = CStringGetTextDatum(GetUserNameFromId(GetUserId(), false));
	/* ids past replicated entries, as for a message's (dead_letter.c) */
	keystore_dead_letter_ids_past_rows();
	effects_execute(EF_PARK, values, NULL, 1);
	if (SPI_processed == 0)
		return 0;
	return DatumGetInt64(column_value(0, 1, &isnull));
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
 * Removes the completed effects past their consumer's retention window,
 * consumers without a window of their own following default_retention_secs
 * (-1: forever); returns how many.  Nothing in a database without effects.
 */
uint64
effects_purge(int32 only_consumer, int default_retention_secs)
{
	Datum		args[2];
	char		nulls[2] = {' ', ' '};
	Interval   *window = palloc0(sizeof(Interval));

	if (!effects_storage_exists())
		return 0;
	window->time = (int64) default_retention_secs * USECS_PER_SEC;
	args[0] = IntervalPGetDatum(window);
	if (default_retention_secs < 0)
		nulls[0] = 'n';
	args[1] = Int32GetDatum(only_consumer);
	effects_execute(EF_PURGE, args, nulls, 0);
	return SPI_processed;
}
