/*-------------------------------------------------------------------------
 *
 * keystore.c
 *	  The extension's storage: the consumers table, the processed-keys table
 *	  and the statements that read and write them.
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
 * The caller must be connected to SPI.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
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

/*
 * Retention never removes the key of a message that waits in the
 * dead-letter queue: an operator may still replay it.
 *
 * MERGE WITH THE DEAD-LETTER QUEUE: idem_consumer.dead_letters comes with
 * that branch; once it is here, set KEEP_PENDING_DEAD_LETTERS to 1 and add
 * retention_dead_letters to REGRESS in the Makefile.  The condition is
 * served by the table's UNIQUE (consumer_id, key) index.
 */
#define KEEP_PENDING_DEAD_LETTERS 0

#if KEEP_PENDING_DEAD_LETTERS
#define AND_NO_PENDING_DEAD_LETTER(row) \
	" AND NOT EXISTS (SELECT FROM " STORAGE_SCHEMA ".dead_letters AS d" \
	" WHERE d.consumer_id OPERATOR(pg_catalog.=) " row ".consumer_id" \
	" AND d.key OPERATOR(pg_catalog.=) " row ".key" \
	" AND d.status OPERATOR(pg_catalog.=) 'pending')"
#else
#define AND_NO_PENDING_DEAD_LETTER(row) ""
#endif

/* rows of a range of heap blocks: ctid from (first, 0) up to (end, 0) */
#define IN_BLOCK_RANGE(ctid, lo, hi) \
	ctid " OPERATOR(pg_catalog.>=) " lo " AND " ctid " OPERATOR(pg_catalog.<) " hi

/*
 * Per consumer, the newest processed_at and the number of rows in a range
 * of blocks of a table; $1 and $2 bound the range.
 */
#define LATEST_IN_BLOCKS(table) \
	"SELECT consumer_id, pg_catalog.max(processed_at), pg_catalog.count(*)" \
	" FROM " STORAGE_SCHEMA "." table \
	" WHERE " IN_BLOCK_RANGE("ctid", "$1", "$2") \
	" GROUP BY consumer_id"

/*
 * Per consumer, the TIDs, in order, of the rows of a range of blocks ($3,
 * $4) that are older than the consumer's cutoff; $1 and $2 are parallel
 * arrays of consumer ids and cutoffs.  Consumers not in $1 keep everything.
 */
