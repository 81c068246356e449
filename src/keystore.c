/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  The extension's storage: the consumers table, the processed-keys table,
 *	  the dead-letter table and the statements that read and write them.
 *
 * Every statement here runs as the owner of the tables, the way
 * ri_triggers.c runs its checks as the owner of the referenced table: the
 * caller needs EXECUTE on the API functions, not privileges on the storage.
 * Nothing the caller controls (business SQL, search_path) runs while the
 * user id is switched: the statements are fixed, fully schema-qualified
 * text, and their parameters are values.
 *
 * Uniqueness of (consumer, key) rests on the unique index of
 * processed_keys over a 32-bit hash of the pair, with key_collisions
 * holding the keys whose hash another key already took.  A new key costs
 * one INSERT ... ON CONFLICT DO NOTHING, which gives the documented
 * concurrency behaviour: a second inserter of the same hash waits for the
 * first transaction, then finds the row (first committed) or inserts its
 * own (first aborted); under REPEATABLE READ or SERIALIZABLE a row
 * committed after our snapshot was taken raises a serialization failure.
 * Only on a conflict do we look at the occupant of the hash to tell a
 * duplicate from a collision.
 *
 * The SQL statements are the reference path.  Recording a key and telling
 * a duplicate take a fast path in C instead whenever the storage is exactly
 * as the extension creates it: the key's hash is looked up in the unique
 * index with the caller's snapshot, and a key found there visible is a
 * duplicate without further ado (no transaction id, no WAL, no waiting).
 * A new key is inserted the way INSERT ... ON CONFLICT does it, with a
 * speculative insertion, but without the executor: heap tuple with a
 * speculative token, index entry with a partial uniqueness check, then
 * the tuple confirmed.  Anything else (another key in the hash's place, a
 * row not visible to the snapshot, a concurrent inserter) gives the
 * speculative tuple up and takes the SQL path, which waits and decides.
 *
 * Invariant: a key is in key_collisions only while processed_keys holds a
 * different key of the same hash.  Recording a collision first updates the
 * occupant (a no-op update) so that a concurrent deletion of the occupant
 * waits for it, and whoever deletes an occupant moves a collision in its
 * place.  Hence a successful insert into processed_keys proves the key was
 * in neither table.
 *
 * Retention (retention.c) removes rows chunk by chunk: it reads the rows of
 * a range of heap blocks of a table and names the ones to remove by TID,
 * and keystore_remove_rows() removes them and keeps the invariant, moving
 * a collision into the place of every occupant it removed.  The purge's
 * statements are in the table below with the others, and the one condition
 * that keeps the keys of pending dead letters is marked there.
 *
 * Consumer ids are cached per backend, but only once the row that maps the
 * name is known to be committed by another transaction: an id created by
 * the current transaction would be a lie after a rollback, and a later
 * backend would create the same consumer under a second id.
 *
 * The dead-letter statements are here for the owner switch and plan
 * caching only; what they mean is dead_letter.c's business.
 *
 * The caller must be connected to SPI.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_index.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/primnodes.h"
#include "optimizer/plancat.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/bufpage.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

#define STORAGE_SCHEMA "idem_consumer"

typedef struct KeystoreStmtDef
{
	const char *sql;
	int			nargs;
	Oid			argtypes[KS_MAX_ARGS];
	int			cursor_options; /* as for SPI_prepare_cursor */
} KeystoreStmtDef;

#define SAME_HASH_AS_ARGS \
	STORAGE_SCHEMA ".key_hash(consumer_id, key) OPERATOR(pg_catalog.=) " \
	STORAGE_SCHEMA ".key_hash($1, $2)"
#define SAME_KEY_AS_ARGS \
	"consumer_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"
#define DEAD_LETTER_COLUMNS \
	"dead_letter_id, consumer_id, key, sql, params, settings, status," \
	" resolved_by, discard_reason"

#define DL_INSERT_COLUMNS \
	"consumer_id, key, sql, params, event_time, settings, sqlstate, message," \
	" detail, hint, context, dead_lettered_by"
#define DL_INSERT_VALUES "$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12"
#define DL_INSERT_TYPES \
	INT4OID, TEXTOID, TEXTOID, TEXTARRAYOID, TIMESTAMPTZOID, TEXTARRAYOID, \
	TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID
#define DL_INSERT_CONFLICT \
	" ON CONFLICT (consumer_id, key) DO UPDATE SET sql = excluded.sql," \
	" params = excluded.params, event_time = excluded.event_time," \
	" settings = excluded.settings, sqlstate = excluded.sqlstate," \
	" message = excluded.message, detail = excluded.detail, hint = excluded.hint," \
	" context = excluded.context, first_failed_at = pg_catalog.now()," \
	" last_failed_at = pg_catalog.now(), attempts = 1," \
	" dead_lettered_by = excluded.dead_lettered_by, status = 'pending'," \
	" resolved_at = NULL, resolved_by = NULL, discard_reason = NULL"
#define DL_INSERT_UNLESS_PENDING \
	" WHERE dead_letters.status OPERATOR(pg_catalog.<>) 'pending'"

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
	" FROM " STORAGE_SCHEMA "." table \
	" WHERE " IN_BLOCK_RANGE("ctid", "$1", "$2") \
	" GROUP BY consumer_id"

/*
 * Per consumer, the TIDs of the rows of a range of blocks ($3, $4) that
 * are older than the consumer's cutoff; $1 and $2 are parallel arrays of
 * consumer ids and cutoffs.  Consumers not in $1 keep everything.  The
 * TIDs come in no particular order: ordering them in the aggregate makes
 * the planner sort the whole chunk, twice, which tripled the statement's
 * time; the caller sorts a consumer's TIDs only when its quota cuts them.
 */
#define PURGEABLE_IN_BLOCKS(table) \
	"SELECT k.consumer_id, pg_catalog.array_agg(k.ctid)" \
	" FROM " STORAGE_SCHEMA "." table " AS k" \
	" JOIN ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2))" \
	" AS w (consumer_id, cutoff)" \
	" ON k.consumer_id OPERATOR(pg_catalog.=) w.consumer_id" \
	" WHERE " IN_BLOCK_RANGE("k.ctid", "$3", "$4") \
	" AND k.processed_at OPERATOR(pg_catalog.<) w.cutoff" \
	AND_NO_PENDING_DEAD_LETTER("k") \
	" GROUP BY k.consumer_id"

/*
 * In every statement on keys, $1 is a consumer id and $2 a key, but for
 * the inserts into processed_keys and key_collisions, whose columns are in
 * table order.
 */
