/*-------------------------------------------------------------------------
 *
 * storage.c
 *	  Where the extension's storage is: finds the tables of the idem_consumer
 *	  schema in this database, their owner and the generations of the key
 *	  store, tells whether a generation's key index is exactly the one the
 *	  install script creates (the condition of the fast path), and defines
 *	  the hashes those indexes are built on, with the seed of the 64-bit one.
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
 * A storage table that Citus distributes is refused here too: Citus keeps a
 * distributed or reference table's rows in its shards and leaves the table
 * itself, the shell, to its planner, so the fast paths, which write a
 * table's heap and index directly, would write rows Citus never reads.
 * Keys and their dead letters go to Citus only as the routed tables
 * (routed.c), which no fast path writes.
 *
 * This file reads the catalogs, and the seed from its table, only; it runs
 * no statement.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/storage.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_index.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_proc.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "funcapi.h"
#include "nodes/primnodes.h"
#include "storage/bufmgr.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "keyhash.h"
#include "storage.h"

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
	bool		seed_known;		/* seed is that of key_seed as it is now */
	Oid			seed_relid;
	IdemHashSeed seed;
	uint64		hash_mask;		/* the bits of key_hash64 kept */
} storage;

PG_FUNCTION_INFO_V1(idem_key_hash);
PG_FUNCTION_INFO_V1(idem_key_hash64_sql);
PG_FUNCTION_INFO_V1(idem_new_key_seed);
PG_FUNCTION_INFO_V1(idem_storage_changed);

/*
 * Whether relid is one of the tables of a generation of the key store.
 */
static bool
generation_table(Oid relid)
{
	for (int i = 0; i < KEYGEN_NUM; i++)
		if (relid == storage.info.gens[i].keys_relid ||
			relid == storage.info.gens[i].collisions_relid)
			return true;
	return false;
}

/*
 * Notes that a storage table may have been dropped or changed owner.
 */
static void
storage_relcache_callback(Datum arg, Oid relid)
{
	bool		storage_table = relid == InvalidOid ||
		relid == storage.info.consumers_relid ||
		generation_table(relid);
	bool		part_table = OidIsValid(relid) &&
		(relid == storage.dead_letters_relid ||
		 relid == storage.parts.effects_relid);

	if (relid == InvalidOid || relid == storage.seed_relid)
		storage.seed_known = false;

	/* Citus invalidates a table it distributes: checked again then */
	if (storage.located && (storage_table || part_table))
		storage.recheck = true;
	if (storage_table || part_table)
		storage.parts_known = false;
}

/*
 * The relcache callbacks of the modules above, which the one callback of
 * the library calls.  The server has room for ten relcache callbacks in
 * a process, for every library it loads: a walsender that loads Citus and
 * pgoutput beside this library ran out of them when each module took a
 * slot of its own, and a Citus shard move then waited forever for its
 * logical replication.
 */
#define STORAGE_MAX_SUBSCRIBERS 8

static RelcacheCallbackFunction storage_subscribers[STORAGE_MAX_SUBSCRIBERS];
static int	storage_nsubscribers = 0;

/*
 * Calls the storage's own callback, then every module's.
 */
static void
storage_relcache_dispatch(Datum arg, Oid relid)
{
	storage_relcache_callback(arg, relid);
	for (int i = 0; i < storage_nsubscribers; i++)
		storage_subscribers[i] (arg, relid);
}

/*
 * Has callback called at every relcache invalidation, as
 * CacheRegisterRelcacheCallback would, without a slot of its own.
 */
void
storage_relcache_subscribe(RelcacheCallbackFunction callback)
{
	if (storage_nsubscribers >= STORAGE_MAX_SUBSCRIBERS)
		elog(FATAL, "out of idem_consumer relcache callback slots");
	storage_subscribers[storage_nsubscribers++] = callback;
}

/*
 * Registers the library's one relcache callback; called once from
 * _PG_init.
 */
