"""idem_consumer 1.2 from psycopg2: Decimal, datetime with tzinfo,
psycopg2.extras.Json, int and str as psycopg2 writes them into the
statement (client-side literals; a str is an untyped literal, and an
untyped route literal is read by the routes' type's input function)."""

import psycopg2
import psycopg2.extras

from scenarios import Scenarios


class Psycopg2(Scenarios):
    NAME = "psycopg2"

    def connect(self, dbname=None):
        # PGHOST, PGPORT, PGUSER and PGDATABASE come from the environment
        extra = {"dbname": dbname} if dbname else {}
        conn = psycopg2.connect("", options="-c statement_timeout=20s", **extra)
        conn.autocommit = True
        return conn

    def sqlstate(self, exc):
        return getattr(exc, "pgcode", None)

    def jsonb(self, obj):
        return psycopg2.extras.Json(obj)
