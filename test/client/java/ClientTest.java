// idem_consumer 1.2 from pgjdbc: BigDecimal, OffsetDateTime, long, String
// and a jsonb PGobject bound with PreparedStatement.setObject, as a Java
// consumer binds a message's values.  Checks typed values in params as
// ARRAY[?::text, ...] (a redelivery writing a value another way is a
// duplicate, another value under the key is IK001, null stays NULL),
// expect_rows with text[] and typed values (an event before its order
// raises IK002 and records nothing), the
// text[] form from createArrayOf("text"), routed keys, routed external
// effects (the inline cycle, a fenced-off complete, a dead effect re-armed,
// the outbox), routed row demands (IK002 recording nothing, an entry
// parked with its demand, its replay demanding the rows again), and the
// JDBC example of docs/clients.md (DocsExample.java, generated from it by
// run).
//
// Prints TAP lines and the "# pass N" / "# fail N" summary that
// test/run-tests counts; each test is bounded in time.  Connects to
// 127.0.0.1:PGPORT, database PGDATABASE, as PGUSER.

import java.math.BigDecimal;
import java.sql.Array;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.time.OffsetDateTime;
import java.time.ZoneId;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.postgresql.util.PGobject;

public class ClientTest {
    static final int TEST_TIMEOUT = 60;     // seconds for one test
    static final String CONSUMER = "payments-jdbc";
    static final String PAY_SQL =
        "with p as (insert into public.payments_jdbc (amount, paid_at, doc, note, order_id)"
        + " values ($1, $2, $3, $4, $5) returning order_id, amount)"
        + " update public.orders_jdbc o set paid = o.paid + p.amount from p where o.id = p.order_id";
    static final String ROWS_SQL = "update public.orders_jdbc set paid = paid + $1 where id = $2";
    static final OffsetDateTime BERLIN_10H =
        OffsetDateTime.of(2026, 1, 1, 10, 0, 0, 0, ZoneId.of("Europe/Berlin").getRules()
                          .getOffset(java.time.LocalDateTime.of(2026, 1, 1, 10, 0)));
    static final OffsetDateTime UTC_9H = OffsetDateTime.of(2026, 1, 1, 9, 0, 0, 0, ZoneOffset.UTC);

    static Connection conn;

    interface Body { void run() throws Exception; }

    static Connection connect() throws SQLException {
        String url = "jdbc:postgresql://127.0.0.1:" + System.getenv("PGPORT") + "/" + System.getenv("PGDATABASE");
        Properties p = new Properties();
        p.setProperty("user", System.getenv("PGUSER"));
        p.setProperty("options", "-c statement_timeout=20s");
        p.setProperty("connectTimeout", "10");
        p.setProperty("socketTimeout", String.valueOf(TEST_TIMEOUT));
        return DriverManager.getConnection(url, p);
    }

    static void exec(String sql) throws SQLException {
        try (Statement s = conn.createStatement()) {
            s.execute(sql);
        }
    }

    // the first row of a query, its columns as objects; null when no row
    static Object[] row(PreparedStatement ps) throws SQLException {
        try (ResultSet rs = ps.executeQuery()) {
            if (!rs.next())
                return null;
            Object[] r = new Object[rs.getMetaData().getColumnCount()];
            for (int i = 0; i < r.length; i++)
                r[i] = rs.getObject(i + 1);
            return r;
        }
    }