void
storage_init(void)
{
	CacheRegisterRelcacheCallback(storage_relcache_dispatch, (Datum) 0);
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
 * Returns the OID of the index index_name if it is the index the extension
 * creates on table keys_relid (unique, btree, immediate, valid, on
 * hash_func(consumer_id, key) and nothing else) and the table is a plain
 * table that is no partition, InvalidOid if the fast path must not use it.
 * Only the executor routes rows of a partitioned table and checks a
 * partition's constraint.
 */
static Oid
usable_hash_index(Oid nspid, Oid keys_relid, const char *index_name,
				  const char *hash_func)
{
	Oid			indexoid = get_relname_relid(index_name, nspid);
	HeapTuple	tuple;
	Form_pg_index index;
	Oid			funcid = InvalidOid;
	bool		usable;

	if (!OidIsValid(indexoid) || !OidIsValid(keys_relid))
		return InvalidOid;

	tuple = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(indexoid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	index = (Form_pg_index) GETSTRUCT(tuple);
	usable = index->indrelid == keys_relid &&
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

	/* the expression calls our hash function, whose C code we call too */
	tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(funcid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	usable = ((Form_pg_proc) GETSTRUCT(tuple))->pronamespace == nspid &&
		strcmp(NameStr(((Form_pg_proc) GETSTRUCT(tuple))->proname), hash_func) == 0;
	ReleaseSysCache(tuple);

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(indexoid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	usable = usable && ((Form_pg_class) GETSTRUCT(tuple))->relam == BTREE_AM_OID &&
		((Form_pg_class) GETSTRUCT(tuple))->relkind == RELKIND_INDEX;
	ReleaseSysCache(tuple);

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(keys_relid));
	if (!HeapTupleIsValid(tuple))
		return InvalidOid;
	usable = usable && ((Form_pg_class) GETSTRUCT(tuple))->relkind == RELKIND_RELATION &&
		!((Form_pg_class) GETSTRUCT(tuple))->relispartition;
	ReleaseSysCache(tuple);

	return usable ? indexoid : InvalidOid;
}

/*
 * Finds the generations of the key store.  Before 1.2 there is one, the
 * tables processed_keys and key_collisions themselves; in a database
 * updated to 1.2 they are the legacy generation, the keys recorded before
 * the update, and the ring processed_keys_N and key_collisions_N takes the
 * new ones (keygen.c).  A database created at 1.2 has the ring alone: its
 * legacy generation has no tables (InvalidOid), which every user of
 * gens[KEYGEN_LEGACY] takes for a generation that holds no key.
 */
static void
locate_generations(Oid nspid)
{
	StorageInfo *si = &storage.info;
	KeyGeneration *legacy = &si->gens[KEYGEN_LEGACY];
	Oid			local_nspid = get_namespace_oid(LOCAL_SCHEMA, true);

	memset(si->gens, 0, sizeof(si->gens));
	memset(si->filter_all_places, 0, sizeof(si->filter_all_places));
	si->generations_relid = get_relname_relid("key_generations", nspid);
	si->has_ring = OidIsValid(si->generations_relid);
	for (int g = 1; si->has_ring && g <= KEYGEN_RING; g++)
	{
		KeyGeneration *gen = &si->gens[g];
		char		name[NAMEDATALEN];

		snprintf(name, sizeof(name), "processed_keys_%d", g);
		gen->keys_relid = get_relname_relid(name, nspid);
		snprintf(name, sizeof(name), "key_collisions_%d", g);
		gen->collisions_relid = get_relname_relid(name, nspid);
		if (!OidIsValid(gen->keys_relid) || !OidIsValid(gen->collisions_relid))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("storage of extension \"idem_consumer\" is missing generation %d", g),
					 errdetail("Tables %s.processed_keys_%d and %s.key_collisions_%d were not found.",
							   STORAGE_SCHEMA, g, STORAGE_SCHEMA, g),
					 errhint("Recreate the extension with DROP EXTENSION idem_consumer; CREATE EXTENSION idem_consumer;")));
		gen->hash64 = true;
		snprintf(name, sizeof(name), "key_filter_%d", g);
		gen->filter_relid = OidIsValid(local_nspid) ?
			get_relname_relid(name, local_nspid) : InvalidOid;
		snprintf(name, sizeof(name), "processed_keys_%d_hash", g);
		gen->hash_index = usable_hash_index(nspid, gen->keys_relid, name,
											"key_hash64");
	}

	si->filter_all_relid = InvalidOid;
	if (si->has_ring && OidIsValid(local_nspid))
	{
		si->filter_all_relid = get_relname_relid("key_filter_all", local_nspid);
		for (int place = 1; place <= FILTER_ALL_PLACES; place++)
		{
			char		name[NAMEDATALEN];

			snprintf(name, sizeof(name), "key_filter_all_%d", place);
			si->filter_all_places[place] = get_relname_relid(name, local_nspid);
			if (!OidIsValid(si->filter_all_places[place]))
				si->filter_all_relid = InvalidOid;
		}
	}

	legacy->keys_relid = get_relname_relid("processed_keys", nspid);
	legacy->collisions_relid = get_relname_relid("key_collisions", nspid);
	legacy->hash64 = false;
	legacy->hash_index = usable_hash_index(nspid, legacy->keys_relid,
										   "processed_keys_hash", "key_hash");

	/* a pair half there is no generation: its keys could not be told apart */
	if (OidIsValid(legacy->keys_relid) != OidIsValid(legacy->collisions_relid) ||
		(!OidIsValid(legacy->keys_relid) && !si->has_ring))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("storage of extension \"idem_consumer\" is missing"),
				 errdetail("Neither the tables %s.processed_keys and %s.key_collisions nor %s.key_generations were found.",
						   STORAGE_SCHEMA, STORAGE_SCHEMA, STORAGE_SCHEMA),
				 errhint("Recreate the extension with DROP EXTENSION idem_consumer; CREATE EXTENSION idem_consumer;")));
}

