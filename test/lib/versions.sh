# test/lib/versions.sh -- the server-side suites on the other PostgreSQL
# major versions.
#
# Owns: one Debian root per major version that Debian 12 does not ship
# (17 from Debian 13 "trixie", 18 from "sid"), made with debootstrap once
# and reused by later runs, and a run of test/run-tests' server-side
# suites (regress, isolation, isolation-sql-path, tap, debian, and citus
# on the newest) inside it, on a copy of the working tree and of the Citus
# sources beside it, against that version's Debian packages.
#
# Source it from bash after common.sh.

# Where the Debian roots live between runs (CI machines keep /var/tmp).
VERSION_ROOTS=${VERSION_ROOTS:-/var/tmp/idem_consumer-roots}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The suites that run on every major version, the Debian package of that
# version included; the client, Node.js, broker, PGXN and Prometheus
# suites run on 15 only.
VERSION_SUITES="regress isolation isolation-sql-path tap debian"
# The Citus suite runs on 15 (Citus 13.2.2) and on the newest major
# (Citus 14.0.1, the release of 16 to 18), not on each: a Citus build and
# its fault loads take about 6 minutes, and CI has 45 for everything.
CITUS_VERSION=18
version_suites_of() {
    if [ "$1" = "$CITUS_VERSION" ]; then
        echo "$VERSION_SUITES citus"
    else
        echo "$VERSION_SUITES"
    fi
}
# Bounds one version's run, the root's creation and packages included (a
# run from nothing took 6 minutes on 2 cores, 12 with Citus; CI has 45 for
# everything).
VERSION_TIMEOUT=${VERSION_TIMEOUT:-900}
VERSION_CITUS_TIMEOUT=${VERSION_CITUS_TIMEOUT:-1500}

# debian_release_of MAJOR: the Debian release whose packages give MAJOR.
debian_release_of() {
    case $1 in
        17) echo trixie ;;
        18) echo sid ;;
        *) return 1 ;;
    esac
}

# ensure_version_root MAJOR: make the Debian root of MAJOR unless a
# finished one is there; prints its path.
ensure_version_root() {
    local major=$1 release root log
    release=$(debian_release_of "$major") || die "no Debian release known for PostgreSQL $major"
    root=$VERSION_ROOTS/pg$major
    if [ ! -f "$root/.idem_consumer-ready" ]; then
        apt_install_missing debootstrap >&2
        # never into what may still be mounted there (/dev, /proc)
        as_root rm -rf --one-file-system "$root"
        as_root mkdir -p "$root"
        log=$(mktemp)
        progress "debootstrap $release into $root (once; minutes)" >&2
        # a release file past its Valid-Until (sid's, now and then) must
        # not stop a test run
        if ! as_root timeout "$VERSION_TIMEOUT" debootstrap --variant=minbase --include=ca-certificates \
                "$release" "$root" "$DEBIAN_MIRROR" >"$log" 2>&1; then
            tail -n 30 "$log" >&2; rm -f "$log"
            die "debootstrap $release failed (last lines above)"
        fi
        rm -f "$log"
        echo "deb $DEBIAN_MIRROR $release main" | as_root tee "$root/etc/apt/sources.list" >/dev/null
        echo 'Acquire::Check-Valid-Until "false";' |
            as_root tee "$root/etc/apt/apt.conf.d/90idem-consumer-valid-until" >/dev/null
        as_root touch "$root/.idem_consumer-ready"
    fi
    printf '%s\n' "$root"
}

# enter_version_root ROOT: what a run inside ROOT needs from the host
# (name resolution, the host's extra certificate authorities for the npm
# registry, /proc and /dev), undone when the script exits.
enter_version_root() {
    local root=$1 m
    as_root cp /etc/resolv.conf /etc/hosts "$root/etc/"
    if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
        as_root mkdir -p "$root/usr/local/share/ca-certificates"
        as_root cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
        as_root chroot "$root" update-ca-certificates >/dev/null 2>&1 || true
    fi
    for m in proc dev dev/pts; do
        mountpoint -q "$root/$m" && continue
        if [ "$m" = proc ]; then
            as_root mount -t proc proc "$root/proc"
        else
            as_root mount --bind "/$m" "$root/$m"
        fi
        add_cleanup "as_root umount -l '$root/$m'"
    done
}