static const KeystoreStmtDef keystore_stmt_defs[KS_NUM_STMTS] = {
	[KS_FIND_CONSUMER] = {
		"SELECT consumer_id, xmin FROM " STORAGE_SCHEMA ".consumers"
		" WHERE name OPERATOR(pg_catalog.=) $1",
		1, {TEXTOID}
	},
	[KS_CREATE_CONSUMER] = {
		"INSERT INTO " STORAGE_SCHEMA ".consumers (name) VALUES ($1)"
		" ON CONFLICT (name) DO NOTHING RETURNING consumer_id",
		1, {TEXTOID}
	},
	[KS_INSERT_KEY] = {
		"INSERT INTO " STORAGE_SCHEMA ".processed_keys (consumer_id, processed_at, key)"
		" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
		3, {INT4OID, INT4OID, TEXTOID}
	},
	/* the occupant of the key's hash: is it the key, or is the key a collision */
	[KS_PROBE_KEY] = {
		"SELECT (" SAME_KEY_AS_ARGS "),"
		" EXISTS (SELECT FROM " STORAGE_SCHEMA ".key_collisions WHERE " SAME_KEY_AS_ARGS ")"
		" FROM " STORAGE_SCHEMA ".processed_keys WHERE " SAME_HASH_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	/*
	 * A no-op update of the occupant, before a collision is recorded: a
	 * transaction deleting the occupant concurrently then waits for us and
	 * sees our collision when it moves one into the occupant's place.
	 */
	[KS_CLAIM_OCCUPANT] = {
		"UPDATE " STORAGE_SCHEMA ".processed_keys SET processed_at = processed_at"
		" WHERE " SAME_HASH_AS_ARGS " AND NOT (" SAME_KEY_AS_ARGS ")",
		2, {INT4OID, TEXTOID}
	},
	[KS_INSERT_COLLISION] = {
		"INSERT INTO " STORAGE_SCHEMA ".key_collisions (consumer_id, processed_at, key)"
		" VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
		3, {INT4OID, INT4OID, TEXTOID}
	},
	[KS_DELETE_KEY] = {
		"DELETE FROM " STORAGE_SCHEMA ".processed_keys"
		" WHERE " SAME_HASH_AS_ARGS " AND " SAME_KEY_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	[KS_DELETE_COLLISION] = {
		"DELETE FROM " STORAGE_SCHEMA ".key_collisions WHERE " SAME_KEY_AS_ARGS
		" RETURNING processed_at",
		2, {INT4OID, TEXTOID}
	},
	/* any collision of any consumer whose hash is $1 */
	[KS_FIND_COLLISION] = {
		"SELECT consumer_id, key FROM " STORAGE_SCHEMA ".key_collisions"
		" WHERE " STORAGE_SCHEMA ".key_hash(consumer_id, key) OPERATOR(pg_catalog.=) $1"
		" LIMIT 1",
		1, {INT4OID}
	},

	/*
	 * Dead letters.  The two locking reads return DEAD_LETTER_COLUMNS, in
	 * the order dead_letter.c reads them.
	 */
	/*
	 * A new entry, or a new failure in the place of a resolved entry that
	 * outlived its key (the purge removes resolved entries with their
	 * keys; a key removed by hand leaves its entry).  A pending entry
	 * stays as it is.  The second form is for version 1.1 of the SQL
	 * objects, which records the parking role.
	 */
	[KS_DL_INSERT] = {
		"INSERT INTO " STORAGE_SCHEMA ".dead_letters (" DL_INSERT_COLUMNS ")"
		" VALUES (" DL_INSERT_VALUES ")" DL_INSERT_CONFLICT DL_INSERT_UNLESS_PENDING,
		12, {DL_INSERT_TYPES}
	},
	[KS_DL_INSERT_ROLE] = {
		"INSERT INTO " STORAGE_SCHEMA ".dead_letters (" DL_INSERT_COLUMNS ", dead_lettered_role)"
		" VALUES (" DL_INSERT_VALUES ", $13)" DL_INSERT_CONFLICT
		", dead_lettered_role = excluded.dead_lettered_role" DL_INSERT_UNLESS_PENDING,
		13, {DL_INSERT_TYPES, REGROLEOID}
	},
	/* what a replay needs to know whose rights the entry's SQL runs with */
	[KS_DL_ROLE] = {
		"SELECT d.dead_lettered_role, c.name, d.dead_lettered_by"
		" FROM " STORAGE_SCHEMA ".dead_letters AS d"
		" JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.consumer_id OPERATOR(pg_catalog.=) d.consumer_id"
		" WHERE d.dead_letter_id OPERATOR(pg_catalog.=) $1",
		1, {INT8OID}
	},
	[KS_DL_KEY_STATUS] = {
		"SELECT status, dead_letter_id FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE " SAME_KEY_AS_ARGS,
		2, {INT4OID, TEXTOID}
	},
	[KS_DL_LOCK] = {
		"SELECT " DEAD_LETTER_COLUMNS " FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1 FOR NO KEY UPDATE",
		1, {INT8OID}
	},
	/* the oldest pending entry of a consumer after $2 that nobody is replaying */
	[KS_DL_LOCK_NEXT_PENDING] = {
		"SELECT " DEAD_LETTER_COLUMNS " FROM " STORAGE_SCHEMA ".dead_letters"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1"
		" AND status OPERATOR(pg_catalog.=) 'pending'"
		" AND dead_letter_id OPERATOR(pg_catalog.>) $2"
		" ORDER BY dead_letter_id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED",
		2, {INT4OID, INT8OID}
	},
	[KS_DL_FAILED_AGAIN] = {
		"UPDATE " STORAGE_SCHEMA ".dead_letters"
		" SET attempts = attempts OPERATOR(pg_catalog.+) 1, last_failed_at = pg_catalog.now(),"
		" sqlstate = $2, message = $3, detail = $4, hint = $5, context = $6"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		6, {INT8OID, TEXTOID, TEXTOID, TEXTOID, TEXTOID, TEXTOID}
	},
	[KS_DL_REPLAYED] = {
		"UPDATE " STORAGE_SCHEMA ".dead_letters"
		" SET status = 'replayed', attempts = attempts OPERATOR(pg_catalog.+) 1,"
		" resolved_at = pg_catalog.now(), resolved_by = $2"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		2, {INT8OID, TEXTOID}
	},
	[KS_DL_DISCARDED] = {
		"UPDATE " STORAGE_SCHEMA ".dead_letters"
		" SET status = 'discarded', resolved_at = pg_catalog.now(), resolved_by = $2,"
		" discard_reason = $3"
		" WHERE dead_letter_id OPERATOR(pg_catalog.=) $1",
		3, {INT8OID, TEXTOID, TEXTOID}
	},
	[KS_DL_DELETE_RESOLVED] = {
		"DELETE FROM " STORAGE_SCHEMA ".dead_letters WHERE " SAME_KEY_AS_ARGS
		" AND status OPERATOR(pg_catalog.<>) 'pending'",
		2, {INT4OID, TEXTOID}
	},

	/* retention settings and the purge (retention.c) */
	[KS_RETENTION_SETTINGS] = {
		"SELECT consumer_id, retention FROM " STORAGE_SCHEMA ".retention_settings",
		0, {InvalidOid}
	},
	[KS_SET_RETENTION] = {
		"INSERT INTO " STORAGE_SCHEMA ".retention_settings (consumer_id, retention)"
		" VALUES ($1, $2) ON CONFLICT (consumer_id) DO UPDATE"
		" SET retention = excluded.retention, updated_at = pg_catalog.now()",
		2, {INT4OID, INTERVALOID}
	},
	[KS_RESET_RETENTION] = {
		"DELETE FROM " STORAGE_SCHEMA ".retention_settings"
		" WHERE consumer_id OPERATOR(pg_catalog.=) $1",
		1, {INT4OID}
	},
	/* sizes in bytes, in the order of KeystoreTable */
	[KS_TABLE_SIZES] = {
		"SELECT pg_catalog.pg_relation_size('" STORAGE_SCHEMA ".key_collisions'::pg_catalog.regclass),"
		" pg_catalog.pg_relation_size('" STORAGE_SCHEMA ".processed_keys'::pg_catalog.regclass)",
		0, {InvalidOid}
	},
	[KS_LATEST_COLLISIONS] = {
		LATEST_IN_BLOCKS("key_collisions"),
		2, {TIDOID, TIDOID}
	},
	[KS_LATEST_KEYS] = {
		LATEST_IN_BLOCKS("processed_keys"),
		2, {TIDOID, TIDOID}
	},
	[KS_PURGEABLE_COLLISIONS] = {
		PURGEABLE_IN_BLOCKS("key_collisions"),
		4, {INT4ARRAYOID, INT4ARRAYOID, TIDOID, TIDOID}
	},
	[KS_PURGEABLE_KEYS] = {
		PURGEABLE_IN_BLOCKS("processed_keys"),
		4, {INT4ARRAYOID, INT4ARRAYOID, TIDOID, TIDOID}
	},
	/*
	 * Removals by TID use a generic plan: a custom plan knows the thousands
	 * of TIDs and, costing a random read for each, would rather read the
	 * whole table, though they lie in the few blocks of one chunk.  They
	 * check the rows again against the cutoffs ($2 and $3, as for
	 * PURGEABLE_IN_BLOCKS): between the two statements a row may have been
	 * deleted and vacuumed away, and its TID given to a new key.
	 */
	[KS_REMOVE_COLLISIONS] = {
		"WITH removed AS (DELETE FROM " STORAGE_SCHEMA ".key_collisions AS k"
		" USING ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS w (consumer_id, cutoff)"
		" WHERE k.ctid OPERATOR(pg_catalog.=) ANY ($1)"
		" AND k.consumer_id OPERATOR(pg_catalog.=) w.consumer_id"
		" AND k.processed_at OPERATOR(pg_catalog.<) w.cutoff"
		AND_NO_PENDING_DEAD_LETTER("k")
		" RETURNING k.consumer_id, k.key)"
		AND_RESOLVED_ENTRIES_EXPIRE
		" SELECT FROM removed",
		3, {TIDARRAYOID, INT4ARRAYOID, INT4ARRAYOID}, CURSOR_OPT_GENERIC_PLAN
	},
	/* returns the hashes whose occupants it removed */
	[KS_REMOVE_KEYS] = {
		"WITH removed AS (DELETE FROM " STORAGE_SCHEMA ".processed_keys AS k"
		" USING ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS w (consumer_id, cutoff)"
		" WHERE k.ctid OPERATOR(pg_catalog.=) ANY ($1)"
		" AND k.consumer_id OPERATOR(pg_catalog.=) w.consumer_id"
		" AND k.processed_at OPERATOR(pg_catalog.<) w.cutoff"
		AND_NO_PENDING_DEAD_LETTER("k")
		" RETURNING k.consumer_id, k.key)"
		AND_RESOLVED_ENTRIES_EXPIRE
		" SELECT " STORAGE_SCHEMA ".key_hash(consumer_id, key) FROM removed",
		3, {TIDARRAYOID, INT4ARRAYOID, INT4ARRAYOID}, CURSOR_OPT_GENERIC_PLAN
	},
	/*
	 * Which of the hashes in $1 have collisions.  Generic: planning a custom
	 * plan for thousands of constants costs more than running it.  Written
	 * as a join over unnest($1), so that each hash is looked up once, by the
	 * index or in a hash table; "key_hash(...) = ANY ($1)" compared every
	 * collision with every hash of the array, which took most of a purge's
	 * time once the collisions numbered hundreds.
	 */
	[KS_COLLIDING_HASHES] = {
		"SELECT DISTINCT h.hash FROM pg_catalog.unnest($1) AS h (hash)"
		" WHERE EXISTS (SELECT FROM " STORAGE_SCHEMA ".key_collisions AS c"
		" WHERE " STORAGE_SCHEMA ".key_hash(c.consumer_id, c.key) OPERATOR(pg_catalog.=) h.hash)",
		1, {INT4ARRAYOID}, CURSOR_OPT_GENERIC_PLAN
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
		"INSERT INTO " STORAGE_SCHEMA ".processed_keys (consumer_id, processed_at, key)"
		" SELECT $1, $2, b.key FROM pg_catalog.unnest($3) AS b(key)"
		" ORDER BY " STORAGE_SCHEMA ".key_hash($1, b.key), b.key COLLATE pg_catalog.\"C\""
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
		" WHERE NOT EXISTS (SELECT FROM " STORAGE_SCHEMA ".processed_keys AS p"
		"  WHERE " STORAGE_SCHEMA ".key_hash(p.consumer_id, p.key) OPERATOR(pg_catalog.=) "
		STORAGE_SCHEMA ".key_hash($1, d.key)"
		"  AND p.consumer_id OPERATOR(pg_catalog.=) $1 AND p.key OPERATOR(pg_catalog.=) d.key)"
		" AND NOT EXISTS (SELECT FROM " STORAGE_SCHEMA ".key_collisions AS c"
		"  WHERE c.consumer_id OPERATOR(pg_catalog.=) $1 AND c.key OPERATOR(pg_catalog.=) d.key)",
		3, {INT4OID, TEXTARRAYOID, TEXTARRAYOID}
	},
};

typedef struct ConsumerIdEntry
{
	char		name[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	int32		consumer_id;
} ConsumerIdEntry;

/*
 * Per-backend state.  "located" means the OIDs, owner and plans belong to
 * the storage as it is now; "recheck" is set by a relcache invalidation of
 * the storage tables, after which we verify the tables still exist before
 * trusting anything cached (DROP EXTENSION and CREATE EXTENSION again give
 * new tables and new consumer ids).  hash_index is the unique index of
 * processed_keys if it is the one the extension creates, else InvalidOid,
 * which turns the fast path off.
 */
static struct
{
	bool		located;
	bool		recheck;
	Oid			keys_relid;
	Oid			consumers_relid;
	Oid			hash_index;
	Oid			owner;
	SPIPlanPtr	plans[KS_NUM_STMTS];
	HTAB	   *consumer_ids;
} keystore;

/* What the fast path found in the place of a key's hash. */
typedef enum KeyProbe
{
	PROBE_EMPTY,				/* no row visible to the snapshot */
	PROBE_KEY,					/* the key itself: it is recorded */
	PROBE_OTHER					/* another key: the key may be a collision */
} KeyProbe;

/* processed_keys and its unique index, opened for the fast path */
typedef struct FastPath
{
	Relation	keys;
	Relation	hash_index;
	IndexInfo  *index_info;		/* built by the first insert */
	Snapshot	snapshot;
	IndexScanDesc scan;			/* set up by the first probe */
	TupleTableSlot *slot;		/* the same */
	MemoryContext cxt;			/* where these live */
} FastPath;

PG_FUNCTION_INFO_V1(idem_key_hash);

/*
 * Notes that a storage table may have been dropped or changed owner.
 */
static void
keystore_relcache_callback(Datum arg, Oid relid)
{
	if (keystore.located &&
		(relid == InvalidOid ||
		 relid == keystore.keys_relid ||
		 relid == keystore.consumers_relid))
		keystore.recheck = true;
}

/*
 * Registers the invalidation callback; called once from _PG_init.
 */
void
keystore_init(void)
{
	CacheRegisterRelcacheCallback(keystore_relcache_callback, (Datum) 0);
}

/*
 * Forgets every OID, plan and consumer id cached for the storage.
 */
static void
keystore_reset(void)
{
	for (int i = 0; i < KS_NUM_STMTS; i++)
	{
		if (keystore.plans[i] != NULL)
			SPI_freeplan(keystore.plans[i]);
		keystore.plans[i] = NULL;
	}
	if (keystore.consumer_ids != NULL)
		hash_destroy(keystore.consumer_ids);
	keystore.consumer_ids = NULL;
	keystore.located = false;
	keystore.recheck = false;
}

/*
 * Returns the owner of a storage table, or InvalidOid if it is gone.
 */
static Oid
storage_table_owner(Oid relid)
{
	HeapTuple	tuple;
	Oid			owner;

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);
	return owner;
}

/*
 * Returns the OID of processed_keys_hash if it is the index the extension
 * creates (unique, btree, immediate, valid, on key_hash(consumer_id, key)
 * and nothing else), InvalidOid if the fast path must not maintain it.
 */
static Oid
usable_hash_index(Oid nspid)
{
	Oid			indexoid = get_relname_relid("processed_keys_hash", nspid);
	HeapTuple	tuple;
	Form_pg_index index;
	Oid			funcid = InvalidOid;
	bool		usable;

	if (!OidIsValid(indexoid))
		return InvalidOid;

	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(indexoid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	index = (Form_pg_index) GETSTRUCT(tuple);
	usable = index->indrelid == keystore.keys_relid &&
		index->indisunique && index->indimmediate && index->indisvalid &&
		index->indisready && index->indislive &&
		index->indnatts == 1 && index->indkey.values[0] == 0 &&
		heap_attisnull(tuple, Anum_pg_index_indpred, NULL) &&
		!heap_attisnull(tuple, Anum_pg_index_indexprs, NULL);
	if (usable)
	{
		bool		isnull;
		List	   *exprs;
		FuncExpr   *expr;

		exprs = (List *) stringToNode(TextDatumGetCString(
			SysCacheGetAttr(INDEXRELID, tuple, Anum_pg_index_indexprs, &isnull)));
		expr = (FuncExpr *) linitial(exprs);
		usable = list_length(exprs) == 1 && IsA(expr, FuncExpr) &&
			list_length(expr->args) == 2 &&
			IsA(linitial(expr->args), Var) && IsA(lsecond(expr->args), Var) &&
			((Var *) linitial(expr->args))->varattno == 1 &&
			((Var *) lsecond(expr->args))->varattno == 3;
		if (usable)
			funcid = expr->funcid;
	}
	ReleaseSysCache(tuple);
	if (!usable)
		return InvalidOid;

	/* the expression calls our key_hash, whose C code key_hash_value is */
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	usable = ((Form_pg_proc) GETSTRUCT(tuple))->pronamespace == nspid &&
		strcmp(NameStr(((Form_pg_proc) GETSTRUCT(tuple))->proname), "key_hash") == 0;
	ReleaseSysCache(tuple);

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(indexoid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	usable = usable && ((Form_pg_class) GETSTRUCT(tuple))->relam == BTREE_AM_OID;
	ReleaseSysCache(tuple);

	return usable ? indexoid : InvalidOid;
}

/*
 * Finds the storage tables of this database, or raises a clear error.
 */
static void
keystore_locate(void)
{
	Oid			nspid;
	HASHCTL		ctl;

	nspid = get_namespace_oid(STORAGE_SCHEMA, true);
	if (OidIsValid(nspid))
	{
		keystore.keys_relid = get_relname_relid("processed_keys", nspid);
		keystore.consumers_relid = get_relname_relid("consumers", nspid);
	}
	if (!OidIsValid(nspid) ||
		!OidIsValid(keystore.keys_relid) ||
		!OidIsValid(keystore.consumers_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("storage of extension \"idem_consumer\" is missing"),
				 errdetail("Tables %s.processed_keys and %s.consumers were not found.",
						   STORAGE_SCHEMA, STORAGE_SCHEMA),
				 errhint("Recreate the extension with DROP EXTENSION idem_consumer; CREATE EXTENSION idem_consumer;")));

	keystore.owner = storage_table_owner(keystore.keys_relid);
	keystore.hash_index = usable_hash_index(nspid);

	ctl.keysize = sizeof(((ConsumerIdEntry *) NULL)->name);
	ctl.entrysize = sizeof(ConsumerIdEntry);
	ctl.hcxt = CacheMemoryContext;
	keystore.consumer_ids = hash_create("idem_consumer consumer ids", 16, &ctl,
										HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
	keystore.located = true;
	keystore.recheck = false;
}

/*
 * Makes the cached storage state trustworthy before a statement runs.
 */
static void
keystore_ready(void)
{
	if (keystore.located && keystore.recheck)
	{
		Oid			owner = storage_table_owner(keystore.keys_relid);

		keystore.recheck = false;
		if (!OidIsValid(owner) ||
			!OidIsValid(storage_table_owner(keystore.consumers_relid)))
			keystore_reset();
		else
		{
			keystore.owner = owner;
			keystore.hash_index =
				usable_hash_index(get_rel_namespace(keystore.keys_relid));
		}
	}
	if (!keystore.located)
		keystore_locate();
}

/*
 * Runs one storage statement as the owner of the storage tables; nulls is
 * as for SPI_execute_plan.
 */
int
keystore_execute(KeystoreStmt stmt, Datum *values, const char *nulls,
				 long tcount)
{
	Oid			save_userid;
	int			save_sec_context;
	int			rc;

	keystore_ready();

	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(keystore.owner,
						   save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);

	if (keystore.plans[stmt] == NULL)
	{
		const KeystoreStmtDef *def = &keystore_stmt_defs[stmt];
		SPIPlanPtr	plan;

		plan = SPI_prepare_cursor(def->sql, def->nargs, (Oid *) def->argtypes,
								  def->cursor_options);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 def->sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		keystore.plans[stmt] = plan;
	}

	rc = SPI_execute_plan(keystore.plans[stmt], values, nulls, false, tcount);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 keystore_stmt_defs[stmt].sql, SPI_result_code_string(rc));

	/* errors restore the user id through transaction abort */
	SetUserIdAndSecContext(save_userid, save_sec_context);

	return rc;
}

/*
 * Runs one storage statement without null parameters as the owner.
 */
static inline int
keystore_exec(KeystoreStmt stmt, Datum *values, long tcount)
{
	return keystore_execute(stmt, values, NULL, tcount);
}

/*
 * Returns the id of a consumer; with create, creates the consumer if it
 * does not exist yet, otherwise returns 0 for an unknown consumer.
 */
int32
keystore_consumer_id(const char *consumer, bool create)
{
	ConsumerIdEntry *entry;
	Datum		name_datum;
	bool		isnull;
	int32		consumer_id;

	keystore_ready();
	entry = hash_search(keystore.consumer_ids, consumer, HASH_FIND, NULL);
	if (entry != NULL)
		return entry->consumer_id;

	name_datum = CStringGetTextDatum(consumer);
	for (;;)
	{
		keystore_exec(KS_FIND_CONSUMER, &name_datum, 1);
		if (SPI_processed == 1)
		{
			TransactionId xmin;

			consumer_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
													  SPI_tuptable->tupdesc,
													  1, &isnull));
			xmin = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[0],
													   SPI_tuptable->tupdesc,
													   2, &isnull));
			if (!TransactionIdIsCurrentTransactionId(xmin))
			{
				entry = hash_search(keystore.consumer_ids, consumer,
									HASH_ENTER, NULL);
				entry->consumer_id = consumer_id;
			}
			return consumer_id;
		}

		if (!create)
			return 0;

		keystore_exec(KS_CREATE_CONSUMER, &name_datum, 1);
		if (SPI_processed == 1)
			return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc,
											   1, &isnull));

		/*
		 * A concurrent transaction created the consumer and committed after
		 * our lookup; under READ COMMITTED the next lookup sees it.  Under
		 * REPEATABLE READ the insert has already raised a serialization
		 * failure, so this loop runs at most twice.
		 */
		create = false;
	}
}

