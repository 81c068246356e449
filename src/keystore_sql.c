/*-------------------------------------------------------------------------
 *
 * keystore_sql.c
 *	  The fixed SQL statements of the key store on the tables of each
 *	  generation, written once per generation, which run as the owner of
 *	  the storage through storage_stmt.c.
 *
 * What each statement means is the business of the file that runs it:
 * keystore.c and keystore_remove.c (keys and collisions, the purge's
 * reads and removals).  Other modules keep their statements in a
 * StorageStmtSet of their own (consumers_sql.c, dead_letter_sql.c,
 * retention_store.c, effects_store_sql.c) and run them through
 * storage_stmt_run().  The one condition that keeps the keys of pending
 * dead letters out of every purge is here, at AND_NO_PENDING_DEAD_LETTER.
 *
 * The caller must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keystore_sql.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "keygen_state.h"
#include "keystore_sql.h"

#define SAME_HASH_AS_ARGS \
	"@HASH@(consumer_id, key) OPERATOR(pg_catalog.=) @HASH@($1, $2)"
#define SAME_KEY_AS_ARGS \
	"consumer_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
/*
 * A resolved dead-letter entry (replayed or discarded) expires with its
 * key: the statements that remove keys by TID remove the resolved entries
 * of the removed keys in the same statement.  A redelivery after the
 * purge is then a new message, as for any expired key, and no stale entry
 * makes it look dead-lettered or blocks parking it again.  "removed" is
 * the CTE of the removed rows.
 */
#define AND_RESOLVED_ENTRIES_EXPIRE \
	", expired AS (DELETE FROM " STORAGE_SCHEMA ".dead_letters AS d USING removed AS r" \
	" WHERE d.consumer_id OPERATOR(pg_catalog.=) r.consumer_id" \
	" AND d.key OPERATOR(pg_catalog.=) r.key" \
	" AND d.status OPERATOR(pg_catalog.<>) 'pending')"

/*
 * Retention never removes the key of a message that waits in the
 * dead-letter queue: an operator may still replay it, and a redelivery
 * applied after the key were gone would let that replay apply it twice.
 * Written as a set membership so that the planner hashes the pending
 * entries once per statement: as NOT EXISTS, with dead_letters empty or
 * nearly so, it rescans that table for every candidate row, which cost a
 * third of a purge.
 */
#define AND_NO_PENDING_DEAD_LETTER(row) \
	" AND NOT (" row ".consumer_id, " row ".key) OPERATOR(pg_catalog.=) ANY" \
	" (SELECT d.consumer_id, d.key FROM " STORAGE_SCHEMA ".dead_letters AS d" \
	" WHERE d.status OPERATOR(pg_catalog.=) 'pending')"

/*
 * A purge never waits for a lock: a transaction of any role that holds an
 * expired row (an idem_forget not yet committed, say) would otherwise stall
 * the purge of every consumer for as long as it stays open.  So a removal
 * first locks its rows with SKIP LOCKED, and leaves to a later run each key
 * that it could not lock, or whose resolved dead-letter entry (which
 * expires with it) it could not lock.  "candidate" is the CTE of the rows
 * named by TID ($1) that are still older than their consumer's cutoff ($2,
 * $3) and locked; "busy_entry" that of the keys whose entry someone holds.
 * Every set of TIDs is passed as an array, so that each lookup is a TID
 * scan.
 */
#define LOCK_REMOVABLE(table) \
	"WITH candidate AS MATERIALIZED (SELECT k.ctid AS tid, k.consumer_id, k.key" \
	" FROM " table " AS k" \
	" JOIN ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS w (consumer_id, cutoff)" \
	" ON k.consumer_id OPERATOR(pg_catalog.=) w.consumer_id" \
	" WHERE k.ctid OPERATOR(pg_catalog.=) ANY ($1)" \
	" AND k.processed_at OPERATOR(pg_catalog.<) w.cutoff" \
	AND_NO_PENDING_DEAD_LETTER("k") \
	" FOR UPDATE OF k SKIP LOCKED)," \
	" entry AS MATERIALIZED (SELECT d.ctid AS tid, d.consumer_id, d.key" \
	" FROM " STORAGE_SCHEMA ".dead_letters AS d JOIN candidate AS c" \
	" ON d.consumer_id OPERATOR(pg_catalog.=) c.consumer_id" \
	" AND d.key OPERATOR(pg_catalog.=) c.key" \
	" WHERE d.status OPERATOR(pg_catalog.<>) 'pending')," \
	" locked_entry AS MATERIALIZED (SELECT d.ctid AS tid" \
	" FROM " STORAGE_SCHEMA ".dead_letters AS d" \
	" WHERE d.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT tid FROM entry))" \
	" FOR UPDATE OF d SKIP LOCKED)," \
	" busy_entry AS (SELECT e.consumer_id, e.key FROM entry AS e" \
	" WHERE NOT EXISTS (SELECT FROM locked_entry AS l WHERE l.tid OPERATOR(pg_catalog.=) e.tid))"

