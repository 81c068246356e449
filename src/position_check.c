/*-------------------------------------------------------------------------
 *
 * position_check.c
 *	  idem_position_passed(consumer, topic, partition, offset): whether the
 *	  consumer's position on the partition has passed the offset, that is,
 *	  whether the message at that offset is applied and its redelivery a
 *	  duplicate; and the cache of positions of each backend that answers
 *	  it, for a redelivery, at about the cost of the round trip of a bare
 *	  SELECT (test/bench/positions).
 *
 * The function answers the duplicate question rather than returning the
 * position, because only that question can be answered from a cache: a
 * position cached by a backend may be below the stored one (another
 * session advanced it since), never above it but after a rewind, so the
 * cache tells "passed" (the offset is below the cached position) and
 * nothing else.  Any other answer reads the row.
 *
 * The answer is for the moment of the call, as idem_is_processed()'s: the
 * row is read through the primary key's index under a snapshot taken by
 * the call, which sees the positions committed until then and those of
 * the caller's own transaction, whatever its isolation level.  The cache
 * holds only positions of rows committed by other transactions (never a
 * row the caller's transaction wrote, which a rollback would take back).
 *
 * Why a cached "passed" is never wrong.  A committed position goes down,
 * or goes away, only by an UPDATE that lowers it or moves the row (a
 * rewind, or the storage owner by hand), a DELETE or a TRUNCATE: an
 * advance never lowers it (positions.c).  Triggers of the table fire on
 * each of those (UPDATE only when it lowers a position or changes a key),
 * enabled ALWAYS so that a logical subscriber's apply worker fires them
 * too, and each queues a relcache invalidation of the table
 * (storage_changed(), storage.c); ALTER TABLE, DROP and TRUNCATE queue
 * one of their own.  PostgreSQL sends the invalidations of a transaction
 * once its commit is visible to new snapshots and before the COMMIT
 * returns (CommitTransaction(), and FinishPreparedTransaction() for
 * COMMIT PREPARED; a hot standby replays them after the commit), and
 * drops them if it aborts.  Every call here first accepts the pending
 * invalidations, and one of the table (or of every relation, after an
 * overflow of the queue) empties the cache.  A position enters the cache
 * from a read whose snapshot was taken after invalidations were accepted,
 * and only if none of the table came before it was stored.  So a rewind
 * that committed before the call began has either emptied the cache, or
 * was seen by the read that filled it; and a read that could not see it
 * stored a position the rewind's invalidation empties at the next call.
 * Within the rewinding transaction, its own invalidation is applied at
 * the next command, before the next statement's check.  A call that runs
 * while a rewind commits (its commit visible, its invalidation not yet
 * sent) answers as if it had run just before; no client has been told of
 * the commit yet.  A trigger disabled by the table's owner voids all of
 * this, and docs/brokers.md says so.
 *
 * The consumer is resolved by consumers.c, from its cache when it can,
 * and the current role's right to act on it is checked at every call,
 * before the cache of positions is read: a role that SET ROLE to another
 * team gets 42501, not what the first role cached.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/position_check.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "idem_consumer.h"
#include "positions.h"

/* the cache is emptied when it reaches this many positions */
#define POSITION_CACHE_MAX		8192

/* The key of a cached position; the topic is padded with zeros. */
typedef struct PositionCacheKey
{
	int32		consumer_id;
	int32		partition;
	char		topic[KAFKA_MAX_TOPIC_BYTES + 1];
} PositionCacheKey;

typedef struct PositionCacheEntry
{
	PositionCacheKey key;
	int64		position;		/* committed, at most the stored one */
} PositionCacheEntry;

static HTAB *position_cache;

/* bumped by every invalidation of the table: the cache is then emptied */
static uint64 position_inval_count;
static uint64 position_cache_inval_count;

/* the table the cached positions were read from */
static Oid	position_cache_relid = InvalidOid;

PG_FUNCTION_INFO_V1(idem_position_passed);

/*
 * Notes an invalidation of the table of positions, or of every relation.
 * Catalogs are not read here.
 */
static void
position_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == position_cache_relid)
		position_inval_count++;
}

/*
 * Registers the invalidation callback; called once from _PG_init.
 */
void
position_check_init(void)
{
	storage_relcache_subscribe(position_relcache_callback);
}

/*
 * Returns the cache, emptied if the table was invalidated since it was
 * filled, or if it is full.
 */
