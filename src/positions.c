/*-------------------------------------------------------------------------
 *
 * positions.c
 *	  The positions of Kafka consumers: for each consumer, topic and
 *	  partition, the offset of the next message to read, kept in
 *	  idem_consumer.positions and moved in the caller's transaction
 *	  (idem_position_advance, idem_position_rewind), read by
 *	  idem_positions() and its view, and the lag idem_metrics() shows.
 *	  The check of one message, idem_position_passed(), is
 *	  position_check.c's.
 *
 * A position moves forward only.  The row is locked (SELECT ... FOR
 * UPDATE) before it is compared, so that two sessions advancing one
 * partition take turns: the second sees the first's committed position,
 * not the one its own snapshot began with, and is refused if its own is
 * below it.  Nothing is lost, nothing goes back, whatever the order of the
 * commits (test/isolation/specs/position_advance.spec).  A consumer that
 * applies a batch advances first, then applies: the position before, which
 * the call returns, tells which of its messages another member applied
 * while it waited for the lock, and those are duplicates without a look at
 * the key store.  The locked row of an advance is then updated by
 * positions_fastpath.c without the executor when the table is as created,
 * by PS_ADVANCE otherwise.
 *
 * Only a rewind moves a position back, and every rewind leaves a row in
 * idem_consumer.position_rewinds: the roles (current and session), the
 * time, both positions and the reason, which must be given.
 *
 * Acting on a consumer's positions takes the privileges of its owner, as
 * every other action on a consumer (consumers.c).  The view reads
 * idem_positions() without a consumer, which returns the rows of the
 * consumers the caller may act on, tested inside the statement of this
 * file as visible_rows.c explains: no condition of the caller meets
 * another team's row.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/positions.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

#include "idem_consumer.h"
#include "positions.h"

/* a position would move backwards */
#define ERRCODE_POSITION_BACKWARDS	MAKE_SQLSTATE('I','P','0','0','1')

/* rows fetched from the cursor of the view at a time */
#define POSITIONS_BATCH				1000

typedef enum PositionStmt
{
	PS_LOCK,
	PS_INSERT,
	PS_ADVANCE,
	PS_REWIND,
	PS_RECORD_REWIND,
	PS_VISIBLE,
	PS_LAG,
	PS_NUM_STMTS
} PositionStmt;

/* $1 consumer_id, $2 topic, $3 partition: the key of a position */
#define POSITION_KEY \
	" WHERE consumer_id OPERATOR(pg_catalog.=) $1" \
	" AND topic OPERATOR(pg_catalog.=) $2" \
	" AND \"partition\" OPERATOR(pg_catalog.=) $3"

/*
 * The columns of idem_positions(), after the consumer's name: the lag is
 * the log-end offset last reported minus the position, never below 0 (the
 * report may be older than the last advance).
 */
#define POSITION_COLUMNS \
	" p.topic, p.\"partition\", p.\"position\", p.log_end_offset," \
	" pg_catalog.int8larger(p.log_end_offset OPERATOR(pg_catalog.-) p.\"position\", 0)," \
	" p.advanced_at, p.log_end_at, p.rewinds, p.last_rewound_at, p.last_rewound_by," \
	" p.last_rewind_reason FROM " STORAGE_SCHEMA ".positions AS p"

