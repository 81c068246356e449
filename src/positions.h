/*-------------------------------------------------------------------------
 *
 * positions.h
 *	  What positions.c shares with position_check.c: the arguments that
 *	  name a position, and the table of positions as the C code reads it.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/positions.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_POSITIONS_H
#define IDEM_POSITIONS_H

#include "fmgr.h"
#include "utils/relcache.h"

/* Kafka's limit on the length of a topic's name */
#define KAFKA_MAX_TOPIC_BYTES		249

/* The arguments that name a position: consumer, topic, partition. */
typedef struct PositionKey
{
	char	   *consumer;
	text	   *topic;
	int32		partition;
} PositionKey;

/*
 * The columns of idem_consumer.positions, in the order of the table, which
 * the C code reads directly.
 */
enum PositionColumn
{
	PC_CONSUMER_ID,
	PC_TOPIC,
	PC_PARTITION,
	PC_POSITION,
	PC_ADVANCED_AT,
	PC_LOG_END_OFFSET,
	PC_LOG_END_AT,
	PC_REWINDS,
	PC_LAST_REWOUND_AT,
	PC_LAST_REWOUND_BY,
	PC_LAST_REWIND_REASON,
	PC_NUM_COLUMNS
};

extern void get_position_key(FunctionCallInfo fcinfo, PositionKey *key);
extern int64 get_offset_arg(FunctionCallInfo fcinfo, int argno, const char *argname);
extern Relation positions_open(Oid *index);
/* positions_fastpath.c */
extern bool positions_fast_advance(ItemPointer tid, int32 consumer_id, text *topic,
								   int32 partition, int64 position, Datum log_end,
								   bool log_end_null);
extern void position_scankeys(ScanKeyData *skey, int *nkeys, int32 consumer_id,
							  text *topic, int32 partition);

/* position_check.c */
extern void position_check_init(void);

#endif							/* IDEM_POSITIONS_H */