/*
 * Converts the current transaction's start time to the integer seconds
 * stored in processed_keys.processed_at.
 */
static int32
processed_at_now(void)
{
	int64		seconds = GetCurrentTransactionStartTimestamp() / USECS_PER_SEC;

	if (seconds < 0 || seconds > PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("transaction start time is outside the range idem_consumer can record"),
				 errdetail("Processing times are stored as seconds from 2000-01-01 to 2068-01-19.")));
	return (int32) seconds;
}

/*
 * Fetches a column of the first row an SPI statement returned.
 */
static inline Datum
result_column(int colno)
{
	bool		isnull;

	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
						 colno, &isnull);
}

/*
 * Computes idem_consumer.key_hash(consumer_id, key).  Stored in the unique
 * index, so it must never change.
 */
static int32
key_hash_value(int32 consumer_id, text *key)
{
	uint32		hash;

	hash = hash_bytes((const unsigned char *) VARDATA_ANY(key),
					  VARSIZE_ANY_EXHDR(key));
	hash = hash_combine(hash_bytes_uint32((uint32) consumer_id), hash);
	return (int32) hash;
}

/*
 * Tells whether processed_keys has exactly the columns the extension
 * creates, (consumer_id int4, processed_at int4, key text), and nothing
 * else: the fast path forms its tuples from these three values alone, so
 * an added column (even a dropped one, which still takes a slot) would get
 * a garbage value instead of its default.
 */
