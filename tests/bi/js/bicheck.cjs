// Drives a ClickHouse HTTP endpoint with @clickhouse/client (Node), the client JS BI and
// notebook tools embed, and prints what each step returned as JSON for pytest.
// stdin: {"url", "username", "password", "database", "steps": [step, ...]}
// step:  {"op": "ping"} | {"op": "query", "query", "format", "query_params", "repeat"}
//        | {"op": "insert", "table", "values", "format"} | {"op": "command", "query"}
// repeat: run the query N times (default 1), each timed in elapsed_ms (from client.query to
// the rows parsed by rs.json(): what the caller waits for), the last one's rows kept.
'use strict';
const { createClient } = require('@clickhouse/client');

async function main() {
  const chunks = [];
  for await (const c of process.stdin) chunks.push(c);
  const script = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  const client = createClient({
    url: script.url,
    username: script.username,
    password: script.password,
    database: script.database,
    request_timeout: 60000,
  });
  const out = [];
  for (const st of script.steps) {
    const r = { op: st.op, sql: st.query || st.table || '' };
    try {
      if (st.op === 'ping') {
        const p = await client.ping();
        r.success = p.success;
        if (!p.success) r.error = String(p.error && (p.error.message || p.error));
      } else if (st.op === 'query') {
        const n = Math.max(1, st.repeat || 1);
        for (let i = 0; i < n; i++) {
          const start = process.hrtime.bigint();
          const rs = await client.query({
            query: st.query, format: st.format || 'JSONEachRow', query_params: st.query_params,
          });
          r.query_id = rs.query_id;
          r.rows = await rs.json();
          if (st.repeat) {
            (r.elapsed_ms = r.elapsed_ms || []).push(
              Number(process.hrtime.bigint() - start) / 1e6);
          }
        }
      } else if (st.op === 'insert') {
        const res = await client.insert({
          table: st.table, values: st.values, format: st.format || 'JSONEachRow',
        });
        r.executed = res.executed;
        r.summary = res.summary || null;
      } else if (st.op === 'command') {
        const res = await client.command({ query: st.query });
        r.summary = res.summary || null;
      } else {
        throw new Error('unknown op ' + st.op);
      }
    } catch (e) {
      r.error = (e && e.code ? 'Code: ' + e.code + '. ' : '') + String(e && (e.message || e));
    }
    out.push(r);
  }
  await client.close();
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((e) => { console.error(e); process.exit(1); });