    static Object one(String sql, Object... params) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            for (int i = 0; i < params.length; i++)
                ps.setObject(i + 1, params[i]);
            return row(ps)[0];
        }
    }

    static void check(boolean ok, String what) {
        if (!ok)
            throw new AssertionError(what);
    }

    static void equal(Object got, Object want, String what) {
        if (want == null ? got != null : !(want instanceof BigDecimal
                ? got instanceof BigDecimal && ((BigDecimal) got).compareTo((BigDecimal) want) == 0
                : want.equals(got)))
            throw new AssertionError(what + ": expected " + want + ", got " + got);
    }

    // run body, which must fail with SQLSTATE state
    static void failsWith(String state, Body body) throws Exception {
        try {
            body.run();
        } catch (SQLException e) {
            if (!state.equals(e.getSQLState()))
                throw new AssertionError("expected SQLSTATE " + state + ", got " + e.getSQLState() + ": " + e.getMessage());
            return;
        }
        throw new AssertionError("expected SQLSTATE " + state + ", the statement succeeded");
    }

    static PGobject jsonb(String text) throws SQLException {
        PGobject o = new PGobject();
        o.setType("jsonb");
        o.setValue(text);
        return o;
    }

    static Boolean applyV(String key, BigDecimal amount, OffsetDateTime paidAt, String doc, String note, long orderId)
            throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(
                "select idem_apply(?, ?, ?, ARRAY[?::text, ?::text, ?::text, ?::text, ?::text])")) {
            ps.setObject(1, key);
            ps.setObject(2, CONSUMER);
            ps.setObject(3, PAY_SQL);
            ps.setObject(4, amount);
            ps.setObject(5, paidAt);
            ps.setObject(6, jsonb(doc));
            ps.setObject(7, note);
            ps.setObject(8, orderId);
            return (Boolean) row(ps)[0];
        }
    }

    static BigDecimal paid(long orderId) throws SQLException {
        return (BigDecimal) one("select paid from orders_jdbc where id = ?", orderId);
    }

    static Boolean processed(String key) throws SQLException {
        return (Boolean) one("select idem_is_processed(?, ?)", key, CONSUMER);
    }

    // (a) typed values in params apply once; a redelivery writing the values
    // another way (10.0 / 10.00, the instant at another offset, jsonb keys
    // in another order) is a duplicate; the balance is exact; a null value
    // is NULL
    static void typedRedeliveryIsDuplicate() throws Exception {
        equal(applyV("a-1", new BigDecimal("10.0"), BERLIN_10H, "{\"card\": \"visa\", \"tags\": [\"x\"]}", "first", 1L),
              true, "first delivery");
        equal(applyV("a-1", new BigDecimal("10.00"), UTC_9H, "{\"tags\": [\"x\"], \"card\": \"visa\"}", "first", 1L),
              false, "redelivery");
        equal(paid(1), new BigDecimal("10.0"), "paid");
        equal(one("select count(*) from payments_jdbc where order_id = 1"), 1L, "payments");
        equal(applyV("a-2", new BigDecimal("1"), UTC_9H, "{}", null, 5L), true, "a null note");
        equal(one("select note is null from payments_jdbc where order_id = 5"), true, "stored as NULL");
    }

    // (b) another value under the key is IK001 and runs nothing
    static void otherValueIsKeyReuse() throws Exception {
        equal(applyV("b-1", new BigDecimal("5"), UTC_9H, "{}", "b", 2L), true, "first delivery");
        failsWith("IK001", () -> applyV("b-1", new BigDecimal("5.01"), UTC_9H, "{}", "b", 2L));
        failsWith("IK001", () -> applyV("b-1", new BigDecimal("5"), UTC_9H.plusSeconds(1), "{}", "b", 2L));
        failsWith("IK001", () -> applyV("b-1", new BigDecimal("5"), UTC_9H, "{\"a\": 1}", "b", 2L));
        equal(paid(2), new BigDecimal("5"), "paid");
    }

    static Object[] rowsCall(String sql, String key, String... params) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(sql)) {
            ps.setString(1, key);
            ps.setString(2, CONSUMER);
            ps.setString(3, ROWS_SQL);
            ps.setArray(4, conn.createArrayOf("text", params));
            return row(ps);
        }
    }

    // (c) idem_apply with expect_rows => 1: an event before its order
    // raises IK002 and records nothing; after the order the redelivery applies
    static void eventBeforeItsOrder() throws Exception {
        String call = "select idem_apply(?, ?, ?, ?, expect_rows => 1)";
        String[] params = {new BigDecimal("7.50").toString(), Long.toString(101L)};
        failsWith("IK002", () -> rowsCall(call, "c-1", params));
        equal(processed("c-1"), false, "processed after IK002");
        exec("insert into orders_jdbc (id) values (101)");
        equal(rowsCall(call, "c-1", params)[0], true, "the redelivery applies");
        equal(rowsCall(call, "c-1", params)[0], false, "a duplicate");
        equal(processed("c-1"), true, "processed");
        equal(paid(101), new BigDecimal("7.50"), "paid");
    }

    // (c) idem_try_apply with expect_rows: IK002 is transient by default
    // (raised, nothing parked), then applied, then duplicate
    static void tryApplyRows() throws Exception {
        String call = "select idem_try_apply(?, ?, ?, ?, expect_rows => 1)::text";
        String[] params = {new BigDecimal("2.25").toString(), Long.toString(102L)};
        failsWith("IK002", () -> rowsCall(call, "c-2", params));
        equal(processed("c-2"), false, "processed after IK002");
        equal(one("select count(*) from idem_dead_letters where consumer = ? and key = ?", CONSUMER, "c-2"), 0L,
              "parked");
        exec("insert into orders_jdbc (id) values (102)");
        equal(rowsCall(call, "c-2", params)[0], "applied", "outcome");
        equal(rowsCall(call, "c-2", params)[0], "duplicate", "outcome of the redelivery");
        equal(paid(102), new BigDecimal("2.25"), "paid");
    }

    static Object[] rowsV(String call, String key, BigDecimal amount, long orderId) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(call)) {
            ps.setObject(1, key);
            ps.setObject(2, CONSUMER);
            ps.setObject(3, ROWS_SQL);
            ps.setObject(4, amount);
            ps.setObject(5, orderId);
            ps.setObject(6, 1L);
            return row(ps);
        }
    }

    // (c) typed values (BigDecimal and long) with expect_rows: IK002 before
    // the order, nothing recorded; then applied; a redelivery writing the
    // amount another way is a duplicate
    static void typedRowsForm() throws Exception {
        String call = "select idem_apply(?, ?, ?, ARRAY[?::text, ?::text], expect_rows => ?)";
        failsWith("IK002", () -> rowsV(call, "c-3", new BigDecimal("3.5"), 103L));
        equal(processed("c-3"), false, "processed after IK002");
        exec("insert into orders_jdbc (id) values (103)");
        equal(rowsV(call, "c-3", new BigDecimal("3.5"), 103L)[0], true, "applied");
        equal(rowsV(call, "c-3", new BigDecimal("3.50"), 103L)[0], false, "a duplicate");
        failsWith("IK001", () -> rowsV(call, "c-3", new BigDecimal("3.51"), 103L));
        equal(paid(103), new BigDecimal("3.5"), "paid");

        String tryCall = "select idem_try_apply(?, ?, ?, ARRAY[?::text, ?::text], expect_rows => ?)::text";
        failsWith("IK002", () -> rowsV(tryCall, "c-4", new BigDecimal("1.25"), 104L));
        equal(processed("c-4"), false, "processed after IK002");
        exec("insert into orders_jdbc (id) values (104)");
        equal(rowsV(tryCall, "c-4", new BigDecimal("1.25"), 104L)[0], "applied", "outcome");
        equal(rowsV(tryCall, "c-4", new BigDecimal("1.250"), 104L)[0], "duplicate", "outcome of the redelivery");
        equal(paid(104), new BigDecimal("1.25"), "paid");
    }

    // (d) idem_apply with createArrayOf("text"): applies once; the
    // toString() of equal values written another way is a duplicate;
    // another value is IK001
    static void textArrayForm() throws Exception {
        String call = "select idem_apply(?, ?, ?, ?)";
        Body first = () -> equal(applyText(call, new BigDecimal("4.0"), BERLIN_10H, "{\"a\": 1, \"b\": 2}"),
                                 true, "first delivery");
        first.run();
        equal(applyText(call, new BigDecimal("4.00"), UTC_9H, "{\"b\": 2, \"a\": 1}"), false, "redelivery");
        failsWith("IK001", () -> applyText(call, new BigDecimal("4.01"), UTC_9H, "{}"));
        equal(paid(3), new BigDecimal("4.0"), "paid");
    }

    static Boolean applyText(String call, BigDecimal amount, OffsetDateTime at, String doc) throws SQLException {
        try (PreparedStatement ps = conn.prepareStatement(call)) {
            ps.setString(1, "d-1");
            ps.setString(2, CONSUMER);
            ps.setString(3, PAY_SQL);
            ps.setArray(4, conn.createArrayOf("text",
                new Object[] {amount.toString(), at.toString(), doc, "text form", Long.toString(3L)}));
            return (Boolean) row(ps)[0];
        }
    }

    // Routed keys (docs/citus.md) with the route bound by setLong: stored
    // with it, a redelivery a duplicate, the same key under another route
    // another key; a call without a route 0A000; a failing message parked
    // under its route and applied once by its replay.  In a database of its
    // own, its routed tables made, not distributed, by the function
    // idem_citus_distribute() uses.
    static void routedKeys() throws Exception {
        routedDatabase("client_routed_jdbc", c -> {
            try (Statement s = c.createStatement()) {
                s.execute("create table payments (order_id bigint, msg text)");
                String call = "select idem_apply(?, ?, ?, ?, route => ?)";
                String sql = "insert into public.payments (order_id, msg) values ($1::bigint, $2)";
                List<Object> applied = new ArrayList<>();
                for (long route : new long[] {7, 7, 8}) {
                    try (PreparedStatement ps = c.prepareStatement(call)) {
                        ps.setString(1, "r-1");
                        ps.setString(2, "routed");
                        ps.setString(3, sql);
                        ps.setArray(4, c.createArrayOf("text", new String[] {String.valueOf(route), "r-1"}));
                        ps.setLong(5, route);
                        try (ResultSet rs = ps.executeQuery()) {
                            rs.next();
                            applied.add(rs.getBoolean(1));
                        }
                    }
                }
                equal(applied, List.of(true, false, true), "applied, again, under another route");
                try (ResultSet rs = s.executeQuery(
                        "select string_agg(route || ':' || key, ',' order by route) from idem_consumer.routed_keys")) {
                    rs.next();
                    equal(rs.getString(1), "7:r-1,8:r-1", "routed keys");
                }
                failsWith("0A000", () -> s.executeQuery("select idem_apply('r-2', 'routed', 'select 1')").close());

                s.execute("alter table payments add constraint no_bad check (msg <> 'bad')");
                String tryApply = "select idem_try_apply(?, ?, ?, ?, route => ?)";
                List<Object> outcomes = new ArrayList<>();
                for (int i = 0; i < 3; i++) {
                    if (i == 2) {
                        s.execute("alter table payments drop constraint no_bad");
                        try (ResultSet rs = s.executeQuery(
                                "select idem_dlq_replay('d-1', 'routed', 9::bigint)")) {
                            rs.next();
                            outcomes.add(rs.getString(1));
                        }
                    }
                    try (PreparedStatement ps = c.prepareStatement(tryApply)) {
                        ps.setString(1, "d-1");
                        ps.setString(2, "routed");
                        ps.setString(3, sql);
                        ps.setArray(4, c.createArrayOf("text", new String[] {"9", "bad"}));
                        ps.setLong(5, 9L);
                        try (ResultSet rs = ps.executeQuery()) {
                            rs.next();
                            outcomes.add(rs.getString(1));
                        }
                    }
                }
                equal(outcomes, List.of("dead_lettered", "dead_lettered", "applied", "duplicate"),
                      "parked, parked again, replayed, then a duplicate");
                try (ResultSet rs = s.executeQuery("select count(*) from payments where msg = 'bad'")) {
                    rs.next();
                    equal(rs.getLong(1), 1L, "the parked message applied once");
                }
            }
        });
    }

    // Routed row demands (docs/expect-rows.md with a route), the route and
    // expect_rows bound by setLong: idem_apply with both applies, then a
    // duplicate is false; an update of a missing row is IK002 and records
    // nothing.  idem_try_apply with both raises IK002 by
    // default; with IK002 not transient it parks the message with its
    // demand, and the replay demands the rows again: parked again while the
    // row is missing, applied once it exists.  In a database of its own.
    static final String SETTLE_SQL = "update public.orders_due set due = due - $2::int where order_id = $1::bigint";

    // the message paying amount off the order, routed by the order's id,
    // demanding one row, as parameters of rows()
    static Object[] settle(String key, long orderId, int amount) {
        return new Object[] {key, "settle", SETTLE_SQL,
                             new String[] {String.valueOf(orderId), String.valueOf(amount)}, orderId, 1L};
    }

    static void routedRows() throws Exception {
        routedDatabase("client_routed_rows_jdbc", c -> {
            String apply = "select idem_apply(?, ?, ?, ?, route => ?, expect_rows => ?)";
            String tryApply = "select idem_try_apply(?, ?, ?, ?,"
                + " route => ?, expect_rows => ?)::text";
            String replay = "select idem_dlq_replay(?, ?, ?)";
            String due = "select due from orders_due where order_id = ?";
            String processed = "select idem_is_processed(?, ?, ?)";
            String stored = "select (select count(*) from idem_consumer.routed_keys where consumer = ? and key = ?),"
                + " (select count(*) from idem_routed_dead_letters where consumer = ? and key = ?)";
            String parked = "select route, status, sqlstate, attempts, expect_rows from idem_routed_dead_letters"
                + " where consumer = ? and key = ?";
            try (Statement s = c.createStatement()) {
                s.execute("create table orders_due (order_id bigint primary key, due int not null)");
                s.execute("insert into orders_due values (21, 10)");
            }

            // applied with its rows, then a duplicate
            equal(rows(c, apply, settle("rr-1", 21L, 4)), List.of(tuple(true)), "applied");
            equal(rows(c, due, 21L), List.of(tuple(6)), "due after the settlement");
            equal(rows(c, apply, settle("rr-1", 21L, 4)), List.of(tuple(false)), "a duplicate");
            equal(rows(c, due, 21L), List.of(tuple(6)), "due after the duplicate");
            equal(rows(c, processed, "rr-1", "settle", 21L), List.of(tuple(true)), "processed under its route");
            equal(rows(c, processed, "rr-1", "settle", 22L), List.of(tuple(false)), "processed under another route");
            // a missing row: IK002, nothing recorded
            failsWith("IK002", () -> rows(c, apply, settle("rr-2", 22L, 4)));
            equal(rows(c, processed, "rr-2", "settle", 22L), List.of(tuple(false)), "processed after IK002");
            equal(rows(c, stored, "settle", "rr-2", "settle", "rr-2"), List.of(tuple(0L, 0L)),
                  "keys and entries after IK002");
            equal(rows(c, due, 22L), List.of(), "the missing row");

            // the try form: IK002 transient by default, raised and nothing parked
            failsWith("IK002", () -> rows(c, tryApply, settle("rr-3", 24L, 3)));
            equal(rows(c, stored, "settle", "rr-3", "settle", "rr-3"), List.of(tuple(0L, 0L)),
                  "keys and entries after a transient IK002");
            rows(c, "select set_config('idem_consumer.transient_sqlstates', '40001', false)");
            try {
                equal(rows(c, tryApply, settle("rr-3", 24L, 3)), List.of(tuple("dead_lettered")), "parked");
                equal(rows(c, parked, "settle", "rr-3"), List.of(tuple(24L, "pending", "IK002", 1, 1L)),
                      "entry with its demand");
                // the key is recorded with its entry (docs/expect-rows.md), the row not written
                equal(rows(c, stored, "settle", "rr-3", "settle", "rr-3"), List.of(tuple(1L, 1L)),
                      "keys and entries when parked");
                equal(rows(c, processed, "rr-3", "settle", 24L), List.of(tuple(true)), "processed when parked");
                equal(rows(c, due, 24L), List.of(), "the row still missing");
                // the replay demands the rows again: still missing, parked again
                equal(rows(c, replay, "rr-3", "settle", 24L), List.of(tuple("dead_lettered")),
                      "replay, the row missing");
                equal(rows(c, parked, "settle", "rr-3"), List.of(tuple(24L, "pending", "IK002", 2, 1L)),
                      "entry after a replay without the row");
                equal(rows(c, due, 24L), List.of(), "the row missing after the replay");
                // the row there: applied
                rows(c, "insert into orders_due values (24, 5) returning order_id");
                equal(rows(c, replay, "rr-3", "settle", 24L), List.of(tuple("applied")), "replay, the row there");
                equal(rows(c, due, 24L), List.of(tuple(2)), "due after the replay");
                equal(rows(c, parked, "settle", "rr-3"), List.of(tuple(24L, "replayed", "IK002", 3, 1L)),
                      "replayed entry");
                equal(rows(c, stored, "settle", "rr-3", "settle", "rr-3"), List.of(tuple(1L, 1L)),
                      "keys and entries after the replay");
                equal(rows(c, tryApply, settle("rr-3", 24L, 3)), List.of(tuple("duplicate")),
                      "redelivery after the replay");
                equal(rows(c, tryApply, settle("rr-4", 21L, 1)), List.of(tuple("applied")), "try form applied");
                equal(rows(c, "select order_id, due from orders_due order by order_id"),
                      List.of(tuple(21L, 5), tuple(24L, 2)), "dues");
            } finally {
                rows(c, "select set_config('idem_consumer.transient_sqlstates', '', false)");
            }
        });
    }

    // -- routed external effects (docs/effects.md, with a route as in
    //    docs/citus.md), the route bound by setLong

    static final String CHARGE_SQL =
        "update public.accounts set charged = charged + $1::numeric where id = $2::bigint";
    static final String BEGIN_ROUTED =
        "select action::text, fence, provider_key, attempt, outcome_unknown, result::text, last_error"
        + " from idem_effect_begin(?, ?, route => ?, request => ?, lease => ?::interval)";
    static final String COMPLETE_ROUTED =
        "select idem_effect_complete(?, ?, ?, ?, route => ?, sql => ?, params => ?)";
    // bound by setNull(Types.BIGINT): a NULL of the routes' type
    static final Object NULL_BIGINT = new Object();

    interface ConnBody { void run(Connection c) throws Exception; }

    // body on a database of its own, with accounts 1 to 20, whose routed
    // tables are made, not distributed, by the function
    // idem_citus_distribute() uses; dropped afterwards
    static void routedDatabase(String db, ConnBody body) throws Exception {
        exec("drop database if exists " + db);
        exec("create database " + db);
        String url = "jdbc:postgresql://127.0.0.1:" + System.getenv("PGPORT") + "/" + db;
        Properties p = new Properties();
        p.setProperty("user", System.getenv("PGUSER"));
        p.setProperty("options", "-c statement_timeout=20s");
        try (Connection c = DriverManager.getConnection(url, p); Statement s = c.createStatement()) {
            s.execute("create extension idem_consumer");
            s.execute("create table accounts (id bigint primary key, charged numeric not null default 0)");
            s.execute("insert into accounts (id) select generate_series(1, 20)");
            s.execute("select idem_consumer.routed_storage_create('bigint')");
            body.run(c);
        } finally {
            exec("drop database " + db);
        }
    }

    // every row of a query, each a list of its columns; a String[] is bound
    // as text[], NULL_BIGINT as a NULL bigint, anything else by setObject
    static List<List<Object>> rows(Connection c, String sql, Object... params) throws SQLException {
        try (PreparedStatement ps = c.prepareStatement(sql)) {
            for (int i = 0; i < params.length; i++) {
                if (params[i] == NULL_BIGINT)
                    ps.setNull(i + 1, Types.BIGINT);
                else if (params[i] instanceof String[])
                    ps.setArray(i + 1, c.createArrayOf("text", (String[]) params[i]));
                else
                    ps.setObject(i + 1, params[i]);
            }
            List<List<Object>> out = new ArrayList<>();
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    List<Object> r = new ArrayList<>();
                    for (int i = 1; i <= rs.getMetaData().getColumnCount(); i++)
                        r.add(rs.getObject(i));
                    out.add(r);
                }
            }
            return out;
        }
    }

    static List<Object> tuple(Object... values) {
        return Arrays.asList(values);
    }

    // idem_effect_begin with a route: action, fence, provider_key, attempt,
    // outcome_unknown, result, last_error
    static List<Object> beginRouted(Connection c, String key, long route, String request, String lease)
            throws SQLException {
        return rows(c, BEGIN_ROUTED, "charges", key, route, jsonb(request), lease).get(0);
    }

    // idem_effect_complete with a route and the business SQL charging the
    // account of the route
    static void completeRouted(Connection c, String key, Object fence, String result, long route, String amount)
            throws SQLException {
        rows(c, COMPLETE_ROUTED, "charges", key, fence, jsonb(result), route, CHARGE_SQL,
             new String[] {amount, String.valueOf(route)});
    }

    // route, state, fence, attempts and result of an effect
    static List<List<Object>> routedEffect(Connection c, String key) throws SQLException {
        return rows(c, "select route, state, fence, attempts, result::text from idem_routed_effects"
                    + " where consumer = 'charges' and key = ?", key);
    }

    static BigDecimal charged(Connection c, long account) throws SQLException {
        return (BigDecimal) rows(c, "select charged from accounts where id = ?", account).get(0).get(0);
    }

    // Routed effect, inline: begin executes under fence 1; complete stores
    // the result and runs the business SQL on the route's row in one
    // statement; a second begin replays the stored result and the row is
    // charged once
    static void routedEffectInline() throws Exception {
        routedDatabase("client_routed_effects_jdbc", c -> {
            List<Object> first = beginRouted(c, "ch-1", 7L, "{\"amount\": 5}", "30 seconds");
            equal(first.subList(0, 2), tuple("execute", 1L), "action and fence");
            equal(first.subList(3, 6), tuple(1, false, null), "attempt, outcome unknown, result");
            equal(((String) first.get(2)).length(), 36, "provider key");
            equal(routedEffect(c, "ch-1"), List.of(tuple(7L, "in_flight", 1L, 1, null)), "leased effect");
            completeRouted(c, "ch-1", first.get(1), "{\"charge\": \"ch_1\"}", 7L, "5.00");
            equal(routedEffect(c, "ch-1"), List.of(tuple(7L, "completed", 1L, 1, "{\"charge\": \"ch_1\"}")),
                  "completed effect");
            List<Object> again = beginRouted(c, "ch-1", 7L, "{\"amount\": 5}", "30 seconds");
            equal(again.subList(0, 3), tuple("replay", null, first.get(2)), "replay");
            equal(again.get(5), "{\"charge\": \"ch_1\"}", "stored result");
            equal(charged(c, 7), new BigDecimal("5.00"), "charged once");
            equal(charged(c, 8), BigDecimal.ZERO, "another route's row");
        });
    }

    // Routed effect: once a lease of 1 ms has expired, the next begin takes
    // it over (fence 2, outcome unknown, the same provider key); the late
    // holder's complete is IE001 and its business SQL rolls back; its
    // heartbeat is false, the new holder's true; the new holder completes
    static void routedEffectFencedOff() throws Exception {
        routedDatabase("client_routed_effects_jdbc", c -> {
            List<Object> late = beginRouted(c, "ch-2", 8L, "{\"amount\": 3}", "1 millisecond");
            equal(late.subList(0, 2), tuple("execute", 1L), "first lease");
            rows(c, "select pg_sleep(0.05)");
            List<Object> taker = beginRouted(c, "ch-2", 8L, "{\"amount\": 3}", "30 seconds");
            equal(tuple(taker.get(0), taker.get(1), taker.get(3), taker.get(4)), tuple("execute", 2L, 2, true),
                  "takeover");
            equal(taker.get(2), late.get(2), "provider key of the takeover");
            failsWith("IE001", () -> completeRouted(c, "ch-2", late.get(1), "{\"charge\": \"late\"}", 8L, "3"));
            equal(charged(c, 8), BigDecimal.ZERO, "charged after IE001");
            String heartbeat = "select idem_effect_heartbeat(?, ?, ?, '1 minute', route => ?)";
            equal(rows(c, heartbeat, "charges", "ch-2", late.get(1), 8L).get(0).get(0), false, "late heartbeat");
            equal(rows(c, heartbeat, "charges", "ch-2", taker.get(1), 8L).get(0).get(0), true, "heartbeat");
            completeRouted(c, "ch-2", taker.get(1), "{\"charge\": \"ch_2\"}", 8L, "3");
            equal(routedEffect(c, "ch-2"), List.of(tuple(8L, "completed", 2L, 2, "{\"charge\": \"ch_2\"}")),
                  "completed effect");
            equal(charged(c, 8), new BigDecimal("3"), "charged once");
        });
    }

    // Routed effect: a permanent failure is dead, parked in
    // idem_routed_dead_letters under its route (kind effect, IE003); begin
    // then says dead; idem_dlq_replay by key and route re-arms it (waiting, the entry
    // replayed) and the next begin executes it under a new fence
    static void routedEffectDeadLetter() throws Exception {
        routedDatabase("client_routed_effects_jdbc", c -> {
            List<Object> first = beginRouted(c, "ch-3", 9L, "{\"amount\": 4}", "30 seconds");
            equal(first.subList(0, 2), tuple("execute", 1L), "first lease");
            equal(rows(c, "select idem_effect_fail(?, ?, ?, ?, route => ?, retryable => false)::text",
                       "charges", "ch-3", first.get(1), "card declined", 9L).get(0).get(0), "dead", "fail");
            String entries = "select route, kind, status, sqlstate, message from idem_routed_dead_letters";
            equal(rows(c, entries), List.of(tuple(9L, "effect", "pending", "IE003", "card declined")),
                  "dead-letter entry");
            List<Object> dead = beginRouted(c, "ch-3", 9L, "{\"amount\": 4}", "30 seconds");
            equal(tuple(dead.get(0), dead.get(6)), tuple("dead", "card declined"), "begin of a dead effect");
            equal(rows(c, "select idem_dlq_replay(?, ?, ?)", "ch-3", "charges", 9L).get(0).get(0),
                  "applied", "replay");
            equal(routedEffect(c, "ch-3").get(0).get(1), "waiting", "re-armed effect");
            equal(rows(c, entries), List.of(tuple(9L, "effect", "replayed", "IE003", "card declined")),
                  "replayed entry");
            List<Object> again = beginRouted(c, "ch-3", 9L, "{\"amount\": 4}", "30 seconds");
            equal(tuple(again.get(0), again.get(1), again.get(3)), tuple("execute", 2L, 1), "begin after replay");
            completeRouted(c, "ch-3", again.get(1), "{\"charge\": \"ch_3\"}", 9L, "4");
            equal(routedEffect(c, "ch-3"), List.of(tuple(9L, "completed", 2L, 1, "{\"charge\": \"ch_3\"}")),
                  "completed effect");
            equal(charged(c, 9), new BigDecimal("4"), "charged once");
        });
    }

    // Routed outbox: an enqueue with a route commits (or rolls back) with
    // the business transaction; a duplicate enqueue is false; a claim of
    // one route leases its effect, a claim of every route (setNull BIGINT;
    // a NULL of no type is no route, 0A000) the others, each with its route
    // as text; begin and claim are 25001 in a transaction block; the effect
    // functions without a route are 0A000 and store nothing
    static void routedEffectOutbox() throws Exception {
        routedDatabase("client_routed_effects_jdbc", c -> {
            String enqueue = "select idem_effect_enqueue(?, ?, ?, route => ?)";
            List<Object> added = new ArrayList<>();
            c.setAutoCommit(false);
            rows(c, "update accounts set charged = charged + 1 where id = 10 returning id");
            for (Object[] e : new Object[][] {{"o-1", 10L}, {"o-2", 11L}, {"o-3", 12L}, {"o-1", 10L}})
                added.add(rows(c, enqueue, "charges", e[0], jsonb("{\"n\": \"" + e[0] + "\"}"), e[1]).get(0).get(0));
            c.commit();
            equal(added, List.of(true, true, true, false), "enqueued, then a duplicate");
            rows(c, enqueue, "charges", "o-4", jsonb("{\"n\": \"o-4\"}"), 13L);
            c.rollback();
            c.setAutoCommit(true);
            equal(rows(c, "select route, key, state from idem_routed_effects order by key"),
                  List.of(tuple(10L, "o-1", "pending"), tuple(11L, "o-2", "pending"), tuple(12L, "o-3", "pending")),
                  "outbox");
            equal(charged(c, 10), new BigDecimal("1"), "the business write committed with the enqueue");

            String claim = "select key, route, request::text, fence, attempt"
                + " from idem_effect_claim(?, route => ?) order by key";
            failsWith("0A000", () -> rows(c, "select key from idem_effect_claim(?, route => NULL)", "charges"));
            equal(rows(c, claim, "charges", 10L), List.of(tuple("o-1", "10", "{\"n\": \"o-1\"}", 1L, 1)),
                  "claim of one route");
            equal(rows(c, claim, "charges", NULL_BIGINT),
                  List.of(tuple("o-2", "11", "{\"n\": \"o-2\"}", 1L, 1), tuple("o-3", "12", "{\"n\": \"o-3\"}", 1L, 1)),
                  "claim of every route");
            equal(rows(c, "select key, state from idem_routed_effects order by key"),
                  List.of(tuple("o-1", "in_flight"), tuple("o-2", "in_flight"), tuple("o-3", "in_flight")),
                  "leased");
            completeRouted(c, "o-2", 1L, "{\"done\": true}", 11L, "2");
            equal(routedEffect(c, "o-2").get(0).get(1), "completed", "completed from the outbox");
            equal(charged(c, 11), new BigDecimal("2"), "charged");

            c.setAutoCommit(false);
            failsWith("25001", () -> beginRouted(c, "tx-1", 7L, "{}", "30 seconds"));
            c.rollback();
            failsWith("25001", () -> rows(c, claim, "charges", NULL_BIGINT));
            c.rollback();
            c.setAutoCommit(true);
            failsWith("0A000", () -> rows(c, "select * from idem_effect_begin(?, ?)", "charges", "u-1"));
            failsWith("0A000", () -> rows(c, "select idem_effect_enqueue(?, ?, ?)", "charges", "u-2", jsonb("{}")));
            failsWith("0A000", () -> rows(c, "select * from idem_effect_claim(?)", "charges"));
            equal(rows(c, "select count(*) from idem_routed_effects where key in ('tx-1', 'u-1', 'u-2')"),
                  List.of(tuple(0L)), "nothing stored");
        });
    }

    // docs/clients.md's JDBC example, as written there (DocsExample.java)
    static void docsExample() throws Exception {
        exec("drop table if exists payments, orders");
        exec("create table orders (id bigint primary key, paid numeric not null default 0)");
        exec("create table payments (amount numeric, paid_at timestamptz, order_id bigint)");
        exec("insert into orders values (5)");
        try {
            DocsExample.run(conn, "docs-jdbc", new BigDecimal("10.00"), 5L, BERLIN_10H);
            equal(one("select paid from orders where id = 5"), new BigDecimal("20.00"), "paid");
            equal(one("select count(*) from payments"), 1L, "payments");
        } finally {
            exec("drop table payments, orders");
        }
    }

    public static void main(String[] args) throws Exception {
        String[] names = {"typedRedeliveryIsDuplicate", "otherValueIsKeyReuse", "eventBeforeItsOrder",
                          "tryApplyRows", "typedRowsForm", "textArrayForm", "routedKeys",
                          "routedEffectInline", "routedEffectFencedOff", "routedEffectDeadLetter",
                          "routedEffectOutbox", "routedRows", "docsExample"};
        Body[] bodies = {ClientTest::typedRedeliveryIsDuplicate, ClientTest::otherValueIsKeyReuse,
                         ClientTest::eventBeforeItsOrder, ClientTest::tryApplyRows, ClientTest::typedRowsForm,
                         ClientTest::textArrayForm, ClientTest::routedKeys, ClientTest::routedEffectInline,
                         ClientTest::routedEffectFencedOff, ClientTest::routedEffectDeadLetter,
                         ClientTest::routedEffectOutbox, ClientTest::routedRows,
                         ClientTest::docsExample};
        int passed = 0, failed = 0, n = 0;
        ExecutorService pool = Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r);
            t.setDaemon(true);
            return t;
        });
        try {
            conn = connect();
            exec("create extension if not exists idem_consumer");
            exec("drop table if exists orders_jdbc, payments_jdbc");
            exec("create table orders_jdbc (id bigint primary key, paid numeric not null default 0)");
            exec("create table payments_jdbc (n serial primary key, amount numeric, paid_at timestamptz,"
                 + " doc jsonb, note text, order_id bigint)");
            exec("insert into orders_jdbc (id) select generate_series(1, 20)");
        } catch (Exception e) {
            System.out.println("not ok 1 - jdbc: setup");
            System.out.println("# " + e);
            System.out.println("1..1\n# pass 0\n# fail 1");
            System.exit(1);
        }
        for (int i = 0; i < names.length; i++) {
            n++;
            long t0 = System.nanoTime();
            Body body = bodies[i];
            Future<?> f = pool.submit(() -> { body.run(); return null; });
            try {
                f.get(TEST_TIMEOUT, TimeUnit.SECONDS);
                passed++;
                System.out.printf("ok %d - jdbc: %s (%.2f s)%n", n, names[i], (System.nanoTime() - t0) / 1e9);
            } catch (Exception e) {
                f.cancel(true);
                failed++;
                System.out.printf("not ok %d - jdbc: %s%n", n, names[i]);
                Throwable c = e instanceof java.util.concurrent.ExecutionException ? e.getCause() : e;
                System.out.println("# " + c);
                for (StackTraceElement s : c.getStackTrace())
                    if (s.getClassName().startsWith("ClientTest") || s.getClassName().startsWith("DocsExample"))
                        System.out.println("#   at " + s);
            }
        }
        try {
            exec("drop table if exists orders_jdbc, payments_jdbc");
            conn.close();
        } catch (SQLException e) {
            System.out.println("# cleanup: " + e);
        }
        System.out.println("1.." + n);
        System.out.println("# pass " + passed);
        System.out.println("# fail " + failed);
        System.exit(failed == 0 ? 0 : 1);
    }
}
