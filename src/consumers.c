/*-------------------------------------------------------------------------
 *
 * consumers.c
 *	  Consumers: their names and ids, their owners, who may act on them,
 *	  whether they check fingerprints, and the SQL functions
 *	  idem_consumer_create(), idem_consumer_set_owner() and
 *	  idem_set_fingerprint().
 *
 * Every function that acts on a consumer resolves its name here, and the
 * resolution is the access check: the current role must have the
 * privileges of the consumer's owner (has_privs_of_role, the test of
 * PostgreSQL's own ownership checks, so superusers pass and a member that
 * does not inherit them must SET ROLE first), or the call fails with 42501
 * before anything is recorded or counted.  The error names the owner only
 * to a member of it: to anyone else, which role owns a consumer is not
 * theirs to know.  Making a role the owner of a consumer (creating it for
 * that role, or giving it away) takes being allowed to SET ROLE to it, as
 * ALTER ... OWNER TO does.  Consumers created under version 1.0 of the
 * SQL have no owner and stay open to every role with EXECUTE on the API,
 * as they were, until a superuser gives them one; in a database whose SQL
 * is still 1.0 nobody has an owner.
 *
 * Who may create consumers follows the current role, so that SET ROLE and
 * a pooler's SET LOCAL ROLE change it: from version 1.2 of the SQL, a
 * consumer that does not exist yet is created (by its first use or by
 * idem_consumer_create()) only for a role with EXECUTE on
 * idem_consumer_create(text, regrole), which the DBA grants.  Databases
 * at 1.0 and 1.1 keep their rule: every role with EXECUTE on the API
 * creates consumers.  In both, idem_consumer.create_consumers = off, a
 * setting of the session, refuses creation to every role but superusers.
 * The name of a new consumer must pass consumer_names.c.
 *
 * Ids and owners are cached per backend, but only once the row is known to
 * be committed by another transaction: an id created by the current
 * transaction would be a lie after a rollback, and a later backend would
 * create the same consumer under a second id.  The cache is emptied when
 * the storage is located anew and on every relcache invalidation of the
 * storage tables.  From version 1.2 of the SQL a trigger of the consumers
 * table, enabled ALWAYS, sends one for every row updated or deleted,
 * whoever changes it: the setters below, a direct UPDATE by the storage's
 * owner, a restore, or a logical subscriber's apply worker; other backends
 * then see the new owner (and the new fingerprint setting) from their
 * next transaction on.  The setters send one themselves too, for
 * databases whose SQL is 1.1.  Membership
 * itself is not cached here: has_privs_of_role() keeps its own cache,
 * invalidated by GRANT and REVOKE.
 *
 * The caller of the C functions must be connected to SPI.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/consumers.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "parser/parse_func.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "compat.h"
#include "consumers_sql.h"
#include "storage.h"

/* A consumer as the storage knows it. */
typedef struct ConsumerIdEntry
{
	char		name[IDEM_MAX_CONSUMER_BYTES + 1];	/* hash key */
	int32		consumer_id;
	Oid			owner;			/* InvalidOid: no owner, open to all */
	bool		check_fingerprint;	/* compare fingerprints of redeliveries */
} ConsumerIdEntry;

/* Whether roles may create consumers (idem_consumer.create_consumers). */
static bool create_consumers = true;

/* Consumers known to be committed, valid for cache_version. */
static HTAB *consumer_cache;
static uint64 consumer_cache_generation;
static uint64 consumer_cache_version;

/*
 * The entry of consumer_cache found last: a session mostly acts on one
 * consumer call after call, and comparing its name spares hashing it.
 */
static ConsumerIdEntry *consumer_cache_last;

PG_FUNCTION_INFO_V1(idem_consumer_create);
PG_FUNCTION_INFO_V1(idem_consumer_set_owner);
PG_FUNCTION_INFO_V1(idem_set_fingerprint);

/*
 * Returns the cache of consumers, emptied if the storage was located anew
 * or invalidated since it was filled.
 */
