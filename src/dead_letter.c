/*-------------------------------------------------------------------------
 *
 * dead_letter.c
 *	  The dead-letter queue: idem_try_apply(), which parks a message whose
 *	  business SQL fails permanently instead of raising, and the operator
 *	  functions idem_dlq_replay() and idem_dlq_discard().
 *
 * A message is dead-lettered inside the caller's transaction.  Its key is
 * recorded in processed_keys as idem_apply() records it, but outside the
 * subtransaction the business SQL runs in: rolling back the business SQL
 * keeps the key, and the key and the dead-letter row then commit or roll
 * back with the rest of the caller's transaction.  A redelivery finds the
 * key recorded like any duplicate; the dead-letter row, at most one per
 * (consumer, key), tells a parked message from an applied one.
 *
 * Errors are sorted by SQLSTATE.  Transient ones say that the server could
 * not run the statement now, not that the message is wrong: class 40
 * (serialization failure, deadlock), 55P03 (lock not available), class 53
 * (insufficient resources), class 57 (operator intervention, including
 * 57014 query canceled), class 08 (connection exception), class 58 (system
 * error: I/O, a missing file), class XX (internal error, data or index
 * corruption), and whatever idem_consumer.transient_sqlstates adds (by
 * default IK002, too few rows affected: see DEFAULT_TRANSIENT_SQLSTATES).
 * Classes 58 and XX are the server's trouble: parking every message that meets a
 * failing disk or a corrupt index would empty the broker into the queue.  They are re-raised unchanged
 * once the subtransaction is rolled back, so the caller's transaction fails
 * and the broker redelivers.  Any other error is permanent: the message
 * would fail the same way on every redelivery.
 *
 * What the call itself gets wrong is no failure of the message and is
 * raised before anything is recorded: bad arguments, and SQL text that does
 * not parse as one statement of an accepted kind.  Such text comes from the
 * consumer's code and could never be replayed, so stopping the consumer is
 * the useful outcome.  Whatever depends on the database (names, types,
 * parameter values, execution) is tried inside the subtransaction, where a
 * schema mismatch is a permanent failure like any other.
 *
 * Replays lock their entry FOR NO KEY UPDATE before running it, so no two
 * sessions replay one entry; a batch replay skips the entries others hold.
 * A first run's business SQL runs as the current user; a replay's runs as
 * the role that dead-lettered the entry, and only for a caller who is a
 * member of that role (replay_role.c).  Only the statements on the storage
 * run as its owner (keystore.c).  A replay restores the settings that
 * change how the stored text and params are read (search_path, captured
 * as the schemas it resolved to, TimeZone, DateStyle, IntervalStyle) as
 * they were when the message was dead-lettered, for the business SQL only.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_enum.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"
#include "utils/varlena.h"

#include "compat.h"
#include "idem_consumer.h"

/* Longest discard reason accepted, in bytes. */
#define IDEM_MAX_REASON_BYTES 1024

/* The labels of the SQL enum type idem_outcome, in this order. */
typedef enum Outcome
{
	OUTCOME_APPLIED,
	OUTCOME_DUPLICATE,
	OUTCOME_DEAD_LETTERED
} Outcome;

static const char *const outcome_labels[] = {
	[OUTCOME_APPLIED] = "applied",
	[OUTCOME_DUPLICATE] = "duplicate",
	[OUTCOME_DEAD_LETTERED] = "dead_lettered",
};

/* Settings a replay restores, because they change how sql and params read. */
static const char *const replay_settings[] = {
	"search_path", "TimeZone", "DateStyle", "IntervalStyle"
};

/* One entry of idem_consumer.dead_letters, as a replay or discard needs it. */
typedef struct DeadLetterEntry
{
	int64		id;
	int32		consumer_id;
	text	   *key;
	char	   *sql;
	ArrayType  *params;			/* NULL if none */
	ArrayType  *settings;
	char	   *status;
	char	   *resolved_by;	/* NULL while pending */
	char	   *discard_reason; /* NULL unless discarded */
} DeadLetterEntry;

/* The parsed value of idem_consumer.transient_sqlstates. */
typedef struct TransientSqlstate
{
	int			sqlerrcode;
	bool		is_class;		/* compare the class only */
} TransientSqlstate;

typedef struct TransientSqlstates
{
	int			count;
	TransientSqlstate items[FLEXIBLE_ARRAY_MEMBER];
} TransientSqlstates;

static TransientSqlstates *extra_transient = NULL;