/*
 * Whether the keys of the storage keep the fingerprint of their message:
 * from 1.1 on.  The ring of 1.2 has the column in every generation.
 */
static bool
keys_have_fingerprints(const StorageInfo *si)
{
	Oid			legacy_keys = si->gens[KEYGEN_LEGACY].keys_relid;

	return si->has_ring ||
		get_attnum(legacy_keys, "fingerprint") != InvalidAttrNumber;
}

/*
 * Raises an error if Citus distributes a table of schema nspid other than
 * the routed tables (see the header).  Citus's catalog exists only with
 * Citus; it is small, and read only when the storage is located.
 */
static void
refuse_citus_storage(Oid nspid)
{
	Oid			dist_relid = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	Oid			routed_keys = get_relname_relid("routed_keys", nspid);
	Oid			routed_dead_letters = get_relname_relid("routed_dead_letters", nspid);
	Oid			routed_effects = get_relname_relid("routed_effects", nspid);
	AttrNumber	relid_attnum;
	Relation	dist;
	SysScanDesc scan;
	HeapTuple	tuple;

	if (!OidIsValid(dist_relid))
		return;
	relid_attnum = get_attnum(dist_relid, "logicalrelid");
	if (relid_attnum == InvalidAttrNumber)
		return;
	dist = table_open(dist_relid, AccessShareLock);
	scan = systable_beginscan(dist, InvalidOid, false, NULL, 0, NULL);
	while ((tuple = systable_getnext(scan)) != NULL)
	{
		bool		isnull;
		Oid			relid = DatumGetObjectId(heap_getattr(tuple, relid_attnum,
														  RelationGetDescr(dist), &isnull));

		if (isnull || relid == routed_keys || relid == routed_dead_letters ||
			relid == routed_effects || get_rel_namespace(relid) != nspid)
			continue;
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("table %s.%s of extension \"idem_consumer\" is distributed by Citus",
						STORAGE_SCHEMA, get_rel_name(relid)),
				 errdetail("Citus keeps its rows in shards; idem_consumer would write and read the table itself, apart from them, and apply messages twice."),
				 errhint("Undo it with undistribute_table(), and store keys beside the business rows with idem_citus_distribute().")));
	}
	systable_endscan(scan);
	table_close(dist, AccessShareLock);
}

/*
 * Finds the storage tables of this database, or raises a clear error.
 */
