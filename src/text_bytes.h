/*-------------------------------------------------------------------------
 *
 * text_bytes.h
 *	  Texts compared byte by byte, as the "C" collation of the keys, topics
 *	  and consumer names compares them: for the fast paths, which read
 *	  stored rows without the executor, and the keys business SQL holds
 *	  (inflight.c), so that none needs another's file for it.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/text_bytes.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TEXT_BYTES_H
#define IDEM_TEXT_BYTES_H

#include "postgres.h"

/* Whether two texts hold the same bytes. */
static inline bool
text_bytes_equal(text *a, text *b)
{
	return VARSIZE_ANY_EXHDR(a) == VARSIZE_ANY_EXHDR(b) &&
		memcmp(VARDATA_ANY(a), VARDATA_ANY(b), VARSIZE_ANY_EXHDR(a)) == 0;
}

#endif							/* IDEM_TEXT_BYTES_H */