/* The idem_consumer.transient_sqlstates text; extra_transient is what it parses to. */
static char *transient_sqlstates_setting = NULL;

/*
 * Its default: IK002, business SQL that affected fewer rows than its
 * message demands (expect_rows.c).  Its usual cause is a message delivered
 * before the one that creates its rows, which a later redelivery finds;
 * but unlike the built-in classes it is the message's own business, so
 * the setting can leave it out, and a list that does parks such messages
 * instead.
 */
#define DEFAULT_TRANSIENT_SQLSTATES "IK002"

PG_FUNCTION_INFO_V1(idem_try_apply);
PG_FUNCTION_INFO_V1(idem_try_apply_rows);
PG_FUNCTION_INFO_V1(idem_dlq_replay);
PG_FUNCTION_INFO_V1(idem_dlq_replay_consumer);
PG_FUNCTION_INFO_V1(idem_dlq_discard);

/*
 * Parses idem_consumer.transient_sqlstates into a TransientSqlstates.
 */
static bool
check_transient_sqlstates(char **newval, void **extra, GucSource source)
{
	char	   *rawstring = pstrdup(*newval);
	List	   *elems;
	ListCell   *lc;
	TransientSqlstates *parsed;
	int			n = 0;

	if (!SplitIdentifierString(rawstring, ',', &elems))
	{
		GUC_check_errdetail("List syntax is invalid.");
		pfree(rawstring);
		list_free(elems);
		return false;
	}

	parsed = compat_guc_extra_alloc(offsetof(TransientSqlstates, items) +
									Max(list_length(elems), 1) * sizeof(TransientSqlstate));
	if (parsed == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		GUC_check_errmsg("out of memory");
		return false;
	}

	foreach(lc, elems)
	{
		const char *item = (const char *) lfirst(lc);
		size_t		len = strlen(item);
		char		code[5] = {'0', '0', '0', '0', '0'};

		for (size_t i = 0; i < len && i < lengthof(code); i++)
			code[i] = pg_ascii_toupper((unsigned char) item[i]);
		if ((len != 2 && len != 5) ||
			strspn(item, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") != len)
		{
			GUC_check_errdetail("\"%s\" is neither a SQLSTATE nor a SQLSTATE class.", item);
			GUC_check_errhint("Give five-character SQLSTATEs such as 23505 or two-character classes such as 23.");
			compat_guc_extra_free(parsed);
			return false;
		}
		parsed->items[n].is_class = (len == 2);
		parsed->items[n].sqlerrcode =
			MAKE_SQLSTATE(code[0], code[1], code[2], code[3], code[4]);
		n++;
	}
	parsed->count = n;

	list_free(elems);
	pfree(rawstring);
	*extra = parsed;
	return true;
}

/*
 * Installs the parsed value of idem_consumer.transient_sqlstates.
 */
static void
assign_transient_sqlstates(const char *newval, void *extra)
{
	extra_transient = (TransientSqlstates *) extra;
}

/*
 * Returns whether an error is transient: one that a later redelivery of
 * the same message may well not meet.
 */
static bool
sqlstate_is_transient(int sqlerrcode)
{
	switch (ERRCODE_TO_CATEGORY(sqlerrcode))
	{
		case ERRCODE_TRANSACTION_ROLLBACK:
		case ERRCODE_INSUFFICIENT_RESOURCES:
		case ERRCODE_OPERATOR_INTERVENTION:
		case ERRCODE_CONNECTION_EXCEPTION:
		case ERRCODE_SYSTEM_ERROR:
		case ERRCODE_INTERNAL_ERROR:
			return true;
		default:
			break;
	}
	if (sqlerrcode == ERRCODE_LOCK_NOT_AVAILABLE)
		return true;

	if (extra_transient != NULL)
	{
		for (int i = 0; i < extra_transient->count; i++)
		{
			const TransientSqlstate *item = &extra_transient->items[i];

			if (item->is_class ?
				ERRCODE_TO_CATEGORY(sqlerrcode) == item->sqlerrcode :
				sqlerrcode == item->sqlerrcode)
				return true;
		}
	}
	return false;
}

/*
 * Returns the OIDs of the labels of idem_outcome, cached for the call site.
 */
static Oid *
outcome_label_oids(FmgrInfo *flinfo, Oid enumtypoid)
{
	Oid		   *oids = (Oid *) flinfo->fn_extra;

	if (oids != NULL)
		return oids;

	oids = MemoryContextAlloc(flinfo->fn_mcxt, sizeof(Oid) * lengthof(outcome_labels));
	for (int i = 0; i < lengthof(outcome_labels); i++)
	{
		HeapTuple	tuple;

		tuple = SearchSysCache2(ENUMTYPOIDNAME, ObjectIdGetDatum(enumtypoid),
								CStringGetDatum(outcome_labels[i]));
		if (!HeapTupleIsValid(tuple))
			elog(ERROR, "type %s has no label \"%s\"",
				 format_type_be(enumtypoid), outcome_labels[i]);
		oids[i] = ((Form_pg_enum) GETSTRUCT(tuple))->oid;
		ReleaseSysCache(tuple);
	}
	flinfo->fn_extra = oids;
	return oids;
}

/*
 * Returns an outcome as a value of the function's result type idem_outcome.
 */
static Datum
outcome_result(FunctionCallInfo fcinfo, Outcome outcome)
{
	Oid		   *oids = (Oid *) fcinfo->flinfo->fn_extra;

	if (oids == NULL)
		oids = outcome_label_oids(fcinfo->flinfo,
								  get_func_rettype(fcinfo->flinfo->fn_oid));
	return ObjectIdGetDatum(oids[outcome]);
}

/*
 * Returns the name of the current user as text.
 */
static Datum
current_user_datum(void)
{
	return CStringGetTextDatum(GetUserNameFromId(GetUserId(), false));
}

/*
 * Returns the current values of replay_settings as a two-dimensional text
 * array of names and values.
 */
static ArrayType *
capture_settings(void)
{
	Datum		elems[lengthof(replay_settings) * 2];
	int			dims[2] = {lengthof(replay_settings), 2};
	int			lbs[2] = {1, 1};

	for (int i = 0; i < lengthof(replay_settings); i++)
	{
		/* the schemas, so that "$user" cannot resolve to the replaying role */
		bool		is_path = strcmp(replay_settings[i], "search_path") == 0;

		elems[2 * i] = CStringGetTextDatum(replay_settings[i]);
		elems[2 * i + 1] =
			CStringGetTextDatum(is_path ? replay_role_search_path() :
								GetConfigOptionByName(replay_settings[i], NULL, false));
	}
	return construct_md_array(elems, NULL, 2, dims, lbs,
							  TEXTOID, -1, false, TYPALIGN_INT);
}

/*
 * Sets captured settings at the current GUC nest level.
 */
static void
apply_settings(ArrayType *settings)
{
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;

	deconstruct_array(settings, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &nelems);
	for (int i = 0; i + 1 < nelems; i += 2)
	{
		if (nulls[i] || nulls[i + 1])
			continue;
		(void) set_config_option(TextDatumGetCString(elems[i]),
								 TextDatumGetCString(elems[i + 1]),
								 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
								 true, 0, false);
	}
}

/*
 * Runs the business SQL of (consumer_id, key) of consumer in a
 * subtransaction: as the current user, or as run_as with settings when
 * replaying (run_as valid).  Affecting fewer than expect_rows rows is an
 * error of the SQL (IK002); *rows is set to the rows it affected.
 * Returns NULL if it succeeded.  If it failed, its effects are rolled
 * back; a permanent error is returned, allocated in the caller's memory
 * context, and a transient one is re-raised.
 *
 * The caller's SPI connection stays usable either way: SPI cleans up what
 * the subtransaction left, as for PL/pgSQL exception blocks.
 */
static ErrorData *
run_business_sql(int32 consumer_id, const char *consumer, text *key,
				 const char *sql, ArrayType *params, ArrayType *settings,
				 Oid run_as, int64 expect_rows, uint64 *rows)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;
	int			depth = inflight_push(consumer_id, consumer, key);

	BeginInternalSubTransaction(NULL);
	/* allocate in the caller's context, not the subtransaction's */
	MemoryContextSwitchTo(oldcontext);

	PG_TRY();
	{
		int			save_nestlevel = 0;
		ReplayRoleState role_state = {InvalidOid, 0};
		BusinessPlan *bplan;
		ParamListInfo bound_params;

		if (OidIsValid(run_as))
		{
			role_state = replay_role_begin(run_as);
			save_nestlevel = NewGUCNestLevel();
			if (settings != NULL)
				apply_settings(settings);
		}

		bplan = business_plan_get(sql);
		bound_params = business_plan_bind(bplan, params);
		*rows = business_plan_execute(bplan, bound_params);
		expect_rows_demand(expect_rows, *rows, consumer, key);

		if (OidIsValid(run_as))
		{
			/* undo whatever the stored SQL set, as maintenance commands do */
			AtEOXact_GUC(false, save_nestlevel);
			replay_role_end(role_state);
		}

		inflight_pop(depth);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();

		/* the abort restores the user id and the settings */
		inflight_pop(depth);
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;

		if (sqlstate_is_transient(edata->sqlerrcode))
			ReThrowError(edata);
	}
	PG_END_TRY();

	return edata;
}

/*
 * Fills values and nulls with an error's SQLSTATE, message, detail, hint
 * and context, the order of the dead-letter statements.
 */
static void
error_values(ErrorData *edata, Datum *values, char *nulls)
{
	const char *fields[3] = {edata->detail, edata->hint, edata->context};

	values[0] = CStringGetTextDatum(unpack_sql_state(edata->sqlerrcode));
	nulls[0] = ' ';
	values[1] = CStringGetTextDatum(edata->message != NULL ? edata->message : "");
	nulls[1] = ' ';
	for (int i = 0; i < lengthof(fields); i++)
	{
		values[2 + i] = fields[i] != NULL ? CStringGetTextDatum(fields[i]) : (Datum) 0;
		nulls[2 + i] = fields[i] != NULL ? ' ' : 'n';
	}
}

/*
 * Stores a message whose business SQL failed permanently as a new pending
 * dead-letter entry, with the rows it demands (0: none).
 */
static void
dead_letter_insert(int32 consumer_id, text *key, const char *sql,
				   ArrayType *params, NullableDatum event_time,
				   ErrorData *edata, int64 expect_rows)
{
	Datum		values[KS_MAX_ARGS];
	char		nulls[KS_MAX_ARGS];

	memset(nulls, ' ', sizeof(nulls));
	values[0] = Int32GetDatum(consumer_id);
	values[1] = PointerGetDatum(key);
	values[2] = CStringGetTextDatum(sql);
	values[3] = PointerGetDatum(params);
	nulls[3] = params != NULL ? ' ' : 'n';
	values[4] = event_time.value;
	nulls[4] = event_time.isnull ? 'n' : ' ';
	values[5] = PointerGetDatum(capture_settings());
	error_values(edata, &values[6], &nulls[6]);
	values[11] = current_user_datum();
	values[12] = ObjectIdGetDatum(GetUserId());

	values[13] = Int64GetDatum(expect_rows);
	nulls[13] = expect_rows > 0 ? ' ' : 'n';

	/*
	 * On a subscriber that took over, the identity sequence may stand below
	 * the ids of replicated entries (docs/replication.md); entries are
	 * rare enough to check it each time.
	 */
	keystore_execute(KS_DEAD_LETTER_IDS_PAST_ROWS, NULL, NULL, 0);

	/*
	 * A database still at version 1.0 has no column for the role, one at
	 * 1.1 none for the demand, and cannot be given a demand: only the
	 * functions of 1.2 take one.
	 */
	if (expect_rows_stored())
		keystore_execute(KS_DL_INSERT_ROWS, values, nulls, 0);
	else
		keystore_execute(replay_role_supported() ? KS_DL_INSERT_ROLE : KS_DL_INSERT,
						 values, nulls, 0);
}

/*
 * Returns the rows a dead-letter entry's SQL must affect (0: any number).
 */
static int64
dead_letter_expect_rows(int64 id)
{
	Datum		arg = Int64GetDatum(id);
	bool		isnull;
	Datum		value;

	if (!expect_rows_stored())
		return 0;
	keystore_execute(KS_DL_EXPECT_ROWS, &arg, NULL, 1);
	if (SPI_processed == 0)
		return 0;
	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt64(value);
}

/*
 * Returns the status of a key's dead-letter entry, or NULL if it has none.
 */
static char *
dead_letter_status(int32 consumer_id, text *key)
{
	Datum		args[2];
	bool		isnull;

	args[0] = Int32GetDatum(consumer_id);
	args[1] = PointerGetDatum(key);
	keystore_execute(KS_DL_KEY_STATUS, args, NULL, 1);
	if (SPI_processed == 0)
		return NULL;
	return TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
											 SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Returns the outcome of a redelivery of a recorded key whose dead-letter
 * entry has this status (NULL: none): dead_lettered while the entry is
 * pending or was discarded, duplicate otherwise.
 */
static Outcome
redelivery_outcome(const char *status)
{
	return status != NULL && strcmp(status, "replayed") != 0 ?
		OUTCOME_DEAD_LETTERED : OUTCOME_DUPLICATE;
}

/*
 * Copies a column of the first row of the last storage statement's result;
 * returns NULL for an SQL NULL.
 */
static Pointer
result_copy(int colno)
{
	bool		isnull;
	Datum		value;

	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
						  colno, &isnull);
	return isnull ? NULL : (Pointer) PG_DETOAST_DATUM_COPY(value);
}

/*
 * Reads the entry a locking read returned, in DEAD_LETTER_COLUMNS order.
 */
static void
entry_from_result(DeadLetterEntry *entry)
{
	bool		isnull;
	text	   *t;

	entry->id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											SPI_tuptable->tupdesc, 1, &isnull));
	entry->consumer_id = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc, 2, &isnull));
	entry->key = (text *) result_copy(3);
	entry->sql = text_to_cstring((text *) result_copy(4));
	entry->params = (ArrayType *) result_copy(5);
	entry->settings = (ArrayType *) result_copy(6);
	entry->status = text_to_cstring((text *) result_copy(7));
	t = (text *) result_copy(8);
	entry->resolved_by = t != NULL ? text_to_cstring(t) : NULL;
	t = (text *) result_copy(9);
	entry->discard_reason = t != NULL ? text_to_cstring(t) : NULL;
}