# copy_tree_into ROOT: the working tree (tracked and untracked files, not
# ignored ones such as node_modules) as ROOT/root/idem_consumer.
copy_tree_into() {
    local dest=$1/root/idem_consumer
    as_root rm -rf "$dest"
    as_root mkdir -p "$dest"
    if git -C "$REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        (cd "$REPO_ROOT" && git ls-files -z -co --exclude-standard |
            tar --null -T - -cf -) | as_root tar -C "$dest" -xf -
    else
        tar -C "$REPO_ROOT" --exclude=node_modules -cf - . | as_root tar -C "$dest" -xf -
    fi
}

# copy_citus_sources_into ROOT: the Citus sources of ../shared/vendor/citus
# (test/citus/build-citus) as ROOT/root/shared/vendor/citus, beside the
# tree's copy, where the suite looks for them; nothing if they are absent,
# and the suite then says so.
copy_citus_sources_into() {
    local vendor dest=$1/root/shared/vendor/citus
    vendor=$(cd "$REPO_ROOT/.." && pwd)/shared/vendor/citus
    [ -d "$vendor" ] || return 0
    as_root rm -rf "$dest"
    as_root mkdir -p "$dest"
    as_root cp "$vendor"/* "$dest/"
}

# run_version_suite MAJOR: the server-side suites on PostgreSQL MAJOR in
# its Debian root; adds their results to the totals and records the line
# "PostgreSQL MAJOR: N passed, N failed" in version_lines.
run_version_suite() {
    local major=$1 t0=$SECONDS root log status pass fail result lock lock_fd suites bound
    suites=$(version_suites_of "$major")
    bound=$VERSION_TIMEOUT
    [[ " $suites " == *" citus "* ]] && bound=$VERSION_CITUS_TIMEOUT
    echo
    echo "== PostgreSQL $major: $suites (Debian $(debian_release_of "$major"))"
    log="$WORK/pg$major.log"
    # one run at a time per root: another checkout on this machine would
    # replace the tree under a running one.  Held until this script exits,
    # after its cleanup has unmounted what enter_version_root mounted.
    lock="$VERSION_ROOTS/pg$major.lock"
    as_root mkdir -p "$VERSION_ROOTS"
    as_root touch "$lock"
    exec {lock_fd}<"$lock"
    if ! flock -n "$lock_fd"; then
        progress "waiting for another run on PostgreSQL $major to end"
        flock "$lock_fd"
    fi
    if root=$(ensure_version_root "$major"); then
        enter_version_root "$root"
        copy_tree_into "$root"
        copy_citus_sources_into "$root"
        local -a sudo=()
        [ "$(id -u)" -eq 0 ] || sudo=(sudo)
        # what the root's creation left of the bound
        local left=$((bound - (SECONDS - t0)))
        [ "$left" -lt 60 ] && left=60
        timeout -k 30 "$left" "${sudo[@]}" chroot "$root" env -i \
            PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            HOME=/root LANG=C.UTF-8 TERM=dumb PG_MAJOR="$major" \
            SUITE_TIMEOUT="$SUITE_TIMEOUT" \
            bash /root/idem_consumer/test/run-tests $suites {lock_fd}<&- 2>&1 | tee "$log"
        status=${PIPESTATUS[0]}
    else
        echo "could not make the Debian root of PostgreSQL $major" | tee "$log"
        status=1
    fi
    [ "$status" -eq 124 ] && echo "--- PostgreSQL $major: killed after $bound s"
    result=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    pass=$(sed -E 's/^([0-9]+) passed.*/\1/' <<<"${result:-0 passed, 0 failed}")
    fail=$(sed -E 's/.* ([0-9]+) failed$/\1/' <<<"${result:-0 passed, 0 failed}")
    if [ "$status" -ne 0 ] && [ "$fail" -eq 0 ]; then
        fail=1
    fi
    version_lines+=("PostgreSQL $major: $pass passed, $fail failed")
    echo "-- PostgreSQL $major: $pass passed, $fail failed"
    echo "-- PostgreSQL $major took $((SECONDS - t0)) s"
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
}
