# test/lib/common.sh -- shared helpers for test/run-tests and test/demo.
#
# Owns: installing the Debian packages the build and the tests need,
# building and installing the extension (warnings are errors), and starting a
# throw-away PostgreSQL cluster (unix socket only, trust auth, fsync off,
# idem_consumer preloaded) that is stopped and removed when the script exits.
#
# Source it from bash; it expects REPO_ROOT to be set to the repository root.

export PATH="$PATH:/usr/sbin:/sbin"     # runuser

# The PostgreSQL to build and test against: PG_CONFIG in the environment
# names an installation (a relocated copy, say, or one built from source)
# and its major version is read from it; else PG_MAJOR (15 by default, the
# one of Debian 12) selects Debian's packages of that major version.
if [ -n "${PG_CONFIG:-}" ] && [ -x "$PG_CONFIG" ]; then
    PG_MAJOR=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
fi
PG_MAJOR=${PG_MAJOR:-15}
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/$PG_MAJOR/bin/pg_config}

# pg_paths: where the installation keeps its programs and test drivers
# (again after ensure_packages has installed it).
pg_paths() {
    PG_BINDIR=$("$PG_CONFIG" --bindir 2>/dev/null || echo "/usr/lib/postgresql/$PG_MAJOR/bin")
    PGXS_DIR=$(dirname "$(dirname "$(dirname "$("$PG_CONFIG" --pgxs 2>/dev/null ||
        echo "/usr/lib/postgresql/$PG_MAJOR/lib/pgxs/src/makefiles/pgxs.mk")")")")
    PG_REGRESS=$PGXS_DIR/src/test/regress/pg_regress
    PG_ISOLATION_REGRESS=$PGXS_DIR/src/test/isolation/pg_isolation_regress
    PG_TAP_PERL=$PGXS_DIR/src/test/perl
}
pg_paths