static HTAB *
consumer_id_cache(void)
{
	const StorageInfo *si = storage_locate();

	if (consumer_cache != NULL &&
		(consumer_cache_generation != si->generation ||
		 consumer_cache_version != si->consumers_version))
	{
		hash_destroy(consumer_cache);
		consumer_cache = NULL;
		consumer_cache_last = NULL;
	}
	if (consumer_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(((ConsumerIdEntry *) NULL)->name);
		ctl.entrysize = sizeof(ConsumerIdEntry);
		ctl.hcxt = CacheMemoryContext;
		consumer_cache = hash_create("idem_consumer consumers", 16, &ctl,
									 HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		consumer_cache_generation = si->generation;
		consumer_cache_version = si->consumers_version;
	}
	return consumer_cache;
}

/*
 * Returns the name of a role for a message, or its OID if it was dropped.
 */
static char *
role_name_for_message(Oid roleid)
{
	char	   *name = GetUserNameFromId(roleid, true);

	return name != NULL ? name : psprintf("%u", roleid);
}

/*
 * Tells whether the current user may SET ROLE to roleid: what PostgreSQL
 * asks of a role that makes another the owner of an object, and of one
 * that acts as another.
 */
bool
role_can_become(Oid roleid)
{
	return compat_member_can_set_role(GetUserId(), roleid);
}

/*
 * Tells whether the current role may act on a consumer with this owner
 * (InvalidOid: none, a consumer of 1.0).
 */
static bool
has_owner_privileges(Oid owner)
{
	return !OidIsValid(owner) || has_privs_of_role(GetUserId(), owner);
}

/*
 * Tells whether the current role may be told which role owns a consumer:
 * a member of it, whatever the grant's options.
 */
static bool
may_know_owner(Oid owner)
{
	return has_privs_of_role(GetUserId(), owner) ||
		is_member_of_role(GetUserId(), owner);
}

/*
 * Raises 42501 unless the current role may act on a consumer with this
 * owner.
 */
static void
check_consumer_access(const char *consumer, Oid owner)
{
	char	   *owner_name;

	if (has_owner_privileges(owner))
		return;

	if (!role_can_become(owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for consumer \"%s\"", consumer),
				 errdetail("Role \"%s\" does not have the privileges of the consumer's owner.",
						   role_name_for_message(GetUserId())),
				 errhint("Ask an administrator to grant the owner of the consumer to the role that acts on it.")));

	owner_name = role_name_for_message(owner);
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied for consumer \"%s\"", consumer),
			 errdetail("Role \"%s\" is a member of the consumer's owner \"%s\" but does not inherit its privileges.",
					   role_name_for_message(GetUserId()), owner_name),
			 errhint("SET ROLE \"%s\" first.", owner_name)));
}

/*
 * Returns the version of an extension, and its schema in *nspid; NULL if
 * it is gone.
 */
static char *
extension_version(Oid extoid, Oid *nspid)
{
	Relation	rel;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *version = NULL;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		datum = heap_getattr(tuple, Anum_pg_extension_extversion,
										 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = text_to_cstring(DatumGetTextPP(datum));
		*nspid = ((Form_pg_extension) GETSTRUCT(tuple))->extnamespace;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Tells whether the current role holds the privilege to create consumers
 * that version 1.2 of the SQL introduced: EXECUTE on
 * idem_consumer_create(text, regrole).  True in a database still at 1.0
 * or 1.1, where every role with EXECUTE on the API creates consumers.
 * Read at every creation, which is rare, so that an update of the
 * extension or a GRANT takes effect at once.
 */
static bool
has_create_privilege(void)
{
	Oid			extoid = get_extension_oid("idem_consumer", true);
	Oid			nspid = InvalidOid;
	char	   *version;
	Oid			argtypes[2] = {TEXTOID, REGROLEOID};
	char	   *schema;
	Oid			funcoid;

	if (!OidIsValid(extoid))
		return true;
	version = extension_version(extoid, &nspid);
	if (version == NULL || strcmp(version, "1.0") == 0 || strcmp(version, "1.1") == 0)
		return true;

	schema = get_namespace_name(nspid);
	if (schema == NULL)
		return superuser();
	funcoid = LookupFuncName(list_make2(makeString(schema),
										makeString("idem_consumer_create")),
							 2, argtypes, true);
	if (!OidIsValid(funcoid))
		return superuser();
	return compat_function_executable(funcoid, GetUserId());
}

/*
 * Raises an error unless the current role may create a consumer of this
 * name owned by owner: 42501 without the privilege, 22023 for a name no
 * new consumer may have.
 */
static void
check_may_create(const char *consumer, Oid owner)
{
	if (!create_consumers && !superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to create consumer \"%s\"", consumer),
				 errdetail("idem_consumer.create_consumers is off in this session."),
				 errhint("Ask an administrator to create the consumer with idem_consumer_create().")));
	if (!has_create_privilege())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to create consumer \"%s\"", consumer),
				 errdetail("Creating a consumer takes EXECUTE on function idem_consumer_create(text, regrole), which role \"%s\" does not have.",
						   role_name_for_message(GetUserId())),
				 errhint("Ask an administrator to create the consumer with idem_consumer_create(), or to grant EXECUTE on it.")));
	if (!role_can_become(owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to create consumer \"%s\" owned by role \"%s\"",
						consumer, role_name_for_message(owner)),
				 errdetail("Only roles that may SET ROLE to a role may create consumers it owns.")));
	consumer_name_check_new(consumer);
}