static bool
fastpath_columns_match(TupleDesc tupdesc)
{
	static const Oid column_types[] = {INT4OID, INT4OID, TEXTOID};

	if (tupdesc->natts != lengthof(column_types) ||
		(tupdesc->constr != NULL &&
		 (tupdesc->constr->has_generated_stored || tupdesc->constr->num_defval > 0)))
		return false;
	for (int i = 0; i < lengthof(column_types); i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);

		if (att->attisdropped || att->atttypid != column_types[i] ||
			!att->attnotnull ||
			(att->atttypid == TEXTOID && att->attcollation != C_COLLATION_OID))
			return false;
	}
	return true;
}

/*
 * Opens processed_keys and its unique index for the fast path, to write
 * or only to read; returns false when the SQL statements must do the work:
 * idem_consumer.fast_path is off, the table has other columns than ours,
 * triggers, row security, check constraints or other indexes than ours,
 * or the transaction cannot write (the SQL path then raises the usual
 * error).
 */
static bool
fastpath_open(FastPath *fp, bool write)
{
	LOCKMODE	lockmode = write ? RowExclusiveLock : AccessShareLock;
	List	   *indexes;
	bool		usable;

	keystore_ready();
	if (!idem_fast_path || !OidIsValid(keystore.hash_index) ||
		(write && (XactReadOnly || IsInParallelMode())))
		return false;

	fp->keys = table_open(keystore.keys_relid, lockmode);
	indexes = RelationGetIndexList(fp->keys);
	usable = fp->keys->rd_rel->relkind == RELKIND_RELATION &&
		fastpath_columns_match(RelationGetDescr(fp->keys)) &&
		fp->keys->trigdesc == NULL &&
		!fp->keys->rd_rel->relrowsecurity &&
		(fp->keys->rd_att->constr == NULL ||
		 fp->keys->rd_att->constr->num_check == 0) &&
		list_length(indexes) == 1 &&
		linitial_oid(indexes) == keystore.hash_index;
	list_free(indexes);
	if (!usable)
	{
		table_close(fp->keys, NoLock);
		return false;
	}

	fp->hash_index = index_open(keystore.hash_index, lockmode);
	fp->index_info = NULL;
	fp->scan = NULL;
	fp->slot = NULL;
	fp->cxt = CurrentMemoryContext;

	/*
	 * The snapshot an SPI statement would take: it sees what this
	 * transaction did so far, even earlier in the calling statement.
	 */
	CommandCounterIncrement();
	PushActiveSnapshot(GetTransactionSnapshot());
	UpdateActiveSnapshotCommandId();
	fp->snapshot = GetActiveSnapshot();
	return true;
}