/*
 * Tells whether an entry exists and belongs to a consumer the current role
 * may act on.  Read without a lock, so that a role never waits for
 * another team's transaction.
 */
static bool
entry_visible(int64 id)
{
	Datum		arg = Int64GetDatum(id);
	bool		isnull;

	keystore_execute(KS_DL_ENTRY_KEY, &arg, NULL, 1);
	return SPI_processed > 0 &&
		keystore_may_act_on_consumer_id(DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
																	 SPI_tuptable->tupdesc,
																	 1, &isnull)));
}

/*
 * Locks an entry by id and reads it, or raises an error if there is none.
 * An entry of another team's consumer is, to the caller, one that does not
 * exist: the same error tells it nothing.
 */
static void
lock_entry(int64 id, DeadLetterEntry *entry)
{
	Datum		arg = Int64GetDatum(id);

	if (entry_visible(id))
	{
		keystore_execute(KS_DL_LOCK, &arg, NULL, 1);
		if (SPI_processed > 0)
		{
			entry_from_result(entry);
			/* its consumer may have changed owner meanwhile */
			if (keystore_may_act_on_consumer_id(entry->consumer_id))
				return;
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("dead-letter entry %lld does not exist", (long long) id),
			 errhint("The view idem_dead_letters lists the entries.")));
}

