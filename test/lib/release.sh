# test/lib/release.sh -- the release suites of test/run-tests.
#
# Owns: the PGXN distribution check (test/pgxn/dist.t), the links of the
# Markdown files (test/pgxn/doc-links.t), the Prometheus
# rules check and unit tests (docs/prometheus, test/prometheus), the
# postgres_exporter queries file under Debian's exporter, and the
# Debian package: build with dpkg-buildpackage in a copy of the tree,
# lintian, install into the system, smoke test in a scratch cluster of
# Debian's own binaries.
#
# Source it from test/run-tests after common.sh; each suite adds its
# results to total_pass and total_fail, and uses WORK and SUITE_TIMEOUT.

# count_tap LOG STATUS: add the ok / not ok lines of a TAP log to the
# totals; a run that failed without a failed assertion counts one failure.
count_tap() {
    local log=$1 status=$2 pass fail
    pass=$(grep -cE '^ok [0-9]+|^not ok [0-9]+.*# *TODO' "$log")
    fail=$(grep -E '^not ok [0-9]+' "$log" | grep -cvE '# *TODO')
    if [ "$status" -ne 0 ] && [ "$fail" -eq 0 ]; then
        fail=1
    fi
    echo "-- $pass passed, $fail failed"
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
}

# PGXN: META.json against the spec and the control file, make dist, and
# the relative links of the Markdown files the distribution ships.
run_pgxn_suite() {
    local log="$WORK/pgxn.log" t0=$SECONDS status
    echo
    echo "== pgxn: META.json, make dist and the documentation's links"
    (cd "$REPO_ROOT" && timeout -k 30 "$SUITE_TIMEOUT" env PG_CONFIG="$PG_CONFIG" \
        prove -v test/pgxn/dist.t test/pgxn/doc-links.t) >"$log" 2>&1
    status=$?
    cat "$log"
    count_tap "$log" "$status"
    echo "-- pgxn took $((SECONDS - t0)) s"
}

