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
