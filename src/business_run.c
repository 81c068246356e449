/*-------------------------------------------------------------------------
 *
 * business_run.c
 *	  Running a message's business SQL in a subtransaction, for
 *	  idem_try_apply() and dead-letter replays: which of its errors are
 *	  transient, and the settings a replay restores.
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
 * A replay restores the settings that change how the stored text and
 * params are read (search_path, captured as the schemas it resolved to,
 * TimeZone, DateStyle, IntervalStyle) as they were when the message was
 * dead-lettered, for the business SQL only.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/business_run.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/resowner.h"
#include "utils/varlena.h"

#include "compat.h"
#include "business_run.h"

/* Settings a replay restores, because they change how sql and params read. */
static const char *const replay_settings[] = {
	"search_path", "TimeZone", "DateStyle", "IntervalStyle"
};

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
bool
business_run_error_is_transient(int sqlerrcode)
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
 * Returns the current values of replay_settings as a two-dimensional text
 * array of names and values.
 */
ArrayType *
business_run_capture_settings(void)
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
ErrorData *
business_run(int32 consumer_id, const char *consumer, text *key,
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

		if (business_run_error_is_transient(edata->sqlerrcode))
			ReThrowError(edata);
	}
	PG_END_TRY();

	return edata;
}

/*
 * Defines idem_consumer.transient_sqlstates; called once from _PG_init.
 */
void
business_run_init(void)
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