/*
 * Ends the fast path; the locks are kept until the end of the transaction,
 * as the executor keeps them.
 */
static void
fastpath_close(FastPath *fp)
{
	if (fp->scan != NULL)
		index_endscan(fp->scan);
	if (fp->slot != NULL)
		ExecDropSingleTupleTableSlot(fp->slot);
	PopActiveSnapshot();
	index_close(fp->hash_index, NoLock);
	table_close(fp->keys, NoLock);
}

/*
 * Looks up a key's hash in the unique index and reports what the snapshot
 * sees in its place; the unique index lets a snapshot see at most one row
 * of a hash.
 */
static KeyProbe
fastpath_probe(FastPath *fp, int32 hash, int32 consumer_id, text *key)
{
	ScanKeyData skey;
	KeyProbe	found = PROBE_EMPTY;
	MemoryContext oldcxt;

	/* the scan allocates as it goes and lives as long as fp */
	oldcxt = MemoryContextSwitchTo(fp->cxt);
	if (fp->scan == NULL)
	{
		fp->scan = index_beginscan(fp->keys, fp->hash_index, fp->snapshot, 1, 0);
		fp->slot = table_slot_create(fp->keys, NULL);
	}
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_INT4EQ, Int32GetDatum(hash));
	index_rescan(fp->scan, &skey, 1, NULL, 0);

	if (index_getnext_slot(fp->scan, ForwardScanDirection, fp->slot))
	{
		bool		isnull;
		text	   *occupant;

		found = PROBE_OTHER;
		if (DatumGetInt32(slot_getattr(fp->slot, 1, &isnull)) == consumer_id)
		{
			occupant = DatumGetTextPP(slot_getattr(fp->slot, 3, &isnull));
			if (VARSIZE_ANY_EXHDR(occupant) == VARSIZE_ANY_EXHDR(key) &&
				memcmp(VARDATA_ANY(occupant), VARDATA_ANY(key),
					   VARSIZE_ANY_EXHDR(key)) == 0)
				found = PROBE_KEY;
		}
		ExecClearTuple(fp->slot);
	}
	MemoryContextSwitchTo(oldcxt);
	return found;
}