static HTAB *
position_cache_current(void)
{
	if (position_cache != NULL &&
		(position_cache_inval_count != position_inval_count ||
		 hash_get_num_entries(position_cache) >= POSITION_CACHE_MAX))
	{
		hash_destroy(position_cache);
		position_cache = NULL;
	}
	if (position_cache == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(PositionCacheKey);
		ctl.entrysize = sizeof(PositionCacheEntry);
		ctl.hcxt = CacheMemoryContext;
		position_cache = hash_create("idem_consumer positions", 64, &ctl,
									 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		position_cache_inval_count = position_inval_count;
	}
	return position_cache;
}

/*
 * Returns the id of a consumer the current role may act on (42501
 * otherwise), or 0 for an unknown one; without a statement when consumers.c
 * has it cached.
 */
static int32
consumer_id_for_check(const char *consumer)
{
	int32		consumer_id;

	if (keystore_cached_consumer_id(consumer, &consumer_id))
		return consumer_id;
	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	SPI_finish();
	return consumer_id;
}

/*
 * Reads the position of key through the primary key's index under a new
 * snapshot; returns false if there is none.  Caches it if its row was
 * committed by another transaction and no invalidation of the table came
 * between the snapshot's start and now.
 */
static bool
read_position(const PositionCacheKey *ckey, text *topic, int64 *position)
{
	Oid			index;
	Relation	rel = positions_open(&index);
	ScanKeyData skey[3];
	int			nkeys;
	SysScanDesc scan;
	HeapTuple	tuple;
	Snapshot	snapshot;
	uint64		inval_count;
	bool		found = false;
	bool		cacheable = false;

	if (position_cache_relid != RelationGetRelid(rel))
	{
		/* another table (the extension made anew): nothing cached is its */
		position_cache_relid = RelationGetRelid(rel);
		position_inval_count++;
	}
	/* the lock taken above accepted them once; now as late as can be */
	AcceptInvalidationMessages();
	inval_count = position_inval_count;
	snapshot = RegisterSnapshot(GetLatestSnapshot());

	position_scankeys(skey, &nkeys, ckey->consumer_id, topic, ckey->partition);
	scan = systable_beginscan(rel, index, true, snapshot, nkeys, skey);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;

		*position = DatumGetInt64(heap_getattr(tuple, PC_POSITION + 1,
											   RelationGetDescr(rel), &isnull));
		found = !isnull;
		cacheable = found &&
			!TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data));
	}
	systable_endscan(scan);
	UnregisterSnapshot(snapshot);
	table_close(rel, AccessShareLock);

	if (cacheable && inval_count == position_inval_count)
	{
		PositionCacheEntry *entry;

		/* a read is never older than what the cache holds */
		entry = hash_search(position_cache_current(), ckey, HASH_ENTER, NULL);
		entry->position = *position;
	}
	return found;
}

/*
 * idem_position_passed(consumer, topic, partition, offset): whether the
 * consumer's position on the partition is above offset, that is, whether
 * the message at offset is applied; false when the partition has no
 * position, or the consumer does not exist.  The current role must be
 * allowed to act on the consumer (42501).
 */
Datum
idem_position_passed(PG_FUNCTION_ARGS)
{
	PositionKey key;
	int64		offset;
	int32		consumer_id;
	PositionCacheKey ckey;
	PositionCacheEntry *entry;
	int64		position;

	get_position_key(fcinfo, &key);
	offset = get_offset_arg(fcinfo, 3, "offset");

	/* a rewind committed before this call empties the cache here */
	AcceptInvalidationMessages();
	consumer_id = consumer_id_for_check(key.consumer);
	if (consumer_id == 0)
		PG_RETURN_BOOL(false);

	memset(&ckey, 0, sizeof(ckey));
	ckey.consumer_id = consumer_id;
	ckey.partition = key.partition;
	memcpy(ckey.topic, VARDATA_ANY(key.topic), VARSIZE_ANY_EXHDR(key.topic));

	entry = hash_search(position_cache_current(), &ckey, HASH_FIND, NULL);
	if (entry != NULL && offset < entry->position)
		PG_RETURN_BOOL(true);

	if (!read_position(&ckey, key.topic, &position))
		PG_RETURN_BOOL(false);
	PG_RETURN_BOOL(offset < position);
}