/*
 * Raises an error unless an entry is pending.
 */
static void
check_pending(const DeadLetterEntry *entry)
{
	if (strcmp(entry->status, "pending") == 0)
		return;
	if (strcmp(entry->status, "replayed") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dead-letter entry %lld is not pending", (long long) entry->id),
				 errdetail("It was replayed successfully by role \"%s\".",
						   entry->resolved_by)));
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("dead-letter entry %lld is not pending", (long long) entry->id),
			 errdetail("It was discarded by role \"%s\" with the reason \"%s\".",
					   entry->resolved_by, entry->discard_reason)));
}

/*
 * Returns the role a locked entry's SQL runs as, after checking that the
 * caller may act for it, and sets *consumer to the entry's consumer.
 */
static Oid
replay_run_as(const DeadLetterEntry *entry, char **consumer_name)
{
	Datum		arg = Int64GetDatum(entry->id);
	bool		isnull;
	Datum		roleid;
	char	   *consumer;
	char	   *parked_by;

	keystore_execute(KS_DL_ROLE, &arg, NULL, 1);
	roleid = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	consumer = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	parked_by = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3);
	*consumer_name = consumer;
	return replay_role_check(entry->id, consumer,
							 isnull ? InvalidOid : DatumGetObjectId(roleid),
							 parked_by);
}

