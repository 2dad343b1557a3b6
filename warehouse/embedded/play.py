"""``/play``: a page to type a query into, like ClickHouse's. It holds no data and needs no
login to load; its queries go to the endpoint with the user and password typed into it (Basic
auth, never in the URL), so they are answered only for a known user."""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="UTF-8">
<title>ClickHouse Query (gpugap)</title>
<style>
body { font-family: sans-serif; margin: 1em; }
input { margin-right: 1em; }
textarea { width: 100%; height: 10em; font-family: monospace; }
pre { background: #f4f4f4; padding: 0.5em; overflow: auto; }
#stats { color: #666; }
</style>
</head>
<body>
<form id="form">
<label>user <input id="user" value="default" autocomplete="username"></label>
<label>password <input id="password" type="password" autocomplete="current-password"></label>
<label>database <input id="database" placeholder="default"></label>
<textarea id="query" spellcheck="false">SELECT version()</textarea>
<button type="submit">Run</button> <span id="stats"></span>
</form>
<pre id="result"></pre>
<script>
document.getElementById("form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const get = (id) => document.getElementById(id).value;
  const params = new URLSearchParams({ default_format: "PrettyCompactMonoBlock" });
  if (get("database")) params.set("database", get("database"));
  const started = performance.now();
  const result = document.getElementById("result");
  const stats = document.getElementById("stats");
  result.textContent = "";
  stats.textContent = "running...";
  try {
    const response = await fetch(location.pathname.replace(/play\\/?$/, "") + "?" + params, {
      method: "POST",
      body: get("query"),
      headers: { Authorization: "Basic " + btoa(unescape(encodeURIComponent(
        get("user") + ":" + get("password")))) },
    });
    result.textContent = await response.text();
    const summary = JSON.parse(response.headers.get("X-ClickHouse-Summary") || "{}");
    const ms = (performance.now() - started).toFixed(0);
    stats.textContent = response.ok
      ? `${summary.result_rows ?? "?"} rows, read ${summary.read_rows ?? "?"} rows, ${ms} ms`
      : `error ${response.headers.get("X-ClickHouse-Exception-Code") || response.status}`;
  } catch (err) {
    stats.textContent = String(err);
  }
});
</script>
</body>
</html>
"""
