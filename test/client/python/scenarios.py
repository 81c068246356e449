"""idem_consumer 1.2 from Python drivers: the scenarios every driver runs.

Owns the driver-independent checks: values of other types than text in
params as ARRAY[%s::text, ...] (a redelivery that writes a value another
way is a duplicate, another value under the key is IK001, None stays
NULL), expect_rows, with text[] and typed values (an event before its row
raises IK002 and records nothing), the text[] form of
idem_apply, routed keys and routed external effects (the inline cycle, a
fenced-off complete, a dead effect re-armed, the outbox) and routed row
demands (IK002 recording nothing, an entry parked with its demand and
replayed), each passing values the way the driver binds them.  test_psycopg.py and test_psycopg2.py
give each driver's own adapters; run.py runs them.
"""

import contextlib
import datetime
import decimal
from zoneinfo import ZoneInfo

BERLIN = ZoneInfo("Europe/Berlin")
UTC = datetime.timezone.utc


class Scenarios:
    """Checks of one driver.  A subclass sets NAME and implements connect(),
    sqlstate() and jsonb()."""

    NAME = None

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

    def fails_with(self, state, sql, params=None, cur=None):
        """Run sql (on cur, else on a cursor of the test's connection), which
        must fail with SQLSTATE state; return the error."""
        try:
            if cur is None:
                self.execute(sql, params)
            else:
                cur.execute(sql, params)
        except Exception as exc:     # the driver's own error class
            got = self.sqlstate(exc)
            assert got == state, f"expected SQLSTATE {state}, got {got}: {exc}"
            return exc
        raise AssertionError(f"expected SQLSTATE {state}, the statement succeeded")

    @contextlib.contextmanager
    def routed_database(self, name, *setup):
        """A cursor on a database of its own whose routed tables are made,
        not distributed, by the function idem_citus_distribute() uses, after
        the statements of setup; the database is dropped afterwards."""
        db = f"client_{name}_{self.NAME}"
        self.execute(f"drop database if exists {db}")
        self.execute(f"create database {db}")
        conn = self.connect(db)
        try:
            cur = conn.cursor()
            cur.execute("create extension idem_consumer")
            for sql in setup:
                cur.execute(sql)
            cur.execute("select idem_consumer.routed_storage_create('bigint')")
            yield cur
            cur.close()
        finally:
            conn.close()
            self.execute(f"drop database {db}")

    def paid(self, order_id):
        return self.execute(f"select paid from {self.orders} where id = %s", (order_id,))[0]

    def processed(self, key):
        return self.execute("select idem_is_processed(%s, %s)", (key, self.consumer))[0]

    # each value written by its type's output function into params
    TYPED = "select idem_apply(%s, %s, %s, ARRAY[%s::text, %s::text, %s::text, %s::text, %s::text])"

    def apply_v(self, key, amount, paid_at, doc, note, order_id):
        return self.execute(
            self.TYPED,
            (key, self.consumer, self.pay_sql, amount, paid_at, self.jsonb(doc), note, order_id))[0]

    # -- the scenarios -----------------------------------------------------

    def test_typed_redelivery_is_duplicate(self):
        """(a) typed values in params apply once; a redelivery writing the values
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
        # None is NULL, as its parameter's value
        assert self.apply_v("a-2", decimal.Decimal("1"), datetime.datetime(2026, 1, 1, tzinfo=UTC),
                            {}, None, 5) is True
        assert self.execute(f"select note is null from {self.payments} where order_id = 5")[0] is True

    def test_other_value_is_key_reuse(self):
        """(b) another value under the same key raises IK001 and runs nothing."""
        assert self.apply_v("b-1", decimal.Decimal("5"),
                            datetime.datetime(2026, 1, 2, tzinfo=UTC), {}, "b", 2) is True
        self.fails_with("IK001",
                        self.TYPED,
                        ("b-1", self.consumer, self.pay_sql, decimal.Decimal("5.01"),
                         datetime.datetime(2026, 1, 2, tzinfo=UTC), self.jsonb({}), "b", 2))
        self.fails_with("IK001",
                        self.TYPED,
                        ("b-1", self.consumer, self.pay_sql, decimal.Decimal("5"),
                         datetime.datetime(2026, 1, 2, 0, 0, 1, tzinfo=UTC), self.jsonb({}), "b", 2))
        assert self.paid(2) == decimal.Decimal("5"), self.paid(2)

    def test_event_before_its_order(self):
        """(c) idem_apply with expect_rows => 1: the update of an order
        that does not exist yet raises IK002 and records nothing; once the
        order exists the redelivery applies, then it is a duplicate."""
        params = [str(decimal.Decimal("7.50")), str(101)]
        call = "select idem_apply(%s, %s, %s, %s, expect_rows => 1)"
        self.fails_with("IK002", call, ("c-1", self.consumer, self.rows_sql, params))
        assert self.processed("c-1") is False
        self.execute(f"insert into {self.orders} (id) values (101)")
        assert self.execute(call, ("c-1", self.consumer, self.rows_sql, params))[0] is True
        assert self.execute(call, ("c-1", self.consumer, self.rows_sql, params))[0] is False
        assert self.processed("c-1") is True
        assert self.paid(101) == decimal.Decimal("7.50"), self.paid(101)

    def test_try_apply_rows(self):
        """(c) idem_try_apply with expect_rows: IK002 is transient by
        default (raised, nothing parked); then applied, then duplicate."""
        params = [str(decimal.Decimal("2.25")), str(102)]
        call = "select idem_try_apply(%s, %s, %s, %s, expect_rows => 1)::text"
        self.fails_with("IK002", call, ("c-2", self.consumer, self.rows_sql, params))
        assert self.processed("c-2") is False
        parked = self.execute("select count(*) from idem_dead_letters where consumer = %s and key = %s",
                              (self.consumer, "c-2"))[0]
        assert parked == 0, parked
        self.execute(f"insert into {self.orders} (id) values (102)")
        assert self.execute(call, ("c-2", self.consumer, self.rows_sql, params)) == ("applied",)
        assert self.execute(call, ("c-2", self.consumer, self.rows_sql, params)) == ("duplicate",)
        assert self.paid(102) == decimal.Decimal("2.25"), self.paid(102)

    def test_typed_rows_form(self):
        """(c) typed values (Decimal and int) with expect_rows: IK002 before
        the order, nothing recorded; then applied; a redelivery writing the
        amount another way is a duplicate."""
        call = "select idem_apply(%s, %s, %s, ARRAY[%s::text, %s::text], expect_rows => %s)"
        self.fails_with("IK002", call, ("c-3", self.consumer, self.rows_sql, decimal.Decimal("3.5"), 103, 1))
        assert self.processed("c-3") is False
        self.execute(f"insert into {self.orders} (id) values (103)")
        assert self.execute(call, ("c-3", self.consumer, self.rows_sql, decimal.Decimal("3.5"), 103, 1))[0] is True
        assert self.execute(call, ("c-3", self.consumer, self.rows_sql, decimal.Decimal("3.50"), 103, 1))[0] is False
        self.fails_with("IK001", call, ("c-3", self.consumer, self.rows_sql, decimal.Decimal("3.51"), 103, 1))
        assert self.paid(103) == decimal.Decimal("3.5"), self.paid(103)

        try_call = "select idem_try_apply(%s, %s, %s, ARRAY[%s::text, %s::text], expect_rows => %s)::text"
        self.fails_with("IK002", try_call, ("c-4", self.consumer, self.rows_sql, decimal.Decimal("1.25"), 104, 1))
        assert self.processed("c-4") is False
        self.execute(f"insert into {self.orders} (id) values (104)")
        assert self.execute(try_call, ("c-4", self.consumer, self.rows_sql,
                                       decimal.Decimal("1.25"), 104, 1)) == ("applied",)
        assert self.execute(try_call, ("c-4", self.consumer, self.rows_sql,
                                       decimal.Decimal("1.250"), 104, 1)) == ("duplicate",)
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
        with self.routed_database("routed", "create table payments (order_id bigint, msg text)") as cur:
            sql = "insert into public.payments (order_id, msg) values ($1::bigint, $2)"
            applied = []
            for route in (7, 7, 8):
                cur.execute("select idem_apply(%s, %s, %s, %s, route => %s)",
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
                cur.execute("select idem_try_apply(%s, %s, %s, %s, route => %s)",
                            ("d-1", "routed", sql, ["9", "bad"], 9))
                outcomes.append(cur.fetchone()[0])
            assert outcomes == ["dead_lettered", "dead_lettered"], outcomes
            cur.execute("select route, status, sqlstate from idem_routed_dead_letters")
            assert cur.fetchall() == [(9, "pending", "23514")]
            cur.execute("alter table payments drop constraint no_bad")
            cur.execute("select idem_dlq_replay(%s, %s, %s)", ("d-1", "routed", 9))
            assert cur.fetchone()[0] == "applied"
            cur.execute("select idem_try_apply(%s, %s, %s, %s, route => %s)",
                        ("d-1", "routed", sql, ["9", "bad"], 9))
            assert cur.fetchone()[0] == "duplicate"
            cur.execute("select count(*) from payments where msg = 'bad'")
            assert cur.fetchone()[0] == 1
            batch = "select key, route from idem_record_batch(%s, %s, NULL, %s) order by 2, 1"
            cur.execute(batch, ("routed", ["b-1", "b-2", "b-1"], [7, 7, 8]))
            assert cur.fetchall() == [("b-1", "7"), ("b-2", "7"), ("b-1", "8")]
            cur.execute(batch, ("routed", ["b-2", "b-3", "b-1"], [7, 7, 8]))
            assert cur.fetchall() == [("b-3", "7")]

    def test_routed_rows(self):
        """Routed row demands (docs/expect-rows.md with a route) with the
        route and expect_rows bound as the driver binds an int:
        idem_apply with both applies, then a duplicate is false; an update
        of a missing row is IK002 and records nothing.  idem_try_apply
        with both raises IK002 by default; with IK002 not
        transient it parks the message with its demand, and the replay
        demands the rows again: parked again while the row is missing,
        applied once it exists.  In a database of its own."""
        settle = "update public.orders_due set due = due - $2::int where order_id = $1::bigint"
        apply = "select idem_apply(%s, %s, %s, %s, route => %s, expect_rows => %s)"
        try_apply = ("select idem_try_apply(%s, %s, %s, %s,"
                     " route => %s, expect_rows => %s)::text")
        consumer = "settle"

        def message(key, order_id, amount):
            return (key, consumer, settle, [str(order_id), str(amount)], order_id, 1)

        with self.routed_database("routed_rows",
                                  "create table orders_due (order_id bigint primary key, due int not null)",
                                  "insert into orders_due values (21, 10)") as cur:
            def one(sql, params=None):
                cur.execute(sql, params)
                return cur.fetchone()

            def due(order_id):
                row = one("select due from orders_due where order_id = %s", (order_id,))
                return row and row[0]

            def processed(key, route):
                return one("select idem_is_processed(%s, %s, %s)", (key, consumer, route))[0]

            def stored(key):
                return one("select (select count(*) from idem_consumer.routed_keys where consumer = %s and key = %s),"
                           " (select count(*) from idem_routed_dead_letters where consumer = %s and key = %s)",
                           (consumer, key, consumer, key))

            def parked(key):
                cur.execute("select route, status, sqlstate, attempts, expect_rows from idem_routed_dead_letters"
                            " where consumer = %s and key = %s", (consumer, key))
                return cur.fetchall()

            # applied with its rows, then a duplicate
            assert one(apply, message("rr-1", 21, 4)) == (True,)
            assert due(21) == 6, due(21)
            assert one(apply, message("rr-1", 21, 4)) == (False,)
            assert due(21) == 6, due(21)
            assert processed("rr-1", 21) is True
            assert processed("rr-1", 22) is False
            # a missing row: IK002, nothing recorded
            self.fails_with("IK002", apply, message("rr-2", 22, 4), cur=cur)
            assert processed("rr-2", 22) is False
            assert stored("rr-2") == (0, 0), stored("rr-2")
            assert due(22) is None

            # the try form: IK002 transient by default, raised and nothing parked
            self.fails_with("IK002", try_apply, message("rr-3", 24, 3), cur=cur)
            assert stored("rr-3") == (0, 0), stored("rr-3")
            cur.execute("set idem_consumer.transient_sqlstates = '40001'")
            assert one(try_apply, message("rr-3", 24, 3)) == ("dead_lettered",)
            assert parked("rr-3") == [(24, "pending", "IK002", 1, 1)], parked("rr-3")
            # the key is recorded with its entry (docs/expect-rows.md), the row not written
            assert stored("rr-3") == (1, 1), stored("rr-3")
            assert processed("rr-3", 24) is True
            assert due(24) is None
            # the replay demands the rows again: still missing, parked again
            assert one("select idem_dlq_replay(%s, %s, %s)", ("rr-3", consumer, 24)) == ("dead_lettered",)
            assert parked("rr-3") == [(24, "pending", "IK002", 2, 1)], parked("rr-3")
            assert due(24) is None
            # the row there: applied
            cur.execute("insert into orders_due values (24, 5)")
            assert one("select idem_dlq_replay(%s, %s, %s)", ("rr-3", consumer, 24)) == ("applied",)
            assert due(24) == 2, due(24)
            assert parked("rr-3") == [(24, "replayed", "IK002", 3, 1)], parked("rr-3")
            assert stored("rr-3") == (1, 1), stored("rr-3")
            assert one(try_apply, message("rr-3", 24, 3)) == ("duplicate",)
            assert one(try_apply, message("rr-4", 21, 1)) == ("applied",)
            assert (due(21), due(24)) == (5, 2), (due(21), due(24))
            cur.execute("reset idem_consumer.transient_sqlstates")

    # -- routed external effects (docs/effects.md, with a route as in
    #    docs/citus.md), the route bound as the driver binds an int

    ACCOUNTS = ("create table accounts (id bigint primary key, charged numeric not null default 0)",
                "insert into accounts (id) select generate_series(1, 20)")
    CHARGE_SQL = "update public.accounts set charged = charged + $1::numeric where id = $2::bigint"
    EFFECT_COLUMNS = "action::text, fence, provider_key, attempt, outcome_unknown, result, last_error"

    def begin_routed(self, cur, key, route, request, lease="30 seconds"):
        """idem_effect_begin with a route: (action, fence, provider_key, attempt,
        outcome_unknown, result, last_error)."""
        cur.execute(f"select {self.EFFECT_COLUMNS} from idem_effect_begin(%s, %s, route => %s,"
                    f" request => %s, lease => %s::interval)",
                    ("charges", key, route, self.jsonb(request), lease))
        return cur.fetchone()

    def complete_routed(self, cur, key, fence, result, route, amount):
        """idem_effect_complete with a route and the business SQL charging the
        account of the route."""
        cur.execute("select idem_effect_complete(%s, %s, %s, %s, route => %s, sql => %s, params => %s)",
                    ("charges", key, fence, self.jsonb(result), route, self.CHARGE_SQL,
                     [str(amount), str(route)]))

    @staticmethod
    def routed_effect(cur, key):
        cur.execute("select route, state, fence, attempts, result from idem_routed_effects"
                    " where consumer = 'charges' and key = %s", (key,))
        return cur.fetchall()

    @staticmethod
    def charged(cur, account):
        cur.execute("select charged from accounts where id = %s", (account,))
        return cur.fetchone()[0]

    def test_routed_effect_inline(self):
        """Routed effect, inline: begin executes under fence 1; complete
        stores the result and runs the business SQL on the route's row in
        one statement; a second begin replays the stored result and the
        row is charged once."""
        with self.routed_database("routed_effects", *self.ACCOUNTS) as cur:
            action, fence, provider_key, attempt, unknown, result, _ = \
                self.begin_routed(cur, "ch-1", 7, {"amount": 5})
            assert (action, fence, attempt, unknown, result) == ("execute", 1, 1, False, None)
            assert len(provider_key) == 36, provider_key
            assert self.routed_effect(cur, "ch-1") == [(7, "in_flight", 1, 1, None)]
            self.complete_routed(cur, "ch-1", fence, {"charge": "ch_1"}, 7, decimal.Decimal("5.00"))
            assert self.routed_effect(cur, "ch-1") == [(7, "completed", 1, 1, {"charge": "ch_1"})]
            again = self.begin_routed(cur, "ch-1", 7, {"amount": 5})
            assert again[:3] == ("replay", None, provider_key), again
            assert again[5] == {"charge": "ch_1"}, again
            assert self.charged(cur, 7) == decimal.Decimal("5.00"), self.charged(cur, 7)
            assert self.charged(cur, 8) == 0, self.charged(cur, 8)

    def test_routed_effect_fenced_off(self):
        """Routed effect: once a lease of 1 ms has expired, the next begin
        takes it over (fence 2, outcome unknown, the same provider key); the
        late holder's complete is IE001 and its business SQL rolls back; its
        heartbeat is false, the new holder's true; the new holder
        completes."""
        with self.routed_database("routed_effects", *self.ACCOUNTS) as cur:
            late = self.begin_routed(cur, "ch-2", 8, {"amount": 3}, "1 millisecond")
            assert late[:2] == ("execute", 1), late
            cur.execute("select pg_sleep(0.05)")
            taker = self.begin_routed(cur, "ch-2", 8, {"amount": 3})
            assert (taker[0], taker[1], taker[3], taker[4]) == ("execute", 2, 2, True), taker
            assert taker[2] == late[2], (taker, late)
            self.fails_with("IE001", "select idem_effect_complete(%s, %s, %s, %s, route => %s,"
                            " sql => %s, params => %s)",
                            ("charges", "ch-2", late[1], self.jsonb({"charge": "late"}), 8,
                             self.CHARGE_SQL, ["3", "8"]), cur=cur)
            assert self.charged(cur, 8) == 0, self.charged(cur, 8)
            heartbeat = "select idem_effect_heartbeat(%s, %s, %s, '1 minute', route => %s)"
            beats = []
            for fence in (late[1], taker[1]):
                cur.execute(heartbeat, ("charges", "ch-2", fence, 8))
                beats.append(cur.fetchone()[0])
            assert beats == [False, True], beats
            self.complete_routed(cur, "ch-2", taker[1], {"charge": "ch_2"}, 8, 3)
            assert self.routed_effect(cur, "ch-2") == [(8, "completed", 2, 2, {"charge": "ch_2"})]
            assert self.charged(cur, 8) == 3, self.charged(cur, 8)

    def test_routed_effect_dead_letter(self):
        """Routed effect: a permanent failure is dead, parked in
        idem_routed_dead_letters under its route (kind effect, IE003); begin
        then says dead; idem_dlq_replay by key and route re-arms it (waiting, the
        entry replayed) and the next begin executes it under a new fence."""
        with self.routed_database("routed_effects", *self.ACCOUNTS) as cur:
            first = self.begin_routed(cur, "ch-3", 9, {"amount": 4})
            assert first[:2] == ("execute", 1), first
            cur.execute("select idem_effect_fail(%s, %s, %s, %s, route => %s, retryable => false)::text",
                        ("charges", "ch-3", first[1], "card declined", 9))
            assert cur.fetchone()[0] == "dead"
            entries = "select route, kind, status, sqlstate, message from idem_routed_dead_letters"
            cur.execute(entries)
            assert cur.fetchall() == [(9, "effect", "pending", "IE003", "card declined")]
            dead = self.begin_routed(cur, "ch-3", 9, {"amount": 4})
            assert (dead[0], dead[6]) == ("dead", "card declined"), dead
            cur.execute("select idem_dlq_replay(%s, %s, %s)", ("ch-3", "charges", 9))
            assert cur.fetchone()[0] == "applied"
            assert self.routed_effect(cur, "ch-3")[0][1] == "waiting"
            cur.execute(entries)
            assert cur.fetchall() == [(9, "effect", "replayed", "IE003", "card declined")]
            again = self.begin_routed(cur, "ch-3", 9, {"amount": 4})
            assert (again[0], again[1], again[3]) == ("execute", 2, 1), again
            self.complete_routed(cur, "ch-3", again[1], {"charge": "ch_3"}, 9, 4)
            assert self.routed_effect(cur, "ch-3") == [(9, "completed", 2, 1, {"charge": "ch_3"})]
            assert self.charged(cur, 9) == 4, self.charged(cur, 9)

    def test_routed_effect_outbox(self):
        """Routed outbox: an enqueue with a route commits (or rolls back)
        with the business transaction; a duplicate enqueue is false; a claim
        of one route leases its effect, a claim of every route (a NULL of
        the routes' type; an untyped NULL is no route, 0A000) the others,
        each with its route as text; begin and claim are 25001 in a
        transaction block; the effect functions without a route are 0A000
        and store nothing."""
        with self.routed_database("routed_effects", *self.ACCOUNTS) as cur:
            enqueue = "select idem_effect_enqueue(%s, %s, %s, route => %s)"
            added = []
            cur.execute("begin")
            cur.execute("update accounts set charged = charged + 1 where id = 10")
            for key, route in (("o-1", 10), ("o-2", 11), ("o-3", 12), ("o-1", 10)):
                cur.execute(enqueue, ("charges", key, self.jsonb({"n": key}), route))
                added.append(cur.fetchone()[0])
            cur.execute("commit")
            assert added == [True, True, True, False], added
            cur.execute("begin")
            cur.execute(enqueue, ("charges", "o-4", self.jsonb({"n": "o-4"}), 13))
            cur.execute("rollback")
            cur.execute("select route, key, state from idem_routed_effects order by key")
            assert cur.fetchall() == [(10, "o-1", "pending"), (11, "o-2", "pending"), (12, "o-3", "pending")]
            assert self.charged(cur, 10) == 1, self.charged(cur, 10)

            claim = "select key, route, request, fence, attempt from idem_effect_claim(%s, route => {}) order by key"
            self.fails_with("0A000", claim.format("NULL"), ("charges",), cur=cur)
            cur.execute(claim.format("%s"), ("charges", 10))
            assert cur.fetchall() == [("o-1", "10", {"n": "o-1"}, 1, 1)]
            cur.execute(claim.format("%s::bigint"), ("charges", None))
            assert cur.fetchall() == [("o-2", "11", {"n": "o-2"}, 1, 1), ("o-3", "12", {"n": "o-3"}, 1, 1)]
            cur.execute("select key, state from idem_routed_effects order by key")
            assert cur.fetchall() == [("o-1", "in_flight"), ("o-2", "in_flight"), ("o-3", "in_flight")]
            self.complete_routed(cur, "o-2", 1, {"done": True}, 11, 2)
            assert self.routed_effect(cur, "o-2")[0][1] == "completed"
            assert self.charged(cur, 11) == 2, self.charged(cur, 11)

            for sql, params in ((f"select {self.EFFECT_COLUMNS} from idem_effect_begin(%s, %s, route => %s)",
                                 ("charges", "tx-1", 7)),
                                (claim.format("%s::bigint"), ("charges", None))):
                cur.execute("begin")
                self.fails_with("25001", sql, params, cur=cur)
                cur.execute("rollback")
            for sql, params in (("select * from idem_effect_begin(%s, %s)", ("charges", "u-1")),
                                ("select idem_effect_enqueue(%s, %s, %s)", ("charges", "u-2", self.jsonb({}))),
                                ("select * from idem_effect_claim(%s)", ("charges",))):
                self.fails_with("0A000", sql, params, cur=cur)
            cur.execute("select count(*) from idem_routed_effects where key in ('tx-1', 'u-1', 'u-2')")
            assert cur.fetchone()[0] == 0

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