/*
 * Runs a locked pending entry again under its key, as the role that
 * dead-lettered it, and records the result: replayed on success, the new
 * error and one more attempt on a permanent failure.  A transient error is
 * raised and changes nothing.
 */
static Outcome
replay_entry(const DeadLetterEntry *entry)
{
	ErrorData  *edata;
	Datum		values[KS_MAX_ARGS];
	char		nulls[KS_MAX_ARGS];
	Oid			run_as;
	char	   *consumer;
	uint64		rows;

	/* the entry of a dead external effect: replaying it re-arms the effect */
	if (effects_rearm(entry->id))
	{
		values[0] = Int64GetDatum(entry->id);
		values[1] = current_user_datum();
		keystore_execute(KS_DL_REPLAYED, values, NULL, 0);
		return OUTCOME_APPLIED;
	}

	/* a message's SQL runs as the role that parked it, for its members */
	run_as = replay_run_as(entry, &consumer);

	/*
	 * The key was recorded when the entry was made and idem_forget() leaves
	 * keys of pending entries alone; should it have been removed from the
	 * storage by hand all the same, record it again, so that a success
	 * leaves the key applied.
	 */
	(void) keystore_record_key(entry->consumer_id, entry->key);

	/* a message parked by idem_try_apply_rows demands its rows again */
	edata = run_business_sql(entry->consumer_id, consumer, entry->key,
							 entry->sql, entry->params, entry->settings,
							 run_as, dead_letter_expect_rows(entry->id), &rows);

	values[0] = Int64GetDatum(entry->id);
	nulls[0] = ' ';
	if (edata == NULL)
	{
		values[1] = current_user_datum();
		keystore_execute(KS_DL_REPLAYED, values, NULL, 0);
		return OUTCOME_APPLIED;
	}
	error_values(edata, &values[1], &nulls[1]);
	keystore_execute(KS_DL_FAILED_AGAIN, values, nulls, 0);
	return OUTCOME_DEAD_LETTERED;
}

