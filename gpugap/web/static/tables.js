// Sortable tables and number/time formatting for the gpugap page. Every value goes into the
// page as text (textContent), never as markup.
(() => {
"use strict";

const TIME_COLUMNS = new Set(["since", "last_minute", "opened_at", "updated_at", "end_time",
  "start_time", "first", "latest"]);
const RATIO_COLUMNS = new Set(["activity"]);

function pad2(n) { return String(n).padStart(2, "0"); }

function fmtTime(epoch) {
  if (epoch === null || epoch === undefined) return "";
  const d = new Date(epoch * 1000);
  return `${d.getUTCFullYear()}-${pad2(d.getUTCMonth() + 1)}-${pad2(d.getUTCDate())} ` +
    `${pad2(d.getUTCHours())}:${pad2(d.getUTCMinutes())}`;
}

function fmtNumber(v, digits) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number(v).toLocaleString("en-US", {
    minimumFractionDigits: digits, maximumFractionDigits: digits,
  });
}

function fmtCell(column, value) {
  if (value === null || value === undefined) return "";
  if (TIME_COLUMNS.has(column)) return fmtTime(value);
  if (RATIO_COLUMNS.has(column)) return `${fmtNumber(100 * value, 1)} %`;
  if (Array.isArray(value)) return value.join(", ");
  if (typeof value === "number") {
    return Number.isInteger(value) && !column.endsWith("_h") ? String(value) : fmtNumber(value, 2);
  }
  return String(value);
}

// Render rows into a <table>: columns [{key, label}], rows as objects; a click on a header
// sorts by it (numbers as numbers), a second click reverses. link(row, key) may return an href
// for a cell; footer: rows shown after the sorted ones, unsorted (totals).
function renderTable(table, columns, rows, opts = {}) {
  const state = { key: opts.sortKey || null, dir: opts.sortDir || "descending" };
  function draw() {
    table.replaceChildren();
    const thead = table.createTHead();
    const hr = thead.insertRow();
    for (const c of columns) {
      const th = document.createElement("th");
      th.textContent = c.label || c.key;
      th.dataset.key = c.key;
      th.scope = "col";
      if (state.key === c.key) th.setAttribute("aria-sort", state.dir);
      if (rows.length && typeof rows[0][c.key] === "number") th.className = "num";
      th.addEventListener("click", () => {
        state.dir = state.key === c.key && state.dir === "descending" ? "ascending" : "descending";
        state.key = c.key;
        draw();
      });
      hr.appendChild(th);
    }
    const body = table.createTBody();
    const sorted = rows.slice();
    if (state.key) {
      const k = state.key;
      const sign = state.dir === "ascending" ? 1 : -1;
      sorted.sort((a, b) => {
        const x = a[k], y = b[k];
        if (typeof x === "number" && typeof y === "number") return sign * (x - y);
        return sign * String(x ?? "").localeCompare(String(y ?? ""));
      });
    }
    if (!sorted.length) {
      const td = body.insertRow().insertCell();
      td.colSpan = columns.length;
      td.className = "empty";
      td.textContent = opts.empty || "none";
    }
    const fill = (section, rs) => rs.forEach((r) => {
      const tr = section.insertRow();
      for (const c of columns) {
        const td = tr.insertCell();
        const text = fmtCell(c.key, r[c.key]);
        const href = opts.link ? opts.link(r, c.key) : null;
        if (href) {
          const a = document.createElement("a");
          a.href = href;
          a.textContent = text;
          td.appendChild(a);
        } else {
          td.textContent = text;
        }
        if (typeof r[c.key] === "number") td.className = "num";
      }
    });
    fill(body, sorted);
    // rows that stay below the sorted ones (totals)
    if (opts.footer && opts.footer.length) fill(table.createTFoot(), opts.footer);
  }
  draw();
}

// {columns: [...], rows: [[...]]} -> [{column: value}]
function records(data) {
  return data.rows.map((r) => Object.fromEntries(data.columns.map((c, i) => [c, r[i]])));
}

window.gpugapTables = { renderTable, records, fmtTime, fmtNumber };
})();
