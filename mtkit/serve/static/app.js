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

// The Files tab (LibreTranslate's file translation: POST translate_file, then the translatedFileUrl it
// answers), shown when /frontend/settings says filesTranslation; the file chooser offers its formats.
async function loadFiles() {
  const settings = await (await fetch("frontend/settings")).json();
  if (!settings.filesTranslation) return;
  $("tab-files").hidden = false;
  $("file").accept = settings.supportedFilesFormat.join(",");
  $("formats").textContent = "Formats: " + settings.supportedFilesFormat.join(" ");
}

function showTab(files) {
  $("text-panel").hidden = files;
  $("files-panel").hidden = !files;
  $("tab-text").setAttribute("aria-selected", String(!files));
  $("tab-files").setAttribute("aria-selected", String(files));
  $("go").hidden = files;
}

async function translateFile() {
  const file = $("file").files[0];
  const model = models.find((m) => m.name === $("pair").value);
  if (!file || !model) return;
  const data = new FormData();
  data.append("file", file);
  data.append("source", model.source);
  data.append("target", model.target);
  data.append("api_key", $("key").value.trim());  // in the body only, as LibreTranslate's page sends it
  $("file-status").textContent = "translating…";
  $("file-status").className = "muted";
  $("file-result").hidden = true;
  const started = performance.now();
  try {
    const response = await fetch("translate_file", { method: "POST", body: data });
    const answer = await response.json();
    if (!response.ok) throw new Error(answer.error || response.statusText);
    const url = answer.translatedFileUrl;
    const dot = file.name.lastIndexOf(".");
    const name = dot > 0 ? `${file.name.slice(0, dot)}_${model.target}${file.name.slice(dot)}`
                         : `${file.name}_${model.target}`;
    $("file-link").href = url;
    $("file-link").download = name;
    $("file-link").textContent = name;
    $("file-result").hidden = false;
    $("file-status").textContent = `${Math.round(performance.now() - started)} ms`;
  } catch (e) {
    $("file-status").textContent = String(e.message || e);
    $("file-status").className = "error";
  }
}

$("tab-text").addEventListener("click", () => showTab(false));
$("tab-files").addEventListener("click", () => showTab(true));
$("file-go").addEventListener("click", translateFile);
loadFiles().catch(() => {});  // an older server without the settings: the Text tab alone
$("go").addEventListener("click", translate);
$("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && e.ctrlKey) translate(); });
load().catch((e) => { $("status").textContent = "cannot reach the server: " + e; $("status").className = "error"; });
