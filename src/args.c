/*-------------------------------------------------------------------------
 *
 * args.c
 *	  Validators of the arguments the SQL-callable functions share: keys,
 *	  consumer names, business SQL text, counts and event times.
 *
 * Every API function checks its arguments with these before it records or
 * changes anything, so that a bad call leaves nothing behind and the same
 * mistake gets the same SQLSTATE and message whichever function it was
 * made in.  They read only the call's arguments.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "idem_consumer.h"

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
