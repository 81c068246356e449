# test/bench/lib.sh -- what the benchmark scripts share: the message keys,
# the key floor's table and reading callgrind profiles.  Sourced after
# test/lib/common.sh.

# key_sql R: the key of message s of run R, as an SQL expression of s:
#   'order-paid:' || (10^18 + perm(s) * 10^9 + R)
# where perm(s) = s * 950706376 mod (2^31 - 1) is a bijection of
# 1 .. 2^31 - 2 (multiplication by a primitive root modulo a prime).  Keys
# are therefore unique, 30 characters long, and in random order whatever
# order they are produced in.
key_sql() { echo "'order-paid:' || (1000000000000000000 + (s * 950706376 % 2147483647) * 1000000000 + $1)"; }

# The key floor: a table with the key store's columns and a unique index
# with entries of the same size (16 bytes) on a 64-bit hash of the key,
# which unlike the key store's 32-bit hash never meets a collision at these
# sizes; written by a plain INSERT that decides nothing.
PLAIN_KEYS_DDL='CREATE TABLE plain_keys (
    consumer_id integer NOT NULL,
    processed_at integer NOT NULL,
    key text COLLATE "C" NOT NULL,
    fingerprint integer);
CREATE UNIQUE INDEX ON plain_keys (hashtextextended(key, consumer_id));'

# inclusive FILE FUNCTION: instructions spent in FUNCTION and its callees
# in a callgrind profile; prints nothing when FUNCTION is not in it
inclusive() {
    callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
        awk -v f="$2" '!done && ($0 ~ ("[:]" f " ") || $0 ~ ("[:]" f "$")) { gsub(",", "", $1); print $1; done = 1 }'
}

# reserve_huge_pages SIZE_MB: reserves the 2 MB huge pages a cluster
# whose shared memory is SIZE_MB (shared_buffers and about 6% more) needs,
# when the machine lets it, and gives the kernel its count back at exit;
# sets HUGE_PAGES to "on" if the cluster can then run with huge_pages = on,
# else to "off".  Call it in the script's own shell, before the cluster
# starts, so that the cluster is stopped first at exit.
#
# Random reads across gigabytes of shared_buffers in 4 kB pages each cost
# a miss of the TLB, and in a virtual machine a walk of two page tables:
# on such a machine that, not the blocks read, made the key store's cost
# per message grow with its sealed generations (docs/performance.md, "The
# key store's goals").  Servers with large shared_buffers run with huge
# pages, as PostgreSQL's documentation recommends.
reserve_huge_pages() {
    local size_mb=$1 need total free
    HUGE_PAGES=off
    [ -w /proc/sys/vm/nr_hugepages ] || return 0
    [ "$(awk '/^Hugepagesize:/ { print $2 }' /proc/meminfo)" = 2048 ] || return 0
    need=$(((size_mb * 106 / 100) / 2 + 64))
    total=$(awk '/^HugePages_Total:/ { print $2 }' /proc/meminfo)
    free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
    if [ "$free" -lt "$need" ]; then
        add_cleanup "echo $total >/proc/sys/vm/nr_hugepages"
        echo $((total + need - free)) >/proc/sys/vm/nr_hugepages 2>/dev/null || return 0
        free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
        [ "$free" -ge "$need" ] || return 0
    fi
    HUGE_PAGES=on
}

# choose_huge_pages WANT SHARED_BUFFERS: sets HUGE_PAGES for a cluster with
# that shared_buffers, reserving the pages if need be: WANT on (or die),
# try (on if the machine lets it), or off.
choose_huge_pages() {
    HUGE_PAGES=off
    case $1 in
        on|try) reserve_huge_pages "$(size_mb "$2")" ;;
        off) return 0 ;;
        *) die "the huge pages setting must be on, try or off, not '$1'" ;;
    esac
    [ "$HUGE_PAGES" = on ] || [ "$1" = try ] \
        || die "cannot reserve huge pages for shared_buffers = $2 (run as root, or turn them off)"
}

# size_mb SIZE: the megabytes of a size such as 512MB or 4GB
size_mb() {
    case $1 in
        *GB) echo $((${1%GB} * 1024)) ;;
        *MB) echo "${1%MB}" ;;
        *kB) echo $((${1%kB} / 1024)) ;;
        *) echo 0 ;;
    esac
}

# bench_report NAME LINE...: prints each "name=value" LINE as "BENCH
# name=value", and, when BENCH_RESULTS_DIR is set, saves them to
# $BENCH_RESULTS_DIR/NAME-YYYY-MM-DD-HHMM.bench (UTC) after a comment line
# saying what ran where, for test/bench/plot and other scripts.
bench_report() {
    local name=$1 m file
    shift
    for m in "$@"; do echo "BENCH $m"; done
    [ -n "${BENCH_RESULTS_DIR:-}" ] || return 0
    mkdir -p "$BENCH_RESULTS_DIR" || die "cannot create $BENCH_RESULTS_DIR"
    file="$BENCH_RESULTS_DIR/$name-$(date -u +%Y-%m-%d-%H%M).bench"
    {
        echo "# test/bench/$name, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, $("$PG_BINDIR/postgres" --version 2>/dev/null)"
        printf '%s\n' "$@"
    } >"$file" || die "cannot write $file"
    echo "saved to $file"
}

# median: the median of the numbers on standard input, one a line
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