# Prometheus: promtool check rules on each rules file (one test each),
# promtool test rules on each unit-test file (one test per evaluation,
# eval_time, in it; the ones promtool reports as failed count as failed),
# and test/prometheus/exporter.t (postgres_exporter with the queries file
# of docs/prometheus, each assertion one test).
run_prometheus_suite() {
    local t0=$SECONDS f log status n failed
    echo
    echo "== prometheus: rules and their unit tests"
    for f in "$REPO_ROOT"/docs/prometheus/*.rules.yml; do
        log="$WORK/promtool-check.log"
        timeout -k 10 120 promtool check rules "$f" >"$log" 2>&1
        status=$?
        cat "$log"
        if [ "$status" -eq 0 ]; then
            total_pass=$((total_pass + 1)); echo "-- $(basename "$f"): check passed"
        else
            total_fail=$((total_fail + 1)); echo "-- $(basename "$f"): check FAILED"
        fi
    done
    for f in "$REPO_ROOT"/test/prometheus/*.test.yml; do
        log="$WORK/promtool-test.log"
        (cd "$(dirname "$f")" && timeout -k 10 300 promtool test rules "$(basename "$f")") >"$log" 2>&1
        status=$?
        cat "$log"
        n=$(grep -cE '^ *- eval_time:' "$f")
        failed=$(grep -cE '^ +(alertname: .*, time: |expr: ".*", time: )' "$log")
        if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then
            failed=$n
        fi
        [ "$failed" -gt "$n" ] && failed=$n
        echo "-- $(basename "$f"): $((n - failed)) passed, $failed failed"
        total_pass=$((total_pass + n - failed))
        total_fail=$((total_fail + failed))
    done
    # postgres_exporter with docs/prometheus/postgres_exporter-queries.yaml
    # against the scratch cluster; the exporter runs as the server's user
    local xdir="$WORK/exporter"
    mkdir -p "$xdir"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$xdir"
    log="$WORK/exporter.log"
    (cd "$REPO_ROOT" && timeout -k 30 300 env PG_BINDIR="$PG_BINDIR" EXPORTER_WORK="$xdir" \
        prove -v test/prometheus/exporter.t) >"$log" 2>&1
    status=$?
    cat "$log"
    [ "$status" -eq 124 ] && echo "--- exporter.t: killed after 300 s"
    count_tap "$log" "$status"
    # the Grafana dashboard and the rules on Debian's Prometheus, scraping
    # a database under load both ways; plots docs/dashboard.png
    log="$WORK/dashboard.log"
    (cd "$REPO_ROOT" && timeout -k 30 180 env PG_BINDIR="$PG_BINDIR" EXPORTER_WORK="$xdir" \
        prove -v test/prometheus/dashboard.t) >"$log" 2>&1
    status=$?
    cat "$log"
    [ "$status" -eq 124 ] && echo "--- dashboard.t: killed after 180 s"
    count_tap "$log" "$status"
    echo "-- prometheus took $((SECONDS - t0)) s"
}

# Debian package: build, lintian, install, smoke test, for the major
# version of PG_CONFIG (else PG_MAJOR): postgresql-NN-idem-consumer.  Each
# step is one test; a step that cannot run because an earlier one failed
# counts as failed too.  The package installs into Debian's paths for that
# major whatever PG_CONFIG says, so the paths and the smoke test's
# binaries are those of Debian's pg_config of that major.  Needs WORK,
# SUITE_TIMEOUT, REPO_ROOT and common.sh; runs as root or with sudo.
run_debian_suite() {
    local t0=$SECONDS dir="$WORK/debian" version arch meta_version src deb status
    local major deb_pg_config bindir libdir pkg
    local cluster port steps=10 pass=0 fail=0 out
    major=$("$PG_CONFIG" --version 2>/dev/null | sed -nE 's/^PostgreSQL ([0-9]+).*/\1/p')
    major=${major:-${PG_MAJOR:-}}
    pkg=postgresql-$major-idem-consumer
    # Debian's layout: each major's pg_config in its own bin directory
    deb_pg_config=/usr/lib/postgresql/$major/bin/pg_config
    bindir=$("$deb_pg_config" --bindir 2>/dev/null)
    libdir=$("$deb_pg_config" --pkglibdir 2>/dev/null)
    echo
    echo "== debian: package build, lintian, install, smoke test (PostgreSQL $major)"
    mkdir -p "$dir"

    # step NAME STATUS: record and print one step's result
    step() {
        if [ "$2" -eq 0 ]; then
            pass=$((pass + 1)); echo "ok - $1"
        else
            fail=$((fail + 1)); echo "not ok - $1"
        fi
    }
    # finish: the steps that did not run count as failed
    finish() {
        fail=$((steps - pass))
        echo "-- $pass passed, $fail failed"
        total_pass=$((total_pass + pass))
        total_fail=$((total_fail + fail))
        echo "-- debian took $((SECONDS - t0)) s"
    }

    version=$(dpkg-parsechangelog -l "$REPO_ROOT/debian/changelog" -S Version)
    arch=$(dpkg --print-architecture)
    meta_version=$(perl -MJSON::PP -e 'local $/; print decode_json(<STDIN>)->{version}' \
        <"$REPO_ROOT/META.json")
    [ "$version" = "$meta_version" ]
    step "debian/changelog's version $version is META.json's ($meta_version)" $?
    [ -n "$major" ] && [ -n "$bindir" ] && [ -n "$libdir" ]
    status=$?
    [ "$status" -ne 0 ] && echo "no Debian pg_config of PostgreSQL ${major:-(unknown major)} at $deb_pg_config"
    step "Debian's pg_config of PostgreSQL $major: $libdir" $status
    [ "$status" -eq 0 ] || { finish; return; }

    # a copy of the tree as it is (tracked and new files, not build products)
    src="$dir/idem-consumer-$version"
    mkdir -p "$src"
    if git -C "$REPO_ROOT" rev-parse --git-dir >/dev/null 2>&1; then
        (cd "$REPO_ROOT" && git ls-files -z -co --exclude-standard |
            tar --null -T - -cf - | tar -x -C "$src")
    else
        (cd "$REPO_ROOT" && tar --exclude='*.o' --exclude='*.so' --exclude='*.bc' -cf - . |
            tar -x -C "$src")
    fi
    # debian/control names the packages of the versions Debian 12 ships;
    # pg_buildext makes it anew for those this system supports, out of
    # control.in and debian/pgversions, as Debian's own extensions do
    (cd "$src" && pg_buildext updatecontrol &&
        timeout -k 30 "$SUITE_TIMEOUT" env -u PG_CONFIG -u PG_MAJOR \
        dpkg-buildpackage -us -uc -b) >"$dir/build.log" 2>&1
    status=$?
    [ "$status" -ne 0 ] && tail -n 60 "$dir/build.log"
    step "dpkg-buildpackage -us -uc -b" $status
    deb="$dir/${pkg}_${version}_${arch}.deb"
    [ -f "$deb" ]
    status=$?
    step "it builds $(basename "$deb")" $status
    [ -f "$deb" ] || { finish; return; }

    # no errors, on the packages and the .changes; warnings are shown
    timeout -k 10 300 lintian --fail-on error "$dir/idem-consumer_${version}_${arch}.changes" \
        >"$dir/lintian.log" 2>&1
    status=$?
    grep -v 'running with root privileges' "$dir/lintian.log"
    step "lintian reports no errors" $status

    # install; remove again at exit unless it was installed before, and put
    # back what make install had installed in the same paths
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        if [ -e "$libdir/idem_consumer.so" ]; then
            add_cleanup "as_root dpkg --purge $pkg >/dev/null 2>&1; (cd '$REPO_ROOT' && as_root make -s PG_CONFIG='$deb_pg_config' install >/dev/null 2>&1)"
        else
            add_cleanup "as_root dpkg --purge $pkg >/dev/null 2>&1"
        fi
    fi
    as_root env DEBIAN_FRONTEND=noninteractive timeout -k 10 300 apt-get install -y -qq \
        -o DPkg::Lock::Timeout=120 --no-install-recommends --reinstall --allow-downgrades \
        "$deb" >"$dir/install.log" 2>&1
    status=$?
    [ "$status" -ne 0 ] && cat "$dir/install.log"
    step "apt-get install ./$(basename "$deb")" $status
    [ "$status" -eq 0 ] || { finish; return; }
    out=$(dpkg --verify "$pkg" 2>&1; dpkg -S "$libdir/idem_consumer.so" 2>&1)
    [ "$out" = "$pkg: $libdir/idem_consumer.so" ]
    step "the installed files are the package's (dpkg --verify, dpkg -S)" $?
    [ -n "$out" ] && echo "$out"

    # smoke test: Debian's server, the packaged library preloaded
    cluster="$dir/cluster"
    port=$((20000 + RANDOM % 40000))
    mkdir -p "$cluster"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$cluster"
    (cd "$cluster" && as_pg "$bindir/initdb" -D "$cluster/data" -U postgres --auth=trust \
        --no-sync) >"$cluster/initdb.log" 2>&1 || cat "$cluster/initdb.log"
    cat >>"$cluster/data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$cluster'
port = $port
shared_preload_libraries = 'idem_consumer'
fsync = off
EOF
    add_cleanup "(cd '$cluster' && as_pg '$bindir/pg_ctl' -D '$cluster/data' -m immediate -w stop >/dev/null 2>&1)"
    (cd "$cluster" && as_pg timeout -k 10 120 "$bindir/pg_ctl" -D "$cluster/data" \
        -l "$cluster/log" -w start) >/dev/null 2>&1
    status=$?
    [ "$status" -ne 0 ] && cat "$cluster/log"
    step "Debian's server starts with the packaged library preloaded" $status

    out=$(timeout -k 10 120 "$bindir/psql" -X -A -t -q -v ON_ERROR_STOP=1 \
        -h "$cluster" -p "$port" -U postgres -d postgres 2>&1 <<'EOF'
CREATE EXTENSION idem_consumer;
SELECT 'version ' || extversion FROM pg_extension WHERE extname = 'idem_consumer';
CREATE TABLE orders (id int PRIMARY KEY, paid numeric NOT NULL DEFAULT 0);
INSERT INTO orders VALUES (1);
SELECT 'first ' || idem_apply('order-paid:1', 'smoke', 'update orders set paid = paid + $1 where id = 1', ARRAY['10']);
SELECT 'again ' || idem_apply('order-paid:1', 'smoke', 'update orders set paid = paid + $1 where id = 1', ARRAY['10']);
SELECT 'paid ' || paid FROM orders;
SELECT line FROM regexp_split_to_table(idem_metrics(), E'\n') AS line
 WHERE line LIKE 'idem_%total{database="postgres",consumer="smoke"}%';
EOF
)
    echo "$out"
    [ "$out" = "version $(sed -n "s/^default_version = '\(.*\)'/\1/p" "$REPO_ROOT/idem_consumer.control")
first true
again false
paid 10
idem_applied_total{database=\"postgres\",consumer=\"smoke\"} 1
idem_duplicate_detected_total{database=\"postgres\",consumer=\"smoke\"} 1
idem_failed_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_dlq_enqueue_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_key_reuse_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_effect_executed_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_effect_replayed_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_effect_busy_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_effect_fenced_off_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_effect_request_mismatch_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_effect_unknown_outcome_total{database=\"postgres\",consumer=\"smoke\"} 0
idem_effect_dead_total{database=\"postgres\",consumer=\"smoke\"} 0" ]
    step "smoke test: create extension, apply, duplicate, idem_metrics" $?
    (cd "$cluster" && as_pg "$bindir/pg_ctl" -D "$cluster/data" -m fast -w stop) >/dev/null 2>&1
    step "the server stops cleanly" $?
    finish
}
