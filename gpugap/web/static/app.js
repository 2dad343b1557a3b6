// The gpugap page: reads the page's API (/api/NAME, fixed queries over the warehouse views)
// and draws it with Chart.js (bundled in the package). The state lives in the URL's query
// string, so every view can be linked to and reloaded. <body data-state> says "loading",
// "ready" or "error"; data-generation counts the views drawn (the browser tests wait on it).
(() => {
"use strict";

const { renderTable, records, fmtTime, fmtNumber } = window.gpugapTables;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
  "#bcbd22", "#7f7f7f"];
const charts = {};
window.gpugapCharts = charts;
let extent = null;
let generation = 0;
const $ = (id) => document.getElementById(id);

function setState(state, message) {
  document.body.dataset.state = state;
  $("status").textContent = message || "";
}

async function api(name, params) {
  const qs = params ? `?${params}` : "";
  const r = await fetch(`/api/${name}${qs}`, { headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => ({ error: `${r.status} ${r.statusText}` }));
  if (r.status === 401) signInAgain(body);
  if (!r.ok) throw new Error(`${name}: ${body.error || r.status}`);
  return body;
}

// a session that ended (its ID token expired, a sign-out elsewhere): sign in again and come
// back here; with a proxy in front, the page's own load goes through its sign-in
function signInAgain(body) {
  const here = location.pathname + location.search;
  if (body.login) location.assign(`${body.login}?next=${encodeURIComponent(here)}`);
  else location.reload();
}

// --- time range --------------------------------------------------------------------------
const HOUR = 3600;
const MAX_RANGE = 400 * 86400;
const hourCeil = (t) => Math.ceil(t / HOUR) * HOUR;
function toInput(epoch) { return fmtTime(epoch).replace(" ", "T"); }
function fromInput(text) {
  const t = Date.parse(`${text}:00Z`);
  return Number.isNaN(t) ? null : Math.floor(t / 1000);
}
function dataEnd() { return hourCeil(extent.latest + 60); }
function presetRange(preset) {
  const until = dataEnd();
  if (preset === "all") return [Math.max(extent.first, until - MAX_RANGE), until];
  return [until - Number(preset) * HOUR, until];
}

function selected(id) { return Array.from($(id).selectedOptions, (o) => o.value); }
function fillSelect(id, values, chosen) {
  const el = $(id);
  el.replaceChildren();
  for (const v of values) {
    const o = document.createElement("option");
    o.value = v;
    o.textContent = v;
    o.selected = chosen.includes(v);
    el.appendChild(o);
  }
}

// the URL's parameters, completed with the defaults (all the data, every cluster/team/class)
function stateFrom(search) {
  const p = new URLSearchParams(search);
  const preset = p.get("preset") || (p.get("from") ? "custom" : "all");
  let [since, until] = presetRange(preset === "custom" ? "all" : preset);
  if (preset === "custom") {
    since = Number(p.get("from")) || since;
    until = Number(p.get("to")) || until;
  }
  return {
    view: p.get("view") || "estate", preset, since, until,
    cluster: p.getAll("cluster"), team: p.getAll("team"), class: p.getAll("class"),
    by: p.get("by") || "class", allocation: p.get("allocation"), allocCluster: p.get("acluster"),
  };
}

function queryOf(s, withView = true) {
  const p = new URLSearchParams();
  if (withView && s.view !== "estate") p.set("view", s.view);
  if (s.preset !== "all") p.set("preset", s.preset);
  if (s.preset === "custom") { p.set("from", s.since); p.set("to", s.until); }
  for (const k of ["cluster", "team", "class"]) for (const v of s[k]) p.append(k, v);
  if (s.by !== "class") p.set("by", s.by);
  return p;
}

function apiParams(s, extra = {}) {
  const p = new URLSearchParams({ from: s.since, to: s.until });
  for (const k of ["cluster", "team", "class"]) for (const v of s[k]) p.append(k, v);
  for (const [k, v] of Object.entries(extra)) p.set(k, v);
  return p;
}

function showControls(s) {
  $("range-preset").value = s.preset;
  $("from").value = toInput(s.since);
  $("to").value = toInput(s.until);
  $("by").value = s.by;
}

function controlsState() {
  const preset = $("range-preset").value;
  let [since, until] = presetRange(preset === "custom" ? "all" : preset);
  if (preset === "custom") {
    since = fromInput($("from").value) ?? since;
    until = fromInput($("to").value) ?? until;
  }
  return {
    view: "estate", preset, since, until, by: $("by").value,
    cluster: selected("f-cluster"), team: selected("f-team"), class: selected("f-class"),
  };
}

// --- charts ------------------------------------------------------------------------------
function draw(id, config) {
  if (charts[id]) charts[id].destroy();
  const base = {
    animation: false, responsive: true, maintainAspectRatio: false,
    interaction: { mode: "index", intersect: false },
    plugins: { legend: { position: "bottom", labels: { boxWidth: 12 } } },
    elements: { point: { radius: 0 }, line: { borderWidth: 2 } },
  };
  config.options = Object.assign(base, config.options || {});
  charts[id] = new window.Chart($(id), config);
}

const axes = (stacked, title, xTitle) => ({
  x: { stacked, ticks: { maxTicksLimit: 12, autoSkip: true },
    title: { display: !!xTitle, text: xTitle } },
  y: { stacked, beginAtZero: true, title: { display: !!title, text: title } },
});
// the time charts' bucket, as the API chose it from the range (per minute over a few hours,
// per hour up to two weeks, per day beyond): said on the x axis
const bucketTitle = (series) => `UTC · ${series.bucket} buckets`;
const yTitle = (series) => `average GPUs per ${series.bucket.replace(/^1-/, "")} bucket`;

function drawTime(ts) {
  const line = (label, data, color, stack) => ({
    label, data, borderColor: color, backgroundColor: color, fill: false, stack, order: 0,
  });
  const datasets = [line("allocated", ts.allocated, "#1d2430", "a"),
    line("consumed", ts.consumed, "#2ca02c", "c")];
  ts.groups.forEach((g, i) => datasets.push({
    label: `gap · ${g.name}`, data: g.gap, stack: "gap", fill: i === 0 ? "origin" : "-1",
    borderColor: COLORS[i % COLORS.length], backgroundColor: `${COLORS[i % COLORS.length]}99`,
    borderWidth: 1, order: 1,
  }));
  draw("chart-time", { type: "line", data: { labels: ts.t.map(fmtTime), datasets },
    options: { scales: axes(true, yTitle(ts), bucketTitle(ts)),
      elements: { point: { radius: ts.t.length < 3 ? 3 : 0 }, line: { borderWidth: 2 } } } });
}

function drawSplit(split) {
  const rows = records(split);
  const classes = [...new Set(rows.map((r) => r.workload_class || "(none)"))];
  const schedulers = [...new Set(rows.map((r) => r.scheduler || "(none)"))];
  const datasets = [];
  schedulers.forEach((s, i) => {
    for (const [metric, alpha] of [["consumed_gpu_h", "ff"], ["gap_gpu_h", "88"]]) {
      datasets.push({
        label: `${s} ${metric === "gap_gpu_h" ? "gap" : "consumed"}`, stack: s,
        backgroundColor: `${COLORS[i % COLORS.length]}${alpha}`,
        data: classes.map((c) => rows.filter((r) => (r.workload_class || "(none)") === c &&
          (r.scheduler || "(none)") === s).reduce((a, r) => a + r[metric], 0)),
      });
    }
  });
  draw("chart-split", { type: "bar", data: { labels: classes, datasets },
    options: { scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true } } } });
}

