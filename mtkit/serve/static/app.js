"use strict";
// The script of mtkit serve's page (served at /js/app.js, where LibreTranslate serves its page's).
// Clients written for LibreTranslate's page read its settings object's apiSecret: empty, as on a
// LibreTranslate that asks for no secret (mtkit serve never does).
const settings = {
  apiSecret: ""
};
const $ = (id) => document.getElementById(id);
let models = [];

async function load() {
  const answer = await (await fetch("v1/models")).json();
  models = answer.models || [];
  $("pair").innerHTML = "";
  for (const m of models) {
    const option = document.createElement("option");
    option.value = m.name;
    option.textContent = `${m.source} → ${m.target} (${m.name})`;
    $("pair").appendChild(option);
  }
}

async function translate() {
  const lines = $("input").value.split(/\r?\n/);
  const body = { text: lines, model: $("pair").value };
  const beam = parseInt($("beam").value, 10);
  if (beam > 0) body.beam = beam;
  const key = $("key").value.trim();
  if (key) body.api_key = key;  // in the body only: never in a URL, where logs would keep it
  $("status").textContent = "translating…";
  $("status").className = "muted";
  const started = performance.now();
  try {
    const response = await fetch("v1/translate", {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || response.statusText);
    $("output").textContent = answer.translations.map((t) => t.text).join("\n");
    const rows = answer.translations.map((t, i) => {
      if (t.confidence === null) return "";
      const row = document.createElement("tr");
      for (const cell of [`line ${i + 1}`, `confidence ${t.confidence.toFixed(3)}`,
                          `${(100 * Math.exp(t.confidence)).toFixed(1)} % per token`]) {
        const td = document.createElement("td");
        td.textContent = cell;
        row.appendChild(td);
      }
      return row;
    });
    $("scores").replaceChildren(...rows.filter((r) => r));
    $("status").textContent = `${Math.round(performance.now() - started)} ms`;
  } catch (e) {
    $("status").textContent = String(e.message || e);
    $("status").className = "error";
  }
}

$("go").addEventListener("click", translate);
$("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) translate(); });
load().catch((e) => { $("status").textContent = "cannot reach the server: " + e; $("status").className = "error"; });
