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
 * Where keys are routed (routed.c), effects are stored with their route in
 * idem_consumer.routed_effects, colocated with the business rows of the
 * route, and a dead effect's entry in routed_dead_letters, beside the
 * entries of messages: the routed statements below are those on one
 * effect with $1 the route, $2 the consumer's name and $3 the key, the
 * arguments after them in the order of the unrouted statement's, so that
 * effects.c moves an effect through its states the same way in either
 * table.  They never take the fast path, which writes the local table
 * itself; on Citus the routed tables hold their rows in shards.
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
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"

#include "idem_consumer.h"
#include "effects_store.h"
#include "effects_fastpath.h"

#define EFFECTS_TABLE STORAGE_SCHEMA ".effects"

#define ROUTED_EFFECTS_TABLE STORAGE_SCHEMA ".routed_effects"

/*
 * The columns every statement that returns an effect row returns; a
 * routed effect's entry is named by its key, so it has no entry id.
 */
#define EFFECT_ROW_COLUMNS \
	"state, fence, attempts, provider_key, outcome_unknown, lease_until," \
	" retry_at, last_error, result, request, key"
#define EFFECT_STATE_COLUMNS EFFECT_ROW_COLUMNS "," \
	" lease_until OPERATOR(pg_catalog.>) pg_catalog.now()," \
	" retry_at OPERATOR(pg_catalog.<=) pg_catalog.now()"
#define EFFECT_COLUMNS EFFECT_STATE_COLUMNS ", dead_letter_id"
#define ROUTED_EFFECT_COLUMNS EFFECT_STATE_COLUMNS ", NULL::pg_catalog.int8"
/*
 * Those of an effect just leased, whose lease is live and retry_at NULL:
 * Citus allows only immutable functions in RETURNING.
 */
#define ROUTED_LEASED_COLUMNS EFFECT_ROW_COLUMNS ", true, false, NULL::pg_catalog.int8"
#define THE_EFFECT \
	" WHERE consumer_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
#define THE_ROUTED_EFFECT \
	" WHERE route OPERATOR(pg_catalog.=) $1" \
	" AND consumer OPERATOR(pg_catalog.=) $2 AND key OPERATOR(pg_catalog.=) $3"
/* an outbox effect that is due, or whose lease expired */
#define EFFECT_IS_DUE \
	" AND deferred" \
	" AND state OPERATOR(pg_catalog.=) ANY ('{pending,waiting,in_flight}'::pg_catalog.text[])" \
	" AND (retry_at OPERATOR(pg_catalog.<=) pg_catalog.now()" \
	"      OR lease_until OPERATOR(pg_catalog.<=) pg_catalog.now())"

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
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1" EFFECT_IS_DUE
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

/*
 * The statements on one routed effect, in the order of effect_stmt_defs
 * and with the same arguments after the route, consumer and key; the
 * route's type, argtypes[0], is set to the call's (routed_stmts_retype).
 * Citus refuses now() in ON CONFLICT DO UPDATE: the park takes the new
 * row's default instead.
 */