/*
 * Raises object_in_use if business SQL runs in this backend, before
 * entry id is locked or changed: saying so precisely if the entry holds
 * the running message or, for a replay, a message of its consumer.  The
 * entry is read without a lock, so that a replay held elsewhere does not
 * make the refusal wait.
 */
static void
refuse_inside_business_sql(const char *function_name, const char *action,
						   int64 id)
{
	Datum		arg = Int64GetDatum(id);
	bool		isnull;

	if (!inflight_any())
		return;
	keystore_execute(KS_DL_ENTRY_KEY, &arg, NULL, 1);
	if (SPI_processed > 0)
		inflight_check_dead_letter(function_name, action, id,
								   DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
															   SPI_tuptable->tupdesc,
															   1, &isnull)),
								   (text *) result_copy(2));
	inflight_check_none(function_name);
}

/*
 * Returns the dead-letter entry id argument.
 */
static int64
get_id_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("id must not be null")));
	return PG_GETARG_INT64(argno);
}

/*
 * Returns the fingerprint of a call of idem_try_apply, the one idem_apply
 * computes for the same call.  The typed values need the plan and the
 * parameters' input conversion, either of which can fail where
 * idem_try_apply parks the message instead of raising; so they run in a
 * subtransaction, and a message that cannot be bound is fingerprinted by
 * its parameters' text, as 1.1 did: every delivery of it fails the same
 * way until the cause is fixed, and fingerprint_admits() accepts the text
 * fingerprint of a redelivery after that.
 */
static int32
fingerprint_of_try_call(text *explicit_fingerprint, const char *sql,
						ArrayType *params)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	volatile int32 fingerprint = 0;

	if (explicit_fingerprint != NULL)
		return fingerprint_of_text(explicit_fingerprint);

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		BusinessPlan *bplan = business_plan_get(sql);

		fingerprint = fingerprint_of_bound(sql, business_plan_bind(bplan, params));
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		if (sqlstate_is_transient(edata->sqlerrcode))
			ReThrowError(edata);
		FreeErrorData(edata);
		fingerprint = fingerprint_of_message(sql, params);
	}
	PG_END_TRY();
	return fingerprint;
}

/*
 * Like idem_apply, but a permanent failure of the business SQL parks the
 * message in the dead-letter queue instead of raising; returns applied,
 * duplicate or dead_lettered.  key, consumer, sql and params are the
 * first four arguments of the call, event_time and the fingerprint those
 * at the positions given (a fingerprint position past the last argument:
 * none).  The SQL must affect at least expect_rows rows (0: any number);
 * *rows is set to the rows it affected when applied.
 */