static void
locate_storage(void)
{
	Oid			nspid;

	nspid = get_namespace_oid(STORAGE_SCHEMA, true);
	storage.info.consumers_relid = OidIsValid(nspid) ?
		get_relname_relid("consumers", nspid) : InvalidOid;
	if (!OidIsValid(storage.info.consumers_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("storage of extension \"idem_consumer\" is missing"),
				 errdetail("Table %s.consumers was not found.", STORAGE_SCHEMA),
				 errhint("Recreate the extension with DROP EXTENSION idem_consumer; CREATE EXTENSION idem_consumer;")));

	storage.info.owner = storage_table_owner(storage.info.consumers_relid);
	refuse_citus_storage(nspid);
	locate_generations(nspid);
	storage.info.consumers_have_owners =
		get_attnum(storage.info.consumers_relid, "owner") != InvalidAttrNumber;
	storage.info.keys_have_fingerprints = keys_have_fingerprints(&storage.info);
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
		Oid			owner = storage_table_owner(storage.info.consumers_relid);

		if (!OidIsValid(owner))
		{
			storage.located = false;
			storage.recheck = false;
		}
		else
		{
			KeyGeneration before[KEYGEN_NUM];

			storage.info.owner = owner;
			refuse_citus_storage(get_rel_namespace(storage.info.consumers_relid));
			memcpy(before, storage.info.gens, sizeof(before));
			locate_generations(get_rel_namespace(storage.info.consumers_relid));
			/* a generation added (the update to 1.2): statements anew */
			if (memcmp(before, storage.info.gens, sizeof(before)) != 0)
				storage.info.generation++;
			storage.info.consumers_have_owners =
				get_attnum(storage.info.consumers_relid, "owner") != InvalidAttrNumber;
			storage.info.keys_have_fingerprints = keys_have_fingerprints(&storage.info);
			storage.info.consumers_version++;
			/* only now: an error above checks again at the next call */
			storage.recheck = false;
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
 * Returns a number that changes whenever the storage is located anew: the
 * extension created again (and its consumer ids with it), or a generation
 * of keys added (the update to 1.2), which changes what each table of a
 * purge is.
 */
uint64
keystore_storage_version(void)
{
	return storage_locate()->generation;
}

/*
 * Computes idem_consumer.key_hash(consumer_id, key), the 32-bit hash of
 * the keys of 1.0 and 1.1.  Stored in the unique index, so it must never
 * change.
 */
static int32
key_hash32_value(int32 consumer_id, text *key)
{
	uint32		hash;

	hash = hash_bytes((const unsigned char *) VARDATA_ANY(key),
					  VARSIZE_ANY_EXHDR(key));
	hash = hash_combine(hash_bytes_uint32((uint32) consumer_id), hash);
	return (int32) hash;
}


/*
 * Returns this database's seed of key_hash64, reading it from key_seed on
 * first use and after an invalidation of that table.  Read directly, as
 * the catalogs are, since the hash is computed inside index insertions.
 */
static const IdemHashSeed *
key_seed(void)
{
	Oid			nspid;
	Relation	rel;
	SysScanDesc scan;
	HeapTuple	tuple;
	bool		found = false;

	if (storage.seed_known)
		return &storage.seed;

	nspid = get_namespace_oid(LOCAL_SCHEMA, true);
	storage.seed_relid = OidIsValid(nspid) ?
		get_relname_relid("key_seed", nspid) : InvalidOid;
	if (!OidIsValid(storage.seed_relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("hash seed of extension \"idem_consumer\" is missing"),
				 errdetail("Table %s.key_seed was not found.", LOCAL_SCHEMA),
				 errhint("Update the extension with ALTER EXTENSION idem_consumer UPDATE.")));

	rel = table_open(storage.seed_relid, AccessShareLock);
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		isnull[3];
		Datum		k0 = heap_getattr(tuple, 1, RelationGetDescr(rel), &isnull[0]);
		Datum		k1 = heap_getattr(tuple, 2, RelationGetDescr(rel), &isnull[1]);
		Datum		bits = heap_getattr(tuple, 3, RelationGetDescr(rel), &isnull[2]);

		if (found || isnull[0] || isnull[1] || isnull[2] ||
			DatumGetInt32(bits) < 16 || DatumGetInt32(bits) > 64)
		{
			found = false;
			break;
		}
		storage.seed.k0 = (uint64) DatumGetInt64(k0);
		storage.seed.k1 = (uint64) DatumGetInt64(k1);
		storage.hash_mask = DatumGetInt32(bits) == 64 ? PG_UINT64_MAX :
			(UINT64CONST(1) << DatumGetInt32(bits)) - 1;
		found = true;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);

	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("hash seed of extension \"idem_consumer\" is missing"),
				 errdetail("Table %s.key_seed must hold exactly one row, with a width from 16 to 64 bits.", LOCAL_SCHEMA),
				 errhint("Recreate the extension with DROP EXTENSION idem_consumer; CREATE EXTENSION idem_consumer;")));
	storage.seed_known = true;
	return &storage.seed;
}

