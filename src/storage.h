/*-------------------------------------------------------------------------
 *
 * storage.h
 *	  Where the storage of this database is, as storage.c locates it: the
 *	  tables of each generation of the key store and the rest of the
 *	  storage, and their owner; and the hashes of a key.  For the files of
 *	  the key store and those that run statements as the owner.
 *
 * Copyright (c) 2025-2026, idem_consumer maintainers
 *
 * IDENTIFICATION
 *	  src/storage.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STORAGE_H
#define IDEM_STORAGE_H

#include "idem_consumer.h"

/*
 * A generation of the key store: a table of keys, the table of its hash
 * collisions, and the unique index of the keys on their hash.  Keys of
 * 1.0 and 1.1 are in processed_keys and key_collisions, on the 32-bit
 * key_hash; from 1.2 on new keys go into a ring of generations,
 * processed_keys_N and key_collisions_N, on the seeded 64-bit key_hash64
 * (keystore.c, keygen.c).
 */
typedef struct KeyGeneration
{
	Oid			keys_relid;
	Oid			collisions_relid;
	Oid			hash_index;		/* InvalidOid: the fast path is off */
	bool		hash64;			/* key_hash64, or else key_hash */
	Oid			filter_relid;	/* the ring's: its filter (keygen_filter.c) */
} KeyGeneration;

/*
 * Where a generation's tables are in StorageInfo.gens: the legacy pair,
 * processed_keys and key_collisions, at 0 (InvalidOid in a database
 * created at 1.2, which never had them); the ring of 1.2 at 1 to
 * KEYGEN_RING, named after their place.
 */
typedef int KeyGenSlot;

#define KEYGEN_LEGACY 0
#define KEYGEN_RING 16
#define KEYGEN_NUM (KEYGEN_RING + 1)

/* the tables of the filter of all sealed generations: 1 and 2 */
#define FILTER_ALL_PLACES 2

/*
 * The storage tables of this database as last located.  generation changes
 * whenever they are located anew (after DROP and CREATE EXTENSION, say), so
 * that whatever a backend cached about them (plans, consumer ids) can tell
 * it belongs to tables that are gone.  consumers, which every version has,
 * tells one installation of the extension from the next, and its owner is
 * the owner of the storage.
 */
typedef struct StorageInfo
{
	Oid			consumers_relid;
	Oid			owner;
	bool		consumers_have_owners;	/* the SQL is 1.1 or later */
	bool		keys_have_fingerprints; /* the same */
	bool		has_ring;		/* gens[1..KEYGEN_RING] are set: 1.2 or later */
	Oid			generations_relid;	/* key_generations, with the ring */
	KeyGeneration gens[KEYGEN_NUM];
	/* the filter of all sealed generations: its row, and its two tables */
	Oid			filter_all_relid;
	Oid			filter_all_places[FILTER_ALL_PLACES + 1];
	uint64		generation;
	uint64		consumers_version;	/* changes with every invalidation too */
} StorageInfo;

extern const StorageInfo *storage_locate(void);
extern bool keystore_legacy_live(void);
extern int64 key_hash_in(KeyGenSlot slot, int32 consumer_id, text *key);
extern uint64 key_filter_hash(int32 consumer_id, text *key);

#endif							/* IDEM_STORAGE_H */
