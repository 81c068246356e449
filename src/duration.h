/*-------------------------------------------------------------------------
 *
 * duration.h
 *	  Durations in microseconds: the length of an interval argument, and
 *	  the longest lease and retry delay of an external effect, shared by
 *	  the argument checks (args.c) and the storage of effects
 *	  (effects_store.c), so that neither needs the other.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/duration.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_DURATION_H
#define IDEM_DURATION_H

#include "postgres.h"

#include "common/int.h"
#include "datatype/timestamp.h"

/* Longest lease or heartbeat extension, and longest retry delay. */
#define MAX_LEASE_US			USECS_PER_DAY
#define MAX_DELAY_US			(30 * USECS_PER_DAY)

/*
 * Returns an interval as microseconds, a month counted as 30 days, as
 * interval comparison does.  An interval beyond the range of int64
 * microseconds (some 292,000 years either way) saturates at its end, so
 * that a caller's bound check sees it as too long (or not positive)
 * instead of a value wrapped around.
 */
static inline int64
interval_to_us(const Interval *interval)
{
	/* whole days of time go with the days, so that only |rest| < 1 day is added */
	int64		days = (int64) interval->month * DAYS_PER_MONTH + interval->day +
		interval->time / USECS_PER_DAY;
	int64		us;

	if (pg_mul_s64_overflow(days, USECS_PER_DAY, &us) ||
		pg_add_s64_overflow(us, interval->time % USECS_PER_DAY, &us))
		return days > 0 ? PG_INT64_MAX : PG_INT64_MIN;
	return us;
}

#endif							/* IDEM_DURATION_H */
