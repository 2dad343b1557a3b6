// Who is signed in (with sign-on on: GPUGAP_WEB_SIGNON_MODE), a way out, and for a user their
// team's totals beside their own jobs. What each person sees is decided by the warehouse, never
// here: this only says who the page is showing it to.
"use strict";

(async function signedIn() {
  const where = document.getElementById("signed-in");
  if (!where) return;
  let who;
  try {
    const r = await fetch("/api/whoami", { headers: { Accept: "application/json" } });
    if (!r.ok) return; // not signed in (the page itself would not have loaded)
    who = await r.json();
    if (who.mode === "off") return; // no sign-on: the operators' page
  } catch (e) {
    return;
  }
  const role = who.role === "admin" ? "admin" : `${who.role} of ${who.team}`;
  const name = document.createElement("span");
  name.id = "who";
  name.textContent = `${who.user} (${role})`;
  where.append(name);
  const out = document.createElement("form");
  out.method = "post";
  out.action = "/auth/logout";
  const button = document.createElement("button");
  button.type = "submit";
  button.id = "sign-out";
  button.textContent = "Sign out";
  out.append(button);
  where.append(out);
  showRecommendations();
  if (who.role !== "user") return;
  const r = await fetch("/api/team_totals", { headers: { Accept: "application/json" } });
  if (!r.ok) return;
  const team = await r.json();
  const line = document.createElement("span");
  line.id = "team-totals";
  const fmt = (v) => Number(v || 0).toFixed(1);
  line.textContent = `team ${who.team}, last 30 days: ${fmt(team.allocated_gpu_h)} GPU-h ` +
    `allocated, ${fmt(team.consumed_gpu_h)} used, ${fmt(team.gap_gpu_h)} gap ` +
    `(${team.allocations || 0} jobs)`;
  where.append(line);
})();

// The recommendations the warehouse lets this person see; a lead (or an admin) decides them
// here, and the audit trail names the signed-in person (POST /api/decide).
async function showRecommendations() {
  const main = document.getElementById("view-estate");
  if (!main) return;
  const r = await fetch("/api/recommendations", { headers: { Accept: "application/json" } });
  if (!r.ok) return;
  const data = await r.json();
  const section = document.createElement("section");
  section.className = "wide";
  section.id = "recommendations";
  const title = document.createElement("h2");
  title.textContent = data.may_decide ? "Recommendations to decide" : "Recommendations for you";
  section.append(title);
  const table = document.createElement("table");
  const col = (name) => data.columns.indexOf(name);
  const head = table.insertRow();
  for (const h of ["kind", "target", "change", "GPU-h/week saved", "decision"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  if (data.rows.length === 0) {
    const td = table.insertRow().insertCell();
    td.colSpan = 5;
    td.className = "empty";
    td.textContent = "none";
  }
  for (const row of data.rows) {
    const tr = table.insertRow();
    tr.dataset.id = row[col("id")];
    tr.insertCell().textContent = row[col("kind")];
    tr.insertCell().textContent = row[col("target")];
    tr.insertCell().textContent =
      `${row[col("parameter")]}: ${row[col("from_value")]} \u2192 ${row[col("to_value")]}`;
    const saved = tr.insertCell();
    saved.className = "num";
    saved.textContent = Number(row[col("saved_gpu_h_per_week")] || 0).toFixed(1);
    const decision = tr.insertCell();
    const said = document.createElement("span");
    said.className = "decision";
    said.textContent = row[col("decision")]
      ? `${row[col("decision")]} (${row[col("decided_by")]})` : "";
    decision.append(said);
    if (data.may_decide) decision.append(decideForm(tr.dataset.id, said));
  }
  section.append(table);
  main.append(section);
}

function decideForm(id, said) {
  const form = document.createElement("span");
  const why = document.createElement("input");
  why.type = "text";
  why.placeholder = "why";
  why.className = "why";
  form.append(why);
  for (const decision of ["accept", "reject", "defer"]) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = decision;
    button.textContent = decision;
    button.addEventListener("click", async () => {
      const r = await fetch("/api/decide", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ id, decision, why: why.value }),
      });
      const answer = await r.json().catch(() => ({ error: `${r.status}` }));
      said.textContent = r.ok ? `${answer.decision} (${answer.decided_by})` : answer.error;
    });
    form.append(button);
  }
  return form;
}
