/*-------------------------------------------------------------------------
 *
 * keygen_holders.c
 *	  Whether and by whom switches of key generations are held back: the
 *	  transactions that hold key_generations against the switch's lock,
 *	  named in the switch's error or the purge worker's log, and the
 *	  gauges of the ring for the metrics (the current generation's age,
 *	  the sealed generations, the bytes of the keys and of the filters).
 *
 * A switch needs the gate (keygen.c, rule 2): key_generations in
 * EXCLUSIVE mode, which a delivery holds against it only while it
 * records a key, never while it waits for another transaction or stays
 * open, and a retirement or a build of filters while it runs.  A
 * transaction left open after it recorded a key holds back the settle of
 * its generation, not the switch.  So a switch held back for long means a
 * retirement or build that does not end, a lock someone took on
 * key_generations by hand, or a delivery with the fast path off stuck in
 * the rare wait it cannot avoid (keystore.c); the operator learns which:
 * a session (its process, role and how long its transaction has been
 * open) or a prepared transaction.  The holders are read from pg_locks
 * only when a switch has already given up, never on a delivery's path.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/keygen_holders.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "keygen_holders.h"

/* at most this many holders are named; the rest are counted */
#define HOLDERS_NAMED 5

/* how often the worker logs again that a switch is still held back */
#define HELD_BACK_LOG_INTERVAL_MS (60 * 1000)

/* when this backend last logged a switch held back; 0: it is not */
static TimestampTz held_back_logged_at = 0;

typedef enum HoldersStmt
{
	KH_HOLDERS,
	KH_GAUGES,
	KH_NUM_STMTS
} HoldersStmt;

static const StorageStmt holders_stmt_defs[KH_NUM_STMTS] = {
	/*
	 * The transactions holding a lock on relation $1 that a switch's
	 * EXCLUSIVE waits for, oldest first: a session's process, role and
	 * seconds in its transaction, or a prepared transaction's name and
	 * seconds since it was prepared (pg_locks shows its locks without a
	 * process, under a virtual transaction that also holds its xid).
	 */
	[KH_HOLDERS] = {
		"SELECT l.pid, a.usename, p.gid,"
		" pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now()"
		"   OPERATOR(pg_catalog.-) COALESCE(a.xact_start, p.prepared)))::pg_catalog.int8"
		" FROM pg_catalog.pg_locks AS l"
		" LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) l.pid"
		" LEFT JOIN pg_catalog.pg_locks AS x"
		"   ON l.pid IS NULL AND x.pid IS NULL"
		"  AND x.locktype OPERATOR(pg_catalog.=) 'transactionid'"
		"  AND x.virtualtransaction OPERATOR(pg_catalog.=) l.virtualtransaction"
		" LEFT JOIN pg_catalog.pg_prepared_xacts AS p"
		"   ON p.transaction OPERATOR(pg_catalog.=) x.transactionid"
		" WHERE l.locktype OPERATOR(pg_catalog.=) 'relation'"
		"   AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database AS d"
		"        WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())"
		"   AND l.relation OPERATOR(pg_catalog.=) $1 AND l.granted"
		"   AND l.mode OPERATOR(pg_catalog.=) ANY ('{RowShareLock,RowExclusiveLock,ShareUpdateExclusiveLock,"
		"ShareLock,ShareRowExclusiveLock,ExclusiveLock,AccessExclusiveLock}'::pg_catalog.text[])"
		"   AND (l.pid IS NULL OR l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid())"
		" ORDER BY 4 DESC NULLS LAST",
		1, {OIDOID}
	},
	/*
	 * Seconds since the current generation opened (NULL: the first), the
	 * generations open, and the bytes on disk of the key tables (every
	 * generation's, the collisions' and 1.1's, with their indexes) and of
	 * the filters (their pages of bits: each generation's and the two of
	 * all of them): sizes from the files, no row read.  Each table is
	 * opened under ACCESS SHARE for the moment of its size; the retire,
	 * which never queues for its ACCESS EXCLUSIVE, leaves a generation so
	 * held to its next run.  Last, seconds since the oldest generation
	 * still settling was sealed, when the next one opened (NULL: none).
	 */
	[KH_GAUGES] = {
		"SELECT pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-)"
		"  (SELECT g.opened_at FROM " STORAGE_SCHEMA ".key_generations AS g"
		"    ORDER BY g.epoch DESC LIMIT 1)),"
		" (SELECT pg_catalog.count(*) FROM " STORAGE_SCHEMA ".key_generations),"
		" (SELECT pg_catalog.sum(pg_catalog.pg_total_relation_size(c.oid))::pg_catalog.float8"
		"    FROM pg_catalog.pg_class AS c"
		"   WHERE c.relnamespace OPERATOR(pg_catalog.=) '" STORAGE_SCHEMA "'::pg_catalog.regnamespace"
		"     AND c.relkind OPERATOR(pg_catalog.=) 'r'"
		"     AND c.relname OPERATOR(pg_catalog.~) '^(processed_keys|key_collisions)(_[0-9]+)?$'),"
		" (SELECT pg_catalog.sum(pg_catalog.pg_relation_size(c.oid))::pg_catalog.float8"
		"    FROM pg_catalog.pg_class AS c"
		"   WHERE c.relnamespace OPERATOR(pg_catalog.=) '" LOCAL_SCHEMA "'::pg_catalog.regnamespace"
		"     AND c.relkind OPERATOR(pg_catalog.=) 'r'"
		"     AND c.relname OPERATOR(pg_catalog.~) '^key_filter_(all_)?[0-9]+$'),"
		" pg_catalog.date_part('epoch', pg_catalog.now() OPERATOR(pg_catalog.-)"
		"  (SELECT pg_catalog.min(n.opened_at) FROM " STORAGE_SCHEMA ".key_generations AS n"
		"    WHERE n.epoch OPERATOR(pg_catalog.>) (SELECT pg_catalog.min(s.epoch)"
		"      FROM " STORAGE_SCHEMA ".key_generations AS s WHERE s.settled_at IS NULL)))",

		0, {InvalidOid}
	},
};