static const StorageStmt position_stmt_defs[PS_NUM_STMTS] = {
	[PS_LOCK] = {
		"SELECT \"position\", ctid FROM " STORAGE_SCHEMA ".positions" POSITION_KEY
		" FOR UPDATE",
		3, {INT4OID, TEXTOID, INT4OID}
	},
	/* a concurrent first advance inserts nothing here, and is then locked */
	[PS_INSERT] = {
		"INSERT INTO " STORAGE_SCHEMA ".positions"
		" (consumer_id, topic, \"partition\", \"position\", advanced_at,"
		" log_end_offset, log_end_at)"
		" VALUES ($1, $2, $3, $4, pg_catalog.now(), $5,"
		" CASE WHEN $5 IS NOT NULL THEN pg_catalog.now() END)"
		" ON CONFLICT DO NOTHING RETURNING 1",
		5, {INT4OID, TEXTOID, INT4OID, INT8OID, INT8OID}
	},
	/* a log-end offset not reported leaves the last one */
	[PS_ADVANCE] = {
		"UPDATE " STORAGE_SCHEMA ".positions SET \"position\" = $4,"
		" advanced_at = pg_catalog.now(),"
		" log_end_offset = COALESCE($5, log_end_offset),"
		" log_end_at = CASE WHEN $5 IS NOT NULL THEN pg_catalog.now() ELSE log_end_at END"
		POSITION_KEY,
		5, {INT4OID, TEXTOID, INT4OID, INT8OID, INT8OID}
	},
	[PS_REWIND] = {
		"UPDATE " STORAGE_SCHEMA ".positions SET \"position\" = $4,"
		" advanced_at = pg_catalog.now(), rewinds = rewinds OPERATOR(pg_catalog.+) 1,"
		" last_rewound_at = pg_catalog.now(), last_rewound_by = $5, last_rewind_reason = $6"
		POSITION_KEY,
		6, {INT4OID, TEXTOID, INT4OID, INT8OID, NAMEOID, TEXTOID}
	},
	[PS_RECORD_REWIND] = {
		"INSERT INTO " STORAGE_SCHEMA ".position_rewinds"
		" (consumer_id, topic, \"partition\", from_position, to_position, reason,"
		" rewound_by, session_role, rewound_at)"
		" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, pg_catalog.now())",
		8, {INT4OID, TEXTOID, INT4OID, INT8OID, INT8OID, TEXTOID, NAMEOID, NAMEOID}
	},
	/* $1: the caller's role, as in visible_rows.c */
	[PS_VISIBLE] = {
		"SELECT c.name," POSITION_COLUMNS
		" JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.consumer_id OPERATOR(pg_catalog.=) p.consumer_id"
		" WHERE (c.owner IS NULL OR pg_catalog.pg_has_role($1, c.owner, 'USAGE'))"
		" ORDER BY c.name, p.topic, p.\"partition\"",
		1, {NAMEOID}
	},
	/* for idem_metrics(), which tests each consumer itself */
	[PS_LAG] = {
		"SELECT c.name, p.topic, p.\"partition\"::pg_catalog.text,"
		" pg_catalog.int8larger(p.log_end_offset OPERATOR(pg_catalog.-) p.\"position\", 0)"
		" FROM " STORAGE_SCHEMA ".positions AS p"
		" JOIN " STORAGE_SCHEMA ".consumers AS c"
		" ON c.consumer_id OPERATOR(pg_catalog.=) p.consumer_id"
		" WHERE p.log_end_offset IS NOT NULL"
		" ORDER BY c.name, p.topic, p.\"partition\"",
		0, {InvalidOid}
	},
};

static SPIPlanPtr position_plans[PS_NUM_STMTS];
static StorageStmtSet position_stmts = STORAGE_STMT_SET(position_stmt_defs, position_plans);

PG_FUNCTION_INFO_V1(idem_position_advance);
PG_FUNCTION_INFO_V1(idem_position_rewind);
PG_FUNCTION_INFO_V1(idem_positions);

/*
 * Reads and checks the arguments 0 to 2 of the position functions: the
 * consumer, the topic and the partition.
 */
void
get_position_key(FunctionCallInfo fcinfo, PositionKey *key)
{
	key->consumer = get_consumer_arg(fcinfo, 0);
	key->topic = get_name_arg(fcinfo, 1, "topic", KAFKA_MAX_TOPIC_BYTES);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("partition must not be null")));
	key->partition = PG_GETARG_INT32(2);
	if (key->partition < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("partition must not be negative"),
				 errdetail("The value given is %d.", key->partition)));
}

/*
 * Returns a non-null offset argument of at least 0.
 */
int64
get_offset_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	int64		value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	value = PG_GETARG_INT64(argno);
	if (value < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be negative", argname),
				 errdetail("The value given is " INT64_FORMAT ".", value)));
	return value;
}

/*
 * Locks the position of key and returns whether there is one, in *position,
 * and the row version locked, the newest, in *tid.  args holds
 * consumer_id, topic and partition.
 */
static bool
lock_position(Datum *args, int64 *position, ItemPointer tid)
{
	bool		isnull;

	storage_stmt_run(&position_stmts, PS_LOCK, args, NULL, 1);
	if (SPI_processed == 0)
		return false;
	*position = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	ItemPointerCopy((ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0],
													  SPI_tuptable->tupdesc, 2, &isnull)),
					tid);
	return true;
}

/*
 * Locks the position of args (consumer_id, topic, partition) and returns
 * true with it in *stored and the row version in *tid; or inserts args' position (args[3], with the
 * log-end offset args[4]) as the partition's first and returns false.  A
 * concurrent first insert makes ours insert nothing (once that one
 * commits): its row is then locked.  In REPEATABLE READ, a row inserted
 * after the snapshot fails the insert with a serialization failure, as
 * ON CONFLICT does.
 */
