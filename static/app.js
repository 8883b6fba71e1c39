// The translation page: asks serve.py's JSON API and draws what it answers; no build step.
"use strict";

const $ = (id) => document.getElementById(id);

// Sentences whose confidence is below this are marked (the server's confidence_mark_below).
let markBelow = 0.5;

// The elements documents.py places inside a sentence (its HTML_ROLES' inline and whole ones).
const INLINE = ["a", "abbr", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn", "em", "font", "i", "ins",
  "kbd", "label", "mark", "q", "s", "samp", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u",
  "var"];

// Viridis, as attention_plot.py draws the same heatmap, from 0 to 1.
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];

function color(weight) {
  const x = Math.min(Math.max(weight, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const [a, b] = [VIRIDIS[i], VIRIDIS[i + 1]];
  const rgb = a.map((channel, c) => Math.round(channel + (b[c] - channel) * (x - i)));
  return `rgb(${rgb.join(", ")})`;
}

// A request to the server; a refusal throws an Error with the server's own message.
async function api(path, body) {
  const headers = {"Content-Type": "application/json"};
  const key = $("key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = body === undefined ? {headers} : {method: "POST", headers, body: JSON.stringify(body)};
  const response = await fetch(path, init);
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    if (response.status === 401) $("key-box").hidden = false;
    throw new Error(data && data.error ? data.error : `${response.status} ${response.statusText}`);
  }
  return data;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = message === "";
}

async function loadModel() {
  try {
    const health = await api("/health");
    const checkpoint = health.checkpoint || health.model;
    $("model").textContent = `${checkpoint.split("/").pop()} · ${health.engine}`;
    $("model").title = health.source;
    markBelow = health.confidence_mark_below;
    const beam = $("beam");
    beam.replaceChildren(...Array.from({length: health.limits.serve_max_beam_size}, (_, i) => new Option(i + 1)));
    beam.value = health.beam_size;
    // A model of several target languages: the reader picks one (the server's default first).
    const languages = health.target_languages;
    $("target").replaceChildren(...languages.map((language) => new Option(language)));
    $("target").value = health.target_lang || languages[0];
    $("target-box").hidden = languages.length < 2;
    return true;
  } catch (error) {
    $("model").textContent = "Model unknown";
    showError(error.message);
    return false;
  }
}

// The translation as the source's text between its sentences and each sentence's translation, those
// with a confidence below markBelow marked, the value in their tooltip; where that does not give
// back the server's translation exactly, the translation as it is, and a note counts the marked.
function showTranslation({translation, split_for_length: cut, sentences}, text) {
  const source = Array.from(text);
  const parts = [];
  let position = 0;
  for (const sentence of sentences) {
    parts.push(document.createTextNode(source.slice(position, sentence.start).join("")));
    const span = document.createElement("span");
    span.append(...termNodes(sentence));
    if (sentence.confidence !== null && sentence.confidence !== undefined) {
      span.title = `confidence ${sentence.confidence.toFixed(2)}`;
      if (sentence.confidence < markBelow) span.className = "unsure";
    }
    parts.push(span);
    position = sentence.end;
  }
  parts.push(document.createTextNode(source.slice(position).join("")));
  const rebuilt = parts.map((part) => part.textContent).join("");
  const unsure = sentences.filter((s) => s.confidence !== null && s.confidence < markBelow).length;
  if (rebuilt === translation) {
    $("translation").replaceChildren(...parts);
  } else {
    $("translation").textContent = translation;
  }
  $("unsure").textContent = `${unsure} sentence${unsure === 1 ? " is" : "s are"} below confidence ${markBelow}` +
    (rebuilt === translation ? ": marked." : ".");
  $("unsure").hidden = unsure === 0;
  $("pieces").textContent = `${cut} sentence${cut === 1 ? " was" : "s were"} too long for the model: translated in pieces.`;
  $("pieces").hidden = cut === 0;
  $("result").hidden = false;
}

// A sentence's translation as text with each glossary term it holds (the server's "terms", offsets
// in code points) marked, its source term in the tooltip.
function termNodes({translation, terms = []}) {
  const characters = Array.from(translation);
  const nodes = [];
  let position = 0;
  for (const term of terms.filter((t) => t.start !== null).sort((a, b) => a.start - b.start)) {
    if (term.start < position) continue;
    nodes.push(document.createTextNode(characters.slice(position, term.start).join("")));
    const mark = document.createElement("mark");
    mark.className = "term";
    mark.textContent = characters.slice(term.start, term.end).join("");
    mark.title = `glossary: ${term.source} → ${term.target}`;
    nodes.push(mark);
    position = term.end;
  }
  nodes.push(document.createTextNode(characters.slice(position).join("")));
  return nodes;
}

// The glossary box's pairs, one "source term = target term" (or a tab between them) a line.
function glossaryPairs() {
  return $("glossary").value.split("\n").map((line) => line.trim()).filter((line) => line !== "").map((line) => {
    const cut = line.includes("\t") ? line.indexOf("\t") : line.indexOf("=");
    return cut < 0 ? [line, ""] : [line.slice(0, cut).trim(), line.slice(cut + 1).trim()];
  });
}

// A sentence of the text by its span, which counts Unicode code points (JavaScript strings count
// UTF-16 units, and differ past the Basic Multilingual Plane).
function sentenceText(text, {start, end}) {
  return Array.from(text).slice(start, end).join("");
}

function header(text, className) {
  const cell = document.createElement("th");
  cell.className = className;
  const label = document.createElement("span");
  label.textContent = text;
  cell.append(label);
  return cell;
}

function showHeatmap({source_tokens: sources, output_tokens: outputs, weights}) {
  const head = document.createElement("tr");
  head.append(document.createElement("th"), ...sources.map((token) => header(token, "source-token")));
  const rows = outputs.map((token, i) => {
    const row = document.createElement("tr");
    row.append(header(token, "output-token"), ...weights[i].map((weight, j) => {
      const cell = document.createElement("td");
      cell.style.background = color(weight);
      cell.title = `${token} → ${sources[j]}: ${weight.toFixed(3)}`;
      return cell;
    }));
    return row;
  });
  const table = $("heatmap");
  table.replaceChildren(document.createElement("thead"), document.createElement("tbody"));
  table.tHead.append(head);
  table.tBodies[0].append(...rows);
  $("attention").hidden = false;
}

// The inline elements of an HTML text, in document order. DOMParser's document is inert: nothing in it
// runs or loads.
function inlineElements(html) {
  const page = new DOMParser().parseFromString(html, "text/html");
  return Array.from(page.querySelectorAll(INLINE.join(",")));
}

function startTag(element) {
  const attributes = Array.from(element.attributes).map((a) => ` ${a.name}="${a.value}"`).join("");
  return `<${element.localName}${attributes}>`;
}

// Where each inline tag went: the source's and the translation's elements pair up in order, as the
// translation keeps the source's tag tree.
function showTags(source, translated) {
  const pairs = inlineElements(source).map((element, i) => [element, inlineElements(translated)[i]]);
  $("tag-table").tBodies[0].replaceChildren(...pairs.map(([from, to]) => {
    const row = document.createElement("tr");
    for (const text of [startTag(from), from.textContent, to ? to.textContent : ""]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      row.append(cell);
    }
    return row;
  }));
  $("tags").hidden = pairs.length === 0;
}

// HTML through LibreTranslate's API (format html): the markup kept, inline tags placed by the server.
async function translateHtml(text) {
  $("attention").hidden = true;
  const languages = await api("/languages");
  const source = languages.find((language) => language.targets.length > 0);
  const target = $("target-box").hidden ? source.targets[0] : $("target").value;
  const answer = await api("/translate", {q: text, source: source.code, target, format: "html"});
  $("translation").textContent = answer.translatedText;
  $("pieces").hidden = $("unsure").hidden = true;
  $("result").hidden = false;
  showTags(text, answer.translatedText);
}

async function translate(event) {
  event.preventDefault();
  const text = $("source").value;
  const button = $("translate");
  button.disabled = true;
  button.textContent = "Translating…";
  showError("");
  $("tags").hidden = true;
  try {
    if ($("format").value === "html") {
      await translateHtml(text);
      return;
    }
    // Only a model of several target languages is told which; the others need not be.
    const target = $("target-box").hidden ? {} : {target_lang: $("target").value};
    // The whole text in one request: the server finds its sentences and keeps its paragraphs.
    // A glossary only when one is given (the server refuses a malformed row in one line).
    const pairs = glossaryPairs();
    const glossary = pairs.length ? {glossary: pairs} : {};
    const answer = await api("/translate", {text, beam_size: Number($("beam").value), ...target, ...glossary});
    showTranslation(answer, text);
    $("attention").hidden = true;
    if (answer.sentences.length) {
      showHeatmap(await api("/attention", {text: sentenceText(text, answer.sentences[0]), ...target}));
    }
    if ($("model").textContent === "Model unknown") await loadModel();
  } catch (error) {
    $("result").hidden = true;
    $("attention").hidden = true;
    $("tags").hidden = true;
    showError(`The server refused this: ${error.message}`);
  } finally {
    button.disabled = false;
    button.textContent = "Translate";
  }
}

$("form").addEventListener("submit", translate);
$("source").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("form").requestSubmit();
});
loadModel();