static SPIPlanPtr holders_plans[KH_NUM_STMTS];
static StorageStmtSet holders_stmts = STORAGE_STMT_SET(holders_stmt_defs, holders_plans);

/*
 * Returns a sentence naming the transactions that hold key_generations
 * against a switch of generation slot, or NULL when none is left (the
 * holder ended since the switch gave up).  The caller is connected to SPI; the sentence
 * is allocated in the caller's memory context.
 */
static char *
switch_holders(KeyGenSlot slot)
{
	MemoryContext caller_cxt = CurrentMemoryContext;
	Datum		arg = ObjectIdGetDatum(storage_locate()->generations_relid);
	StringInfoData buf;
	uint64		n;

	storage_stmt_run(&holders_stmts, KH_HOLDERS, &arg, NULL, 0);
	n = SPI_processed;
	if (n == 0)
		return NULL;

	MemoryContextSwitchTo(caller_cxt);
	initStringInfo(&buf);
	appendStringInfo(&buf, "The switch sealing generation %d is held back by ", slot);
	for (uint64 i = 0; i < n && i < HOLDERS_NAMED; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		char	   *pid = SPI_getvalue(tuple, desc, 1);
		char	   *role = SPI_getvalue(tuple, desc, 2);
		char	   *gid = SPI_getvalue(tuple, desc, 3);
		char	   *seconds = SPI_getvalue(tuple, desc, 4);

		if (i > 0)
			appendStringInfoString(&buf, ", ");
		if (pid != NULL)
			appendStringInfo(&buf, "process %s (role %s, in a transaction for %s s)",
							 pid, role ? role : "unknown", seconds ? seconds : "?");
		else if (gid != NULL)
			appendStringInfo(&buf, "prepared transaction %s (prepared %s s ago)",
							 quote_literal_cstr(gid), seconds ? seconds : "?");
		else
			appendStringInfoString(&buf, "a transaction of another session");
	}
	if (n > HOLDERS_NAMED)
		appendStringInfo(&buf, " and " UINT64_FORMAT " more", n - HOLDERS_NAMED);
	appendStringInfoChar(&buf, '.');
	SPI_freetuptable(SPI_tuptable);
	return buf.data;
}

/*
 * Reports that a switch could not seal generation sealing in time, naming
 * who holds it: as an error for a call of idem_key_generation_switch(), or
 * for the purge worker (quiet) as a log line, at the first attempt held
 * back and then once a minute while it lasts, so that a worker that tries
 * every second does not fill the log.  With sealing 0, notes that a switch
 * got through.
 */
void
keygen_switch_held_back(KeyGenSlot sealing, bool quiet)
{
	TimestampTz now = GetCurrentTimestamp();
	char	   *holders;

	if (sealing == 0)
	{
		held_back_logged_at = 0;
		return;
	}
	if (quiet && held_back_logged_at != 0 &&
		!TimestampDifferenceExceeds(held_back_logged_at, now, HELD_BACK_LOG_INTERVAL_MS))
		return;
	holders = switch_holders(sealing);
	if (!quiet)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("could not switch key generations: key_generations stayed locked for the whole wait"),
				 holders ? errdetail_internal("%s", holders) : 0,
				 errhint("A delivery holds it only while it records a key, a retirement or a build of filters while it runs; try again, or give a longer wait.")));
	held_back_logged_at = now;
	ereport(LOG,
			(errmsg("idem_consumer could not switch generations of keys in database \"%s\": key_generations stayed locked for the whole wait",
					get_database_name(MyDatabaseId)),
			 holders ? errdetail_internal("%s", holders) : 0,
			 errhint("Keys expire by generations only while the switch goes on; end the transactions named.")));
}

/*
 * Reads the gauges of the ring for idem_metrics(): how long ago the
 * current generation opened (negative before the first switch), how many
 * are sealed, the bytes of the key tables and of the filters, and how
 * long ago the oldest generation still settling was sealed (0: none);
 * returns false where the key store has no ring.  A current generation
 * older than the interval by much more than the purge worker's period is
 * a switch held back; a generation settling for as long, a transaction
 * that recorded keys there and stays open.  Needs an SPI connection.
 */
bool
keygen_ring_gauges(KeyRingGauges *gauges)
{
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	Datum		value;

	if (!storage_locate()->has_ring)
		return false;
	storage_stmt_run(&holders_stmts, KH_GAUGES, NULL, NULL, 1);
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	value = SPI_getbinval(row, desc, 1, &isnull);
	gauges->current_age = isnull ? -1 : DatumGetFloat8(value);
	/* before the first switch no row is there, and the first is current */
	gauges->sealed = (int) Max(DatumGetInt64(SPI_getbinval(row, desc, 2, &isnull)) - 1, 0);
	value = SPI_getbinval(row, desc, 3, &isnull);
	gauges->key_bytes = isnull ? 0 : DatumGetFloat8(value);
	value = SPI_getbinval(row, desc, 4, &isnull);
	gauges->filter_bytes = isnull ? 0 : DatumGetFloat8(value);
	value = SPI_getbinval(row, desc, 5, &isnull);
	gauges->settling_age = isnull ? 0 : DatumGetFloat8(value);
	return true;
}
