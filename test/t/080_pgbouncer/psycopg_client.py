"""psycopg 3 through PgBouncer in transaction mode (test/t/080_pgbouncer.pl).

Usage: psycopg_client.py HOST PORT USER PASSWORD DBNAME MODE [ARG]

  apply THRESHOLD   two connections deliver the same eight messages in
                    turns (the second delivery of each is a redelivery);
                    THRESHOLD is psycopg's prepare_threshold ("none" for
                    None: no server-side prepared statements)
  prepare           two connections run one query with prepare=True
  moved             one connection runs a query seven times (psycopg
                    prepares it at the sixth) while, before the seventh,
                    another client holds the server connection it used
  psycopg2          apply with psycopg2 (which sends every query as text,
                    with its parameters quoted into it)

Prints one line per call: "LABEL RESULT", or "LABEL ERROR CLASS SQLSTATE
MESSAGE" for an error of the server.
"""
import sys

import psycopg

APPLY = ("SELECT idem_apply(%s, 'payments', "
         "'update orders set paid = paid + $1 where id = $2', ARRAY[%s, %s])")


def connect(args, threshold):
    host, port, user, password, dbname = args
    return psycopg.connect(host=host, port=port, user=user, password=password,
                           dbname=dbname, autocommit=True, connect_timeout=10,
                           prepare_threshold=threshold)


def call(label, conn, query, params, **kwargs):
    """Runs one query and prints its result or the server's error."""
    try:
        row = conn.execute(query, params, **kwargs).fetchone()
        print(label, "t" if row[0] is True else "f" if row[0] is False else row[0])
    except psycopg.DatabaseError as e:
        message = str(e).splitlines()[0]
        print(label, "ERROR", type(e).__name__, e.sqlstate, message)
    sys.stdout.flush()


def main():
    args, mode = sys.argv[1:6], sys.argv[6]
    if mode == "apply":
        threshold = None if sys.argv[7] == "none" else int(sys.argv[7])
        prefix = sys.argv[8]
        first, second = connect(args, threshold), connect(args, threshold)
        for i in range(1, 9):
            for label, conn in (("c1", first), ("c2", second)):
                call(f"{label} {i}", conn, APPLY, (f"{prefix}:{i}", "1", "3"))
    elif mode == "prepare":
        first, second = connect(args, 5), connect(args, 5)
        call("c1", first, "SELECT %s::text", ("one",), prepare=True)
        call("c2", second, "SELECT %s::text", ("two",), prepare=True)
    elif mode == "moved":
        conn, holder = connect(args, 5), connect(args, 5)
        for i in range(1, 8):
            if i == 7:
                holder.execute("BEGIN")
                holder.execute("SELECT 1")
            call(f"c1 {i}", conn, "SELECT %s::text", (str(i),))
        holder.execute("ROLLBACK")
    elif mode == "psycopg2":
        import psycopg2
        prefix = sys.argv[7]
        host, port, user, password, dbname = args
        conns = []
        for _ in range(2):
            conn = psycopg2.connect(host=host, port=port, user=user, password=password,
                                    dbname=dbname, connect_timeout=10)
            conn.autocommit = True
            conns.append(conn)
        for i in range(1, 9):
            for label, conn in (("c1", conns[0]), ("c2", conns[1])):
                try:
                    with conn.cursor() as cur:
                        cur.execute(APPLY, (f"{prefix}:{i}", "1", "6"))
                        print(f"{label} {i}", "t" if cur.fetchone()[0] else "f")
                except psycopg2.DatabaseError as e:
                    print(f"{label} {i}", "ERROR", type(e).__name__, e.pgcode,
                          str(e).splitlines()[0])
                sys.stdout.flush()
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
