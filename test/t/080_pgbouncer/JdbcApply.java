// pgjdbc through PgBouncer in transaction mode (test/t/080_pgbouncer.pl).
//
// Usage: java -cp postgresql.jar:DIR JdbcApply URL USER PASSWORD PREFIX [transactions|moved]
//
// Two connections deliver the same eight messages in turns, each through
// its own PreparedStatement (the second delivery of each message is a
// redelivery).  With "transactions", the same with autocommit off, each
// delivery committed.  With "moved", one connection delivers seven
// messages, and before the seventh the other holds, in a transaction, the
// server connection the first one used.  The URL's prepareThreshold decides when
// pgjdbc switches a PreparedStatement from unnamed to named server-side
// statements.  Prints one line per call: "LABEL t|f", or "LABEL ERROR
// SQLSTATE MESSAGE".
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

public class JdbcApply {
    static final String APPLY = "SELECT idem_apply(?, 'payments', "
        + "'update orders set paid = paid + $1 where id = $2', ARRAY['1', '4'])";

    public static void main(String[] args) throws SQLException {
        String url = args[0], user = args[1], password = args[2], prefix = args[3];
        DriverManager.setLoginTimeout(10);
        try (Connection first = DriverManager.getConnection(url, user, password);
             Connection second = DriverManager.getConnection(url, user, password);
             PreparedStatement p1 = first.prepareStatement(APPLY);
             PreparedStatement p2 = second.prepareStatement(APPLY)) {
            if (args.length > 4 && args[4].equals("transactions")) {
                first.setAutoCommit(false);
                second.setAutoCommit(false);
                // stops at the first failed commit: its transaction, aborted,
                // keeps the server connection until the program ends
                for (int i = 1; i <= 3; i++) {
                    call("c1 " + i, p1, prefix + ":" + i);
                    if (!commit("c1 " + i, first))
                        return;
                    call("c2 " + i, p2, prefix + ":" + i);
                    if (!commit("c2 " + i, second))
                        return;
                }
                return;
            }
            if (args.length > 4 && args[4].equals("moved")) {
                // the other connection's transaction by plain statements,
                // which pgjdbc never prepares
                for (int i = 1; i <= 7; i++) {
                    if (i == 7)
                        second.createStatement().execute("BEGIN; SELECT 1");
                    call("c1 " + i, p1, prefix + ":" + i);
                }
                second.createStatement().execute("ROLLBACK");
                return;
            }
            for (int i = 1; i <= 8; i++) {
                call("c1 " + i, p1, prefix + ":" + i);
                call("c2 " + i, p2, prefix + ":" + i);
            }
        }
    }

    static boolean commit(String label, Connection conn) {
        try {
            conn.commit();
            System.out.println(label + " commit");
            return true;
        } catch (SQLException e) {
            System.out.println(label + " commit ERROR " + e.getSQLState() + " " + e.getMessage().split("\n")[0]);
            return false;
        } finally {
            System.out.flush();
        }
    }

    static void call(String label, PreparedStatement ps, String key) {
        try {
            ps.setString(1, key);
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                System.out.println(label + " " + (rs.getBoolean(1) ? "t" : "f"));
            }
        } catch (SQLException e) {
            System.out.println(label + " ERROR " + e.getSQLState() + " " + e.getMessage().split("\n")[0]);
        }
        System.out.flush();
    }
}