# Everything registered with add_cleanup runs, last first, when the script exits.
_cleanup_cmds=()
add_cleanup() { _cleanup_cmds+=("$1"); }
_run_cleanup() {
    local i
    for ((i = ${#_cleanup_cmds[@]} - 1; i >= 0; i--)); do
        eval "${_cleanup_cmds[i]}" || true
    done
    _cleanup_cmds=()
}
trap _run_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

die() { echo "ERROR: $*" >&2; exit 1; }

# Run a command as root (directly, or through sudo when we are not root).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Run a command as the OS user that owns the server (the server refuses root).
# AS_PG is the same prefix as an array, for use after timeout and the like.
if [ "$(id -u)" -eq 0 ]; then AS_PG=(runuser -u postgres --); else AS_PG=(); fi
as_pg() { "${AS_PG[@]}" "$@"; }

# progress LINE: print one line of what a long step is doing, with the
# seconds since the script started, so that a newcomer sees it move.
progress() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

# with_heartbeat LOG CMD...: runs CMD with its output in LOG and, while it
# runs, prints every 15 s how long it has taken and LOG's last line, so
# that a long install is never silent; returns CMD's status.
with_heartbeat() {
    local log=$1 pid rc=0 waited=0 last
    shift
    "$@" >"$log" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        waited=$((waited + 1))
        if [ $((waited % 15)) -eq 0 ]; then
            last=$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-90)
            progress "  ... ${waited}s${last:+: $last}"
        fi
    done
    wait "$pid" || rc=$?
    return "$rc"
}

# Install whatever is missing; apt-get update only when something is.
# ensure_packages [PROFILE]: "build" is what compiling and running the
# extension needs; "demo" adds Node.js for test/demo's external-call phase;
# "server" what the server-side suites need (pg_regress, isolation, TAP:
# the suites run on every major version); "package" adds the tools that
# build and check the Debian package; "citus" what test/citus/build-citus
# needs to compile Citus (a test dependency only) and its driver to run;
# "all" (the default) adds everything the other suites run.
# (pgbench ships in postgresql-NN itself, prove in perl; prometheus brings
# promtool, which the TAP tests run on idem_metrics().)
ensure_packages() {
    local profile=${1:-all}
    # build-essential: dpkg-dev and PGXS's compiler, which Debian's
    # default install lacks
    local pkgs="build-essential make gcc perl" debian_server=
    # an installation of one's own (PG_CONFIG outside Debian's paths, a
    # build from source, say) brings its server; Debian's is installed
    if [ "$PG_CONFIG" = "/usr/lib/postgresql/$PG_MAJOR/bin/pg_config" ]; then
        debian_server=yes
        pkgs="postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR $pkgs"
    fi
    if [ "$profile" = citus ]; then
        # Citus (test/citus/build-citus, configured --without-libcurl):
        # columnar's zstd and lz4, libpq and OpenSSL to link, the GSSAPI
        # headers that libpq-int.h includes and the ICU headers that
        # pg_locale.h includes when the server was built with them
        # (Debian's is); and libcurl from 18 on (test/citus/build-citus)
        pkgs="$pkgs libpq-dev libssl-dev libzstd-dev liblz4-dev libkrb5-dev libicu-dev"
        [ "$PG_MAJOR" -ge 18 ] && pkgs="$pkgs libcurl4-openssl-dev"
        # shellcheck disable=SC2086
        apt_install_missing $pkgs
        pg_paths
        return 0
    fi
    if [ "$profile" != build ]; then
        # node and npm run the client tests and the demo's effect consumers;
        # the machines usually have them
        command -v node >/dev/null && command -v npm >/dev/null || pkgs="$pkgs nodejs npm"
    fi
    if [ "$profile" != build ] && [ "$profile" != demo ]; then
        pkgs="$pkgs libipc-run-perl prometheus"
        # the prometheus suite runs Debian's postgres_exporter with the
        # queries file of docs/prometheus and scrapes it with curl, and
        # plots the dashboard's preview with gnuplot
        pkgs="$pkgs prometheus-postgres-exporter curl gnuplot-nox"
        # PL/Proxy: test/t/021_plproxy.pl and test/bench/plproxy (docs/plproxy)
        [ -n "$debian_server" ] && pkgs="$pkgs postgresql-$PG_MAJOR-plproxy"
        # test/t/080_pgbouncer.pl: Debian's PgBouncer in transaction mode,
        # with psycopg 3, psycopg2 and pgjdbc clients (javac compiles the
        # latter's program)
        pkgs="$pkgs pgbouncer python3-psycopg python3-psycopg2 libpostgresql-jdbc-java"
        # any JDK: Debian 12 has 17, later releases 21 and newer
        command -v javac >/dev/null || pkgs="$pkgs default-jdk-headless"
    fi
    if [ "$profile" = all ]; then
        # the broker test (test/broker/run) starts a RabbitMQ node of its own
        pkgs="$pkgs rabbitmq-server"
        # the Kafka test (test/kafka/broker) resolves the broker with Maven
        # and runs it on Java 17 or later (the JDK above)
        command -v mvn >/dev/null || pkgs="$pkgs maven"
        # the client suite runs idem_consumer from psycopg 3, psycopg2 and
        # pgjdbc (test/client/python, test/client/java: javac and java, no
        # build tool), as Debian ships them; tzdata for Python's zoneinfo
        # (the tests deliver one instant from Europe/Berlin and from UTC)
        pkgs="$pkgs python3 python3-psycopg python3-psycopg2 libpostgresql-jdbc-java tzdata"
    fi
    if [ "$profile" = all ] || [ "$profile" = package ]; then
        # the Debian package build, its lint and the PGXN zip check (test/lib/release.sh)
        # (make dist archives the committed tree with git)
        pkgs="$pkgs postgresql-server-dev-all debhelper dpkg-dev lintian unzip git"
    fi
    # shellcheck disable=SC2086
    apt_install_missing $pkgs
    pg_paths
    ensure_bitcode_compiler
}

# ensure_bitcode_compiler: Debian's PGXS also compiles LLVM bitcode for
# JIT inlining, with the clang its server was built with (clang-14 on
# Debian 12, another on later releases): install that clang and its llvm.
ensure_bitcode_compiler() {
    local global="$PGXS_DIR/src/Makefile.global" clang llvm_version
    [ -f "$global" ] || return 0
    grep -qE '^with_llvm[[:space:]]*=[[:space:]]*yes' "$global" || return 0
    clang=$(sed -nE 's/^CLANG[[:space:]]*=[[:space:]]*//p' "$global")
    [ -n "$clang" ] && ! command -v "$clang" >/dev/null || return 0
    llvm_version=${clang##*-}
    apt_install_missing "clang-$llvm_version" "llvm-$llvm_version"
}

# apt_install_missing PKG...: apt-get install those not installed yet.
apt_install_missing() {
    local missing="" p n log
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    log=$(mktemp)
    n=$(wc -w <<<"$missing")
    progress "installing $n Debian package(s) and what they depend on:$missing"
    progress "  apt-get update"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$log" 2>&1 \
        || { cat "$log"; rm -f "$log"; die "apt-get update failed (output above)"; }
    progress "  apt-get install (this takes minutes on a new machine)"
    # shellcheck disable=SC2086
    with_heartbeat "$log" as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y \
        -o Dpkg::Use-Pty=0 --no-install-recommends $missing \
        || { tail -n 40 "$log"; rm -f "$log"; die "apt-get install$missing failed (last lines above)"; }
    rm -f "$log"
    progress "  packages installed"
}

# npm_registry_check: fail early, with npm's own reason, when the npm
# registry cannot be reached, instead of a silent npm ci failure later.
npm_registry_check() {
    local out
    # one metadata request without retries: npm ping retries for minutes
    # and then prints no reason; this prints npm's error (DNS, proxy, TLS)
    out=$(timeout 60 npm view pg version --fetch-retries=0 --fetch-timeout=20000 2>&1) && return 0
    echo "$out" | grep -v 'complete log of this run' | tail -n 10 >&2
    die "the npm registry ($(npm config get registry 2>/dev/null)) cannot be reached: npm said the above"
}

# node-postgres for the scripts that run Node.js consumers (the client
# tests, test/effects): npm ci in test/client/node unless it is there.
ensure_node_modules() {
    [ -d "$REPO_ROOT/test/client/node/node_modules/pg" ] && return 0
    npm_ci "$REPO_ROOT/test/client/node" "node-postgres"
}

# npm_ci DIR WHAT: npm ci in DIR, from npm's cache alone when it holds every
# package of the lock file (no registry needed), else from the registry,
# checked first, with a line every 15 s while it works.
npm_ci() {
    local dir=$1 what=$2 log
    log=$(mktemp)
    if (cd "$dir" && npm ci --offline --no-audit --no-fund) >"$log" 2>&1; then
        progress "npm ci in ${dir#"$REPO_ROOT"/} ($what): from npm's cache"
        rm -f "$log"
        return 0
    fi
    npm_registry_check
    progress "npm ci in ${dir#"$REPO_ROOT"/} ($what) from $(npm config get registry 2>/dev/null)"
    with_heartbeat "$log" bash -c 'cd "$1" && exec npm ci --prefer-offline --fetch-retries=1 --no-audit --no-fund' npm-ci "$dir" \
        || { tail -n 30 "$log"; rm -f "$log"; die "npm ci in $dir failed (last lines above)"; }
    rm -f "$log"
}

# Warnings are errors.  (PostgreSQL 15's own headers are not clean for
# -Wunused-parameter; the Makefile's PG_CFLAGS, which come after COPT,
# turn that one off.)  EXTRA_COPT in the environment is appended: an
# installation compiled with other optimization flags can need a warning
# of PostgreSQL's own macros turned off.
BUILD_COPT="-Wall -Wextra -Werror${EXTRA_COPT:+ $EXTRA_COPT}"

# make clean; make with warnings as errors; make install.
build_and_install() {
    local log
    log=$(mktemp)
    progress "building idem_consumer (COPT='$BUILD_COPT') and installing it into $("$PG_CONFIG" --pkglibdir)"
    if ! (cd "$REPO_ROOT" &&
          make -s PG_CONFIG="$PG_CONFIG" clean &&
          make -s PG_CONFIG="$PG_CONFIG" COPT="$BUILD_COPT") >"$log" 2>&1; then
        cat "$log"; rm -f "$log"
        die "build failed (warnings are errors)"
    fi
    if ! (cd "$REPO_ROOT" && as_root make -s PG_CONFIG="$PG_CONFIG" install) >"$log" 2>&1; then
        cat "$log"; rm -f "$log"
        die "make install failed"
    fi
    rm -f "$log"
}

# Print the value of a Makefile variable, e.g. make_var REGRESS.
make_var() {
    (cd "$REPO_ROOT" &&
     make -s --no-print-directory PG_CONFIG="$PG_CONFIG" -f Makefile -f - \
          "__print_var-$1" <<<'__print_var-%: ; @echo $($*)')
}

# make_pg_tempdir VAR: create a temporary directory owned by the postgres
# user, removed on exit, and store its path in VAR.  (Not a $(...) function:
# the cleanup must be registered in this shell, not in a subshell.)
make_pg_tempdir() {
    local d
    d=$(mktemp -d "${TMPDIR:-/tmp}/idem_consumer.XXXXXX") || die "mktemp failed"
    add_cleanup "rm -rf '$d'"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$d"
    chmod 755 "$d"
    printf -v "$1" '%s' "$d"
}

# start_scratch_cluster DIR PORT [LISTEN]: initdb + start a cluster in DIR
# (created if needed, must be writable by the server's user); data in
# DIR/data, socket in DIR, server log in DIR/log; LISTEN, empty by default,
# is its listen_addresses (JDBC has no unix sockets).  Exports PGHOST,
# PGPORT, PGUSER for clients and registers stopping it and removing DIR on
# exit.
# SCRATCH_POSTGRES in the environment names the program pg_ctl starts
# instead of PG_BINDIR's postgres (a wrapper that runs it under valgrind,
# say); TEST_LOG_DIR, if set, receives a copy of the server log once the
# server has stopped.
start_scratch_cluster() {
    local dir=$1 port=$2 listen=${3:-}
    mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
    add_cleanup "rm -rf '$dir'"
    (cd "$dir" && as_pg "$PG_BINDIR/initdb" -D "$dir/data" -U postgres \
        --auth=trust --encoding=UTF8 --locale=C --no-sync) >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log"; die "initdb failed"; }
    cat >>"$dir/data/postgresql.conf" <<EOF

# scratch test cluster (test/lib/common.sh); fsync off: tests only
listen_addresses = '$listen'
unix_socket_directories = '$dir'
port = $port
shared_preload_libraries = 'idem_consumer'
fsync = off
max_connections = 100
# key_generation_gate.spec holds a key in a prepared transaction
max_prepared_transactions = 5
EOF
    [ -n "${TEST_LOG_DIR:-}" ] && add_cleanup "cp '$dir/log' '$TEST_LOG_DIR/server.log'"
    add_cleanup "(cd '$dir' && as_pg '$PG_BINDIR/pg_ctl' -D '$dir/data' -m immediate -w stop >/dev/null 2>&1)"
    local -a postgres_opt=()
    [ -n "${SCRATCH_POSTGRES:-}" ] && postgres_opt=(-p "$SCRATCH_POSTGRES")
    if ! (cd "$dir" && as_pg "$PG_BINDIR/pg_ctl" -D "$dir/data" -l "$dir/log" "${postgres_opt[@]}" -w start) >/dev/null 2>&1; then
        cat "$dir/log" 2>/dev/null
        die "could not start the scratch cluster"
    fi
    export PGHOST=$dir PGPORT=$port PGUSER=postgres
}

# pg_install_copy DIR: copies the PostgreSQL installation of PG_CONFIG,
# with what is installed in it (idem_consumer), to DIR in Debian's layout
# (lib/postgresql/MAJOR, share/postgresql/MAJOR and include/postgresql
# under one prefix), whose programs find each other relative to
# themselves; prints the copy's pg_config.  For test dependencies that
# install into PostgreSQL (Citus), so that they never land in the
# installation the machine and the other suites use.
pg_install_copy() {
    local copy=$1 bindir prefix
    bindir=$("$PG_CONFIG" --bindir)
    prefix=${bindir%/lib/postgresql/$PG_MAJOR/bin}
    [ "$prefix" != "$bindir" ] && [ -d "$prefix/share/postgresql/$PG_MAJOR" ] &&
        [ -d "$prefix/include/postgresql" ] ||
        die "cannot copy the PostgreSQL installation of $PG_CONFIG: not in Debian's layout"
    rm -rf "$copy" &&
        mkdir -p "$copy/lib/postgresql" "$copy/share/postgresql" "$copy/include" &&
        cp -a "$prefix/lib/postgresql/$PG_MAJOR" "$copy/lib/postgresql/" &&
        cp -a "$prefix/share/postgresql/$PG_MAJOR" "$copy/share/postgresql/" &&
        cp -a "$prefix/include/postgresql" "$copy/include/" ||
        die "cannot copy the PostgreSQL installation of $PG_CONFIG to $copy"
    echo "$copy/lib/postgresql/$PG_MAJOR/bin/pg_config"
}
