/*-------------------------------------------------------------------------
 *
 * effects_store_sql.c
 *	  The statements on external effects: on idem_consumer.effects,
 *	  effect_policies and the effect entries of dead_letters, and on
 *	  routed_effects and the effect entries of routed_dead_letters, run as
 *	  the owner of the tables; and the purges of completed effects, for
 *	  retention.c and routed.c, which run statements of this file and
 *	  nothing else.  What the other statements read and write is
 *	  effects_store.c's business.
 *
 * As for the keys, the caller needs EXECUTE on the API functions and no
 * privilege on the tables: each statement here runs through
 * storage_stmt_run() (storage_stmt.c) with the user id of the storage's
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
 *	  src/effects_store_sql.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "idem_consumer.h"
#include "effects_store_sql.h"

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

/*
 * Runs a statement on one routed effect as the owner of the storage, the
 * route of type route_type; values as for effects_execute, the route, the
 * consumer and the key first.
 */
void
effects_execute_routed(EffectStmt stmt, Oid route_type, Datum *values,
					   const char *nulls)
{
	Assert(routed_effect_stmt_defs[stmt].sql != NULL);
	routed_stmts_retype(&routed_effect_stmts, routed_effect_stmt_defs,
						&routed_effect_plans_type, route_type);
	storage_stmt_run(&routed_effect_stmts, stmt, values, nulls, 0);
}

/*
 * Runs a statement on the routed effects of every route as the owner of
 * the storage.
 */
void
effects_execute_every_route(RoutedEffectsStmt stmt, Datum *values,
							const char *nulls)
{
	storage_stmt_run(&routed_effects_stmts, stmt, values, nulls, 0);
}
