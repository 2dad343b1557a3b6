import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Array;
import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Timestamp;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Properties;

/**
 * Drives a ClickHouse endpoint with the ClickHouse JDBC driver the way BI tools do, and prints
 * what each step returned as JSON for pytest.
 *
 * <p>Usage: java BiCheck MODE URL USER PASSWORD &lt; script, MODE "default" (only user and
 * password) or "metabase" (the properties metabase-clickhouse-driver's connection-details->spec
 * sets). The script has one step a line, fields separated by tabs:
 *
 * <pre>
 * connect
 * meta.product
 * meta.catalogs
 * meta.schemas
 * meta.tables    CATALOG  SCHEMA_PATTERN  TABLE_PATTERN  [TYPE,TYPE...]
 * meta.columns   CATALOG  SCHEMA          TABLE            (an empty field is null)
 * query          SQL  [ARG...]          (a PreparedStatement when there are ARGs or "?" in SQL)
 * statement      SQL                    (a plain Statement.executeQuery)
 * update         SQL  [ARG...]          (executeUpdate)
 * prepare        SQL                    (for addbatch/executebatch)
 * addbatch       ARG...
 * executebatch
 * repeat         N  STEP  [FIELD...]    (STEP N times, each timed: elapsed_ms)
 * </pre>
 *
 * <p>repeat reports the last run's result under the inner step's op, plus elapsed_ms: the
 * milliseconds of each run, from the call into the driver (prepareStatement for query) to the
 * last row read.
 *
 * ARG is TYPE:VALUE with TYPE s (setString), i (setInt), l (setLong), d (setDouble), ts
 * (setTimestamp, "yyyy-mm-dd hh:mm:ss[.f]"), n (setNull VARCHAR).
 */
public final class BiCheck {
    private static Connection conn;
    private static PreparedStatement batch;

