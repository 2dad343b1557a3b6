// The job page: /job?id=ID[&cluster=NAME] reads /api/job (gpugap job's report) and draws it.
// <body data-state> says "loading", "ready" or "error"; data-match "one", "ambiguous" or
// "unknown" (the browser tests wait on them). Every value goes in as text, never as markup.
(() => {
"use strict";

const { renderTable, records, fmtTime, fmtNumber } = window.gpugapTables;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
  "#bcbd22", "#7f7f7f"];
const charts = {};
window.gpugapCharts = charts;
const $ = (id) => document.getElementById(id);
const epoch = (iso) => (iso ? Math.floor(Date.parse(iso) / 1000) : null);

function setState(state, message) {
  document.body.dataset.state = state;
  $("status").textContent = message || "";
}

function card(id, value, digits = 2) {
  $(id).textContent = fmtNumber(value, digits);
  $(id).dataset.value = value ?? "";
}

function hms(seconds) {
  const s = Math.round(seconds);
  const pad = (n) => String(n).padStart(2, "0");
  return `${Math.floor(s / 3600)}:${pad(Math.floor((s % 3600) / 60))}:${pad(s % 60)}`;
}

function jobHref(cluster, allocationId) {
  return `/job?${new URLSearchParams({ id: allocationId, cluster })}`;
}

function meta(a) {
  const dl = $("job-meta");
  dl.replaceChildren();
  const rows = [
    ["allocation", a.allocation_id], ["name", a.name], ["owner", a.owner], ["team", a.team],
    ["class", a.workload_class], [a.scheduler === "slurm" ? "partition" : "namespace",
      a.scheduler === "slurm" ? a.partition : a.namespace],
    ["GPUs asked for", a.gpus_requested], ["nodes", a.nodes.join(", ")],
    ["submitted", fmtTime(epoch(a.submit_time))], ["started", fmtTime(epoch(a.start_time))],
    ["ended", a.end_time ? fmtTime(epoch(a.end_time)) : "running"],
    ["elapsed", a.elapsed_s === null ? "" : hms(a.elapsed_s)],
    ["time limit", a.time_limit_s ? hms(a.time_limit_s) : ""], ["state", a.final_state || ""],
  ];
  for (const [k, v] of rows) {
    if (v === "" || v === null || v === undefined) continue;
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = String(v);
    dl.append(dt, dd);
  }
}

function advice(list) {
  const ol = $("advice");
  ol.replaceChildren();
  $("no-advice").hidden = list.length > 0;
  for (const a of list) {
    const li = document.createElement("li");
    li.dataset.kind = a.kind;
    const say = document.createElement("strong");
    say.textContent = a.say;
    const freed = document.createElement("small");
    freed.textContent = ` (would have freed ${fmtNumber(a.saved_gpu_h, 2)} GPU-h)`;
    const apply = document.createElement("pre");
    apply.textContent = a.apply;
    const why = document.createElement("p");
    why.textContent = a.why;
    li.append(say, freed, apply, why);
    ol.appendChild(li);
  }
}

function draw(id, labels, datasets, y) {
  if (charts[id]) charts[id].destroy();
  charts[id] = new window.Chart($(id), {
    type: "line", data: { labels, datasets },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false,
      interaction: { mode: "index", intersect: false },
      plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
      elements: { point: { radius: labels.length < 3 ? 3 : 0 }, line: { borderWidth: 2 } },
      scales: { x: { ticks: { maxTicksLimit: 12 } }, y },
    },
  });
}

function series(s) {
  const start = epoch(s.start);
  const labels = Array.from({ length: s.points }, (_, i) => fmtTime(start + i * s.step_s));
  const set = (g, i, data) => ({ label: `${g.node} ${g.gpu_uuid.slice(0, 12)}`, data,
    borderColor: COLORS[i % COLORS.length], backgroundColor: COLORS[i % COLORS.length],
    spanGaps: false });
  draw("chart-util", labels, s.gpus.map((g, i) => set(g, i, g.utilisation)),
    { min: 0, max: 1, title: { display: true, text: "utilisation" } });
  draw("chart-memory", labels, s.gpus.map((g, i) => set(g, i,
    g.memory_mib.map((m) => (m === null ? null : m / 1024)))),
  { beginAtZero: true, title: { display: true, text: "GiB" } });
  $("series-note").textContent = `(consumed / measured; UTC, ${s.step_s / 60}-minute buckets)`;
}

const cols = (keys) => keys.map((key) => ({ key, label: key.replace(/_gpu_h$/, " GPU-h")
  .replace(/_/g, " ") }));