static bool
lock_or_insert_position(Datum *args, const char *nulls, int64 *stored, ItemPointer tid)
{
	for (;;)
	{
		if (lock_position(args, stored, tid))
			return true;
		storage_stmt_run(&position_stmts, PS_INSERT, args, nulls, 0);
		if (SPI_processed == 1)
			return false;
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * idem_position_advance(consumer, topic, partition, position
 * [, log_end_offset [, from_position]]): moves the consumer's position on
 * the partition to position, which is the offset of the next message to
 * read, in the caller's transaction.  A position equal to the stored one
 * moves nothing (and reports the log-end offset); one below it is refused
 * with IP001, the transaction's work with it.  from_position, when given,
 * is the offset of the first message the caller applies with this
 * advance: a stored position above it is refused with IP001 too, as
 * another member applied some of those messages.  A caller that sends its
 * batch statement without waiting for the position before relies on it
 * (node/lib/kafka.js).  Returns the position before, NULL for the
 * partition's first.  The consumer is created on first use, as by
 * idem_apply.
 */
Datum
idem_position_advance(PG_FUNCTION_ARGS)
{
	PositionKey key;
	int64		position;
	int64		from = -1;
	int64		stored = 0;
	bool		found;
	ItemPointerData tid;
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};

	get_position_key(fcinfo, &key);
	position = get_offset_arg(fcinfo, 3, "position");
	if (!PG_ARGISNULL(4))
		(void) get_offset_arg(fcinfo, 4, "log_end_offset");
	else
		nulls[4] = 'n';
	if (PG_NARGS() > 5 && !PG_ARGISNULL(5))
	{
		from = get_offset_arg(fcinfo, 5, "from_position");
		if (from > position)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("from_position must not be above position"),
					 errdetail("The position given is " INT64_FORMAT "; from_position is " INT64_FORMAT ".",
							   position, from)));
	}
	inflight_check_none("idem_position_advance");

	SPI_connect();
	args[0] = Int32GetDatum(keystore_consumer_id(key.consumer, true));
	args[1] = PointerGetDatum(key.topic);
	args[2] = Int32GetDatum(key.partition);
	args[3] = Int64GetDatum(position);
	args[4] = PG_ARGISNULL(4) ? (Datum) 0 : PG_GETARG_DATUM(4);

	found = lock_or_insert_position(args, nulls, &stored, &tid);
	if (found)
	{
		/* from_position, given, is at most position */
		if ((from >= 0 ? from : position) < stored)
			ereport(ERROR,
					(errcode(ERRCODE_POSITION_BACKWARDS),
					 errmsg("position of consumer \"%s\" on partition %d of topic \"%s\" cannot move backwards",
							key.consumer, key.partition, text_to_cstring(key.topic)),
					 from >= 0 ?
					 errdetail("The stored position is " INT64_FORMAT "; the messages given start at " INT64_FORMAT ".",
							   stored, from) :
					 errdetail("The stored position is " INT64_FORMAT "; the position given is " INT64_FORMAT ".",
							   stored, position),
					 errhint("The messages below the stored position are applied: skip them.  An operator moves a position back with idem_position_rewind().")));
		if (!positions_fast_advance(&tid, DatumGetInt32(args[0]), key.topic, key.partition,
									position, args[4], nulls[4] == 'n'))
			storage_stmt_run(&position_stmts, PS_ADVANCE, args, nulls, 0);
	}
	SPI_finish();

	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_INT64(stored);
}

/*
 * idem_position_rewind(consumer, topic, partition, position, reason): moves
 * the consumer's position on the partition back to position (or sets the
 * first one), and records the rewind.  Returns the position before, NULL
 * if there was none.  The messages read again are still deduplicated by
 * their keys: a rewind replays what was not applied, or what was
 * forgotten (idem_forget), not what was.
 */
