/*-------------------------------------------------------------------------
 *
 * replay_role.c
 *	  Whose rights a dead-letter replay runs the stored SQL with, and who
 *	  may replay it.
 *
 * The SQL of a dead-letter entry came from the role that parked it, so a
 * replay runs it as that role, never as the operator who replays: a role
 * allowed to call idem_try_apply() could otherwise park SQL that fails for
 * itself (insufficient privilege is a permanent error) and have it run
 * with an operator's rights.  The rules:
 *
 *	- idem_try_apply() stores the current user in dead_letters
 *	  .dead_lettered_role (version 1.1 of the SQL objects), and the
 *	  search_path as the schemas it resolves to at that moment, quoted, with
 *	  pg_catalog where the server searched it and pg_temp last: "$user"
 *	  and a missing schema cannot resolve differently later, and no
 *	  temporary object of the replaying session comes first.
 *	- A replay is refused (42501) unless the calling user may SET ROLE to
 *	  that role (role_can_become(): membership on PostgreSQL 15, a grant
 *	  WITH SET from 16 on); superusers may become every role.  Acting on
 *	  the entry's consumer at all takes its owner's privileges
 *	  (consumers.c).
 *	- The SQL runs with SetUserIdAndSecContext() as that role, as a
 *	  security-restricted operation whose setting changes are undone, the
 *	  way PostgreSQL runs index expressions as a table's owner during
 *	  maintenance: the stored SQL cannot leave a temporary object, a
 *	  prepared statement or a changed setting behind in the operator's
 *	  session.
 *	- In a database whose SQL objects are still version 1.0 there is no
 *	  role to run as, so replays are refused with a hint to update the
 *	  extension; parking and discarding work as under 1.0.  The update script
 *	  fills the role of older entries in from dead_lettered_by.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/replay_role.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"

#include "idem_consumer.h"

/*
 * Tells whether the dead-letter table has the column of version 1.1 that
 * holds the parking role.
 */
bool
replay_role_supported(void)
{
	return storage_parts()->dead_letters_have_role;
}

/*
 * Returns the current search_path as the schemas it resolves to now,
 * quoted and comma-separated, the temporary schema replaced by a trailing
 * pg_temp.
 */
char *
replay_role_search_path(void)
{
	List	   *schemas = fetch_search_path(true);
	ListCell   *lc;
	StringInfoData buf;

	initStringInfo(&buf);
	foreach(lc, schemas)
	{
		Oid			nspid = lfirst_oid(lc);
		char	   *name;

		if (isAnyTempNamespace(nspid))
			continue;
		name = get_namespace_name(nspid);
		if (name == NULL)
			continue;			/* dropped meanwhile */
		if (buf.len > 0)
			appendStringInfoString(&buf, ", ");
		appendStringInfoString(&buf, quote_identifier(name));
	}
	if (buf.len > 0)
		appendStringInfoString(&buf, ", ");
	appendStringInfoString(&buf, "pg_temp");
	list_free(schemas);
	return buf.data;
}

/*
 * Returns the role a replay of an entry runs as, after checking that the
 * current user may act for it; roleid is the entry's dead_lettered_role
 * (InvalidOid if unknown), consumer and parked_by_name describe the entry
 * for the messages.
 */
Oid
replay_role_check(const char *entry_name, const char *consumer, Oid roleid,
				  const char *parked_by_name)
{
	char	   *rolename;

	if (!OidIsValid(roleid) ||
		!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(roleid)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role that dead-lettered %s of consumer \"%s\" no longer exists",
						entry_name, consumer),
				 errdetail("The entry was dead-lettered by role \"%s\"; a replay runs its SQL as that role.",
						   parked_by_name),
				 errhint("Discard the entry with idem_dlq_discard and have the producer send the message again.")));

	rolename = GetUserNameFromId(roleid, false);
	if (!role_can_become(roleid))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to replay dead-letter %s of consumer \"%s\"",
						entry_name, consumer),
				 errdetail("A replay runs the entry's SQL as role \"%s\", which dead-lettered it.",
						   rolename),
				 errhint("Replay as a member of role \"%s\".", rolename)));
	return roleid;
}

/*
 * Raises an error: replays need version 1.1 of the SQL objects.
 */
void
replay_role_require_supported(void)
{
	if (replay_role_supported())
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("dead-letter replay needs version 1.1 of extension \"idem_consumer\""),
			 errdetail("Version 1.0 does not record which role dead-lettered an entry, and a replay runs the entry's SQL as that role."),
			 errhint("Run ALTER EXTENSION idem_consumer UPDATE.")));
}

/*
 * Switches to the replay's role for its business SQL; returns the state
 * that replay_role_end() restores.  An error in between restores it
 * through the (sub)transaction abort.
 */
ReplayRoleState
replay_role_begin(Oid roleid)
{
	ReplayRoleState state;

	GetUserIdAndSecContext(&state.save_userid, &state.save_sec_context);
	SetUserIdAndSecContext(roleid,
						   state.save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	return state;
}

/*
 * Switches back to the user that called the replay.
 */
void
replay_role_end(ReplayRoleState state)
{
	SetUserIdAndSecContext(state.save_userid, state.save_sec_context);
}
