/*-------------------------------------------------------------------------
 *
 * visible_rows.c
 *	  The rows behind the views that show each role only the consumers it
 *	  may act on: idem_processed_keys, idem_dead_letters, idem_effects and
 *	  the routed idem_routed_dead_letters and idem_routed_effects.
 *
 * Each view is SELECT * FROM a set-returning function of this file, the
 * way pg_stat_statements' view reads its function.  A view that filters
 * by owner in its own WHERE clause, even a security barrier, lets another
 * team's rows reach plan nodes the caller can observe: the planner pushes
 * the caller's leakproof conditions (text =, <, integer and timestamp
 * comparisons) below the barrier into the scan of the storage, and
 * EXPLAIN ANALYZE reports the rows each node under the barrier produced
 * and removed, which tells whether another team's key, SQL or parameter
 * exists.  Here the owner test runs inside a fixed statement of this
 * file, with the caller's role as a parameter, so that the caller's plan
 * holds a function scan whose rows all passed it: no condition of the
 * caller meets another team's row, and no count or estimate of the
 * caller's plan depends on one.
 *
 * The statements run as the owner of the storage through a cursor
 * (storage_stmt_open(), storage_stmt.c), a batch at a time into the
 * function's tuplestore, which spills to disk past work_mem: a key store
 * of many millions of keys never sits whole in memory.  The price is that
 * a view reaches no key through an index: every read of a view reads its
 * whole table (for keys, every generation).
 *
 * The owner test is has_privs_of_role(), through pg_has_role(..., 'USAGE'),
 * as for every other check on a consumer (consumers.c); a consumer
 * without an owner (created under 1.0) is open to every role.  A routed
 * entry names its consumer by name: one this node does not know (on
 * Citus, a consumer registered only on the workers, read on the
 * coordinator) is shown only to the roles with the privileges of the
 * storage's owner, which may read the tables directly anyway.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/visible_rows.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/tuplestore.h"

#include "storage.h"

/* rows fetched from the cursor at a time */
#define VISIBLE_ROWS_BATCH 1000

typedef enum VisibleStmt
{
	VS_PROCESSED_KEYS,
	VS_PROCESSED_KEYS_RING,
	VS_DEAD_LETTERS,
	VS_EFFECTS,
	VS_ROUTED_DEAD_LETTERS,
	VS_ROUTED_EFFECTS,
	VS_NUM_STMTS
} VisibleStmt;

/*
 * $1 is the caller's role, by name: on Citus the test of a routed row may
 * run on a worker, where role OIDs are the worker's own.
 */
#define MAY_ACT_ON(c) \
	" (" c ".owner IS NULL OR pg_catalog.pg_has_role($1, " c ".owner, 'USAGE'))"

/*
 * A routed entry whose consumer this node knows follows the consumer's
 * owner; one it does not know shows only if $2, the caller has the
 * privileges of the storage's owner.  The routed statements are planned
 * with their parameters' values each time (CURSOR_OPT_CUSTOM_PLAN): Citus
 * plans the join of a distributed table with the local consumers in
 * steps, and a generic plan would leave it parameters instead of values.
 */
#define ROUTED_MAY_ACT_ON(c) \
	" CASE WHEN " c ".consumer_id IS NULL THEN $2 ELSE" MAY_ACT_ON(c) " END"

/*
 * The keys and collisions of every generation open (keygen.c names them):
 * a dropped generation keeps its rows until it is truncated, and the live
 * keys of one that was carried (keygen_retire.c) are in the current one
 * already.  Before the first switch no generation is listed, and the
 * first is open.
 */
#define KEYS_OF(table) \
	"SELECT consumer_id, processed_at, key FROM " STORAGE_SCHEMA "." table
#define GENERATION_OPEN(n) \
	" WHERE EXISTS (SELECT FROM " STORAGE_SCHEMA ".key_generations AS g" \
	" WHERE g.generation OPERATOR(pg_catalog.=) " #n ")" \
	" OR (" #n " OPERATOR(pg_catalog.=) 1 AND NOT EXISTS" \
	" (SELECT FROM " STORAGE_SCHEMA ".key_generations))"
