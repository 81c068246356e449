/*-------------------------------------------------------------------------
 *
 * storage.c
 *	  Where the extension's storage is: finds the tables of the idem_consumer
 *	  schema in this database and their owner, tells whether the key index
 *	  is exactly the one the install script creates (the condition of the
 *	  fast path), and defines the hash that index is built on.
 *
 * What is found is cached per backend.  A relcache invalidation of a
 * storage table makes the next caller verify that the tables still exist
 * before anything cached is trusted: DROP EXTENSION and CREATE EXTENSION
 * again give new tables, new owners and new consumer ids.  Each time the
 * tables are located anew the generation changes, and the files above
 * (keystore_sql.c's plans, keystore.c's consumer ids) drop what they
 * cached for an older one.  The parts later versions of the SQL objects
 * add (the effects table, the columns of dead_letters that tell the
 * version) are probed here too, cached the same way, and forgotten by the
 * same invalidations and by those of their own tables: this is the one
 * place that looks the storage up in the catalogs.
 *
 * This file reads the catalogs only; it runs no statement.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/storage.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_proc.h"
#include "common/hashfn.h"
#include "nodes/primnodes.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "keystore_internal.h"

/*
 * Per-backend state.  "located" means the OIDs and owner belong to the
 * storage as it is now; "recheck" is set by a relcache invalidation of the
 * storage tables.  "parts_known" means the same of the parts later versions
 * added; every invalidation that sets "recheck" clears it, and so do those
 * of the parts' own tables.
 */
static struct
{
	bool		located;
	bool		recheck;
	StorageInfo info;
	bool		parts_known;
	Oid			dead_letters_relid; /* InvalidOid: none */
	StorageParts parts;
} storage;

PG_FUNCTION_INFO_V1(idem_key_hash);

/*
 * Notes that a storage table may have been dropped or changed owner.
 */
static void
storage_relcache_callback(Datum arg, Oid relid)
{
	bool		storage_table = relid == InvalidOid ||
		relid == storage.info.keys_relid ||
		relid == storage.info.consumers_relid;

	if (storage.located && storage_table)
		storage.recheck = true;
	if (storage_table ||
		(OidIsValid(relid) &&
		 (relid == storage.dead_letters_relid ||
		  relid == storage.parts.effects_relid)))
		storage.parts_known = false;
}

/*
 * Registers the invalidation callback; called once from _PG_init.
 */
void
storage_init(void)
{
	CacheRegisterRelcacheCallback(storage_relcache_callback, (Datum) 0);
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
 * and nothing else) on a plain table that is no partition, InvalidOid if
 * the fast path must not maintain it.  Only the executor routes rows of a
 * partitioned table and checks a partition's constraint.
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
	usable = index->indrelid == storage.info.keys_relid &&
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
	usable = usable && ((Form_pg_class) GETSTRUCT(tuple))->relam == BTREE_AM_OID &&
		((Form_pg_class) GETSTRUCT(tuple))->relkind == RELKIND_INDEX;
	ReleaseSysCache(tuple);

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(storage.info.keys_relid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	usable = usable && ((Form_pg_class) GETSTRUCT(tuple))->relkind == RELKIND_RELATION &&
		!((Form_pg_class) GETSTRUCT(tuple))->relispartition;
	ReleaseSysCache(tuple);

	return usable ? indexoid : InvalidOid;
}

/*
 * Finds the storage tables of this database, or raises a clear error.
 */
static void
locate_storage(void)
{
	Oid			nspid;

	nspid = get_namespace_oid(STORAGE_SCHEMA, true);
	if (OidIsValid(nspid))
	{
		storage.info.keys_relid = get_relname_relid("processed_keys", nspid);
		storage.info.consumers_relid = get_relname_relid("consumers", nspid);
	}
	if (!OidIsValid(nspid) ||
		!OidIsValid(storage.info.keys_relid) ||
		!OidIsValid(storage.info.consumers_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("storage of extension \"idem_consumer\" is missing"),
				 errdetail("Tables %s.processed_keys and %s.consumers were not found.",
						   STORAGE_SCHEMA, STORAGE_SCHEMA),
				 errhint("Recreate the extension with DROP EXTENSION idem_consumer; CREATE EXTENSION idem_consumer;")));

	storage.info.owner = storage_table_owner(storage.info.keys_relid);
	storage.info.hash_index = usable_hash_index(nspid);
	storage.info.consumers_have_owners =
		get_attnum(storage.info.consumers_relid, "owner") != InvalidAttrNumber;
	storage.info.keys_have_fingerprints =
		get_attnum(storage.info.keys_relid, "fingerprint") != InvalidAttrNumber;
	storage.info.generation++;
	storage.info.consumers_version++;
	storage.located = true;
	storage.recheck = false;
}

/*
 * Returns the storage tables as they are now, locating them if needed;
 * raises an error if they are missing.
 */
const StorageInfo *
storage_locate(void)
{
	if (storage.located && storage.recheck)
	{
		Oid			owner = storage_table_owner(storage.info.keys_relid);

		storage.recheck = false;
		if (!OidIsValid(owner) ||
			!OidIsValid(storage_table_owner(storage.info.consumers_relid)))
			storage.located = false;
		else
		{
			storage.info.owner = owner;
			storage.info.hash_index =
				usable_hash_index(get_rel_namespace(storage.info.keys_relid));
			storage.info.consumers_have_owners =
				get_attnum(storage.info.consumers_relid, "owner") != InvalidAttrNumber;
			storage.info.keys_have_fingerprints =
				get_attnum(storage.info.keys_relid, "fingerprint") != InvalidAttrNumber;
			storage.info.consumers_version++;
		}
	}
	if (!storage.located)
		locate_storage();
	return &storage.info;
}

/*
 * Returns the parts of the storage that versions after 1.0 of the SQL
 * objects add, probing them if needed.  Unlike storage_locate() it raises
 * no error: a database at an older version, or without the extension,
 * has none of them.
 */
const StorageParts *
storage_parts(void)
{
	Oid			nspid;
	Oid			dead_letters;

	if (storage.parts_known)
		return &storage.parts;

	nspid = get_namespace_oid(STORAGE_SCHEMA, true);
	dead_letters = OidIsValid(nspid) ?
		get_relname_relid("dead_letters", nspid) : InvalidOid;
	storage.dead_letters_relid = dead_letters;
	storage.parts.effects_relid = OidIsValid(nspid) ?
		get_relname_relid("effects", nspid) : InvalidOid;
	storage.parts.dead_letters_have_role = OidIsValid(dead_letters) &&
		get_attnum(dead_letters, "dead_lettered_role") != InvalidAttrNumber;
	storage.parts.dead_letters_have_expect_rows = OidIsValid(dead_letters) &&
		get_attnum(dead_letters, "expect_rows") != InvalidAttrNumber;
	storage.parts_known = true;
	return &storage.parts;
}

/*
 * Returns the OID of processed_keys, which changes when the extension is
 * created again (and its consumer ids with it).
 */
Oid
keystore_keys_relid(void)
{
	return storage_locate()->keys_relid;
}

/*
 * Computes idem_consumer.key_hash(consumer_id, key).  Stored in the unique
 * index, so it must never change.
 */
int32
key_hash_value(int32 consumer_id, text *key)
{
	uint32		hash;

	hash = hash_bytes((const unsigned char *) VARDATA_ANY(key),
					  VARSIZE_ANY_EXHDR(key));
	hash = hash_combine(hash_bytes_uint32((uint32) consumer_id), hash);
	return (int32) hash;
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