function drawFree(free) {
  draw("chart-free", { type: "line", data: { labels: free.t.map(fmtTime), datasets: [
    { label: "unallocated", data: free.unallocated, borderColor: "#7f7f7f",
      backgroundColor: "#7f7f7f55", fill: "origin" },
    { label: "unattributed use", data: free.unattributed, borderColor: "#d62728",
      backgroundColor: "#d62728" },
  ] }, options: { scales: axes(false, yTitle(free), bucketTitle(free)),
    elements: { point: { radius: free.t.length < 3 ? 3 : 0 }, line: { borderWidth: 2 } } } });
}

function drawPadding(rows) {
  const top = rows.slice(0, 15);
  draw("chart-padding", { type: "bar", data: {
    labels: top.map((r) => r.name || r.allocation_id),
    datasets: [{ label: "padding GPU-h", data: top.map((r) => r.padding_gpu_h),
      backgroundColor: "#ff7f0e" }],
  }, options: { indexAxis: "y", plugins: { legend: { display: false } } } });
}

// --- the views ---------------------------------------------------------------------------
function card(id, value, digits = 1) {
  $(id).textContent = fmtNumber(value, digits);
  $(id).dataset.value = value ?? "";
}

const TOP_COLUMNS = ["allocation_id", "name", "cluster", "scheduler", "workload_class", "team",
  "owner", "gpus", "allocated_gpu_h", "consumed_gpu_h", "gap_gpu_h", "unmeasured_gpu_h"];
const cols = (keys) => keys.map((key) => ({ key, label: key.replace(/_gpu_h$/, " GPU-h")
  .replace(/_/g, " ") }));