Datum
idem_position_rewind(PG_FUNCTION_ARGS)
{
	PositionKey key;
	int64		position;
	int64		stored = 0;
	bool		found;
	int32		consumer_id;
	ItemPointerData tid;
	text	   *reason;
	NameData	current_role;
	NameData	session_role;
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', 'n', ' '};	/* no log-end offset */
	Datum		record[8];
	char		record_nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};

	get_position_key(fcinfo, &key);
	position = get_offset_arg(fcinfo, 3, "position");
	reason = get_name_arg(fcinfo, 4, "reason", 1024);
	inflight_check_none("idem_position_rewind");

	SPI_connect();
	consumer_id = keystore_consumer_id(key.consumer, false);
	if (consumer_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" does not exist", key.consumer)));
	args[0] = Int32GetDatum(consumer_id);
	args[1] = PointerGetDatum(key.topic);
	args[2] = Int32GetDatum(key.partition);
	args[3] = Int64GetDatum(position);
	found = lock_or_insert_position(args, nulls, &stored, &tid);
	if (found && position > stored)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a rewind cannot move a position forwards"),
				 errdetail("The stored position of consumer \"%s\" on partition %d of topic \"%s\" is " INT64_FORMAT "; the position given is " INT64_FORMAT ".",
						   key.consumer, key.partition, text_to_cstring(key.topic),
						   stored, position),
				 errhint("Advance a position with idem_position_advance().")));

	/* the position, and the last rewind in its row */
	namestrcpy(&current_role, GetUserNameFromId(GetUserId(), false));
	namestrcpy(&session_role, GetUserNameFromId(GetSessionUserId(), false));
	args[4] = NameGetDatum(&current_role);
	args[5] = PointerGetDatum(reason);
	storage_stmt_run(&position_stmts, PS_REWIND, args, NULL, 0);

	/* and every rewind in position_rewinds */
	record[0] = args[0];
	record[1] = args[1];
	record[2] = args[2];
	record[3] = Int64GetDatum(stored);
	record_nulls[3] = found ? ' ' : 'n';
	record[4] = Int64GetDatum(position);
	record[5] = PointerGetDatum(reason);
	record[6] = NameGetDatum(&current_role);
	record[7] = NameGetDatum(&session_role);
	storage_stmt_run(&position_stmts, PS_RECORD_REWIND, record, record_nulls, 0);
	SPI_finish();

	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_INT64(stored);
}

/*
 * Opens idem_consumer.positions with AccessShareLock and returns it, with
 * its primary key's index in *index, after checking that it is the table
 * this library reads.
 */
Relation
positions_open(Oid *index)
{
	Oid			nspid = get_namespace_oid(STORAGE_SCHEMA, false);
	Relation	rel = table_open(get_relname_relid("positions", nspid), AccessShareLock);

	*index = get_relname_relid("positions_pkey", nspid);
	if (RelationGetDescr(rel)->natts != PC_NUM_COLUMNS || !OidIsValid(*index))
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("the table %s.positions is not the one this library reads", STORAGE_SCHEMA),
				 errhint("Update the extension with ALTER EXTENSION idem_consumer UPDATE.")));
	return rel;
}

/*
 * Sets skey[0..*nkeys) to the keys of a scan of the primary key: the
 * consumer's positions, of one topic unless topic is NULL, of one
 * partition of it unless partition is negative.
 */
void
position_scankeys(ScanKeyData *skey, int *nkeys, int32 consumer_id,
				  text *topic, int32 partition)
{
	*nkeys = 1;
	ScanKeyInit(&skey[0], PC_CONSUMER_ID + 1, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(consumer_id));
	if (topic == NULL)
		return;
	/* the column's collation, "C" */
	ScanKeyEntryInitialize(&skey[(*nkeys)++], 0, PC_TOPIC + 1, BTEqualStrategyNumber,
						   InvalidOid, C_COLLATION_OID, F_TEXTEQ, PointerGetDatum(topic));
	if (partition >= 0)
		ScanKeyInit(&skey[(*nkeys)++], PC_PARTITION + 1, BTEqualStrategyNumber, F_INT4EQ,
					Int32GetDatum(partition));
}

/* The columns of idem_positions(), in order. */
enum PositionsOut
{
	PO_CONSUMER,
	PO_TOPIC,
	PO_PARTITION,
	PO_POSITION,
	PO_LOG_END_OFFSET,
	PO_LAG,
	PO_ADVANCED_AT,
	PO_LOG_END_AT,
	PO_REWINDS,
	PO_LAST_REWOUND_AT,
	PO_LAST_REWOUND_BY,
	PO_LAST_REWIND_REASON,
	PO_NUM_COLUMNS
};

/*
 * Puts the positions of one consumer into the function's tuplestore, in
 * the order of the primary key (topic, partition), read through that
 * index under the query's snapshot instead of by a statement: this is the
 * read of a consumer on each assignment.  The check of one message
 * against its partition's position is idem_position_passed()
 * (position_check.c).  The caller has checked that the current role may
 * act on the consumer.
 */
