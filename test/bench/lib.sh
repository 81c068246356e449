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