/* a candidate whose resolved entry no other transaction holds */
#define CANDIDATE_ENTRY_FREE \
	" NOT EXISTS (SELECT FROM busy_entry AS b" \
	" WHERE b.consumer_id OPERATOR(pg_catalog.=) c.consumer_id" \
	" AND b.key OPERATOR(pg_catalog.=) c.key)"

/* rows of a range of heap blocks: ctid from (first, 0) up to (end, 0) */
#define IN_BLOCK_RANGE(ctid, lo, hi) \
	ctid " OPERATOR(pg_catalog.>=) " lo " AND " ctid " OPERATOR(pg_catalog.<) " hi

/*
 * Per consumer, the newest processed_at, the number of rows and the oldest
 * processed_at in a range of blocks of a table; $1 and $2 bound the range.
 */
#define LATEST_IN_BLOCKS(table) \
	"SELECT consumer_id, pg_catalog.max(processed_at), pg_catalog.count(*)," \
	" pg_catalog.min(processed_at)" \
	" FROM " table \
	" WHERE " IN_BLOCK_RANGE("ctid", "$1", "$2") \
	" GROUP BY consumer_id"

/*
 * Per consumer, the TIDs of the rows of a range of blocks ($3, $4) that
 * are older than the consumer's cutoff; $1 and $2 are parallel arrays of
 * consumer ids and cutoffs.  Consumers not in $1 keep everything.  The
 * TIDs come in no particular order: ordering them in the aggregate would
 * make the planner sort the whole chunk, twice, at twice the cost of the
 * rest of the statement; the caller sorts a consumer's TIDs only when its quota cuts them.
 */
#define PURGEABLE_IN_BLOCKS(table) \
	"SELECT k.consumer_id, pg_catalog.array_agg(k.ctid)" \
	" FROM " table " AS k" \
	" JOIN ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2))" \
	" AS w (consumer_id, cutoff)" \
	" ON k.consumer_id OPERATOR(pg_catalog.=) w.consumer_id" \
	" WHERE " IN_BLOCK_RANGE("k.ctid", "$3", "$4") \
	" AND k.processed_at OPERATOR(pg_catalog.<) w.cutoff" \
	AND_NO_PENDING_DEAD_LETTER("k") \
	" GROUP BY k.consumer_id"


/*
 * Whether key row t is carried by a retirement: its consumer is one of
 * consumers $1 and it is not older than that consumer's cutoff, of the
 * parallel array given
 */
#define CARRIED_FOR_ITS_CONSUMER(t, cutoffs) \
	t ".processed_at OPERATOR(pg_catalog.>=) (SELECT c.cutoff" \
	" FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest(" cutoffs ")) AS c(consumer_id, cutoff)" \
	" WHERE c.consumer_id OPERATOR(pg_catalog.=) " t ".consumer_id)"

/* KS_CARRY_KEYS and KS_CARRY_COLLISIONS on the given table */
#define CARRIED_ROWS(table) \
	"SELECT t.ctid, t.consumer_id, t.processed_at, t.key, t.fingerprint" \
	" FROM " table " AS t WHERE t.ctid OPERATOR(pg_catalog.>) $2" \
	" AND (" CARRIED_FOR_ITS_CONSUMER("t", "$4") \
	" OR (t.consumer_id, t.key) OPERATOR(pg_catalog.=) ANY" \
	" (SELECT d.consumer_id, d.key FROM " STORAGE_SCHEMA ".dead_letters AS d" \
	" WHERE d.status OPERATOR(pg_catalog.=) 'pending'))" \
	" ORDER BY t.ctid LIMIT $3"