/*
 * Computes idem_consumer.key_hash64(consumer_id, key), the hash of the
 * keys of 1.2 and later.
 */
static int64
key_hash64_value(int32 consumer_id, text *key)
{
	const IdemHashSeed *seed = key_seed();

	return (int64) (idem_key_hash64(seed, consumer_id, VARDATA_ANY(key),
									VARSIZE_ANY_EXHDR(key)) & storage.hash_mask);
}

/*
 * Computes the full 64 bits of key_hash64(consumer_id, key), whatever the
 * width the index keeps: the hash of the generations' filters.
 */
uint64
key_filter_hash(int32 consumer_id, text *key)
{
	return idem_key_hash64(key_seed(), consumer_id, VARDATA_ANY(key),
						   VARSIZE_ANY_EXHDR(key));
}

/*
 * Computes the hash of a key in the unique index of a generation.  The
 * 32-bit hash is widened, which keeps its order.
 */
int64
key_hash_in(KeyGenSlot slot, int32 consumer_id, text *key)
{
	if (storage_locate()->gens[slot].hash64)
		return key_hash64_value(consumer_id, key);
	return key_hash32_value(consumer_id, key);
}

/*
 * Whether relid has a heap block.
 */
static bool
has_blocks(Oid relid)
{
	Relation	rel;
	bool		any;

	if (!OidIsValid(relid))
		return false;
	rel = table_open(relid, AccessShareLock);
	any = RelationGetNumberOfBlocks(rel) > 0;
	table_close(rel, NoLock);
	return any;
}

/*
 * Tells whether the legacy generation of a database updated to 1.2 may
 * hold keys: whether its processed_keys or key_collisions have a heap
 * block; never in a database created at 1.2, which has no such tables.  Under 1.2 nothing inserts into them but a collision moved into
 * its occupant's place, so a generation once found empty stays empty (but
 * for rows a DBA writes there, which a session finds once the storage is
 * located anew), and a session stops probing it.  Before 1.2 the legacy
 * pair is the current generation, never a sealed one.
 */
bool
keystore_legacy_live(void)
{
	static uint64 empty_in_generation = 0;
	const StorageInfo *si = storage_locate();
	const KeyGeneration *legacy = &si->gens[KEYGEN_LEGACY];

	if (!si->has_ring || empty_in_generation == si->generation)
		return false;
	if (has_blocks(legacy->keys_relid) || has_blocks(legacy->collisions_relid))
		return true;
	empty_in_generation = si->generation;
	return false;
}

/*
 * idem_consumer.key_hash(consumer_id, key): the unique index key of the
 * keys of 1.0 and 1.1.
 */
Datum
idem_key_hash(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32(key_hash32_value(PG_GETARG_INT32(0), PG_GETARG_TEXT_PP(1)));
}

/*
 * idem_consumer.key_hash64(consumer_id, key): the unique index key of the
 * generations of 1.2 and later.
 */
Datum
idem_key_hash64_sql(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(key_hash64_value(PG_GETARG_INT32(0), PG_GETARG_TEXT_PP(1)));
}

/*
 * idem_consumer.new_key_seed(): a seed for key_hash64 from the strong
 * random source, for the install script.
 */
Datum
idem_new_key_seed(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	uint64		seed[2];
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	if (!pg_strong_random(seed, sizeof(seed)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random hash seed")));
	values[0] = Int64GetDatum((int64) seed[0]);
	values[1] = Int64GetDatum((int64) seed[1]);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}

/*
 * Trigger function of the storage tables whose rows sessions cache
 * (key_generations, key_filter_all, consumers), after every row a
 * statement changes and after TRUNCATE: makes every session read the table
 * again once the transaction commits.  Enabled ALWAYS, it fires for the
 * rows a logical subscriber applies too, so that a session connected to a
 * subscriber records no key in a generation sealed upstream and acts on no
 * consumer with an owner changed upstream.
 */
Datum
idem_storage_changed(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_AFTER(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("function %s must be fired as an AFTER trigger",
						"idem_consumer.storage_changed")));
	CacheInvalidateRelcacheByRelid(RelationGetRelid(trigdata->tg_relation));
	return PointerGetDatum(NULL);
}
