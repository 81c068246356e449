"""idem_consumer 1.2 from Python drivers: the scenarios every driver runs.

Owns the driver-independent checks: typed parameters through idem_apply_v
(a redelivery that writes a value another way is a duplicate, another value
under the key is IK001), the rows forms, text[] and typed (an event
before its row raises IK002 and records nothing) and the text[] form of
idem_apply, each passing
values the way the driver binds them.  test_psycopg.py and test_psycopg2.py
give each driver's own adapters; run.py runs them.
"""

import datetime
import decimal
from zoneinfo import ZoneInfo

BERLIN = ZoneInfo("Europe/Berlin")
UTC = datetime.timezone.utc


class Scenarios:
    """Checks of one driver.  A subclass sets NAME and implements connect(),
    sqlstate(), jsonb() and TEXT (the placeholder of a str passed to
    idem_apply_v)."""

    NAME = None
    TEXT = "%s"

    def __init__(self):
        self.conn = self.connect()
        self.orders = f"orders_{self.NAME}"
        self.payments = f"payments_{self.NAME}"
        self.consumer = f"payments-{self.NAME}"
        # a payment: the business SQL binds $1 numeric, $2 timestamptz,
        # $3 jsonb, $4 text and $5 bigint, and changes the order's row
        self.pay_sql = (
            f"with p as (insert into public.{self.payments} (amount, paid_at, doc, note, order_id)"
            f" values ($1, $2, $3, $4, $5) returning order_id, amount)"
            f" update public.{self.orders} o set paid = o.paid + p.amount from p where o.id = p.order_id")
        self.rows_sql = f"update public.{self.orders} set paid = paid + $1 where id = $2"
        self.execute("create extension if not exists idem_consumer")
        self.execute(f"drop table if exists {self.orders}, {self.payments}")
        self.execute(f"create table {self.orders} (id bigint primary key, paid numeric not null default 0)")
        self.execute(f"create table {self.payments} (n serial primary key, amount numeric,"
                     f" paid_at timestamptz, doc jsonb, note text, order_id bigint)")
        self.execute(f"insert into {self.orders} (id) select generate_series(1, 20)")

    def close(self):
        self.execute(f"drop table if exists {self.orders}, {self.payments}")
        self.conn.close()

    # -- helpers -----------------------------------------------------------

    def execute(self, sql, params=None):
        cur = self.conn.cursor()
        cur.execute(sql, params)
        row = cur.fetchone() if cur.description else None
        cur.close()
        return row

    def fails_with(self, state, sql, params=None):
        """Run sql, which must fail with SQLSTATE state; return the error."""
        try:
            self.execute(sql, params)
        except Exception as exc:     # the driver's own error class
            got = self.sqlstate(exc)
            assert got == state, f"expected SQLSTATE {state}, got {got}: {exc}"
            return exc
        raise AssertionError(f"expected SQLSTATE {state}, the statement succeeded")

    def paid(self, order_id):
        return self.execute(f"select paid from {self.orders} where id = %s", (order_id,))[0]

    def processed(self, key):
        return self.execute("select idem_is_processed(%s, %s)", (key, self.consumer))[0]

    def apply_v(self, key, amount, paid_at, doc, note, order_id):
        return self.execute(
            f"select idem_apply_v(%s, %s, %s, %s, %s, %s, {self.TEXT}, %s)",
            (key, self.consumer, self.pay_sql, amount, paid_at, self.jsonb(doc), note, order_id))[0]

    # -- the scenarios -----------------------------------------------------

    def test_typed_redelivery_is_duplicate(self):
        """(a) idem_apply_v applies once; a redelivery writing the values
        another way (10.0 / 10.00, the instant in another zone, jsonb keys
        in another order, int of another width) is a duplicate."""
        first = self.apply_v("a-1", decimal.Decimal("10.0"),
                             datetime.datetime(2026, 1, 1, 10, 0, tzinfo=BERLIN),
                             {"card": "visa", "tags": ["x", "y"]}, "first", 1)
        assert first is True, first
        again = self.apply_v("a-1", decimal.Decimal("10.00"),
                             datetime.datetime(2026, 1, 1, 9, 0, tzinfo=UTC),
                             {"tags": ["x", "y"], "card": "visa"}, "first", 1)
        assert again is False, again
        assert self.paid(1) == decimal.Decimal("10.0"), self.paid(1)
        n, at, doc = self.execute(f"select count(*), min(paid_at), min(doc::text) from {self.payments}"
                                  f" where order_id = 1")
        assert n == 1, n
        assert at == datetime.datetime(2026, 1, 1, 9, 0, tzinfo=UTC), at
        assert doc == '{"card": "visa", "tags": ["x", "y"]}', doc

    def test_other_value_is_key_reuse(self):
        """(b) another value under the same key raises IK001 and runs nothing."""
        assert self.apply_v("b-1", decimal.Decimal("5"),
                            datetime.datetime(2026, 1, 2, tzinfo=UTC), {}, "b", 2) is True
        self.fails_with("IK001",
                        f"select idem_apply_v(%s, %s, %s, %s, %s, %s, {self.TEXT}, %s)",
                        ("b-1", self.consumer, self.pay_sql, decimal.Decimal("5.01"),
                         datetime.datetime(2026, 1, 2, tzinfo=UTC), self.jsonb({}), "b", 2))
        self.fails_with("IK001",
                        f"select idem_apply_v(%s, %s, %s, %s, %s, %s, {self.TEXT}, %s)",
                        ("b-1", self.consumer, self.pay_sql, decimal.Decimal("5"),
                         datetime.datetime(2026, 1, 2, 0, 0, 1, tzinfo=UTC), self.jsonb({}), "b", 2))
        assert self.paid(2) == decimal.Decimal("5"), self.paid(2)

    def test_event_before_its_order(self):
        """(c) idem_apply_rows with expect_rows => 1: the update of an order
        that does not exist yet raises IK002 and records nothing; once the
        order exists the redelivery applies, then it is a duplicate."""
        params = [str(decimal.Decimal("7.50")), str(101)]
        call = "select idem_apply_rows(%s, %s, %s, %s, expect_rows => 1)"
        self.fails_with("IK002", call, ("c-1", self.consumer, self.rows_sql, params))
        assert self.processed("c-1") is False
        self.execute(f"insert into {self.orders} (id) values (101)")
        assert self.execute(call, ("c-1", self.consumer, self.rows_sql, params))[0] == 1
        assert self.execute(call, ("c-1", self.consumer, self.rows_sql, params))[0] is None
        assert self.processed("c-1") is True
        assert self.paid(101) == decimal.Decimal("7.50"), self.paid(101)

    def test_try_apply_rows(self):
        """(c) idem_try_apply_rows: IK002 is transient by default (raised,
        nothing parked); then applied with its rows, then duplicate."""
        params = [str(decimal.Decimal("2.25")), str(102)]
        call = ("select outcome::text, rows from idem_try_apply_rows(%s, %s, %s, %s, expect_rows => 1)")
        self.fails_with("IK002", call, ("c-2", self.consumer, self.rows_sql, params))
        assert self.processed("c-2") is False
        parked = self.execute("select count(*) from idem_dead_letters where consumer = %s and key = %s",
                              (self.consumer, "c-2"))[0]
        assert parked == 0, parked
        self.execute(f"insert into {self.orders} (id) values (102)")
        assert self.execute(call, ("c-2", self.consumer, self.rows_sql, params)) == ("applied", 1)
        assert self.execute(call, ("c-2", self.consumer, self.rows_sql, params)) == ("duplicate", None)
        assert self.paid(102) == decimal.Decimal("2.25"), self.paid(102)

    def test_typed_rows_form(self):
        """(c) idem_apply_rows_v and idem_try_apply_rows_v with Decimal and
        int: IK002 before the order, nothing recorded; then applied with its
        rows; a redelivery writing the amount another way is a duplicate."""
        call = "select idem_apply_rows_v(%s, %s, %s, %s, %s, %s)"
        self.fails_with("IK002", call, ("c-3", self.consumer, self.rows_sql, 1, decimal.Decimal("3.5"), 103))
        assert self.processed("c-3") is False
        self.execute(f"insert into {self.orders} (id) values (103)")
        assert self.execute(call, ("c-3", self.consumer, self.rows_sql, 1, decimal.Decimal("3.5"), 103))[0] == 1
        assert self.execute(call, ("c-3", self.consumer, self.rows_sql, 1, decimal.Decimal("3.50"), 103))[0] is None
        self.fails_with("IK001", call, ("c-3", self.consumer, self.rows_sql, 1, decimal.Decimal("3.51"), 103))
        assert self.paid(103) == decimal.Decimal("3.5"), self.paid(103)

        try_call = "select outcome::text, rows from idem_try_apply_rows_v(%s, %s, %s, %s, %s, %s)"
        self.fails_with("IK002", try_call, ("c-4", self.consumer, self.rows_sql, 1, decimal.Decimal("1.25"), 104))
        assert self.processed("c-4") is False
        self.execute(f"insert into {self.orders} (id) values (104)")
        assert self.execute(try_call, ("c-4", self.consumer, self.rows_sql, 1,
                                       decimal.Decimal("1.25"), 104)) == ("applied", 1)
        assert self.execute(try_call, ("c-4", self.consumer, self.rows_sql, 1,
                                       decimal.Decimal("1.250"), 104)) == ("duplicate", None)
        assert self.paid(104) == decimal.Decimal("1.25"), self.paid(104)

    def test_text_array_form(self):
        """(d) idem_apply with a Python list of str as text[]: applies once;
        the str() of equal values written another way is a duplicate; another
        value is IK001."""
        def deliver(amount, paid_at, doc):
            return self.execute(
                "select idem_apply(%s, %s, %s, %s)",
                ("d-1", self.consumer, self.pay_sql,
                 [str(amount), str(paid_at), doc, "text form", str(3)]))[0]
        assert deliver(decimal.Decimal("4.0"), datetime.datetime(2026, 3, 1, 12, 0, tzinfo=BERLIN),
                       '{"a": 1, "b": 2}') is True
        assert deliver(decimal.Decimal("4.00"), datetime.datetime(2026, 3, 1, 11, 0, tzinfo=UTC),
                       '{"b": 2, "a": 1}') is False
        self.fails_with("IK001", "select idem_apply(%s, %s, %s, %s)",
                        ("d-1", self.consumer, self.pay_sql,
                         ["4.01", "2026-03-01 11:00:00+00:00", "{}", "text form", "3"]))
        assert self.paid(3) == decimal.Decimal("4.0"), self.paid(3)

    def test_routed_keys(self):
        """Routed keys (docs/citus.md) with the route bound as the driver
        binds an int: stored with it, a redelivery a duplicate, the same key
        under another route another key; a call without a route 0A000; a
        failing message parked under its route and applied once by its
        replay.  In a database of its own, its routed tables made, not
        distributed, by the function idem_citus_distribute() uses."""
        db = f"client_routed_{self.NAME}"
        self.execute(f"drop database if exists {db}")
        self.execute(f"create database {db}")
        conn = self.connect(db)
        try:
            cur = conn.cursor()
            cur.execute("create extension idem_consumer")
            cur.execute("create table payments (order_id bigint, msg text)")
            cur.execute("select idem_consumer.routed_storage_create('bigint')")
            sql = "insert into public.payments (order_id, msg) values ($1::bigint, $2)"
            applied = []
            for route in (7, 7, 8):
                cur.execute("select idem_apply_routed(%s, %s, %s, %s, route => %s)",
                            ("r-1", "routed", sql, [str(route), "r-1"], route))
                applied.append(cur.fetchone()[0])
            assert applied == [True, False, True], applied
            cur.execute("select route, key from idem_consumer.routed_keys order by route")
            assert cur.fetchall() == [(7, "r-1"), (8, "r-1")]
            cur.execute("select count(*) from payments")
            assert cur.fetchone()[0] == 2
            try:
                cur.execute("select idem_apply(%s, %s, %s)", ("r-2", "routed", "select 1"))
            except Exception as exc:     # the driver's own error class
                assert self.sqlstate(exc) == "0A000", exc
            else:
                raise AssertionError("a call without a route was not refused")
            cur.execute("alter table payments add constraint no_bad check (msg <> 'bad')")
            outcomes = []
            for _ in range(2):
                cur.execute("select idem_try_apply_routed(%s, %s, %s, %s, route => %s)",
                            ("d-1", "routed", sql, ["9", "bad"], 9))
                outcomes.append(cur.fetchone()[0])
            assert outcomes == ["dead_lettered", "dead_lettered"], outcomes
            cur.execute("select route, status, sqlstate from idem_routed_dead_letters")
            assert cur.fetchall() == [(9, "pending", "23514")]
            cur.execute("alter table payments drop constraint no_bad")
            cur.execute("select idem_dlq_replay_routed(%s, %s, %s)", ("d-1", "routed", 9))
            assert cur.fetchone()[0] == "applied"
            cur.execute("select idem_try_apply_routed(%s, %s, %s, %s, route => %s)",
                        ("d-1", "routed", sql, ["9", "bad"], 9))
            assert cur.fetchone()[0] == "duplicate"
            cur.execute("select count(*) from payments where msg = 'bad'")
            assert cur.fetchone()[0] == 1
            batch = "select key, route from idem_record_batch_routed(%s, %s, %s) order by 2, 1"
            cur.execute(batch, ("routed", ["b-1", "b-2", "b-1"], [7, 7, 8]))
            assert cur.fetchall() == [("b-1", 7), ("b-2", 7), ("b-1", 8)]
            cur.execute(batch, ("routed", ["b-2", "b-3", "b-1"], [7, 7, 8]))
            assert cur.fetchall() == [("b-3", 7)]
            cur.close()
        finally:
            conn.close()
            self.execute(f"drop database {db}")

    def test_docs_examples(self):
        """docs/clients.md's Python examples as written there: the text[]
        form, the typed form and the typed rows form, each a message of its
        own."""
        from decimal import Decimal
        self.execute("drop table if exists payments, orders")
        self.execute("create table orders (id bigint primary key, paid numeric not null default 0)")
        self.execute("create table payments (amount numeric, paid_at timestamptz, order_id bigint)")
        self.execute("insert into orders values (5)")
        try:
            for n, snippet in enumerate(self.docs_examples()):
                cur = self.conn.cursor()
                exec(snippet, {"cur": cur, "key": f"docs-{self.NAME}-{n}", "amount": Decimal("10.00"),
                               "order_id": 5, "Decimal": Decimal,
                               "paid_at": datetime.datetime(2026, 1, 1, 10, 0, tzinfo=BERLIN)})
                cur.close()
            assert len(self.docs_examples()) == 3
            assert self.execute("select paid from orders where id = 5")[0] == Decimal("20.00")
            assert self.execute("select count(*) from payments")[0] == 1
        finally:
            self.execute("drop table payments, orders")

    @staticmethod
    def docs_examples():
        """The snippets of the Python block of docs/clients.md, split at its
        comments."""
        import os
        import re
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "docs", "clients.md")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        start = text.index("```python\n") + len("```python\n")
        block = text[start:text.index("```", start)]
        return [s for s in re.split(r"^#.*$", block, flags=re.M) if s.strip()]


def tests(cls):
    """The names of the test methods of a Scenarios class: the shared ones
    in the order written, then the driver's own."""
    names = [n for n in Scenarios.__dict__ if n.startswith("test_")]
    return names + [n for n in cls.__dict__ if n.startswith("test_") and n not in names]
