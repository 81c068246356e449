/*-------------------------------------------------------------------------
 *
 * retention_api.c
 *	  The SQL functions of retention: idem_set_retention(),
 *	  idem_reset_retention(), idem_purge() and
 *	  idem_consumer.default_retention().
 *
 * A window is stored per consumer; purging is retention.c's.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/retention_api.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

PG_FUNCTION_INFO_V1(idem_set_retention);
PG_FUNCTION_INFO_V1(idem_reset_retention);
PG_FUNCTION_INFO_V1(idem_purge);
PG_FUNCTION_INFO_V1(idem_default_retention);

/*
 * Returns the id of an existing consumer, or raises an error.
 */
static int32
existing_consumer_id(const char *consumer)
{
	int32		consumer_id = keystore_consumer_id(consumer, false);

	if (consumer_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" does not exist", consumer),
				 errhint("A consumer exists once it has recorded a key with idem_apply().")));
	return consumer_id;
}

/*
 * idem_set_retention(consumer, retention): sets the window of a consumer's
 * keys; NULL keeps them forever.
 */
Datum
idem_set_retention(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	bool		forever = PG_ARGISNULL(1);

	if (!forever)
		check_retention_arg(PG_GETARG_INTERVAL_P(1));

	inflight_check_none("idem_set_retention");
	SPI_connect();
	retention_store_set_window(existing_consumer_id(consumer),
							   forever ? (Datum) 0 : PG_GETARG_DATUM(1), forever);
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * idem_reset_retention(consumer): makes a consumer follow
 * idem_consumer.retention again.
 */
Datum
idem_reset_retention(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);

	inflight_check_none("idem_reset_retention");
	SPI_connect();
	retention_store_reset_window(existing_consumer_id(consumer));
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * idem_purge(consumer, batch_size): removes expired keys of one consumer,
 * or of all when consumer is NULL, at most batch_size per consumer, and
 * returns how many it removed; 0 means the run is complete.  Routed keys
 * (routed.c) go all at once, whatever batch_size.  Where keys expire by
 * whole generations, it removes only the legacy tables' keys one by one,
 * and the purge of every consumer drops the expired generations.
 */
Datum
idem_purge(PG_FUNCTION_ARGS)
{
	int32		only_consumer = 0;
	int32		batch_size;
	uint64		total = 0;
	char	   *consumer = NULL;

	batch_size = get_count_arg(fcinfo, 1, "batch_size");
	inflight_check_none("idem_purge");
	inflight_check_not_recording("idem_purge");

	SPI_connect();
	if (!PG_ARGISNULL(0))
	{
		consumer = get_consumer_arg(fcinfo, 0);
		only_consumer = existing_consumer_id(consumer);
	}
	else
		keystore_check_every_consumer("purge the keys");

	purge_begin_batch(only_consumer, batch_size);
	for (;;)
	{
		uint64		removed;
		PurgeProgress progress = purge_step(&removed);

		total += removed;
		if (progress != PURGE_CONTINUES)
			break;
		CHECK_FOR_INTERRUPTS();
	}
	total += routed_purge(consumer);

	/*
	 * Where keys expire by whole generations, the purge of every consumer
	 * drops the expired ones too, as the worker does, so that a schedule
	 * of idem_purge() alone keeps the key store bounded; it deletes no key
	 * of the ring one by one.
	 */
	if (consumer == NULL && keygen_retention_by_generation())
		(void) keygen_retire();
	SPI_finish();

	PG_RETURN_INT64((int64) total);
}

/*
 * idem_consumer.default_retention(): idem_consumer.retention as an
 * interval, NULL for forever; for the idem_retention view.
 */
Datum
idem_default_retention(PG_FUNCTION_ARGS)
{
	int			default_retention = retention_default_secs();
	Interval   *result;

	if (default_retention < 0)
		PG_RETURN_NULL();
	result = palloc0(sizeof(Interval));
	result->day = default_retention / SECS_PER_DAY;
	result->time = (int64) (default_retention % SECS_PER_DAY) * USECS_PER_SEC;
	PG_RETURN_INTERVAL_P(result);
}