#define KEYS_OF_GENERATION(n) \
	" UNION ALL " KEYS_OF("processed_keys_" #n) GENERATION_OPEN(n) \
	" UNION ALL " KEYS_OF("key_collisions_" #n) GENERATION_OPEN(n)

/*
 * The keys of the ring, after those of the legacy pair in a database
 * updated to 1.2 (VS_PROCESSED_KEYS), or alone, from the first generation
 * on, in one created at 1.2 (VS_PROCESSED_KEYS_RING), which has no legacy
 * tables to name.
 */
#define KEYS_OF_GENERATIONS_2_TO_16 \
	KEYS_OF_GENERATION(2) KEYS_OF_GENERATION(3) KEYS_OF_GENERATION(4) \
	KEYS_OF_GENERATION(5) KEYS_OF_GENERATION(6) KEYS_OF_GENERATION(7) \
	KEYS_OF_GENERATION(8) KEYS_OF_GENERATION(9) KEYS_OF_GENERATION(10) \
	KEYS_OF_GENERATION(11) KEYS_OF_GENERATION(12) KEYS_OF_GENERATION(13) \
	KEYS_OF_GENERATION(14) KEYS_OF_GENERATION(15) KEYS_OF_GENERATION(16)
#define PROCESSED_KEYS_FROM(keys) \
	"SELECT c.name, k.key," \
	" '2000-01-01 00:00:00+00'::pg_catalog.timestamptz OPERATOR(pg_catalog.+)" \
	" pg_catalog.make_interval(secs => k.processed_at)" \
	" FROM (" keys ") AS k" \
	" JOIN " STORAGE_SCHEMA ".consumers AS c" \
	" ON c.consumer_id OPERATOR(pg_catalog.=) k.consumer_id" \
	" WHERE" MAY_ACT_ON("c")

static const StorageStmt visible_stmt_defs[VS_NUM_STMTS] = {
	[VS_PROCESSED_KEYS] = {
		PROCESSED_KEYS_FROM(KEYS_OF("processed_keys") " UNION ALL " KEYS_OF("key_collisions")
							KEYS_OF_GENERATION(1) KEYS_OF_GENERATIONS_2_TO_16),
		1, {NAMEOID}
	},
	[VS_PROCESSED_KEYS_RING] = {
		PROCESSED_KEYS_FROM(KEYS_OF("processed_keys_1") GENERATION_OPEN(1)
							" UNION ALL " KEYS_OF("key_collisions_1") GENERATION_OPEN(1)
							KEYS_OF_GENERATIONS_2_TO_16),
		1, {NAMEOID}
	},
	[VS_DEAD_LETTERS] = {
		"SELECT d.dead_letter_id, c.name, d.key, d.status, d.sqlstate,"
		" d.message, d.detail, d.hint, d.context, d.attempts,"
		" d.first_failed_at, d.last_failed_at, d.event_time, d.sql, d.params,"
		" d.settings, d.dead_lettered_by, d.resolved_at, d.resolved_by,"
		" d.discard_reason, d.kind, d.expect_rows"
		" FROM " STORAGE_SCHEMA ".dead_letters AS d"
		" JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.consumer_id OPERATOR(pg_catalog.=) d.consumer_id"
		" WHERE" MAY_ACT_ON("c"),
		1, {NAMEOID}
	},
	[VS_EFFECTS] = {
		"SELECT c.name, e.key, e.state, e.deferred, e.attempts, e.fence,"
		" e.provider_key, e.outcome_unknown, e.lease_until, e.retry_at,"
		" e.last_error, e.result, e.request, e.dead_letter_id, e.created_at,"
		" e.updated_at, e.completed_at"
		" FROM " STORAGE_SCHEMA ".effects AS e"
		" JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.consumer_id OPERATOR(pg_catalog.=) e.consumer_id"
		" WHERE" MAY_ACT_ON("c"),
		1, {NAMEOID}
	},
	[VS_ROUTED_DEAD_LETTERS] = {
		"SELECT d.route, d.consumer, d.key, d.status, d.sqlstate, d.message,"
		" d.detail, d.hint, d.context, d.attempts, d.first_failed_at,"
		" d.last_failed_at, d.event_time, d.sql, d.params, d.settings,"
		" d.dead_lettered_by, d.resolved_at, d.resolved_by,"
		" d.discard_reason, d.kind, d.expect_rows"
		" FROM " STORAGE_SCHEMA ".routed_dead_letters AS d"
		" LEFT JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.name OPERATOR(pg_catalog.=) d.consumer"
		" WHERE" ROUTED_MAY_ACT_ON("c"),
		2, {NAMEOID, BOOLOID}, CURSOR_OPT_CUSTOM_PLAN
	},
	[VS_ROUTED_EFFECTS] = {
		"SELECT e.route, e.consumer, e.key, e.state, e.deferred, e.attempts,"
		" e.fence, e.provider_key, e.outcome_unknown, e.lease_until,"
		" e.retry_at, e.last_error, e.result, e.request, e.created_at,"
		" e.updated_at, e.completed_at"
		" FROM " STORAGE_SCHEMA ".routed_effects AS e"
		" LEFT JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.name OPERATOR(pg_catalog.=) e.consumer"
		" WHERE" ROUTED_MAY_ACT_ON("c"),
		2, {NAMEOID, BOOLOID}, CURSOR_OPT_CUSTOM_PLAN
	},
};

static SPIPlanPtr visible_plans[VS_NUM_STMTS];
static StorageStmtSet visible_stmts = STORAGE_STMT_SET(visible_stmt_defs, visible_plans);

/*
 * Fails unless the rows of a statement have the types of the columns the
 * function returns: its OUT parameters, or for a routed view the column
 * definition list of the view, which names the route's type.
 */
static void
check_row_type(TupleDesc rows, TupleDesc result)
{
	bool		same = rows->natts == result->natts;

	for (int i = 0; same && i < rows->natts; i++)
		same = TupleDescAttr(rows, i)->atttypid == TupleDescAttr(result, i)->atttypid;
	if (!same)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the columns of the function do not match the storage table"),
				 errdetail("The storage gives %d columns and the function returns %d, or their types differ.",
						   rows->natts, result->natts)));
}