/*
 * In every statement on keys, $1 is a consumer id and $2 a key, but for
 * the inserts into the key and collision tables, whose columns are in
 * table order.  Hashes are passed and returned as bigint, whichever the
 * generation's hash.  Each statement runs on one generation
 * (keystore_internal.h), whose tables and hash function replace the
 * tokens @KEYS@, @COLLISIONS@ and @HASH@ (the function of the
 * generation's unique index).
 */
static const StorageStmt keystore_stmt_defs[KS_NUM_STMTS] = {
	/* from 1.1 on, keys keep the fingerprint of their message ($4, may be NULL) */
	[KS_INSERT_KEY_FP] = {
		"INSERT INTO @KEYS@ (consumer_id, processed_at, key, fingerprint)"
		" VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
		4, {INT4OID, INT4OID, TEXTOID, INT4OID}
	},
	/* KS_PROBE_KEY, and the fingerprint and time of the key where it is */
	[KS_PROBE_KEY_FP] = {
		"SELECT (" SAME_KEY_AS_ARGS "),"
		" EXISTS (SELECT FROM @COLLISIONS@ WHERE " SAME_KEY_AS_ARGS "),"
		" CASE WHEN (" SAME_KEY_AS_ARGS ") THEN fingerprint ELSE"
		"  (SELECT c.fingerprint FROM @COLLISIONS@ AS c"
		"   WHERE c.consumer_id OPERATOR(pg_catalog.=) $1 AND c.key OPERATOR(pg_catalog.=) $2) END,"
		" CASE WHEN (" SAME_KEY_AS_ARGS ") THEN processed_at ELSE"
		"  (SELECT c.processed_at FROM @COLLISIONS@ AS c"
		"   WHERE c.consumer_id OPERATOR(pg_catalog.=) $1 AND c.key OPERATOR(pg_catalog.=) $2) END"
		" FROM @KEYS@ WHERE " SAME_HASH_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	[KS_INSERT_COLLISION_FP] = {
		"INSERT INTO @COLLISIONS@ (consumer_id, processed_at, key, fingerprint)"
		" VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
		4, {INT4OID, INT4OID, TEXTOID, INT4OID}
	},
	[KS_DELETE_COLLISION_FP] = {
		"DELETE FROM @COLLISIONS@ WHERE " SAME_KEY_AS_ARGS
		" RETURNING processed_at, fingerprint",
		2, {INT4OID, TEXTOID}
	},
	[KS_INSERT_KEY] = {
		"INSERT INTO @KEYS@ (consumer_id, processed_at, key)"
		" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
		3, {INT4OID, INT4OID, TEXTOID}
	},
	/* the occupant of the key's hash: is it the key, or is the key a collision */
	[KS_PROBE_KEY] = {
		"SELECT (" SAME_KEY_AS_ARGS "),"
		" EXISTS (SELECT FROM @COLLISIONS@ WHERE " SAME_KEY_AS_ARGS ")"
		" FROM @KEYS@ WHERE " SAME_HASH_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	/*
	 * A no-op update of the occupant, before a collision is recorded: a
	 * transaction deleting the occupant concurrently then waits for us and
	 * sees our collision when it moves one into the occupant's place.
	 */
	[KS_CLAIM_OCCUPANT] = {
		"UPDATE @KEYS@ SET processed_at = processed_at"
		" WHERE " SAME_HASH_AS_ARGS " AND NOT (" SAME_KEY_AS_ARGS ")",
		2, {INT4OID, TEXTOID}
	},
	[KS_INSERT_COLLISION] = {
		"INSERT INTO @COLLISIONS@ (consumer_id, processed_at, key)"
		" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
		3, {INT4OID, INT4OID, TEXTOID}
	},
	/* who wrote the key's row, and when it says the key was recorded */
	[KS_KEY_WRITES] = {
		"SELECT xmin, processed_at FROM @KEYS@"
		" WHERE " SAME_HASH_AS_ARGS " AND " SAME_KEY_AS_ARGS
		" UNION ALL SELECT xmin, processed_at FROM @COLLISIONS@"
		" WHERE " SAME_KEY_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	[KS_DELETE_KEY] = {
		"DELETE FROM @KEYS@"
		" WHERE " SAME_HASH_AS_ARGS " AND " SAME_KEY_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	[KS_DELETE_COLLISION] = {
		"DELETE FROM @COLLISIONS@ WHERE " SAME_KEY_AS_ARGS
		" RETURNING processed_at",
		2, {INT4OID, TEXTOID}
	},
	/* any collision of any consumer whose hash is $1 */
	[KS_FIND_COLLISION] = {
		"SELECT consumer_id, key FROM @COLLISIONS@"
		" WHERE @HASH@(consumer_id, key) OPERATOR(pg_catalog.=) $1"
		" LIMIT 1",
		1, {INT8OID}
	},

	/*
	 * The dead-letter entry of a key, for idem_forget (keystore_remove.c):
	 * its resolved entry goes with the key, a pending one keeps it.
	 */
	[KS_ENTRY_STATUS] = {
		"SELECT status, dead_letter_id FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE " SAME_KEY_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	[KS_DELETE_RESOLVED_ENTRY] = {
		"DELETE FROM " STORAGE_SCHEMA ".dead_letters WHERE " SAME_KEY_AS_ARGS
		" AND status OPERATOR(pg_catalog.<>) 'pending'",
		2, {INT4OID, TEXTOID}
	},

	/* the purge's reads and removals (retention.c) */
	[KS_LATEST_COLLISIONS] = {
		LATEST_IN_BLOCKS("@COLLISIONS@"),
		2, {TIDOID, TIDOID}
	},
	[KS_LATEST_KEYS] = {
		LATEST_IN_BLOCKS("@KEYS@"),
		2, {TIDOID, TIDOID}
	},
	[KS_PURGEABLE_COLLISIONS] = {
		PURGEABLE_IN_BLOCKS("@COLLISIONS@"),
		4, {INT4ARRAYOID, INT4ARRAYOID, TIDOID, TIDOID}
	},
	[KS_PURGEABLE_KEYS] = {
		PURGEABLE_IN_BLOCKS("@KEYS@"),
		4, {INT4ARRAYOID, INT4ARRAYOID, TIDOID, TIDOID}
	},
	/*
	 * Removals by TID use a generic plan: a custom plan knows the thousands
	 * of TIDs and, costing a random read for each, would rather read the
	 * whole table, though they lie in the few blocks of one chunk.  They
	 * check the rows again against the cutoffs ($2 and $3, as for
	 * PURGEABLE_IN_BLOCKS): between the two statements a row may have been
	 * deleted and vacuumed away, and its TID given to a new key.  They
	 * remove only what they could lock at once (LOCK_REMOVABLE).
	 */
	[KS_REMOVE_COLLISIONS] = {
		LOCK_REMOVABLE("@COLLISIONS@") ","
		" removed AS (DELETE FROM @COLLISIONS@ AS k"
		" WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT c.tid FROM candidate AS c"
		" WHERE " CANDIDATE_ENTRY_FREE "))"
		" RETURNING k.consumer_id, k.key)"
		AND_RESOLVED_ENTRIES_EXPIRE
		" SELECT FROM removed",
		3, {TIDARRAYOID, INT4ARRAYOID, INT4ARRAYOID}, CURSOR_OPT_GENERIC_PLAN
	},
	/*
	 * Returns the hashes whose occupants it removed.  An occupant leaves
	 * only if every collision of its hash is locked too, since one of them
	 * moves into its place (keystore_remove_rows()).
	 */
	[KS_REMOVE_KEYS] = {
		LOCK_REMOVABLE("@KEYS@") ","
		" colliding AS MATERIALIZED (SELECT x.ctid AS tid,"
		" @HASH@(x.consumer_id, x.key) AS hash"
		" FROM @COLLISIONS@ AS x"
		" WHERE @HASH@(x.consumer_id, x.key) OPERATOR(pg_catalog.=) ANY"
		" (ARRAY(SELECT @HASH@(consumer_id, key) FROM candidate)))," 
		" locked_colliding AS MATERIALIZED (SELECT x.ctid AS tid"
		" FROM @COLLISIONS@ AS x"
		" WHERE x.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT tid FROM colliding))"
		" FOR UPDATE OF x SKIP LOCKED),"
		" busy_hash AS (SELECT x.hash FROM colliding AS x"
		" WHERE NOT EXISTS (SELECT FROM locked_colliding AS l WHERE l.tid OPERATOR(pg_catalog.=) x.tid)),"
		" removed AS (DELETE FROM @KEYS@ AS k"
		" WHERE k.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT c.tid FROM candidate AS c"
		" WHERE " CANDIDATE_ENTRY_FREE
		" AND NOT EXISTS (SELECT FROM busy_hash AS h WHERE h.hash OPERATOR(pg_catalog.=) "
		"@HASH@(c.consumer_id, c.key))))"
		" RETURNING k.consumer_id, k.key)"
		AND_RESOLVED_ENTRIES_EXPIRE
		" SELECT @HASH@(consumer_id, key)::pg_catalog.int8 FROM removed",
		3, {TIDARRAYOID, INT4ARRAYOID, INT4ARRAYOID}, CURSOR_OPT_GENERIC_PLAN
	},
	/*
	 * Which of the hashes in $1 have collisions.  Generic: planning a custom
	 * plan for thousands of constants costs more than running it.  Written
	 * as a join over unnest($1), so that each hash is looked up once, by the
	 * index or in a hash table; "key_hash(...) = ANY ($1)" would compare
	 * every collision with every hash of the array, most of a purge's time
	 * once the collisions number hundreds.
	 */
	[KS_COLLIDING_HASHES] = {
		"SELECT DISTINCT h.hash FROM pg_catalog.unnest($1) AS h (hash)"
		" WHERE EXISTS (SELECT FROM @COLLISIONS@ AS c"
		" WHERE @HASH@(c.consumer_id, c.key) OPERATOR(pg_catalog.=) h.hash)",
		1, {INT8ARRAYOID}, CURSOR_OPT_GENERIC_PLAN
	},

	/*
	 * A batch of keys ($3) in one insert.  The rows go in in the order of
	 * the unique index, (hash, then key for keys of one hash), so that all
	 * batches wait for each other's keys in one global order.  A batch
	 * waits for another transaction only at a hash that transaction has
	 * inserted, and every transaction inserts its hashes in ascending
	 * order: when B waits for A at hash h, A has passed h, and A can only
	 * come to wait for B at a hash above h, which B has not reached.  So
	 * two batches cannot wait for each other, whatever order their arrays
	 * are in.  A key repeated in the batch conflicts with its own first
	 * copy and is returned once.
	 */
	[KS_INSERT_BATCH] = {
		"INSERT INTO @KEYS@ (consumer_id, processed_at, key)"
		" SELECT $1, $2, b.key FROM pg_catalog.unnest($3) AS b(key)"
		" ORDER BY @HASH@($1, b.key), b.key COLLATE pg_catalog.\"C\""
		" ON CONFLICT DO NOTHING RETURNING key",
		3, {INT4OID, INT4OID, TEXTARRAYOID}
	},

	/*
	 * The keys of batch $2 that were not inserted ($3 are those that were)
	 * and are not recorded either: they collide with another key's hash,
	 * or the occupant was deleted after the insert saw it.
	 */
	[KS_UNRESOLVED_BATCH] = {
		"SELECT d.key FROM (SELECT b.key FROM pg_catalog.unnest($2) AS b(key)"
		" EXCEPT SELECT i.key FROM pg_catalog.unnest($3) AS i(key)) AS d"
		" WHERE NOT EXISTS (SELECT FROM @KEYS@ AS p"
		"  WHERE @HASH@(p.consumer_id, p.key) OPERATOR(pg_catalog.=) "
		"@HASH@($1, d.key)"
		"  AND p.consumer_id OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) d.key)"
		" AND NOT EXISTS (SELECT FROM @COLLISIONS@ AS c"
		"  WHERE c.consumer_id OPERATOR(pg_catalog.=) $1 AND c.key OPERATOR(pg_catalog.=) d.key)",
		3, {INT4OID, TEXTARRAYOID, TEXTARRAYOID}
	},

	/*
	 * Whether a pending dead letter's key is in the generation: such a key
	 * is never dropped (see AND_NO_PENDING_DEAD_LETTER).
	 */
	[KS_PENDING_IN_GENERATION] = {
		"SELECT FROM " STORAGE_SCHEMA ".dead_letters AS d"
		" WHERE d.status OPERATOR(pg_catalog.=) 'pending'"
		" AND (EXISTS (SELECT FROM @KEYS@ AS k"
		"  WHERE @HASH@(k.consumer_id, k.key) OPERATOR(pg_catalog.=) @HASH@(d.consumer_id, d.key)"
		"  AND k.consumer_id OPERATOR(pg_catalog.=) d.consumer_id AND k.key OPERATOR(pg_catalog.=) d.key)"
		" OR EXISTS (SELECT FROM @COLLISIONS@ AS c"
		"  WHERE c.consumer_id OPERATOR(pg_catalog.=) d.consumer_id AND c.key OPERATOR(pg_catalog.=) d.key))"
		" LIMIT 1",
		0, {InvalidOid}
	},
	/*
	 * The resolved dead-letter entries of a generation's keys expire with
	 * them, but for those of the keys a retirement carries into the
	 * current generation (consumers $1 with cutoffs $2)
	 */
	[KS_EXPIRE_RESOLVED_IN_GENERATION] = {
		"DELETE FROM " STORAGE_SCHEMA ".dead_letters AS d"
		" WHERE d.status OPERATOR(pg_catalog.<>) 'pending'"
		" AND (EXISTS (SELECT FROM @KEYS@ AS k"
		"  WHERE @HASH@(k.consumer_id, k.key) OPERATOR(pg_catalog.=) @HASH@(d.consumer_id, d.key)"
		"  AND k.consumer_id OPERATOR(pg_catalog.=) d.consumer_id AND k.key OPERATOR(pg_catalog.=) d.key"
		"  AND " CARRIED_FOR_ITS_CONSUMER("k", "$2") " IS NOT TRUE)"
		" OR EXISTS (SELECT FROM @COLLISIONS@ AS c"
		"  WHERE c.consumer_id OPERATOR(pg_catalog.=) d.consumer_id AND c.key OPERATOR(pg_catalog.=) d.key"
		"  AND " CARRIED_FOR_ITS_CONSUMER("c", "$2") " IS NOT TRUE))",
		2, {INT4ARRAYOID, INT4ARRAYOID}
	},
	/* the caller holds ACCESS EXCLUSIVE on both already: no wait */
	[KS_TRUNCATE_GENERATION] = {
		"TRUNCATE @KEYS@, @COLLISIONS@@FILTER@",
		0, {InvalidOid}
	},

	/*
	 * The keys a retirement carries out of a generation into the current
	 * one (keygen_retire.c): those of the consumers $1, and those of
	 * pending dead letters, after the row $2, a page at a time.
	 */
	[KS_CARRY_KEYS] = {
		CARRIED_ROWS("@KEYS@"),
		4, {INT4ARRAYOID, TIDOID, INT4OID, INT4ARRAYOID}
	},
	[KS_CARRY_COLLISIONS] = {
		CARRIED_ROWS("@COLLISIONS@"),
		4, {INT4ARRAYOID, TIDOID, INT4OID, INT4ARRAYOID}
	},

	/* the identity sequence behind replicated rows (IDS_PAST_ROWS) */
	[KS_DEAD_LETTER_IDS_PAST_ROWS] = {
		IDS_PAST_ROWS("dead_letters", "dead_letter_id"),
		0, {InvalidOid}
	},
};

/*
 * The statements of each generation, with its names in place of the
 * tokens, made when the storage is located anew, and their plans.
 */
static StorageStmt keystore_gen_stmts[KEYGEN_NUM][KS_NUM_STMTS];
static SPIPlanPtr keystore_plans[KEYGEN_NUM][KS_NUM_STMTS];
static StorageStmtSet keystore_stmts[KEYGEN_NUM];
static uint64 keystore_texts_generation;
static MemoryContext keystore_texts_cxt;

/*
 * Returns text with every token replaced by its value; tokens and values
 * are parallel arrays of ntokens.
 */
static char *
replace_tokens(const char *text, const char *const *tokens,
			   const char *const *values, int ntokens)
{
	StringInfoData buf;
	const char *p = text;

	initStringInfo(&buf);
	while (*p != '\0')
	{
		int			t;

		for (t = 0; t < ntokens; t++)
			if (strncmp(p, tokens[t], strlen(tokens[t])) == 0)
				break;
		if (t < ntokens)
		{
			appendStringInfoString(&buf, values[t]);
			p += strlen(tokens[t]);
		}
		else
			appendStringInfoChar(&buf, *p++);
	}
	return buf.data;
}

/*
 * Writes the statements of every generation of the storage as located now.
 */
static void
make_generation_texts(const StorageInfo *si)
{
	static const char *const tokens[] = {"@KEYS@", "@COLLISIONS@", "@HASH@", "@FILTER@"};

	if (keystore_texts_cxt == NULL)
		keystore_texts_cxt = AllocSetContextCreate(TopMemoryContext,
												   "idem_consumer key store statements",
												   ALLOCSET_DEFAULT_SIZES);
	MemoryContextReset(keystore_texts_cxt);

	for (int g = 0; g < KEYGEN_NUM; g++)
	{
		const KeyGeneration *gen = &si->gens[g];
		MemoryContext oldcxt;
		const char *values[lengthof(tokens)];

		if (!OidIsValid(gen->keys_relid))
			continue;
		if (keystore_stmts[g].stmts == NULL)
		{
			keystore_stmts[g].stmts = keystore_gen_stmts[g];
			keystore_stmts[g].nstmts = KS_NUM_STMTS;
			keystore_stmts[g].plans = keystore_plans[g];
		}
		oldcxt = MemoryContextSwitchTo(keystore_texts_cxt);
		values[0] = quote_qualified_identifier(STORAGE_SCHEMA, get_rel_name(gen->keys_relid));
		values[1] = quote_qualified_identifier(STORAGE_SCHEMA,
											   get_rel_name(gen->collisions_relid));
		values[2] = gen->hash64 ? STORAGE_SCHEMA ".key_hash64" : STORAGE_SCHEMA ".key_hash";
		values[3] = !OidIsValid(gen->filter_relid) ? "" :
			psprintf(", %s", quote_qualified_identifier(LOCAL_SCHEMA,
														get_rel_name(gen->filter_relid)));
		for (int i = 0; i < KS_NUM_STMTS; i++)
		{
			keystore_gen_stmts[g][i] = keystore_stmt_defs[i];
			keystore_gen_stmts[g][i].sql =
				replace_tokens(keystore_stmt_defs[i].sql, tokens, values,
							   lengthof(tokens));
		}
		MemoryContextSwitchTo(oldcxt);
	}
	keystore_texts_generation = si->generation;
}

/*
 * Runs one statement of the key store on a generation, as the owner of the
 * storage tables, with the given snapshot (NULL: as SPI_execute_plan
 * takes one).
 */
static int
execute_on_generation(KeyGenSlot slot, KeystoreStmt stmt, Datum *values,
					  const char *nulls, Snapshot snapshot, long tcount)
{
	const StorageInfo *si = storage_locate();
	StorageStmtSet *set = &keystore_stmts[slot];

	if (keystore_texts_generation != si->generation)
		make_generation_texts(si);
	if (!OidIsValid(si->gens[slot].keys_relid))
		elog(ERROR, "idem_consumer has no generation %d", (int) slot);
	return storage_stmt_run_snapshot(set, stmt, values, nulls, snapshot, tcount);
}

/*
 * Runs one statement of the key store on a generation.
 */
int
keystore_execute_in(KeyGenSlot slot, KeystoreStmt stmt, Datum *values,
					const char *nulls, long tcount)
{
	return execute_on_generation(slot, stmt, values, nulls, NULL, tcount);
}

/*
 * Runs one statement of the key store on a generation with a snapshot of
 * the caller's choice.
 */
int
keystore_execute_snapshot(KeyGenSlot slot, KeystoreStmt stmt, Datum *values,
						  Snapshot snapshot, long tcount)
{
	return execute_on_generation(slot, stmt, values, NULL, snapshot, tcount);
}

/*
 * Runs one statement of the key store on the current generation, the one
 * that takes new keys.
 */
int
keystore_execute(KeystoreStmt stmt, Datum *values, const char *nulls,
				 long tcount)
{
	return execute_on_generation(keygen_state()->current, stmt, values, nulls,
								 NULL, tcount);
}
