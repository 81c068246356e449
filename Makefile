# PGXS build of idem_consumer.
#
# Extension scripts live in extension/, the pg_regress suite in sql/ and
# expected/, isolation specs in test/isolation/, TAP tests in test/t/.

MODULE_big = idem_consumer
OBJS = \
	src/idem_consumer.o \
	src/storage.o \
	src/storage_stmt.o \
	src/keystore_sql.o \
	src/fastpath.o \
	src/positions_fastpath.o \
	src/keystore_fastpath.o \
	src/keystore.o \
	src/keystore_batch.o \
	src/keystore_remove.o \
	src/routing.o \
	src/routed.o \
	src/keygen_state.o \
	src/keygen.o \
	src/keygen_gate.o \
	src/keygen_retire.o \
	src/keygen_holders.o \
	src/keygen_filter.o \
	src/consumers.o \
	src/consumers_sql.o \
	src/consumer_names.o \
	src/fingerprint.o \
	src/keyhash.o \
	src/plan_cache.o \
	src/args.o \
	src/apply.o \
	src/batch.o \
	src/histogram.o \
	src/stats.o \
	src/stats_slots.o \
	src/stats_xact.o \
	src/stats_file.o \
	src/stats_views.o \
	src/metrics.o \
	src/business_run.o \
	src/dead_letter.o \
	src/dead_letter_entry.o \
	src/dead_letter_resolve.o \
	src/dead_letter_sql.o \
	src/try_apply.o \
	src/key_place_resolve.o \
	src/expect_rows.o \
	src/retention.o \
	src/retention_api.o \
	src/retention_store.o \
	src/retention_windows.o \
	src/purge_worker.o \
	src/effects_store.o \
	src/effects_store_sql.o \
	src/effects_fastpath.o \
	src/effects.o \
	src/effects_api.o \
	src/inflight.o \
	src/replay_locks.o \
	src/visible_rows.o \
	src/positions.o \
	src/position_check.o \
	src/replay_role.o

EXTENSION = idem_consumer
DATA = $(wildcard extension/idem_consumer--*.sql)
PGFILEDESC = "idem_consumer - idempotent message consumption"

REGRESS = hash_width apply bad_input plan_cache security collisions storage batch dead_letter stats stats_readers metrics_dead_letters retention retention_dead_letters retention_chunks effects effects_fastpath ownership key_reuse dead_letter_roles dead_letter_expiry own_key fastpath_fallback spi_results interval_bounds function_labels partitioned_storage view_barriers view_leaks business_settings replay_locks dlq_in_flight key_store_guard create_rights membership consumer_names foreign_messages typed_fingerprints typed_params expect_rows api_surface call_shapes key_generations key_generation_retention routed_keys routed_dead_letters routed_effects trigger_guard hostile_search_path plan_cache_memory positions positions_fastpath position_check
REGRESS_OPTS = --load-extension=idem_consumer

ISOLATION = narrow_hash apply_concurrency collision_concurrency batch_deadlock dlq_replay purge_concurrency effects_begin effects_takeover effects_claim effects_fastpath ownership_cache dlq_replay_rr collision_fingerprints consumer_ids old_generation key_generation_switch key_generation_drop key_generation_filter key_generation_collisions key_generation_carry key_generation_gate routed_dlq_replay routed_refusal consumer_row_changes position_advance position_check
ISOLATION_OPTS = --inputdir=test/isolation --load-extension=idem_consumer

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

# PostgreSQL's headers are not -Wextra clean for unused parameters and
# signed/unsigned comparisons; everything else -Wextra finds is an error
# when built with COPT=-Werror, as CI does.
PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare

# Only the entry points the server looks up by name are exported (see
# src/compat.h); 16 and later add this flag themselves.  PG_CFLAGS reaches
# the compiler only, not the LLVM bitcode's compile.
PG_CFLAGS += -fvisibility=hidden

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXN distribution: make dist writes idem_consumer-<version>.zip of the
# committed tree (HEAD), the version taken from META.json.
DISTVERSION = $(shell perl -MJSON::PP -e 'local $$/; print decode_json(<STDIN>)->{version}' < META.json)

.PHONY: dist
dist:
	git archive --format zip --prefix=$(EXTENSION)-$(DISTVERSION)/ \
		--output $(EXTENSION)-$(DISTVERSION).zip HEAD