#define PURGEABLE_IN_BLOCKS(table) \
	"SELECT k.consumer_id, pg_catalog.array_agg(k.ctid ORDER BY k.ctid)" \
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
 * the inserts, whose columns are in table order.
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
	[KS_KEYS_STORED] = {
		"SELECT c.name, pg_catalog.count(k.consumer_id)"
		" FROM " STORAGE_SCHEMA ".consumers AS c LEFT JOIN"
		" (SELECT consumer_id FROM " STORAGE_SCHEMA ".processed_keys"
		"  UNION ALL SELECT consumer_id FROM " STORAGE_SCHEMA ".key_collisions) AS k"
		" ON k.consumer_id OPERATOR(pg_catalog.=) c.consumer_id"
		" GROUP BY c.name ORDER BY c.name",
		0, {InvalidOid}
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
	 * whole table, though they lie in the few blocks of one chunk.
	 */
	[KS_REMOVE_COLLISIONS] = {
		"DELETE FROM " STORAGE_SCHEMA ".key_collisions"
		" WHERE ctid OPERATOR(pg_catalog.=) ANY ($1)",
		1, {TIDARRAYOID}, CURSOR_OPT_GENERIC_PLAN
	},
	/* returns the hashes whose occupants it removed */
	[KS_REMOVE_KEYS] = {
		"DELETE FROM " STORAGE_SCHEMA ".processed_keys"
		" WHERE ctid OPERATOR(pg_catalog.=) ANY ($1)"
		" RETURNING " STORAGE_SCHEMA ".key_hash(consumer_id, key)",
		1, {TIDARRAYOID}, CURSOR_OPT_GENERIC_PLAN
	},
	/*
	 * Which of the hashes in $1 have collisions.  Generic too: planning a
	 * custom plan for thousands of constants costs more than running it.
	 */
	[KS_COLLIDING_HASHES] = {
		"SELECT DISTINCT " STORAGE_SCHEMA ".key_hash(consumer_id, key)"
		" FROM " STORAGE_SCHEMA ".key_collisions"
		" WHERE " STORAGE_SCHEMA ".key_hash(consumer_id, key) OPERATOR(pg_catalog.=) ANY ($1)",
		1, {INT4ARRAYOID}, CURSOR_OPT_GENERIC_PLAN
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
 * new tables and new consumer ids).
 */
static struct
{
	bool		located;
	bool		recheck;
	Oid			keys_relid;
	Oid			consumers_relid;
	Oid			owner;
	SPIPlanPtr	plans[KS_NUM_STMTS];
	HTAB	   *consumer_ids;
} keystore;

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
			keystore.owner = owner;
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
 * Records a key; returns false if the key was already recorded.
 *
 * The fast path is one insert.  Its conflict means that the key's hash is
 * taken: by the key itself (a duplicate), or by another key, in which case
 * our key goes to key_collisions.  Each time a concurrent transaction
 * changed the occupant between two steps, we start over.
 */
bool
keystore_record_key(int32 consumer_id, text *key)
{
	Datum		key_args[2];
	Datum		row[3];

	key_args[0] = row[0] = Int32GetDatum(consumer_id);
	row[1] = Int32GetDatum(processed_at_now());
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
 * Returns whether a key is recorded and visible to this transaction.
 */
bool
keystore_key_exists(int32 consumer_id, text *key)
{
	Datum		key_args[2];

	key_args[0] = Int32GetDatum(consumer_id);
	key_args[1] = PointerGetDatum(key);
	keystore_exec(KS_PROBE_KEY, key_args, 1);
	return SPI_processed == 1 &&
		(DatumGetBool(result_column(1)) || DatumGetBool(result_column(2)));
}

/*
 * Computes the hash of (consumer_id, key) that processed_keys is unique on.
 */
static int32
key_hash_of(int32 consumer_id, text *key)
{
	uint32		hash;

	hash = hash_bytes((const unsigned char *) VARDATA_ANY(key),
					  VARSIZE_ANY_EXHDR(key));
	hash = hash_combine(hash_bytes_uint32((uint32) consumer_id), hash);
	return (int32) hash;
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
		promote_collision(key_hash_of(consumer_id, key));
		return true;
	}

	keystore_exec(KS_DELETE_COLLISION, key_args, 0);
	if (SPI_processed == 1)
		return true;

	/* a concurrent forget may have just moved the key out of key_collisions */
	keystore_exec(KS_DELETE_KEY, key_args, 0);
	if (SPI_processed == 1)
	{
		promote_collision(key_hash_of(consumer_id, key));
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
 * Removes the rows of a table at the given TIDs and returns how many it
 * removed; rows removed or updated meanwhile by others are skipped.
 *
 * The TIDs must come from a statement of the current transaction, which
 * keeps them from being reused.  Removing a row of processed_keys may leave
 * collisions without their occupant: one statement finds which of the
 * removed hashes have any (rarely one in thousands), in a snapshot taken
 * after the removal so that it also sees a collision recorded by a
 * transaction we waited for; promote_collision() then fills each place.
 */
uint64
keystore_remove_rows(KeystoreTable table, ItemPointer tids, int ntids)
{
	Datum	   *tid_datums;
	Datum		arg;
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

	if (table == KS_TABLE_COLLISIONS)
	{
		keystore_exec(KS_REMOVE_COLLISIONS, &arg, 0);
		return SPI_processed;
	}

	keystore_exec(KS_REMOVE_KEYS, &arg, 0);
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
 * Returns how many keys each consumer has stored, as a List of KeysStored
 * allocated in the SPI procedure context.
 */
List *
keystore_keys_stored(void)
{
	List	   *result = NIL;

	keystore_exec(KS_KEYS_STORED, NULL, 0);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		KeysStored *ks = palloc(sizeof(KeysStored));
		bool		isnull;

		ks->consumer = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		ks->keys = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[i],
											   SPI_tuptable->tupdesc, 2, &isnull));
		result = lappend(result, ks);
	}
	return result;
}

/*
 * idem_consumer.key_hash(consumer_id, key): the unique index key of
 * processed_keys.  Stored in indexes, so it must never change.
 */
Datum
idem_key_hash(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(key_hash_of(PG_GETARG_INT32(0), PG_GETARG_TEXT_PP(1)));
}