/*
 * Inserts a key whose hash the probe found free, as a speculative
 * insertion; returns false, killing the speculative tuple, if the unique
 * index already has an entry of that hash that may be live.  Such an entry
 * comes from a transaction still running or committed after our snapshot,
 * or from this one: the SQL path must wait for it, fail to serialize, or
 * tell a duplicate from a collision.
 */
static bool
fastpath_insert(FastPath *fp, int32 hash, int32 consumer_id,
				int32 processed_at, text *key)
{
	TupleDesc	tupdesc = RelationGetDescr(fp->keys);
	TupleTableSlot *slot;
	TransactionId xid = GetCurrentTransactionId();
	uint32		token;
	Datum		index_value = Int32GetDatum(hash);
	bool		index_isnull = false;
	bool		inserted;

	slot = MakeSingleTupleTableSlot(tupdesc, &TTSOpsVirtual);
	slot->tts_values[0] = Int32GetDatum(consumer_id);
	slot->tts_values[1] = Int32GetDatum(processed_at);
	slot->tts_values[2] = PointerGetDatum(key);
	memset(slot->tts_isnull, 0, tupdesc->natts * sizeof(bool));
	ExecStoreVirtualTuple(slot);

	if (fp->index_info == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(fp->cxt);

		fp->index_info = BuildIndexInfo(fp->hash_index);
		MemoryContextSwitchTo(oldcxt);
	}

	/* as ExecInsert does for INSERT ... ON CONFLICT */
	token = SpeculativeInsertionLockAcquire(xid);
	table_tuple_insert_speculative(fp->keys, slot, GetCurrentCommandId(true),
								   0, NULL, token);
	inserted = index_insert(fp->hash_index, &index_value, &index_isnull,
							&slot->tts_tid, fp->keys, UNIQUE_CHECK_PARTIAL,
							false, fp->index_info);
	table_tuple_complete_speculative(fp->keys, slot, token, inserted);
	SpeculativeInsertionLockRelease(xid);

	ExecDropSingleTupleTableSlot(slot);
	return inserted;
}

/*
 * Records a key with the SQL statements; returns false if the key was
 * already recorded.
 *
 * The first statement is one insert.  Its conflict means that the key's
 * hash is taken: by the key itself (a duplicate), or by another key, in
 * which case our key goes to key_collisions.  Each time a concurrent
 * transaction changed the occupant between two steps, we start over.
 */
static bool
record_key_sql(int32 consumer_id, int32 processed_at, text *key)
{
	Datum		key_args[2];
	Datum		row[3];

	key_args[0] = row[0] = Int32GetDatum(consumer_id);
	row[1] = Int32GetDatum(processed_at);
	key_args[1] = row[2] = PointerGetDatum(key);

	for (;;)
	{
		CHECK_FOR_INTERRUPTS();

		keystore_exec(KS_INSERT_KEY, row, 0);
		if (SPI_processed == 1)
			return true;

		keystore_exec(KS_PROBE_KEY, key_args, 1);
		if (SPI_processed == 0)
			continue;			/* the occupant was deleted meanwhile */
		if (DatumGetBool(result_column(1)) || DatumGetBool(result_column(2)))
			return false;

		keystore_exec(KS_CLAIM_OCCUPANT, key_args, 0);
		if (SPI_processed == 0)
			continue;			/* the occupant was deleted or replaced */

		keystore_exec(KS_INSERT_COLLISION, row, 0);
		return SPI_processed == 1;
	}
}

/*
 * Records a key through an open fast path, leaving to the SQL statements
 * what the fast path cannot decide; returns false if the key was already
 * recorded.
 */
static bool
fastpath_record(FastPath *fp, int32 hash, int32 consumer_id,
				int32 processed_at, text *key)
{
	switch (fastpath_probe(fp, hash, consumer_id, key))
	{
		case PROBE_KEY:
			return false;
		case PROBE_EMPTY:
			if (fastpath_insert(fp, hash, consumer_id, processed_at, key))
				return true;
			break;
		case PROBE_OTHER:
			break;
	}
	return record_key_sql(consumer_id, processed_at, key);
}