function showJob(r) {
  const a = r.allocation;
  document.title = `gpugap: job ${a.job}`;
  $("job-title").textContent = `Job ${a.job} · cluster ${a.cluster} · ${a.scheduler}`;
  meta(a);
  const f = r.figures;
  card("j-allocated", f.allocated_gpu_h);
  card("j-consumed", f.consumed_gpu_h);
  card("j-gap", f.gap_gpu_h);
  card("j-gap-pct", f.gap_pct, 1);
  card("j-idle", f.idle_gpu_h);
  card("j-unmeasured", f.unmeasured_gpu_h);
  card("j-padding", r.padding ? r.padding.padding_gpu_h : null);
  card("j-wait", r.queue ? r.queue.wait_s / 60 : null, 1);
  advice(r.advice);
  if (r.series) series(r.series);
  const pct = (v) => (v === null ? null : 100 * v);
  const gpus = r.gpus.map((g) => ({ ...g, needed: g.needed ? "yes" : "no",
    utilisation_pct: pct(g.utilisation), idle_pct: pct(g.idle_share),
    peak_pct: pct(g.peak_activity),
    peak_memory_gib: g.peak_memory_mib === null ? null : g.peak_memory_mib / 1024 }));
  renderTable($("t-gpus"), cols(["gpu_uuid", "node", "allocated_gpu_h", "consumed_gpu_h",
    "gap_gpu_h", "idle_gpu_h", "utilisation_pct", "idle_pct", "peak_pct", "peak_memory_gib",
    "needed"]).map((c) => ({ ...c, label: c.label.replace(/ pct$/, " %") })), gpus,
  { sortKey: "gap_gpu_h", empty: "no GPU-hour stored" });
  const idle = r.idle;
  $("idle-note").textContent = idle ? `(every GPU idle: ${idle.idle_minutes} of ` +
    `${idle.measured_minutes} measured minutes, ${idle.stretches} stretch(es); the longest ` +
    `from ${idle.listed_from_minutes} minutes)` : "(no minute stored)";
  const stretches = (idle ? idle.longest : []).map((s) => ({ start: epoch(s.start),
    end: epoch(s.end), minutes: s.minutes, gpu_h: s.gpu_h }));
  renderTable($("t-idle"), [{ key: "start", label: "from" }, { key: "end", label: "to" },
    { key: "minutes", label: "minutes" }, { key: "gpu_h", label: "GPU-h" }], stretches,
  { empty: "no idle stretch this long" });
  renderTable($("t-recs"), cols(["id", "parameter", "from_value", "to_value",
    "saved_gpu_h_per_week", "confidence"]), r.recommendations,
  { empty: "none open for its family" });
  const notes = $("notes");
  notes.replaceChildren(...r.notes.map((n) => {
    const li = document.createElement("li");
    li.textContent = n;
    return li;
  }));
  $("view-job").hidden = false;
  return `${a.allocation_id}: ${r.advice.length} piece(s) of advice`;
}

function showCandidates(amb) {
  $("cand-title").textContent = `${amb.matches} allocations match "${amb.id}": pick one`;
  const rows = amb.candidates.map((c) => ({ ...c, start_time: epoch(c.start_time),
    end_time: epoch(c.end_time) }));
  renderTable($("t-candidates"), cols(["allocation_id", "cluster", "name", "owner",
    "gpus_requested", "start_time", "end_time", "final_state"]), rows, {
    link: (r, key) => (key === "allocation_id" ? jobHref(r.cluster, r.allocation_id) : null),
  });
  $("view-candidates").hidden = false;
  return `${amb.matches} allocations match`;
}

async function init() {
  const p = new URLSearchParams(location.search);
  const id = p.get("id") || "";
  const cluster = p.get("cluster") || "";
  $("q-id").value = id;
  $("q-cluster").value = cluster;
  if (!id) {
    setState("ready", "give a job id, an array task, a run, namespace/pod or a pod UID");
    return;
  }
  const q = new URLSearchParams({ id });
  if (cluster) q.set("cluster", cluster);
  try {
    const r = await fetch(`/api/job?${q}`, { headers: { Accept: "application/json" } });
    const body = await r.json().catch(() => ({ error: `${r.status} ${r.statusText}` }));
    if (r.status === 401) { // the session ended: sign in again and come back
      const here = location.pathname + location.search;
      if (body.login) location.assign(`${body.login}?next=${encodeURIComponent(here)}`);
      else location.reload();
      return;
    }
    if (!r.ok) throw new Error(body.error || String(r.status));
    document.body.dataset.match = body.match;
    let said;
    if (body.match === "one") said = showJob(body.job);
    else if (body.match === "ambiguous") said = showCandidates(body);
    else said = body.message;
    setState("ready", said);
  } catch (err) {
    setState("error", String(err.message || err));
  }
}

document.addEventListener("DOMContentLoaded", init);
})();