/*
 * Fills the function's tuplestore with the rows of statement stmt that
 * the current user may see.
 */
static Datum
visible_rows(FunctionCallInfo fcinfo, VisibleStmt stmt, bool routed)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			role = GetUserId();
	NameData	role_name;
	Datum		args[2];
	Portal		portal;
	bool		checked = false;

	/* as the parser says of such a function called in FROM without one */
	if (routed && (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
				   rsinfo->expectedDesc == NULL))
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("a column definition list is required for function %s",
						get_func_name(fcinfo->flinfo->fn_oid)),
				 errhint("Read the views idem_routed_dead_letters and idem_routed_effects, which name the columns.")));
	InitMaterializedSRF(fcinfo, routed ? MAT_SRF_USE_EXPECTED_DESC : 0);

	SPI_connect();
	namestrcpy(&role_name, GetUserNameFromId(role, false));
	args[0] = NameGetDatum(&role_name);
	if (routed)
		args[1] = BoolGetDatum(has_privs_of_role(role, storage_locate()->owner));
	portal = storage_stmt_open(&visible_stmts, stmt, args, NULL);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		storage_stmt_fetch(portal, VISIBLE_ROWS_BATCH);
		if (SPI_processed == 0)
			break;
		if (!checked)
		{
			check_row_type(SPI_tuptable->tupdesc, rsinfo->setDesc);
			checked = true;
		}
		/* the tuplestore copies each tuple into its own context */
		for (uint64 i = 0; i < SPI_processed; i++)
			tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[i]);
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	SPI_finish();

	return (Datum) 0;
}

/*
 * The SQL-callable functions, one per view: each fills its view's rows.
 */
#define VISIBLE_ROWS_FUNCTION(name, stmt, routed) \
PG_FUNCTION_INFO_V1(name); \
Datum \
name(PG_FUNCTION_ARGS) \
{ \
	return visible_rows(fcinfo, (stmt), (routed)); \
}

/*
 * idem_consumer.processed_keys_visible(): the keys of every generation,
 * those of the legacy one where the database has it.
 */
PG_FUNCTION_INFO_V1(idem_processed_keys_visible);
Datum
idem_processed_keys_visible(PG_FUNCTION_ARGS)
{
	bool		legacy = OidIsValid(storage_locate()->gens[KEYGEN_LEGACY].keys_relid);

	return visible_rows(fcinfo, legacy ? VS_PROCESSED_KEYS : VS_PROCESSED_KEYS_RING, false);
}

VISIBLE_ROWS_FUNCTION(idem_dead_letters_visible, VS_DEAD_LETTERS, false)
VISIBLE_ROWS_FUNCTION(idem_effects_visible, VS_EFFECTS, false)
VISIBLE_ROWS_FUNCTION(idem_routed_dead_letters_visible, VS_ROUTED_DEAD_LETTERS, true)
VISIBLE_ROWS_FUNCTION(idem_routed_effects_visible, VS_ROUTED_EFFECTS, true)
