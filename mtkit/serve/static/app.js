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
  const model = models.find((m) => m.name === body.model);
  if (model && model.alignments) body.alignments = true;  // where its engine gives them (/v1/models)
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
    showAligned(lines, answer.translations);
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

// Each line's words as spans, source above, translation below: hovering a word lights up the words
// its alignment (/v1/translate's "alignment": [source word, target word] pairs) joins it with.
function words(line, side, index) {
  const div = document.createElement("div");
  line.split(/(\s+)/).forEach((part, k) => {
    if (k % 2) { div.appendChild(document.createTextNode(part)); return; }
    if (!part) return;
    const span = document.createElement("span");
    span.textContent = part;
    span.className = "w";
    span.dataset.side = side;
    span.dataset.line = index;
    span.dataset.word = Math.floor(k / 2) - (line.match(/^\s+/) ? 1 : 0);
    div.appendChild(span);
  });
  if (!div.childNodes.length) div.appendChild(document.createElement("br"));
  return div;
}

function showAligned(lines, translations) {
  const source = lines.map((line, i) => words(line, "src", i));
  const target = translations.map((t, i) => words(t.text, "tgt", i));
  $("source").replaceChildren(...source);
  $("output").replaceChildren(...target);
  $("source-box").hidden = !translations.some((t) => t.alignment && t.alignment.length);
  for (const [i, t] of translations.entries()) {
    for (const span of [...source[i].querySelectorAll(".w"), ...target[i].querySelectorAll(".w")]) {
      span.addEventListener("mouseenter", () => light(i, span, t.alignment || [], true));
      span.addEventListener("mouseleave", () => light(i, span, t.alignment || [], false));
    }
  }
}

function light(line, span, alignment, on) {
  const word = Number(span.dataset.word), fromSource = span.dataset.side === "src";
  span.classList.toggle("hl", on);
  for (const [s, t] of alignment) {
    if ((fromSource ? s : t) !== word) continue;
    const other = document.querySelector(
      `.w[data-side="${fromSource ? "tgt" : "src"}"][data-line="${line}"][data-word="${fromSource ? t : s}"]`);
    if (other) other.classList.toggle("hl", on);
  }
}

$("go").addEventListener("click", translate);
$("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) translate(); });
load().catch((e) => { $("status").textContent = "cannot reach the server: " + e; $("status").className = "error"; });