/*
 * Finds a consumer in the storage; returns false if it does not exist.
 * Caches what it found once the row is committed.
 */
static bool
lookup_consumer(const char *consumer, ConsumerIdEntry *found)
{
	const StorageInfo *si = storage_locate();
	HTAB	   *cache = consumer_id_cache();
	ConsumerIdEntry *entry;
	Datum		name_datum;
	bool		isnull;
	TransactionId xmin;

	entry = consumer_cache_last;
	if (entry == NULL || strcmp(entry->name, consumer) != 0)
		entry = hash_search(cache, consumer, HASH_FIND, NULL);
	if (entry != NULL)
	{
		consumer_cache_last = entry;
		*found = *entry;
		return true;
	}

	name_datum = CStringGetTextDatum(consumer);
	consumers_execute(si->consumers_have_owners ? CS_FIND_OWNED : CS_FIND,
					  &name_datum, NULL, 1);
	if (SPI_processed == 0)
		return false;

	strlcpy(found->name, consumer, sizeof(found->name));
	found->consumer_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc,
													 1, &isnull));
	xmin = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc,
											   2, &isnull));
	found->owner = InvalidOid;
	found->check_fingerprint = false;
	if (si->consumers_have_owners)
	{
		Datum		owner = SPI_getbinval(SPI_tuptable->vals[0],
										  SPI_tuptable->tupdesc, 3, &isnull);

		if (!isnull)
			found->owner = DatumGetObjectId(owner);
		found->check_fingerprint =
			DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									   SPI_tuptable->tupdesc, 4, &isnull)) &&
			si->keys_have_fingerprints;
	}
	if (!TransactionIdIsCurrentTransactionId(xmin))
	{
		entry = hash_search(cache, consumer, HASH_ENTER, NULL);
		*entry = *found;
	}
	return true;
}

/*
 * Inserts a consumer owned by owner; returns its id, or 0 if a concurrent
 * transaction created it first.
 *
 * The id the identity sequence gives may be taken by a row that logical
 * replication applied (docs/replication.md): on a subscriber that takes
 * over, the sequence still stands where it was, below the publisher's.
 * The insert then inserts nothing, as it does when the name is taken; if
 * the name is free, the sequence is moved past the largest id and the
 * insert tried again.  Each try takes a new id and nothing is written but
 * the consumer's row, so the loop ends, with nothing half-recorded, once
 * the sequence has passed the ids taken (or at the sequence's end, with
 * its error).
 */
static int32
insert_consumer(const char *consumer, Oid owner)
{
	const StorageInfo *si = storage_locate();
	Datum		args[2];
	bool		isnull;

	args[0] = CStringGetTextDatum(consumer);
	args[1] = ObjectIdGetDatum(owner);
	for (;;)
	{
		consumers_execute(si->consumers_have_owners ? CS_CREATE_OWNED : CS_CREATE,
						  args, NULL, 1);
		if (SPI_processed > 0)
			return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 1, &isnull));

		/* under READ COMMITTED, a new snapshot sees a concurrent creation */
		consumers_execute(CS_FIND, args, NULL, 1);
		if (SPI_processed > 0)
			return 0;

		consumers_execute(CS_IDS_PAST_ROWS, NULL, NULL, 0);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Returns the id of a consumer the current role may act on, raising 42501
 * for one it may not; with create, creates the consumer, owned by the
 * current role, if it does not exist yet, otherwise returns 0 for an
 * unknown consumer.
 */
int32
keystore_consumer_id(const char *consumer, bool create)
{
	return keystore_consumer_id_and_fp_check(consumer, create, NULL);
}

/*
 * keystore_consumer_id(), also telling whether the consumer compares the
 * fingerprints of redeliveries (when check_fingerprint is not NULL).
 */