/*
 * Records a key; returns false if the key was already recorded.
 */
bool
keystore_record_key(int32 consumer_id, text *key)
{
	FastPath	fp;
	bool		recorded;

	if (!fastpath_open(&fp, true))
		return record_key_sql(consumer_id, processed_at_now(), key);

	recorded = fastpath_record(&fp, key_hash_value(consumer_id, key),
							   consumer_id, processed_at_now(), key);
	fastpath_close(&fp);
	return recorded;
}

/* A key of a batch, sorted in the order of the unique index. */
typedef struct BatchKey
{
	int32		hash;
	int			index;			/* position in the batch */
	text	   *key;
} BatchKey;

/*
 * Orders batch keys by hash, then by key as COLLATE "C" does: the order of
 * KS_INSERT_BATCH.
 */
static int
batch_key_cmp_keys(const BatchKey *a, const BatchKey *b)
{
	int			len_a = VARSIZE_ANY_EXHDR(a->key);
	int			len_b = VARSIZE_ANY_EXHDR(b->key);
	int			cmp;

	if (a->hash != b->hash)
		return a->hash < b->hash ? -1 : 1;
	cmp = memcmp(VARDATA_ANY(a->key), VARDATA_ANY(b->key), Min(len_a, len_b));
	if (cmp != 0)
		return cmp;
	return len_a == len_b ? 0 : (len_a < len_b ? -1 : 1);
}

/*
 * qsort comparator of batch keys; the first occurrence of a key sorts
 * first.
 */
static int
batch_key_cmp(const void *a, const void *b)
{
	const BatchKey *ka = (const BatchKey *) a;
	const BatchKey *kb = (const BatchKey *) b;
	int			cmp = batch_key_cmp_keys(ka, kb);

	return cmp != 0 ? cmp : ka->index - kb->index;
}

/*
 * Records the keys of a batch through the fast path, one at a time in the
 * order of the unique index, which rules out deadlocks between batches
 * for the reason given at KS_INSERT_BATCH; a key the fast path cannot
 * decide takes the SQL statements at its place in that order.  Sets
 * isnew[i] when keys[i] was not recorded before and is the first
 * occurrence of its key in the batch.  Returns false, doing nothing, when
 * the fast path cannot be used.
 */
bool
keystore_record_keys(int32 consumer_id, text **keys, int nkeys, bool *isnew)
{
	FastPath	fp;
	BatchKey   *sorted;
	int32		processed_at;
	MemoryContext keycxt;

	if (!fastpath_open(&fp, true))
		return false;

	processed_at = processed_at_now();
	sorted = palloc(Max(nkeys, 1) * sizeof(BatchKey));
	for (int i = 0; i < nkeys; i++)
	{
		sorted[i].hash = key_hash_value(consumer_id, keys[i]);
		sorted[i].index = i;
		sorted[i].key = keys[i];
		isnew[i] = false;
	}
	qsort(sorted, nkeys, sizeof(BatchKey), batch_key_cmp);

	keycxt = AllocSetContextCreate(CurrentMemoryContext,
								   "idem_consumer batch key",
								   ALLOCSET_SMALL_SIZES);
	for (int i = 0; i < nkeys; i++)
	{
		MemoryContext oldcxt;

		CHECK_FOR_INTERRUPTS();
		if (i > 0 && batch_key_cmp_keys(&sorted[i - 1], &sorted[i]) == 0)
			continue;			/* a repeat: one message */

		oldcxt = MemoryContextSwitchTo(keycxt);
		isnew[sorted[i].index] = fastpath_record(&fp, sorted[i].hash, consumer_id,
												 processed_at, sorted[i].key);
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(keycxt);
	}
	MemoryContextDelete(keycxt);
	pfree(sorted);

	fastpath_close(&fp);
	return true;
}

/*
 * Inserts the keys of a batch that are not recorded; returns how many were
 * inserted and leaves their keys in SPI_tuptable.  Keys that conflicted
 * are either recorded already or collide: see keystore_unresolved_batch.
 */
uint64
keystore_insert_batch(int32 consumer_id, ArrayType *keys)
{
	Datum		args[3];

	args[0] = Int32GetDatum(consumer_id);
	args[1] = Int32GetDatum(processed_at_now());
	args[2] = PointerGetDatum(keys);
	keystore_exec(KS_INSERT_BATCH, args, 0);
	return SPI_processed;
}

/*
 * Finds the keys of a batch that keystore_insert_batch did not insert
 * (inserted holds those it did) and that are not recorded either; returns
 * how many and leaves them in SPI_tuptable.  Each needs
 * keystore_record_key, which tells a collision from a key whose occupant
 * was deleted meanwhile.  Runs as a statement of its own, so that under
 * READ COMMITTED it sees the rows the insert waited for.
 */
uint64
keystore_unresolved_batch(int32 consumer_id, ArrayType *keys,
						  ArrayType *inserted)
{
	Datum		args[3];

	args[0] = Int32GetDatum(consumer_id);
	args[1] = PointerGetDatum(keys);
	args[2] = PointerGetDatum(inserted);
	keystore_exec(KS_UNRESOLVED_BATCH, args, 0);
	return SPI_processed;
}

/*
 * Returns whether a key is recorded and visible to this transaction.
 */
bool
keystore_key_exists(int32 consumer_id, text *key)
{
	Datum		key_args[2];
	FastPath	fp;

	/* a collision is visible only with its occupant, see the invariant */
	if (fastpath_open(&fp, false))
	{
		KeyProbe	found = fastpath_probe(&fp, key_hash_value(consumer_id, key),
										   consumer_id, key);

		fastpath_close(&fp);
		if (found != PROBE_OTHER)
			return found == PROBE_KEY;
	}

	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);
	keystore_exec(KS_PROBE_KEY, key_args, 1);
	return SPI_processed == 1 &&
		(DatumGetBool(result_column(1)) || DatumGetBool(result_column(2)));
}


/*
 * Moves a collision of a deleted occupant into its place in processed_keys,
 * so that every collision keeps an occupant.  hash is the deleted
 * occupant's.
 */
static void
promote_collision(int32 hash)
{
	Datum		hash_arg = Int32GetDatum(hash);

	for (;;)
	{
		Datum		collision_args[2];
		Datum		row[3];

		CHECK_FOR_INTERRUPTS();

		keystore_exec(KS_FIND_COLLISION, &hash_arg, 1);
		if (SPI_processed == 0)
			return;
		collision_args[0] = row[0] = result_column(1);
		collision_args[1] = row[2] = PointerGetDatum(PG_DETOAST_DATUM_COPY(result_column(2)));

		keystore_exec(KS_DELETE_COLLISION, collision_args, 0);
		if (SPI_processed == 0)
			continue;			/* forgotten meanwhile: look again */
		row[1] = result_column(1);

		keystore_exec(KS_INSERT_KEY, row, 0);
		if (SPI_processed != 1)
			elog(ERROR, "could not move a hash collision of idem_consumer into processed_keys");
		return;
	}
}