static void
positions_of_consumer(ReturnSetInfo *rsinfo, int32 consumer_id, Datum name,
					  text *topic, int32 partition)
{
	Oid			index;
	Relation	rel = positions_open(&index);
	ScanKeyData skey[3];
	int			nkeys;
	SysScanDesc scan;
	HeapTuple	tuple;
	Datum		in[PC_NUM_COLUMNS];
	bool		in_nulls[PC_NUM_COLUMNS];
	Datum		out[PO_NUM_COLUMNS];
	bool		out_nulls[PO_NUM_COLUMNS];

	position_scankeys(skey, &nkeys, consumer_id, topic, partition);
	scan = systable_beginscan(rel, index, true, GetActiveSnapshot(), nkeys, skey);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		heap_deform_tuple(tuple, RelationGetDescr(rel), in, in_nulls);
		out[PO_CONSUMER] = name;
		out_nulls[PO_CONSUMER] = false;
#define COPY_COLUMN(o, i) (out[(o)] = in[(i)], out_nulls[(o)] = in_nulls[(i)])
		COPY_COLUMN(PO_TOPIC, PC_TOPIC);
		COPY_COLUMN(PO_PARTITION, PC_PARTITION);
		COPY_COLUMN(PO_POSITION, PC_POSITION);
		COPY_COLUMN(PO_LOG_END_OFFSET, PC_LOG_END_OFFSET);
		COPY_COLUMN(PO_ADVANCED_AT, PC_ADVANCED_AT);
		COPY_COLUMN(PO_LOG_END_AT, PC_LOG_END_AT);
		COPY_COLUMN(PO_REWINDS, PC_REWINDS);
		COPY_COLUMN(PO_LAST_REWOUND_AT, PC_LAST_REWOUND_AT);
		COPY_COLUMN(PO_LAST_REWOUND_BY, PC_LAST_REWOUND_BY);
		COPY_COLUMN(PO_LAST_REWIND_REASON, PC_LAST_REWIND_REASON);
#undef COPY_COLUMN
		/* as int8larger(log_end_offset - position, 0) in the statements */
		out_nulls[PO_LAG] = in_nulls[PC_LOG_END_OFFSET];
		if (!out_nulls[PO_LAG])
			out[PO_LAG] = Int64GetDatum(Max(DatumGetInt64(in[PC_LOG_END_OFFSET]) -
											DatumGetInt64(in[PC_POSITION]), 0));
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, out, out_nulls);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
}

/*
 * idem_positions([of_consumer [, of_topic [, of_partition]]]): the
 * positions of a consumer, which the caller must be allowed to act on
 * (42501 otherwise), of one topic of it, of one partition of that topic;
 * or with no consumer those of every consumer the caller may act on (the
 * view idem_positions).  An unknown consumer has no positions.
 */
Datum
idem_positions(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	NameData	role_name;
	Datum		arg;
	Portal		portal;

	if (PG_ARGISNULL(1) && !PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("of_partition needs of_topic")));
	if (PG_ARGISNULL(0) && !PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("of_topic needs of_consumer"),
				 errhint("Read the view idem_positions for every consumer's positions.")));
	InitMaterializedSRF(fcinfo, 0);
	SPI_connect();
	if (!PG_ARGISNULL(0))
	{
		int32		consumer_id = keystore_consumer_id(get_consumer_arg(fcinfo, 0), false);

		if (consumer_id != 0)
			positions_of_consumer(rsinfo, consumer_id, PG_GETARG_DATUM(0),
								  PG_ARGISNULL(1) ? NULL : PG_GETARG_TEXT_PP(1),
								  PG_ARGISNULL(2) ? -1 : PG_GETARG_INT32(2));
		SPI_finish();
		return (Datum) 0;
	}

	namestrcpy(&role_name, GetUserNameFromId(GetUserId(), false));
	arg = NameGetDatum(&role_name);
	portal = storage_stmt_open(&position_stmts, PS_VISIBLE, &arg, NULL);
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		storage_stmt_fetch(portal, POSITIONS_BATCH);
		if (SPI_processed == 0)
			break;
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
 * For idem_metrics(): leaves in SPI_tuptable, for every position with a
 * log-end offset, the consumer's name, the topic, the partition and the
 * lag; returns their number.  Before the positions exist (1.1), none.
 * Needs an SPI connection.
 */
uint64
positions_lag_summary(void)
{
	Oid			nspid = get_namespace_oid(STORAGE_SCHEMA, true);

	if (!OidIsValid(nspid) || !OidIsValid(get_relname_relid("positions", nspid)))
	{
		SPI_tuptable = NULL;
		return 0;
	}
	storage_stmt_run(&position_stmts, PS_LAG, NULL, NULL, 0);
	return SPI_processed;
}
