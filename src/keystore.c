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
#include "catalog/pg_index.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "nodes/primnodes.h"
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

typedef enum KeystoreStmt
{
	KS_FIND_CONSUMER,
	KS_CREATE_CONSUMER,
	KS_INSERT_KEY,
	KS_PROBE_KEY,
	KS_CLAIM_OCCUPANT,
	KS_INSERT_COLLISION,
	KS_DELETE_KEY,
	KS_DELETE_COLLISION,
	KS_FIND_COLLISION,
	KS_INSERT_BATCH,
	KS_UNRESOLVED_BATCH,
	KS_NUM_STMTS
} KeystoreStmt;

typedef struct KeystoreStmtDef
{
	const char *sql;
	int			nargs;
	Oid			argtypes[3];
} KeystoreStmtDef;

#define SAME_HASH_AS_ARGS \
	STORAGE_SCHEMA ".key_hash(consumer_id, key) OPERATOR(pg_catalog.=) " \
	STORAGE_SCHEMA ".key_hash($1, $2)"
#define SAME_KEY_AS_ARGS \
	"consumer_id OPERATOR(pg_catalog.=) $1 AND key OPERATOR(pg_catalog.=) $2"

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
	/* any collision of any consumer whose hash equals the key's */
	[KS_FIND_COLLISION] = {
		"SELECT consumer_id, key FROM " STORAGE_SCHEMA ".key_collisions"
		" WHERE " SAME_HASH_AS_ARGS " LIMIT 1",
		2, {INT4OID, TEXTOID}
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
 * Runs one storage statement as the owner of the storage tables.
 */
static int
keystore_exec(KeystoreStmt stmt, Datum *values, long tcount)
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

		plan = SPI_prepare(def->sql, def->nargs, (Oid *) def->argtypes);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 def->sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		keystore.plans[stmt] = plan;
	}

	rc = SPI_execute_plan(keystore.plans[stmt], values, NULL, false, tcount);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed for \"%s\": %s",
			 keystore_stmt_defs[stmt].sql, SPI_result_code_string(rc));

	/* errors restore the user id through transaction abort */
	SetUserIdAndSecContext(save_userid, save_sec_context);

	return rc;
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
 * Opens processed_keys and its unique index for the fast path, to write
 * or only to read; returns false when the SQL statements must do the work:
 * the table has triggers, row security, check constraints or other indexes
 * than ours, or the transaction cannot write (the SQL path then raises the
 * usual error).
 */
static bool
fastpath_open(FastPath *fp, bool write)
{
	LOCKMODE	lockmode = write ? RowExclusiveLock : AccessShareLock;
	List	   *indexes;
	bool		usable;

	keystore_ready();
	if (!OidIsValid(keystore.hash_index) ||
		(write && (XactReadOnly || IsInParallelMode())))
		return false;

	fp->keys = table_open(keystore.keys_relid, lockmode);
	indexes = RelationGetIndexList(fp->keys);
	usable = fp->keys->rd_rel->relkind == RELKIND_RELATION &&
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
 * so that every collision keeps an occupant.  The arguments name the
 * deleted occupant.
 */
static void
promote_collision(Datum *occupant_args)
{
	for (;;)
	{
		Datum		collision_args[2];
		Datum		row[3];

		CHECK_FOR_INTERRUPTS();

		keystore_exec(KS_FIND_COLLISION, occupant_args, 1);
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
		promote_collision(key_args);
		return true;
	}

	keystore_exec(KS_DELETE_COLLISION, key_args, 0);
	if (SPI_processed == 1)
		return true;

	/* a concurrent forget may have just moved the key out of key_collisions */
	keystore_exec(KS_DELETE_KEY, key_args, 0);
	if (SPI_processed == 1)
	{
		promote_collision(key_args);
		return true;
	}
	return false;
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