/*
 * Removes a key; returns whether it was recorded.
 */
bool
keystore_forget_key(int32 consumer_id, text *key)
{
	Datum		key_args[2];

	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);

	keystore_exec(KS_DELETE_KEY, key_args, 0);
	if (SPI_processed == 1)
	{
		promote_collision(key_hash_value(consumer_id, key));
		return true;
	}

	keystore_exec(KS_DELETE_COLLISION, key_args, 0);
	if (SPI_processed == 1)
		return true;

	/* a concurrent forget may have just moved the key out of key_collisions */
	keystore_exec(KS_DELETE_KEY, key_args, 0);
	if (SPI_processed == 1)
	{
		promote_collision(key_hash_value(consumer_id, key));
		return true;
	}
	return false;
}

/*
 * Returns the OID of processed_keys, which changes when the extension is
 * created again (and its consumer ids with it).
 */
Oid
keystore_keys_relid(void)
{
	keystore_ready();
	return keystore.keys_relid;
}

/*
 * Fills blocks[KS_NUM_TABLES] with the number of heap blocks of each table
 * that holds keys.
 */
void
keystore_table_blocks(BlockNumber *blocks)
{
	keystore_exec(KS_TABLE_SIZES, NULL, 1);
	for (int i = 0; i < KS_NUM_TABLES; i++)
		blocks[i] = (BlockNumber) (DatumGetInt64(result_column(i + 1)) / BLCKSZ);
	SPI_freetuptable(SPI_tuptable);
}

/*
 * Removes the rows of a table at the given TIDs that are still older than
 * their consumer's cutoff (consumer_ids and cutoffs are the parallel int4
 * arrays the TIDs were selected with) and returns how many it removed; rows
 * removed or updated meanwhile by others are skipped.
 *
 * The TIDs should come from a statement of the current transaction, whose
 * snapshot keeps them from being reused; the cutoffs are checked again all
 * the same, so that a reused TID could never remove a key inside its
 * window.  Removing a row of processed_keys may leave
 * collisions without their occupant: one statement finds which of the
 * removed hashes have any (rarely one in thousands), in a snapshot taken
 * after the removal so that it also sees a collision recorded by a
 * transaction we waited for; promote_collision() then fills each place.
 */
uint64
keystore_remove_rows(KeystoreTable table, ItemPointer tids, int ntids,
					 Datum consumer_ids, Datum cutoffs)
{
	Datum	   *tid_datums;
	Datum		arg;
	Datum		remove_args[3];
	uint64		removed;
	Datum	   *hashes;
	int32	   *colliding;
	uint64		ncolliding;

	if (ntids == 0)
		return 0;

	tid_datums = palloc(sizeof(Datum) * ntids);
	for (int i = 0; i < ntids; i++)
		tid_datums[i] = PointerGetDatum(&tids[i]);
	arg = PointerGetDatum(construct_array(tid_datums, ntids, TIDOID,
										  sizeof(ItemPointerData), false,
										  TYPALIGN_SHORT));

	remove_args[0] = arg;
	remove_args[1] = consumer_ids;
	remove_args[2] = cutoffs;
	if (table == KS_TABLE_COLLISIONS)
	{
		keystore_exec(KS_REMOVE_COLLISIONS, remove_args, 0);
		return SPI_processed;
	}

	keystore_exec(KS_REMOVE_KEYS, remove_args, 0);
	removed = SPI_processed;
	if (removed == 0)
		return 0;

	hashes = palloc(sizeof(Datum) * removed);
	for (uint64 i = 0; i < removed; i++)
	{
		bool		isnull;

		hashes[i] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
								  1, &isnull);
	}
	SPI_freetuptable(SPI_tuptable);
	arg = PointerGetDatum(construct_array(hashes, (int) removed, INT4OID,
										  sizeof(int32), true, TYPALIGN_INT));

	keystore_exec(KS_COLLIDING_HASHES, &arg, 0);
	ncolliding = SPI_processed;
	colliding = palloc(sizeof(int32) * Max(ncolliding, 1));
	for (uint64 i = 0; i < ncolliding; i++)
	{
		bool		isnull;

		colliding[i] = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[i],
												   SPI_tuptable->tupdesc,
												   1, &isnull));
	}
	SPI_freetuptable(SPI_tuptable);

	for (uint64 i = 0; i < ncolliding; i++)
		promote_collision(colliding[i]);

	return removed;
}

/*
 * Returns the number of keys stored, all consumers together, without
 * reading a row: the live rows the cumulative statistics keep for each
 * table (counted up and down by every committed insert and delete, set
 * exactly by VACUUM and ANALYZE).  A table the statistics do not know
 * (after a crash, say) is estimated from its pages instead, at the
 * density its last VACUUM or ANALYZE counted, or at rows of average width
 * if never counted.
 */
double
keystore_keys_estimate(void)
{
	Oid			relids[2];
	double		total = 0;

	keystore_ready();
	relids[0] = keystore.keys_relid;
	relids[1] = get_relname_relid("key_collisions",
								  get_rel_namespace(keystore.keys_relid));
	for (int i = 0; i < lengthof(relids); i++)
	{
		PgStat_StatTabEntry *tabentry;
		Relation	rel;
		BlockNumber pages;

		if (!OidIsValid(relids[i]))
			continue;
		tabentry = pgstat_fetch_stat_tabentry(relids[i]);
		if (tabentry != NULL)
		{
			total += Max(tabentry->n_live_tuples, 0);
			continue;
		}

		rel = table_open(relids[i], AccessShareLock);
		pages = RelationGetNumberOfBlocks(rel);
		if (pages == 0)
			;
		else if (rel->rd_rel->reltuples >= 0 && rel->rd_rel->relpages > 0)
			total += rint(rel->rd_rel->reltuples / rel->rd_rel->relpages * pages);
		else
		{
			int32		width = get_rel_data_width(rel, NULL) +
				MAXALIGN(SizeofHeapTupleHeader) + sizeof(ItemIdData);

			total += floor((double) (BLCKSZ - SizeOfPageHeaderData) / width) * pages;
		}
		table_close(rel, AccessShareLock);
	}
	return total;
}

/*
 * idem_consumer.key_hash(consumer_id, key): the unique index key of
 * processed_keys.
 */
Datum
idem_key_hash(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(key_hash_value(PG_GETARG_INT32(0), PG_GETARG_TEXT_PP(1)));
}
