"""idem_consumer 1.2 from psycopg 3: Decimal, datetime with tzinfo, Jsonb,
int, str and None as psycopg 3 binds them (server-side parameters, each
with its type; a str and None are sent untyped, so each value in params is
cast, %s::text, and so is a route)."""

import psycopg
from psycopg.types.json import Jsonb

from scenarios import Scenarios


class Psycopg3(Scenarios):
    NAME = "psycopg3"

    def connect(self, dbname=None):
        # PGHOST, PGPORT, PGUSER and PGDATABASE come from the environment
        extra = {"dbname": dbname} if dbname else {}
        return psycopg.connect("", autocommit=True, options="-c statement_timeout=20s", **extra)

    def sqlstate(self, exc):
        return getattr(exc, "sqlstate", None)

    def jsonb(self, obj):
        return Jsonb(obj)

    def test_untyped_route_needs_a_cast(self):
        """psycopg 3 sends a str as an untyped parameter: idem_apply's route,
        "any", cannot take its type from it (42P18) and nothing is recorded;
        cast, it is a route (ignored here, where keys are not routed)."""
        self.fails_with("42P18", "select idem_apply(%s, %s, %s, route => %s)",
                        ("s-1", self.consumer, "select 1", "7"))
        assert self.processed("s-1") is False
        assert self.execute("select idem_apply(%s, %s, %s, route => %s::bigint)",
                            ("s-1", self.consumer, "select 1", "7"))[0] is True