int32
keystore_consumer_id_and_fp_check(const char *consumer, bool create,
								  bool *check_fingerprint)
{
	ConsumerIdEntry found;

	for (;;)
	{
		int32		consumer_id;

		if (lookup_consumer(consumer, &found))
		{
			check_consumer_access(consumer, found.owner);
			if (check_fingerprint != NULL)
				*check_fingerprint = found.check_fingerprint;
			return found.consumer_id;
		}
		if (!create)
			return 0;

		check_may_create(consumer, GetUserId());
		consumer_id = insert_consumer(consumer, GetUserId());
		if (consumer_id != 0)
		{
			/* the column's default */
			if (check_fingerprint != NULL)
				*check_fingerprint = storage_locate()->keys_have_fingerprints &&
					storage_locate()->consumers_have_owners;
			return consumer_id;
		}

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
 * keystore_consumer_id() of a consumer this backend has cached, without a
 * statement (and so without SPI): returns false if it is not cached, and
 * raises 42501 for one the current role may not act on.
 */
bool
keystore_cached_consumer_id(const char *consumer, int32 *consumer_id)
{
	ConsumerIdEntry *entry = hash_search(consumer_id_cache(), consumer,
										 HASH_FIND, NULL);

	if (entry == NULL)
		return false;
	check_consumer_access(consumer, entry->owner);
	*consumer_id = entry->consumer_id;
	return true;
}

/*
 * Tells whether the current role may act on the consumer of this id, for
 * the functions that name a consumer by one of its rows (a dead-letter
 * entry): they treat a row of another team's consumer as one that does not
 * exist, so that an id tells a foreign role nothing.
 */
bool
keystore_may_act_on_consumer_id(int32 consumer_id)
{
	Datum		arg = Int32GetDatum(consumer_id);
	bool		isnull;
	Datum		owner;

	if (!storage_locate()->consumers_have_owners)
		return true;
	consumers_execute(CS_BY_ID, &arg, NULL, 1);
	if (SPI_processed == 0)
		return true;
	owner = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	return isnull || has_owner_privileges(DatumGetObjectId(owner));
}

/*
 * Tells whether the current role may read the counters of a consumer of
 * this database: one with no owner, or whose owner's privileges it has.
 * A consumer that no longer exists has no owner to ask, and is nobody's
 * to read but pg_read_all_stats's, which the caller checks first.
 */
bool
keystore_may_read_consumer(const char *consumer)
{
	ConsumerIdEntry found;

	return lookup_consumer(consumer, &found) && has_owner_privileges(found.owner);
}

/*
 * Raises 42501 unless the current role may act on every consumer; for the
 * functions that act on all consumers at once.  Neither the names of
 * other roles' consumers nor their owners are told.
 */
void
keystore_check_every_consumer(const char *what)
{
	Datum		arg = ObjectIdGetDatum(GetUserId());

	if (superuser() || !storage_locate()->consumers_have_owners)
		return;
	consumers_execute(CS_FOREIGN, &arg, NULL, 1);
	if (SPI_processed == 0)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("permission denied to %s of every consumer", what),
			 errdetail("Role \"%s\" does not have the privileges of the owners of every consumer of this database.",
					   role_name_for_message(GetUserId())),
			 errhint("Name the consumer, or act as a role with the privileges of every owner.")));
}

/*
 * Raises the error of a function that needs version 1.1 of the SQL.
 */
static void
require_owners(const char *function)
{
	if (!storage_locate()->consumers_have_owners)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s needs version 1.1 of extension \"idem_consumer\"", function),
				 errdetail("The consumers table of this database has no owner column."),
				 errhint("ALTER EXTENSION idem_consumer UPDATE")));
}

/*
 * idem_consumer_create(consumer, owner): creates a consumer owned by owner
 * (the current role when NULL).
 */