static Outcome
try_apply_message(FunctionCallInfo fcinfo, int event_time_argno,
				  int fingerprint_argno, int64 expect_rows, uint64 *rows)
{
	text	   *key = get_key_arg(fcinfo, 0);
	char	   *consumer = get_consumer_arg(fcinfo, 1);
	char	   *sql = get_sql_arg(fcinfo, 2);
	ArrayType  *params = PG_ARGISNULL(3) ? NULL : PG_GETARG_ARRAYTYPE_P(3);
	NullableDatum event_time;
	text	   *explicit_fingerprint = get_fingerprint_arg(fcinfo, fingerprint_argno);
	int32		consumer_id;
	bool		check_fingerprint;
	int32		fingerprint;
	RecordedKey recorded = {0};
	Outcome		outcome;
	bool		redelivered;
	int			call;

	check_event_time_arg(fcinfo, event_time_argno);
	event_time.isnull = PG_ARGISNULL(event_time_argno);
	event_time.value = event_time.isnull ? (Datum) 0 : PG_GETARG_DATUM(event_time_argno);
	if (params != NULL)
		business_params_check(params);
	business_sql_check(sql);
	expect_rows_check_sql(expect_rows, sql);

	SPI_connect();
	consumer_id = keystore_consumer_id_ext(consumer, true, &check_fingerprint);
	call = stats_call_begin(consumer);

	if (check_fingerprint)
		fingerprint = fingerprint_of_try_call(explicit_fingerprint, sql, params);
	inflight_check_key(consumer_id, consumer, key, "record");
	redelivered = !keystore_record_key_fp(consumer_id, key,
										  check_fingerprint ? &fingerprint : NULL,
										  &recorded);
	if (redelivered && check_fingerprint &&
		!fingerprint_admits(explicit_fingerprint, fingerprint, &recorded,
							sql, params))
	{
		ErrorData  *edata;
		char	   *status;

		/* another message under the key: a permanent failure of its own */
		stats_call_key_reuse(call);
		status = dead_letter_status(consumer_id, key);
		if (status != NULL)
		{
			/*
			 * One entry per key: the message's own redelivery finds the
			 * entry its first delivery made, and reports it like any
			 * parked message.
			 */
			outcome = redelivery_outcome(status);
		}
		else
		{
			edata = fingerprint_key_reuse_error(consumer, key, fingerprint, &recorded);
			dead_letter_insert(consumer_id, key, sql, params, event_time, edata,
							   expect_rows);
			outcome = OUTCOME_DEAD_LETTERED;
			redelivered = false;
		}
	}
	else if (redelivered)
		outcome = redelivery_outcome(dead_letter_status(consumer_id, key));
	else
	{
		ErrorData  *edata = run_business_sql(consumer_id, consumer, key, sql,
											 params, NULL, InvalidOid,
											 expect_rows, rows);

		if (edata == NULL)
			outcome = OUTCOME_APPLIED;
		else
		{
			dead_letter_insert(consumer_id, key, sql, params, event_time, edata,
							   expect_rows);
			outcome = OUTCOME_DEAD_LETTERED;
		}
	}

	SPI_finish();

	/* a redelivery of a parked message is a duplicate, like any other */
	stats_call_end(call,
				   outcome == OUTCOME_APPLIED ? 1 : 0,
				   redelivered ? 1 : 0,
				   outcome == OUTCOME_DEAD_LETTERED && !redelivered ? 1 : 0,
				   event_time.isnull ? DT_NOBEGIN : DatumGetTimestampTz(event_time.value));

	return outcome;
}

/*
 * idem_try_apply(key, consumer, sql, params, event_time, fingerprint):
 * returns applied, duplicate or dead_lettered.  The fingerprint argument
 * exists from version 1.1 of the SQL on.
 */
Datum
idem_try_apply(PG_FUNCTION_ARGS)
{
	uint64		rows;
	Outcome		outcome = try_apply_message(fcinfo, 4, 5, 0, &rows);

	PG_RETURN_DATUM(outcome_result(fcinfo, outcome));
}

/*
 * idem_try_apply_rows(key, consumer, sql, params, expect_rows, event_time,
 * fingerprint): idem_try_apply, where affecting fewer than expect_rows
 * rows is an error of the SQL (IK002, transient unless
 * idem_consumer.transient_sqlstates leaves it out); returns the outcome and
 * the rows the SQL affected, NULL unless applied.
 */
Datum
idem_try_apply_rows(PG_FUNCTION_ARGS)
{
	int64		expect_rows = get_expect_rows_arg(fcinfo, 4);
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	uint64		rows = 0;
	Outcome		outcome;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	outcome = try_apply_message(fcinfo, 5, 6, expect_rows, &rows);

	values[0] = ObjectIdGetDatum(outcome_label_oids(fcinfo->flinfo,
													TupleDescAttr(tupdesc, 0)->atttypid)[outcome]);
	values[1] = Int64GetDatum((int64) rows);
	nulls[1] = outcome != OUTCOME_APPLIED;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}

