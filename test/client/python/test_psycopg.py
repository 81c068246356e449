"""idem_consumer 1.2 from psycopg 3: Decimal, datetime with tzinfo, Jsonb,
int and str as psycopg 3 binds them (server-side parameters, each with its
type; a str is sent untyped, so it needs a cast where idem_apply_v cannot
tell its type)."""

import psycopg
from psycopg.types.json import Jsonb

from scenarios import Scenarios


class Psycopg3(Scenarios):
    NAME = "psycopg3"
    TEXT = "%s::text"

    def connect(self, dbname=None):
        # PGHOST, PGPORT, PGUSER and PGDATABASE come from the environment
        extra = {"dbname": dbname} if dbname else {}
        return psycopg.connect("", autocommit=True, options="-c statement_timeout=20s", **extra)

    def sqlstate(self, exc):
        return getattr(exc, "sqlstate", None)

    def jsonb(self, obj):
        return Jsonb(obj)

    def test_str_needs_a_cast(self):
        """psycopg 3 sends a str as an untyped parameter: idem_apply_v cannot
        take its type from "any" (42P18) and nothing is recorded."""
        import decimal
        self.fails_with("42P18", "select idem_apply_v(%s, %s, %s, %s, %s)",
                        ("s-1", self.consumer, "select $1::numeric, $2::text", decimal.Decimal("1"), "x"))
        assert self.processed("s-1") is False