Datum
idem_consumer_create(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	Oid			owner = get_role_arg(fcinfo, 1, true);
	ConsumerIdEntry found;

	SPI_connect();
	require_owners("idem_consumer_create()");
	if (!lookup_consumer(consumer, &found))
	{
		check_may_create(consumer, owner);
		if (insert_consumer(consumer, owner) != 0)
		{
			SPI_finish();
			PG_RETURN_VOID();
		}
		lookup_consumer(consumer, &found);
	}
	if (!OidIsValid(found.owner))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("consumer \"%s\" already exists", consumer),
				 errdetail("It was created under version 1.0 and has no owner.")));
	if (!may_know_owner(found.owner))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("consumer \"%s\" already exists", consumer),
				 errdetail("It is owned by a role of which role \"%s\" is not a member.",
						   role_name_for_message(GetUserId())),
				 errhint("Choose another name.")));
	ereport(ERROR,
			(errcode(ERRCODE_DUPLICATE_OBJECT),
			 errmsg("consumer \"%s\" already exists", consumer),
			 errdetail("It is owned by role \"%s\".", role_name_for_message(found.owner)),
			 errhint("Use idem_consumer_set_owner() to change the owner of an existing consumer.")));
	PG_RETURN_VOID();
}

/*
 * idem_consumer_set_owner(consumer, owner): gives a consumer to another
 * owner.  Allowed to roles with the privileges of the present owner that
 * may SET ROLE to the new one, as ALTER ... OWNER TO is; a consumer
 * without an owner is given one by superusers only.
 */
Datum
idem_consumer_set_owner(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	Oid			owner = get_role_arg(fcinfo, 1, false);
	ConsumerIdEntry found;
	Datum		args[2];

	inflight_check_none("idem_consumer_set_owner");
	SPI_connect();
	require_owners("idem_consumer_set_owner()");
	if (!lookup_consumer(consumer, &found))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" does not exist", consumer),
				 errhint("The view idem_consumers lists the consumers.")));
	if (!OidIsValid(found.owner) && !superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to give consumer \"%s\" an owner", consumer),
				 errdetail("The consumer was created under version 1.0 and has no owner."),
				 errhint("A superuser gives owners to such consumers.")));
	check_consumer_access(consumer, found.owner);
	if (!role_can_become(owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to give consumer \"%s\" to role \"%s\"",
						consumer, role_name_for_message(owner)),
				 errdetail("Only roles that may SET ROLE to a role may give it consumers.")));

	args[0] = Int32GetDatum(found.consumer_id);
	args[1] = ObjectIdGetDatum(owner);
	consumers_execute(CS_SET_OWNER, args, NULL, 0);
	CacheInvalidateRelcacheByRelid(storage_locate()->consumers_relid);
	SPI_finish();
	PG_RETURN_VOID();
}

/*
 * idem_set_fingerprint(consumer, enabled): turns the key-reuse check of a
 * consumer on or off.  Keys recorded while it is off keep no fingerprint
 * and are never compared.
 */
Datum
idem_set_fingerprint(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	Datum		args[2];

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("enabled must not be null")));

	inflight_check_none("idem_set_fingerprint");
	SPI_connect();
	require_owners("idem_set_fingerprint()");
	args[0] = Int32GetDatum(keystore_consumer_id(consumer, false));
	if (DatumGetInt32(args[0]) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" does not exist", consumer),
				 errhint("Create it with idem_consumer_create() first.")));
	args[1] = PG_GETARG_DATUM(1);
	consumers_execute(CS_SET_CHECK_FINGERPRINT, args, NULL, 0);
	CacheInvalidateRelcacheByRelid(storage_locate()->consumers_relid);
	SPI_finish();
	PG_RETURN_VOID();
}

/*
 * Defines idem_consumer.create_consumers; called once from _PG_init.
 */
void
consumers_init(void)
{
	DefineCustomBoolVariable("idem_consumer.create_consumers",
							 "Allows this session to create consumers.",
							 "When off, idem_apply and the other functions refuse a consumer that does not "
							 "exist yet, and idem_consumer_create() is refused, for roles other than superusers. "
							 "It is a setting of the session, which SET ROLE does not change: which roles may "
							 "create consumers is EXECUTE on idem_consumer_create(text, regrole).",
							 &create_consumers,
							 true,
							 PGC_SUSET,
							 0,
							 NULL,
							 NULL,
							 NULL);
}

/*
 * Tells whether a consumer's row is visible to this transaction, and sets
 * *xmin (unless NULL) to the transaction that inserted it.
 */
bool
consumer_row_visible(const char *consumer, TransactionId *xmin)
{
	Datum		name = CStringGetTextDatum(consumer);
	bool		isnull;

	consumers_execute(CS_FIND, &name, NULL, 1);
	if (SPI_processed == 0)
		return false;
	if (xmin != NULL)
		*xmin = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 2, &isnull));
	return true;
}
