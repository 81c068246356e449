/*-------------------------------------------------------------------------
 *
 * apply.c
 *	  The SQL-callable API: idem_apply(), idem_is_processed() and
 *	  idem_forget().  Validates arguments and puts keystore and business
 *	  plans together.  The argument validators are shared with
 *	  dead_letter.c.
 *
 * idem_apply() checks everything that can be checked before it records the
 * key (arguments, the SQL text, the parameter values), so that a bad call
 * records nothing even when the caller catches the error.  It then records
 * the key and runs the business SQL in the caller's transaction: if the
 * business SQL raises, the error propagates as it is and the transaction's
 * rollback removes the key with everything else.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

PG_FUNCTION_INFO_V1(idem_apply);
PG_FUNCTION_INFO_V1(idem_is_processed);
PG_FUNCTION_INFO_V1(idem_forget);

/*
 * Returns a non-null, non-empty text argument no longer than max_bytes.
 */
text *
get_name_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
			 int max_bytes)
{
	text	   *value;
	int			len;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));

	value = PG_GETARG_TEXT_PP(argno);
	len = VARSIZE_ANY_EXHDR(value);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", argname)));
	if (len > max_bytes)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", argname),
				 errdetail("The %s is %d bytes long; the limit is %d bytes.",
						   argname, len, max_bytes)));
	return value;
}

/*
 * Returns a non-null integer argument of at least 1: a count or a size.
 */
int32
get_count_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	int32		value;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));
	value = PG_GETARG_INT32(argno);
	if (value < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at least 1", argname),
				 errdetail("The value given is %d.", value)));
	return value;
}

/*
 * Returns the key argument.
 */
text *
get_key_arg(FunctionCallInfo fcinfo, int argno)
{
	return get_name_arg(fcinfo, argno, "key", IDEM_MAX_KEY_BYTES);
}

/*
 * Returns the consumer argument as a C string.
 */
char *
get_consumer_arg(FunctionCallInfo fcinfo, int argno)
{
	return text_to_cstring(get_name_arg(fcinfo, argno, "consumer",
										 IDEM_MAX_CONSUMER_BYTES));
}

/*
 * Returns the sql argument as a C string.
 */
char *
get_sql_arg(FunctionCallInfo fcinfo, int argno)
{
	char	   *sql;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("sql must not be null")));
	sql = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	if (sql[0] == '\0')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("sql must not be empty")));
	return sql;
}

/*
 * Validates the optional event_time argument.
 */
void
check_event_time_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return;
	if (TIMESTAMP_NOT_FINITE(PG_GETARG_TIMESTAMPTZ(argno)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event_time must be a finite timestamp"),
				 errhint("Pass the time the message was produced, or NULL if it is unknown.")));
}

/*
 * Runs the business SQL of a key just recorded, holding the key against
 * forgetting or recording by that SQL (inflight.c).
 */
static void
execute_holding_key(int32 consumer_id, text *key, BusinessPlan *bplan,
					ParamListInfo bound_params)
{
	int			depth = inflight_push(consumer_id, key);

	PG_TRY();
	{
		business_plan_execute(bplan, bound_params);
	}
	PG_FINALLY();
	{
		inflight_pop(depth);
	}
	PG_END_TRY();
}

/*
 * idem_apply(key, consumer, sql, params, event_time): records (consumer,
 * key) and runs sql with params; returns false, running nothing, if the key
 * was already recorded.
 */
Datum
idem_apply(PG_FUNCTION_ARGS)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	char	   *sql = get_sql_arg(fcinfo, 2);
	ArrayType  *params = PG_ARGISNULL(3) ? NULL : PG_GETARG_ARRAYTYPE_P(3);
	BusinessPlan *bplan;
	ParamListInfo bound_params;
	TimestampTz event_time = PG_ARGISNULL(4) ? DT_NOBEGIN : PG_GETARG_TIMESTAMPTZ(4);
	int32		consumer_id;
	bool		applied;
	int			call;

	check_event_time_arg(fcinfo, 4);

	call = stats_call_begin(consumer);
	SPI_connect();

	bplan = business_plan_get(sql);
	bound_params = business_plan_bind(bplan, params);

	consumer_id = keystore_consumer_id(consumer, true);
	inflight_check_key(consumer_id, consumer, key, "record");
	applied = keystore_record_key(consumer_id, key);
	if (applied)
		execute_holding_key(consumer_id, key, bplan, bound_params);

	SPI_finish();
	stats_call_end(call, applied ? 1 : 0, applied ? 0 : 1, 0, event_time);

	PG_RETURN_BOOL(applied);
}

/*
 * idem_is_processed(key, consumer): whether (consumer, key) is recorded
 * and visible to the current transaction.
 */
Datum
idem_is_processed(PG_FUNCTION_ARGS)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	int32		consumer_id;
	bool		exists = false;

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	if (consumer_id != 0)
		exists = keystore_key_exists(consumer_id, key);
	SPI_finish();

	PG_RETURN_BOOL(exists);
}

/*
 * idem_forget(key, consumer): removes (consumer, key) so that a redelivery
 * is processed again; returns whether the key was recorded.  A resolved
 * dead-letter entry of the key goes with it; a pending one makes it fail
 * (see dead_letter_forget_key).
 */
Datum
idem_forget(PG_FUNCTION_ARGS)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	int32		consumer_id;
	bool		removed = false;

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	if (consumer_id != 0)
	{
		inflight_check_key(consumer_id, consumer, key, "forget");
		dead_letter_forget_key(consumer_id, key);
		removed = keystore_forget_key(consumer_id, key);
	}
	SPI_finish();

	PG_RETURN_BOOL(removed);
}