static StorageStmt routed_effect_stmt_defs[EF_NUM_STMTS] = {
	[EF_INSERT_LEASED] = {
		"INSERT INTO " ROUTED_EFFECTS_TABLE " (route, consumer, key, request, deferred,"
		" state, fence, attempts, lease_until)"
		" VALUES ($1, $2, $3, $4, false, 'in_flight', 1, 1,"
		" pg_catalog.now() OPERATOR(pg_catalog.+) $5)"
		" ON CONFLICT (route, consumer, key) DO NOTHING RETURNING provider_key",
		5, {InvalidOid, TEXTOID, TEXTOID, JSONBOID, INTERVALOID}
	},
	[EF_ENQUEUE] = {
		"INSERT INTO " ROUTED_EFFECTS_TABLE " (route, consumer, key, request, deferred,"
		" state, retry_at)"
		" VALUES ($1, $2, $3, $4, true, 'pending', pg_catalog.now())"
		" ON CONFLICT (route, consumer, key) DO NOTHING RETURNING 1",
		4, {InvalidOid, TEXTOID, TEXTOID, JSONBOID}
	},
	[EF_READ] = {
		"SELECT " ROUTED_EFFECT_COLUMNS " FROM " ROUTED_EFFECTS_TABLE THE_ROUTED_EFFECT,
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
	[EF_LOCK] = {
		"SELECT " ROUTED_EFFECT_COLUMNS " FROM " ROUTED_EFFECTS_TABLE THE_ROUTED_EFFECT
		" FOR NO KEY UPDATE",
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
	/* the outbox of one route: $3 is the most to lease */
	[EF_LOCK_DUE] = {
		"SELECT " ROUTED_EFFECT_COLUMNS " FROM " ROUTED_EFFECTS_TABLE
		" WHERE route OPERATOR(pg_catalog.=) $1 AND consumer OPERATOR(pg_catalog.=) $2"
		EFFECT_IS_DUE
		" ORDER BY created_at, key LIMIT $3 FOR NO KEY UPDATE SKIP LOCKED",
		3, {InvalidOid, TEXTOID, INT4OID}
	},
	/* one effect of the outbox found due by a read of every shard */
	[EF_LOCK_DUE_ONE] = {
		"SELECT " ROUTED_EFFECT_COLUMNS " FROM " ROUTED_EFFECTS_TABLE THE_ROUTED_EFFECT
		EFFECT_IS_DUE " FOR NO KEY UPDATE SKIP LOCKED",
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
	[EF_LEASE] = {
		"UPDATE " ROUTED_EFFECTS_TABLE " SET state = 'in_flight',"
		" fence = fence OPERATOR(pg_catalog.+) 1, attempts = $4, outcome_unknown = $5,"
		" lease_until = pg_catalog.now() OPERATOR(pg_catalog.+) $6, retry_at = NULL,"
		" updated_at = pg_catalog.now()" THE_ROUTED_EFFECT
		" RETURNING " ROUTED_LEASED_COLUMNS,
		6, {InvalidOid, TEXTOID, TEXTOID, INT4OID, BOOLOID, INTERVALOID}
	},
	[EF_COMPLETE] = {
		"UPDATE " ROUTED_EFFECTS_TABLE " SET state = 'completed', result = $4,"
		" lease_until = NULL, completed_at = pg_catalog.now(), updated_at = pg_catalog.now()"
		THE_ROUTED_EFFECT " AND state OPERATOR(pg_catalog.=) 'in_flight'"
		" AND fence OPERATOR(pg_catalog.=) $5",
		5, {InvalidOid, TEXTOID, TEXTOID, JSONBOID, INT8OID}
	},
	[EF_WAIT] = {
		"UPDATE " ROUTED_EFFECTS_TABLE " SET state = 'waiting', retry_at = $4,"
		" last_error = $5, lease_until = NULL, updated_at = pg_catalog.now()"
		THE_ROUTED_EFFECT,
		5, {InvalidOid, TEXTOID, TEXTOID, TIMESTAMPTZOID, TEXTOID}
	},
	/* $5, the entry's id in effect_stmt_defs, is not stored: the key names it */
	[EF_DEAD] = {
		"UPDATE " ROUTED_EFFECTS_TABLE " SET state = 'dead', last_error = $4,"
		" outcome_unknown = outcome_unknown OR $6,"
		" lease_until = NULL, retry_at = NULL, updated_at = pg_catalog.now()"
		THE_ROUTED_EFFECT,
		6, {InvalidOid, TEXTOID, TEXTOID, TEXTOID, INT8OID, BOOLOID}
	},
	[EF_HEARTBEAT] = {
		"UPDATE " ROUTED_EFFECTS_TABLE " SET lease_until = pg_catalog.now()"
		" OPERATOR(pg_catalog.+) $4, updated_at = pg_catalog.now()" THE_ROUTED_EFFECT,
		4, {InvalidOid, TEXTOID, TEXTOID, INTERVALOID}
	},
	[EF_PARK] = {
		"INSERT INTO " STORAGE_SCHEMA ".routed_dead_letters AS d (route, consumer, key,"
		" sql, settings, sqlstate, message, detail, dead_lettered_by, kind)"
		" VALUES ($1, $2, $3, '" EFFECT_ENTRY_SQL "', '{}', $4, $5, $6, $7, 'effect')"
		" ON CONFLICT (route, consumer, key) DO UPDATE SET status = 'pending',"
		" attempts = d.attempts OPERATOR(pg_catalog.+) 1,"
		" last_failed_at = excluded.last_failed_at,"
		" sqlstate = excluded.sqlstate, message = excluded.message, detail = excluded.detail,"
		" dead_lettered_by = excluded.dead_lettered_by,"
		" resolved_at = NULL, resolved_by = NULL, discard_reason = NULL"
		" WHERE d.kind OPERATOR(pg_catalog.=) 'effect'"
		" RETURNING 1",
		7, {InvalidOid, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID}
	},
	[EF_REARM] = {
		"UPDATE " ROUTED_EFFECTS_TABLE " SET state = 'waiting', attempts = 0,"
		" retry_at = pg_catalog.now(), updated_at = pg_catalog.now()"
		THE_ROUTED_EFFECT " AND state OPERATOR(pg_catalog.=) 'dead'",
		3, {InvalidOid, TEXTOID, TEXTOID}
	},
};

/* The statements on routed effects of every route. */
typedef enum RoutedEffectsStmt
{
	RE_DUE,
	RE_LATEST,
	RE_PURGE,
	RE_PURGE_ENTRIES,
	RE_NUM_STMTS
} RoutedEffectsStmt;

static const StorageStmt routed_effects_stmt_defs[RE_NUM_STMTS] = {
	/*
	 * the outbox of consumer $1 on every shard, oldest first, at most $2:
	 * a plain read, since Citus locks rows only in a statement on one
	 * shard; each is then locked by EF_LOCK_DUE_ONE, which checks again
	 */
	[RE_DUE] = {
		"SELECT route, key FROM " ROUTED_EFFECTS_TABLE
		" WHERE consumer OPERATOR(pg_catalog.=) $1" EFFECT_IS_DUE
		" ORDER BY created_at, route, key LIMIT $2",
		2, {TEXTOID, INT4OID}
	},
	/* every consumer's newest completion, or consumer $1's */
	[RE_LATEST] = {
		"SELECT consumer, pg_catalog.max(completed_at) FROM " ROUTED_EFFECTS_TABLE
		" WHERE state OPERATOR(pg_catalog.=) 'completed'"
		" AND ($1 IS NULL OR consumer OPERATOR(pg_catalog.=) $1)"
		" GROUP BY consumer",
		1, {TEXTOID}
	},
	/* the completed effects older than the cutoffs $2 of the consumers $1 */
	[RE_PURGE] = {
		"DELETE FROM " ROUTED_EFFECTS_TABLE " AS e"
		" WHERE e.state OPERATOR(pg_catalog.=) 'completed'"
		" AND e.completed_at OPERATOR(pg_catalog.<)"
		" $2[pg_catalog.array_position($1, e.consumer)]",
		2, {TEXTARRAYOID, TIMESTAMPTZARRAYOID}
	},
	/* the resolved entries of effects that are gone expire with them */
	[RE_PURGE_ENTRIES] = {
		"DELETE FROM " STORAGE_SCHEMA ".routed_dead_letters AS d"
		" WHERE d.status OPERATOR(pg_catalog.<>) 'pending'"
		" AND d.kind OPERATOR(pg_catalog.=) 'effect'"
		" AND NOT EXISTS (SELECT FROM " ROUTED_EFFECTS_TABLE " AS e"
		" WHERE e.route OPERATOR(pg_catalog.=) d.route"
		" AND e.consumer OPERATOR(pg_catalog.=) d.consumer"
		" AND e.key OPERATOR(pg_catalog.=) d.key)",
		0, {InvalidOid}
	},
};

static SPIPlanPtr routed_effect_plans[EF_NUM_STMTS];
static StorageStmtSet routed_effect_stmts =
STORAGE_STMT_SET(routed_effect_stmt_defs, routed_effect_plans);
static Oid	routed_effect_plans_type = InvalidOid;
static SPIPlanPtr routed_effects_plans[RE_NUM_STMTS];
static StorageStmtSet routed_effects_stmts =
STORAGE_STMT_SET(routed_effects_stmt_defs, routed_effects_plans);

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
 * Runs a routed statement on one effect: $1 the route, $2 the consumer,
 * $3 the key, then args.
 */
static void
routed_effect_execute(EffectStmt stmt, const EffectPlace *place, Datum *args,
					  const char *argnulls, int nargs)
{
	Datum		values[STORAGE_MAX_ARGS];
	char		nulls[STORAGE_MAX_ARGS];

	Assert(nargs + 3 <= STORAGE_MAX_ARGS);
	Assert(routed_effect_stmt_defs[stmt].sql != NULL);
	values[0] = place->route;
	values[1] = CStringGetTextDatum(place->consumer);
	values[2] = PointerGetDatum(place->key);
	memset(nulls, ' ', sizeof(nulls));
	for (int i = 0; i < nargs; i++)
	{
		values[3 + i] = args[i];
		if (argnulls != NULL)
			nulls[3 + i] = argnulls[i];
	}
	routed_stmts_retype(&routed_effect_stmts, routed_effect_stmt_defs,
						&routed_effect_plans_type, place->route_type);
	storage_stmt_run(&routed_effect_stmts, stmt, values, nulls, 0);
}

/*
 * Runs a statement on one effect (its place, then args) and reads the row
 * it returned, if any; returns whether there was one.
 */
bool
effects_fetch(EffectStmt stmt, const EffectPlace *place, Datum *args,
			  const char *argnulls, int nargs, EffectRow *row)
{
	if (place->routed)
		routed_effect_execute(stmt, place, args, argnulls, nargs);
	else
	{
		Datum		values[6];
		char		nulls[6];

		Assert(nargs + 2 <= lengthof(values));
		values[0] = Int32GetDatum(place->consumer_id);
		values[1] = PointerGetDatum(place->key);
		memset(nulls, ' ', sizeof(nulls));
		for (int i = 0; i < nargs; i++)
		{
			values[2 + i] = args[i];
			if (argnulls != NULL)
				nulls[2 + i] = argnulls[i];
		}
		effects_execute(stmt, values, nulls, 0);
	}
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
effects_insert_leased(const EffectPlace *place, Jsonb *request,
					  Interval *lease, EffectRow *row)
{
	text	   *provider_key = NULL;
	MemoryContext oldcxt;

	/* the plain case without the executor; the statement decides the rest */
	if (!place->routed)
	{
		oldcxt = MemoryContextSwitchTo(row->cxt);
		provider_key = effects_fast_insert_leased(effects_table_oid(),
												  place->consumer_id, place->key,
												  request, interval_to_us(lease));
		MemoryContextSwitchTo(oldcxt);
	}
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
	Datum		values[3];

	if (!place->routed)
	{
		values[0] = Int32GetDatum(place->consumer_id);
		values[1] = Int32GetDatum(max_count);
		effects_execute(EF_LOCK_DUE, values, NULL, 0);
		return;
	}
	values[0] = place->route;
	values[1] = CStringGetTextDatum(place->consumer);
	values[2] = Int32GetDatum(max_count);
	routed_stmts_retype(&routed_effect_stmts, routed_effect_stmt_defs,
						&routed_effect_plans_type, place->route_type);
	storage_stmt_run(&routed_effect_stmts, EF_LOCK_DUE, values, NULL, 0);
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

	storage_stmt_run(&routed_effects_stmts, RE_DUE, args, NULL, 0);
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
	bool		isnull;

	values[0] = CStringGetTextDatum(unpack_sql_state(ERRCODE_EFFECT_FAILED));
	values[1] = CStringGetTextDatum(message);
	values[2] = CStringGetTextDatum(detail);
	values[3] = CStringGetTextDatum(GetUserNameFromId(GetUserId(), false));
	*entry_id = 0;
	/* ids past replicated entries, as for a message's (dead_letter.c) */
	if (!place->routed)
		keystore_dead_letter_ids_past_rows();
	if (!effects_fetch(EF_PARK, place, values, NULL, 4, NULL))
		return false;
	if (!place->routed)
		*entry_id = DatumGetInt64(column_value(0, 1, &isnull));
	return true;
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
 * Re-arms the dead routed effect of a routed effect's entry; returns
 * false if the effect is not dead.
 */
bool
effects_rearm_routed(Datum route, Oid route_type, const char *consumer, text *key)
{
	EffectPlace place = {.consumer = consumer, .key = key, .routed = true,
	.route = route, .route_type = route_type};

	return effects_fetch(EF_REARM, &place, NULL, NULL, 0, NULL);
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

/*
 * Removes the completed routed effects past their consumer's retention
 * window by the rule of routed keys (routed_purge), counted back from the
 * consumer's newest completion, and the resolved entries of effects that
 * are gone; returns how many effects.  Called by routed_purge(), on the
 * node that purges.
 */
uint64
effects_purge_routed(const char *consumer, RetentionWindows *windows)
{
	Datum		args[2];
	char		nulls[1] = {consumer ? ' ' : 'n'};
	uint64		removed;

	args[0] = consumer ? CStringGetTextDatum(consumer) : (Datum) 0;
	storage_stmt_run(&routed_effects_stmts, RE_LATEST, args, nulls, 0);
	if (!routed_purge_cutoffs(windows, args))
		return 0;
	storage_stmt_run(&routed_effects_stmts, RE_PURGE, args, NULL, 0);
	removed = SPI_processed;
	if (removed > 0)
		storage_stmt_run(&routed_effects_stmts, RE_PURGE_ENTRIES, NULL, NULL, 0);
	return removed;
}