    public static void main(String[] argv) throws Exception {
        String mode = argv[0], url = argv[1];
        Properties props = new Properties();
        props.setProperty("user", argv[2]);
        props.setProperty("password", argv[3]);
        if (mode.equals("metabase")) {
            // metabase-clickhouse-driver src/metabase/driver/clickhouse.clj, connection-details->spec*
            System.setProperty("clickhouse.jdbc.v2", "true");
            props.setProperty("ssl", "false");
            props.setProperty("use_server_time_zone_for_dates", "true");
            props.setProperty("product_name", "metabase/1.53.4");
            props.setProperty("remember_last_set_roles", "true");
            props.setProperty("http_connection_provider", "HTTP_URL_CONNECTION");
            props.setProperty("jdbc_ignore_unsupported_values", "true");
            props.setProperty("jdbc_schema_term", "schema");
            props.setProperty("max_open_connections", "100");
            props.setProperty("custom_http_params", "");
        }
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        List<String> out = new ArrayList<>();
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            String[] f = line.split("\t", -1);
            Json r = new Json();
            r.put("op", f[0]);
            if (f.length > 1) {
                r.put("arg", f[1]);
            }
            try {
                if (conn == null && !f[0].equals("connect")) {
                    conn = DriverManager.getConnection(url, props);
                }
                step(f, url, props, r);
            } catch (Throwable e) {
                r.put("error", describe(e));
            }
            out.add(r.toString());
        }
        if (conn != null) {
            try {
                conn.close();
            } catch (SQLException ignored) {
                // reported by the steps already
            }
        }
        System.out.println("[" + String.join(",\n", out) + "]");
        System.out.flush();
        System.exit(0); // the driver may leave non-daemon threads
    }

    private static void step(String[] f, String url, Properties props, Json r) throws Exception {
        switch (f[0]) {
            case "repeat" -> {
                int n = Integer.parseInt(f[1]);
                String[] inner = Arrays.copyOfRange(f, 2, f.length);
                List<String> ms = new ArrayList<>();
                for (int i = 0; i < n; i++) {
                    r.clear();
                    r.put("op", inner[0]);
                    if (inner.length > 1) {
                        r.put("arg", inner[1]);
                    }
                    long start = System.nanoTime();
                    step(inner, url, props, r);
                    ms.add(String.valueOf((System.nanoTime() - start) / 1e6));
                }
                r.putList("elapsed_ms", ms);
            }
            case "connect" -> {
                conn = DriverManager.getConnection(url, props);
                r.put("closed", String.valueOf(conn.isClosed()));
                r.put("catalog", conn.getCatalog());
                r.put("schema", conn.getSchema());
            }
            case "meta.product" -> {
                DatabaseMetaData md = conn.getMetaData();
                r.put("product_name", md.getDatabaseProductName());
                r.put("product_version", md.getDatabaseProductVersion());
                r.put("major", String.valueOf(md.getDatabaseMajorVersion()));
                r.put("minor", String.valueOf(md.getDatabaseMinorVersion()));
                r.put("driver_version", md.getDriverVersion());
                r.put("user", md.getUserName());
                r.put("read_only", String.valueOf(md.isReadOnly()));
            }
            case "meta.catalogs" -> rows(conn.getMetaData().getCatalogs(), r);
            case "meta.schemas" -> rows(conn.getMetaData().getSchemas(), r);
            case "meta.tables" -> {
                String[] types = f.length > 4 && !f[4].isEmpty() ? f[4].split(",") : null;
                rows(conn.getMetaData().getTables(nz(f[1]), nz(f[2]), nz(f[3]), types), r);
            }
            case "meta.columns" -> rows(conn.getMetaData().getColumns(nz(f[1]), nz(f[2]), nz(f[3]), "%"), r);
            case "statement" -> {
                try (Statement st = conn.createStatement()) {
                    rows(st.executeQuery(f[1]), r);
                }
            }
            case "query" -> {
                try (PreparedStatement ps = conn.prepareStatement(f[1])) {
                    bind(ps, f, 2);
                    rows(ps.executeQuery(), r);
                }
            }
            case "update" -> {
                try (PreparedStatement ps = conn.prepareStatement(f[1])) {
                    bind(ps, f, 2);
                    r.put("update_count", String.valueOf(ps.executeUpdate()));
                }
            }
            case "prepare" -> batch = conn.prepareStatement(f[1]);
            case "addbatch" -> {
                bind(batch, f, 1);
                batch.addBatch();
            }
            case "executebatch" -> {
                int[] counts = batch.executeBatch();
                List<String> c = new ArrayList<>();
                for (int n : counts) {
                    c.add(String.valueOf(n));
                }
                r.putList("batch_counts", c);
                batch.close();
                batch = null;
            }
            default -> throw new IllegalArgumentException("unknown step " + f[0]);
        }
    }

    private static String nz(String s) {
        return s == null || s.isEmpty() ? null : s;
    }

    private static void bind(PreparedStatement ps, String[] f, int from) throws SQLException {
        for (int i = from; i < f.length; i++) {
            int p = i - from + 1;
            String a = f[i];
            int colon = a.indexOf(':');
            String t = a.substring(0, colon), v = a.substring(colon + 1);
            switch (t) {
                case "s" -> ps.setString(p, v);
                case "i" -> ps.setInt(p, Integer.parseInt(v));
                case "l" -> ps.setLong(p, Long.parseLong(v));
                case "d" -> ps.setDouble(p, Double.parseDouble(v));
                case "ts" -> ps.setTimestamp(p, Timestamp.valueOf(v));
                case "n" -> ps.setNull(p, java.sql.Types.VARCHAR);
                default -> throw new IllegalArgumentException("unknown arg type " + t);
            }
        }
    }

    private static void rows(ResultSet rs, Json r) throws SQLException {
        try (rs) {
            ResultSetMetaData md = rs.getMetaData();
            int n = md.getColumnCount();
            List<String> cols = new ArrayList<>(), types = new ArrayList<>(), classes = new ArrayList<>();
            for (int i = 1; i <= n; i++) {
                cols.add(md.getColumnLabel(i));
                types.add(md.getColumnTypeName(i));
                classes.add(md.getColumnClassName(i));
            }
            r.putList("columns", cols);
            r.putList("types", types);
            r.putList("classes", classes);
            List<List<String>> data = new ArrayList<>();
            List<String> objects = null;
            while (rs.next()) {
                List<String> row = new ArrayList<>();
                List<String> objs = new ArrayList<>();
                for (int i = 1; i <= n; i++) {
                    Object o = rs.getObject(i);
                    if (o instanceof Array a) {
                        Object[] items = (Object[]) a.getArray();
                        List<String> s = new ArrayList<>();
                        for (Object x : items) {
                            s.add(String.valueOf(x));
                        }
                        row.add(String.join("|", s));
                    } else {
                        row.add(rs.getString(i));
                    }
                    objs.add(o == null ? null : o.getClass().getName());
                }
                if (objects == null) {
                    objects = objs;
                }
                data.add(row);
            }
            r.putRows("rows", data);
            if (objects != null) {
                r.putList("object_classes", objects);
            }
        }
    }

    private static String describe(Throwable e) {
        StringBuilder sb = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause()) {
            if (sb.length() > 0) {
                sb.append(" <- ");
            }
            sb.append(t.getClass().getName()).append(": ").append(t.getMessage());
            if (t.getCause() == t) {
                break;
            }
        }
        return sb.toString();
    }

    /** A tiny JSON object writer (strings, lists of strings, lists of rows). */
    private static final class Json {
        private final StringBuilder sb = new StringBuilder();

        void clear() {
            sb.setLength(0);
        }

        void put(String k, String v) {
            key(k);
            str(v);
        }

        void putList(String k, List<String> v) {
            key(k);
            list(v);
        }

        void putRows(String k, List<List<String>> rows) {
            key(k);
            sb.append('[');
            for (int i = 0; i < rows.size(); i++) {
                if (i > 0) {
                    sb.append(',');
                }
                list(rows.get(i));
            }
            sb.append(']');
        }

        private void key(String k) {
            sb.append(sb.length() == 0 ? "" : ",");
            str(k);
            sb.append(':');
        }

        private void list(List<String> v) {
            sb.append('[');
            for (int i = 0; i < v.size(); i++) {
                if (i > 0) {
                    sb.append(',');
                }
                str(v.get(i));
            }
            sb.append(']');
        }

        private void str(String s) {
            if (s == null) {
                sb.append("null");
                return;
            }
            sb.append('"');
            for (char c : s.toCharArray()) {
                switch (c) {
                    case '"' -> sb.append("\\\"");
                    case '\\' -> sb.append("\\\\");
                    case '\n' -> sb.append("\\n");
                    case '\r' -> sb.append("\\r");
                    case '\t' -> sb.append("\\t");
                    default -> {
                        if (c < 0x20) {
                            sb.append(String.format("\\u%04x", (int) c));
                        } else {
                            sb.append(c);
                        }
                    }
                }
            }
            sb.append('"');
        }

        @Override
        public String toString() {
            return "{" + sb + "}";
        }
    }
}