// the cost table: null is "no rate" (a rate is missing for some of it), never 0
const NO_RATE = "no rate";
const COST_LABELS = { cluster: "cluster", environment: "environment", rate_status: "rate",
  allocated_gpu_h: "allocated GPU-h", allocated_cost: "allocated cost",
  unallocated_cost: "unallocated cost", egress_gib: "egress GiB", egress_cost: "egress cost",
  total_cost: "total" };
function drawCost(cost) {
  const money = (k) => k.endsWith("_cost");
  const unit = cost.currency ? ` (${cost.currency})` : "";
  const columns = cost.columns.map((key) => ({ key,
    label: `${COST_LABELS[key] || key.replace(/_/g, " ")}${money(key) ? unit : ""}` }));
  const rows = records(cost).map((r) => Object.fromEntries(Object.entries(r).map(
    ([k, v]) => [k, money(k) && (v === null || v === undefined) ? NO_RATE : v])));
  const notes = [];
  if (cost.rate_card) {
    notes.push(`Rate card ${cost.rate_card.name || cost.rate_card.card_id}, in ` +
      `${cost.currency}, loaded ${fmtTime(cost.rate_card.loaded_at)} UTC.`);
  } else {
    notes.push("No rate card is loaded in the warehouse, so every cost is \"no rate\": " +
      "load one with `gpugap cost load` (docs/cost.md).");
  }
  if (cost.filtered.class) {
    notes.push("The class filter does not apply to egress: it is every class's.");
  }
  if (cost.filtered.team) notes.push("The team filter leaves out unallocated capacity.");
  if (cost.truncated) notes.push("Truncated: more clusters or transfer directions than shown.");
  $("cost-note").textContent = notes.join(" ");
  $("cost-note").dataset.card = cost.rate_card ? "loaded" : "none";
  // the last row is every cluster's ("all"): below the sorted ones
  renderTable($("t-cost"), columns, rows.slice(0, -1), {
    empty: "no GPU-hours or transfers in the range", footer: rows.slice(-1) });
}

async function loadEstate(s) {
  const q = apiParams(s);
  const [sum, ts, split, top, idle, gangs, alerts, free, padding, queue, cost, lost, stranded,
    spread, quotas] = await Promise.all([
      api("summary", q), api("timeseries", apiParams(s, { by: s.by })), api("split", q),
      api("top_waste", q), api("idle_now", q), api("partial_gangs", q), api("alerts", q),
      api("unallocated", q), api("padding", q), api("queue_wait", q), api("cost", q),
      api("lost_work", q), api("stranded", q), api("spread_work", q), api("queue_quotas", q)]);
  card("sum-allocated", sum.allocated_gpu_h);
  card("sum-consumed", sum.consumed_gpu_h);
  card("sum-gap", sum.gap_gpu_h);
  card("sum-gap-pct", sum.gap_pct);
  card("sum-unmeasured", sum.unmeasured_gpu_h);
  card("sum-unallocated", sum.unallocated_gpu_h);
  card("sum-unattributed", sum.unattributed_gpu_h);
  card("sum-padding", padding.padding_gpu_h);
  drawTime(ts);
  drawSplit(split);
  drawFree(free);
  const back = queryOf(s, false);
  renderTable($("t-top"), cols(TOP_COLUMNS), records(top), {
    sortKey: "gap_gpu_h", empty: "no allocations in the range",
    link: (r, key) => {
      if (key === "name") return jobHref(r.cluster, r.allocation_id);
      if (key !== "allocation_id") return null;
      const p = new URLSearchParams(back);
      p.set("view", "allocation");
      p.set("acluster", r.cluster);
      p.set("allocation", r.allocation_id);
      return `?${p}`;
    },
  });
  renderTable($("t-idle"), cols(idle.columns), records(idle), { empty: "nothing idle now" });
  renderTable($("t-gangs"), cols(gangs.columns), records(gangs), { empty: "no partial gangs" });
  renderTable($("t-alerts"), cols(alerts.columns), records(alerts), { empty: "no open alerts" });
  const padded = records(padding);
  renderTable($("t-padding"), cols(padding.columns), padded, { sortKey: "padding_gpu_h",
    empty: "no Slurm job ended in the range" });
  drawPadding(padded);
  renderTable($("t-queue"), cols(queue.columns), records(queue), { sortKey: "waited_gpu_h",
    empty: "no work with a submit time started in the range" });
  renderTable($("t-lost"), cols(lost.columns), records(lost), { sortKey: "lost_gpu_h",
    empty: "nothing lost: no run ended preempted, requeued, on a failed node, evicted or " +
      "OOM-killed" });
  renderTable($("t-stranded"), cols(stranded.columns), records(stranded), {
    sortKey: "by_cpu_gpu_h", empty: "nothing stranded, or no node capacity polled in the range" });
  renderTable($("t-spread"), cols(spread.columns), records(spread), {
    sortKey: "allocated_gpu_h", empty: "no work spread over more nodes than it needed" });
  renderTable($("t-quotas"), cols(quotas.columns), records(quotas), { sortKey: "unused_gpu_h",
    empty: "no queue quota polled in the range" });
  drawCost(cost);
  return `${fmtTime(s.since)} – ${fmtTime(s.until)} UTC · ${top.rows.length} top allocations`;
}