/*
 * idem_dlq_replay(id): runs a pending dead-letter entry again in the
 * caller's transaction; returns applied or dead_lettered.
 */
Datum
idem_dlq_replay(PG_FUNCTION_ARGS)
{
	int64		id = get_id_arg(fcinfo, 0);
	DeadLetterEntry entry;
	Outcome		outcome;

	replay_role_require_supported();
	SPI_connect();
	refuse_inside_business_sql("idem_dlq_replay", "replay", id);
	lock_entry(id, &entry);
	check_pending(&entry);
	outcome = replay_entry(&entry);
	SPI_finish();

	PG_RETURN_DATUM(outcome_result(fcinfo, outcome));
}

/*
 * idem_dlq_replay(consumer, max_count): replays up to max_count pending
 * entries of a consumer, oldest first, skipping those another transaction
 * holds; returns each id with its outcome.
 */
Datum
idem_dlq_replay_consumer(PG_FUNCTION_ARGS)
{
	char	   *consumer = get_consumer_arg(fcinfo, 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		max_count;
	int32		consumer_id;
	int64		last_id = 0;
	Oid		   *oids;

	max_count = get_count_arg(fcinfo, 1, "max_count");
	replay_role_require_supported();

	InitMaterializedSRF(fcinfo, 0);
	oids = outcome_label_oids(fcinfo->flinfo,
							  TupleDescAttr(rsinfo->setDesc, 1)->atttypid);

	SPI_connect();
	consumer_id = keystore_consumer_id(consumer, false);
	SPI_finish();
	if (consumer_id == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("consumer \"%s\" does not exist", consumer),
				 errhint("The view idem_dead_letters lists the consumers with entries.")));
	inflight_check_dead_letter("idem_dlq_replay", "replay", 0, consumer_id, NULL);

	/* one SPI connection per entry, so that each entry's memory goes with it */
	for (int n = 0; n < max_count; n++)
	{
		Datum		args[2];
		DeadLetterEntry entry;
		Outcome		outcome;
		Datum		values[2];
		bool		nulls[2] = {false, false};

		CHECK_FOR_INTERRUPTS();

		SPI_connect();
		args[0] = Int32GetDatum(consumer_id);
		args[1] = Int64GetDatum(last_id);
		keystore_execute(KS_DL_LOCK_NEXT_PENDING, args, NULL, 1);
		if (SPI_processed == 0)
		{
			SPI_finish();
			break;
		}
		entry_from_result(&entry);
		outcome = replay_entry(&entry);
		last_id = entry.id;
		SPI_finish();

		values[0] = Int64GetDatum(last_id);
		values[1] = ObjectIdGetDatum(oids[outcome]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}

	return (Datum) 0;
}

/*
 * idem_dlq_discard(id, reason): resolves a pending entry without running
 * it.  Its key stays recorded, so redeliveries are still not applied.
 */
Datum
idem_dlq_discard(PG_FUNCTION_ARGS)
{
	int64		id = get_id_arg(fcinfo, 0);
	text	   *reason = get_name_arg(fcinfo, 1, "reason", IDEM_MAX_REASON_BYTES);
	DeadLetterEntry entry;
	Datum		values[3];

	SPI_connect();
	refuse_inside_business_sql("idem_dlq_discard", "discard", id);
	lock_entry(id, &entry);
	check_pending(&entry);
	values[0] = Int64GetDatum(id);
	values[1] = current_user_datum();
	values[2] = PointerGetDatum(reason);
	keystore_execute(KS_DL_DISCARDED, values, NULL, 0);
	SPI_finish();

	PG_RETURN_VOID();
}

/*
 * Defines idem_consumer.transient_sqlstates; called once from _PG_init.
 */
void
dead_letter_init(void)
{
	DefineCustomStringVariable("idem_consumer.transient_sqlstates",
							   "Adds SQLSTATEs that idem_try_apply re-raises instead of dead-lettering.",
							   "A comma-separated list of five-character SQLSTATEs and two-character "
							   "SQLSTATE classes, on top of the built-in transient ones.  The default, "
							   "IK002, retries a message whose SQL affected fewer rows than it demands; "
							   "a list without it parks such messages.",
							   &transient_sqlstates_setting,
							   DEFAULT_TRANSIENT_SQLSTATES,
							   PGC_USERSET,
							   GUC_LIST_INPUT,
							   check_transient_sqlstates,
							   assign_transient_sqlstates,
							   NULL);
}