// the per-job report of an allocation (/job, gpugap job's)
function jobHref(cluster, allocationId) {
  return `/job?${new URLSearchParams({ id: allocationId, cluster })}`;
}

async function loadAllocation(s) {
  const p = new URLSearchParams({ cluster: s.allocCluster || "", allocation: s.allocation || "" });
  const a = await api("allocation", p);
  $("alloc-title").textContent = `Allocation ${s.allocation} (${s.allocCluster})`;
  const dl = $("alloc-meta");
  dl.replaceChildren();
  for (const [k, v] of Object.entries(a.meta || {})) {
    const dt = document.createElement("dt");
    dt.textContent = k.replace(/_/g, " ");
    const dd = document.createElement("dd");
    dd.textContent = k.endsWith("_time") ? fmtTime(v) : String(v ?? "");
    dl.append(dt, dd);
  }
  const times = [...new Set(a.gpus.flatMap((g) => g.t))].sort((x, y) => x - y);
  const datasets = a.gpus.map((g, i) => {
    const at = new Map(g.t.map((t, j) => [t, g.activity[j]]));
    const color = COLORS[i % COLORS.length];
    return { label: `${g.node} ${g.gpu_uuid.slice(0, 12)}`, borderColor: color,
      backgroundColor: color, data: times.map((t) => at.get(t) ?? null), spanGaps: false,
      pointRadius: times.length < 3 ? 3 : 0 };
  });
  draw("chart-gpus", { type: "line", data: { labels: times.map(fmtTime), datasets },
    options: { scales: { y: { min: 0, max: 1, title: { display: true, text: "activity" } } } } });
  renderTable($("t-gpus"), cols(["gpu_uuid", "node", "allocated_gpu_h", "consumed_gpu_h",
    "gap_gpu_h"]), a.gpus, { sortKey: "gap_gpu_h", empty: "no GPU-hours stored" });
  $("back").href = `?${queryOf({ ...s, view: "estate" })}`;
  $("job-link").href = jobHref(s.allocCluster || "", s.allocation || "");
  return `${a.gpus.length} GPU(s)${a.truncated ? " (truncated)" : ""}`;
}

async function show(search) {
  const s = stateFrom(search);
  showControls(s);
  const alloc = s.view === "allocation";
  $("view-estate").hidden = alloc;
  $("view-allocation").hidden = !alloc;
  setState("loading", "loading…");
  const t0 = performance.now();
  try {
    const what = alloc ? await loadAllocation(s) : await loadEstate(s);
    generation += 1;
    Object.assign(document.body.dataset, { since: s.since, until: s.until });
    document.body.dataset.generation = String(generation);
    window.gpugapLoadMs = performance.now() - t0;
    setState("ready", what);
  } catch (err) {
    setState("error", String(err.message || err));
  }
}

function go(s) {
  const qs = queryOf(s).toString();
  history.pushState(null, "", qs ? `?${qs}` : location.pathname);
  show(location.search);
}

async function init() {
  try {
    let options;
    [extent, options] = await Promise.all([api("extent"), api("options")]);
    const p = new URLSearchParams(location.search);
    fillSelect("f-cluster", options.clusters, p.getAll("cluster"));
    fillSelect("f-team", options.teams, p.getAll("team"));
    fillSelect("f-class", options.classes, p.getAll("class"));
  } catch (err) {
    setState("error", String(err.message || err));
    return;
  }
  $("controls").addEventListener("submit", (e) => { e.preventDefault(); go(controlsState()); });
  $("range-preset").addEventListener("change", () => {
    if ($("range-preset").value !== "custom") go(controlsState());
  });
  for (const id of ["from", "to"]) {
    $(id).addEventListener("change", () => { $("range-preset").value = "custom"; });
  }
  $("by").addEventListener("change", () => go(controlsState()));
  $("reset").addEventListener("click", () => {
    for (const id of ["f-cluster", "f-team", "f-class"]) {
      for (const o of $(id).options) o.selected = false;
    }
    $("range-preset").value = "all";
    go(controlsState());
  });
  window.addEventListener("popstate", () => show(location.search));
  await show(location.search);
}

document.addEventListener("DOMContentLoaded", init);
})();
