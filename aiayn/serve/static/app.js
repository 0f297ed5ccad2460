// aiayn serve: the page. Plain JavaScript, no dependencies, nothing fetched but this server's API.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, attention: null, lastText: "", image: null };
const ACTION = { translation: "Translate", classification: "Classify", lm: "Generate", image_classification: "Classify" };

// ---- calls to the API -------------------------------------------------------------------------

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

function status(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

function fmt(x, digits = 3) {
  return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–";
}

// ---- the model card ---------------------------------------------------------------------------

function fact(name, value) {
  const dt = document.createElement("dt");
  const dd = document.createElement("dd");
  dt.textContent = name;
  dd.textContent = value;
  $("card-facts").append(dt, dd);
}

function showCard(info) {
  const m = (info.config && info.config.model) || {};
  const data = info.data || {};
  $("card-facts").replaceChildren();
  fact("kind", info.kind + (info.ensemble > 1 ? ` (ensemble of ${info.ensemble})` : ""));
  fact("folder", info.paths.join(", "));
  fact("parameters", info.parameters ? info.parameters.toLocaleString("en") : "not known (exported)");
  if (info.vocab_size != null) fact("vocabulary", info.vocab_size.toLocaleString("en"));
  if (m.d_model) {
    fact("shape", `d_model ${m.d_model}, ${m.n_heads} heads, d_ff ${m.d_ff}, ` +
      `${m.n_encoder_layers}+${m.n_decoder_layers} layers, ${m.norm_first ? "pre" : "post"}-LN`);
  }
  if (isImageModel(info)) {
    const grid = Math.floor(m.image_size / m.patch_size);
    fact("image", `${m.image_size}×${m.image_size}, ${m.channels === 1 ? "grey" : "RGB"}, ` +
      `patches of ${m.patch_size}×${m.patch_size} (${grid}×${grid}), ${m.pooling === "cls" ? "class token" : "mean pooling"}`);
  }
  if (data.dataset) {
    const pair = data.src_lang && data.tgt_lang ? ` ${data.src_lang}→${data.tgt_lang}` : "";
    fact("data", `${data.dataset}${pair}`);
  }
  if (info.kind === "translation") {
    const d = info.decode;
    fact("decoding", `beam ${d.beam}, α ${d.alpha}, max length ${d.max_len_a}·src + ${d.max_len_b}`);
  }
  fact("engine", info.engine + (info.routes.includes("/v1/attention") || info.kind !== "translation" ? "" : " (no attention view)"));
  showScores(info.scores || {});
  if (info.card) {
    $("card-readme").hidden = false;
    $("card-readme").querySelector("pre").textContent = info.card;
  }
}

function showScores(scores) {
  const rows = Object.entries(scores).map(([set, s]) => {
    const tr = document.createElement("tr");
    const parts = [];
    for (const key of ["bleu", "chrf", "accuracy", "perplexity"]) {
      if (typeof s[key] === "number") parts.push(`${key} ${fmt(s[key] * (key === "accuracy" ? 100 : 1), 2)}`);
    }
    tr.innerHTML = "<th></th><td></td>";
    tr.children[0].textContent = set;
    tr.children[1].textContent = parts.join(" · ") || "recorded";
    return tr;
  });
  if (rows.length) $("card-scores").tBodies[0].replaceChildren(...rows);
}

// ---- input and results ------------------------------------------------------------------------

function setUp(info) {
  state.model = info;
  const kind = info.kind;
  $("model-line").textContent = `${kind} model · ${info.paths[0]}`;
  $("run").textContent = ACTION[kind] || "—";
  $("run").disabled = !ACTION[kind];
  $("input-label").textContent = { translation: "Sentence to translate", classification: "Text to classify", lm: "Prompt", image_classification: "Image to classify (PNG or JPEG)" }[kind] || "Text";
  $("input-label").htmlFor = isImageModel(info) ? "image-file" : "input";
  for (const el of document.querySelectorAll(".for-translation")) el.hidden = kind !== "translation";
  for (const el of document.querySelectorAll(".for-lm")) el.hidden = kind !== "lm";
  for (const el of document.querySelectorAll(".for-image")) el.hidden = !isImageModel(info);
  $("input").hidden = isImageModel(info);
  if (kind === "translation") {
    $("beam").value = info.decode.beam;
    $("alpha").value = info.decode.alpha;
    $("nbest-n").value = Math.min(3, info.decode.beam);
  }
  if (kind === "lm") $("input").value = "The";
  showCard(info);
}

function intOf(id) { return parseInt($(id).value, 10); }
function numOf(id) { return parseFloat($(id).value); }

// An image classifier: a classifier that reads no text (no vocabulary) but pixels; the page sends
// it an uploaded file.
function isImageModel(info) { return info.vocab_size == null && info.routes.includes("/v1/classify"); }

async function run() {
  const text = $("input").value;
  const image = isImageModel(state.model);
  if (image && !$("image-file").files.length) { status("choose an image first", true); return; }
  if (!image && !text.trim()) { status("type something first", true); return; }
  $("run").disabled = true;
  status("working…");
  try {
    const kind = state.model.kind;
    if (image) await classifyImage($("image-file").files[0]);
    else if (kind === "translation") await translate(text);
    else if (kind === "classification") await classify(text);
    else if (kind === "lm") await generate(text);
    status("");
  } catch (err) {
    status(err.message, true);
  } finally {
    $("run").disabled = false;
  }
}

function timingLine(t, noun = "text") {
  return `${fmt(t.total_ms, 0)} ms (waited ${fmt(t.queue_ms, 0)}, computed ${fmt(t.compute_ms, 0)}` +
    ` in a batch of ${t.batch_texts} ${noun}${t.batch_texts > 1 ? "s" : ""} from ${t.batch_requests} request${t.batch_requests > 1 ? "s" : ""})`;
}

// The decoding controls set on the page (left out when off: the server's defaults apply).
function controls() {
  const c = {};
  const ngram = intOf("no-repeat");
  const penalty = numOf("rep-penalty");
  if (ngram > 0) c.no_repeat_ngram_size = ngram;
  if (isFinite(penalty) && penalty !== 1) c.repetition_penalty = penalty;
  return c;
}

async function translate(text) {
  const beam = intOf("beam");
  const nbest = Math.min(intOf("nbest-n") || 1, beam || 1);
  const prefix = $("prefix").value;
  const body = { texts: [text], beam, alpha: numOf("alpha"), nbest, ...controls() };
  if (prefix.trim()) body.prefixes = [prefix];
  if ($("alignments").checked) body.alignments = true;
  const data = await api("v1/translate", body);
  const t = data.translations[0];
  showAlignment(t.nbest[0]);
  $("result").hidden = false;
  $("output").textContent = t.text;
  const items = t.nbest.map((h, i) => {
    const li = document.createElement("li");
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = fmt(h.score);
    score.title = `log-probability ${fmt(h.log_prob)}; score = log-probability / length penalty`;
    li.append(score, " ", document.createTextNode(h.text));
    if (hasAttention()) {
      const button = document.createElement("button");
      button.className = "small";
      button.textContent = "attention";
      button.addEventListener("click", () => loadAttention(text, body, i + 1));
      li.append(" ", button);
    }
    return li;
  });
  $("nbest").replaceChildren(...items);
  $("timing").textContent = timingLine(data.timing);
  if (hasAttention()) await loadAttention(text, body, 1);
}

// The best hypothesis's alignment, when asked for: "source piece → output piece" per output token.
function showAlignment(h) {
  const p = $("alignment");
  p.hidden = !h.alignment;
  if (!h.alignment) return;
  p.textContent = "alignment: " + h.alignment.map(([i, j]) => `${h.src_tokens[i]}→${h.tokens[j]}`).join(" · ");
}

// An exported model (ONNX, CTranslate2) has no attention to show.
function hasAttention() { return state.model.routes.includes("/v1/attention"); }

// The classes as bars, likeliest first: [label, probability] pairs.
function showClasses(pairs) {
  const items = pairs.map(([label, p]) => {
    const li = document.createElement("li");
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = `${Math.round(120 * p)}px`;
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = fmt(p);
    li.append(bar, score, " ", document.createTextNode(label));
    return li;
  });
  $("nbest").replaceChildren(...items);
}

async function classify(text) {
  const data = await api("v1/classify", { texts: [text] });
  const r = data.results[0];
  $("result").hidden = false;
  $("output").textContent = r.label;
  showClasses(Object.entries(r.probs).sort((a, b) => b[1] - a[1]));
  $("timing").textContent = timingLine(data.timing);
}

// ---- an image: its classes and where the model looked ---------------------------------------

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(new Error(`cannot read ${file.name}`));
    reader.readAsDataURL(file);
  });
}

function loadPicture(url) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("the browser cannot show this image"));
    img.src = url;
  });
}

// A picture whose base64 would not fit the server's body limit (a phone's photo) is scaled down
// here first, to a JPEG of at most 4 times the model's side: the server resizes it to its side anyway.
async function fitted(url) {
  const limit = state.model.limits.max_body_bytes - 1024;
  if (url.length <= limit) return { url, note: "" };
  const picture = await loadPicture(url);
  const most = 4 * state.model.config.model.image_size;
  const scale = Math.min(1, most / Math.max(picture.naturalWidth, picture.naturalHeight));
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, Math.round(picture.naturalWidth * scale));
  canvas.height = Math.max(1, Math.round(picture.naturalHeight * scale));
  canvas.getContext("2d").drawImage(picture, 0, 0, canvas.width, canvas.height);
  const small = canvas.toDataURL("image/jpeg", 0.92);
  if (small.length > limit) throw new Error(`the picture does not fit the server's body limit (${limit} bytes) even scaled down`);
  return { url: small, note: `scaled down in the browser from ${picture.naturalWidth}x${picture.naturalHeight} to ${canvas.width}x${canvas.height}` };
}

async function classifyImage(file) {
  const { url, note } = await fitted(await readAsDataURL(file));
  // The heat maps need the model's attention weights: an exported model (ONNX) has none.
  const attention = state.model.engine === "torch";
  const body = { images: [url], top_k: intOf("image-top-k") || 5, attention };
  const data = await api("v1/classify", body);
  const r = data.results[0];
  $("result").hidden = false;
  $("output").textContent = r.label;
  showClasses(r.top.map(({ label, prob }) => [label, prob]));
  const converted = [note, r.converted].filter(Boolean).join(", then ");
  $("timing").textContent = (converted ? `${converted} · ` : "") + timingLine(data.timing, "image");
  $("image-attention").hidden = !r.attention;
  if (!r.attention) return;
  state.image = { att: r.attention, picture: await loadPicture(url), name: file.name };
  const a = r.attention;
  const options = [new Option("attention rollout", "rollout")];
  a.maps.forEach((heads, l) => heads.forEach((_, h) => options.push(new Option(`layer ${l + 1} head ${h + 1}`, `${l}.${h}`))));
  const keep = $("img-map").value;
  $("img-map").replaceChildren(...options);
  if (options.some((o) => o.value === keep)) $("img-map").value = keep;
  $("img-for").textContent = `over ${file.name}: predicted ${r.label} (${fmt(r.top[0].prob, 2)})`;
  $("img-hint").textContent = `The attention of the ${a.source} to each of the ${a.grid}×${a.grid} patches, ` +
    "drawn over the picture (each map scaled to its own range: dark, least; yellow, most). " +
    "Rollout: the attention followed through every layer, residual included (Abnar & Zuidema 2020).";
  drawImageAttention();
}

// The picture (as a square, as the model reads it) with the chosen map over its patches.
function drawImageAttention() {
  const { att, picture } = state.image;
  const which = $("img-map").value;
  const values = which === "rollout" ? att.rollout : att.maps[+which.split(".")[0]][+which.split(".")[1]];
  const canvas = $("img-canvas");
  const ctx = canvas.getContext("2d");
  const side = canvas.width;
  const cell = side / att.grid;
  ctx.imageSmoothingEnabled = false;
  ctx.globalAlpha = 1;
  ctx.drawImage(picture, 0, 0, side, side);
  const lo = Math.min(...values);
  const span = Math.max(...values) - lo;
  ctx.globalAlpha = 0.55;
  values.forEach((v, i) => {
    ctx.fillStyle = colour(span > 0 ? (v - lo) / span : 0);
    ctx.fillRect((i % att.grid) * cell, Math.floor(i / att.grid) * cell, cell, cell);
  });
  ctx.globalAlpha = 1;
  canvas.dataset.map = which;
  canvas.dataset.cells = values.length;
}

async function generate(prompt) {
  const body = {
    prompt, max_new_tokens: intOf("max-new-tokens"), temperature: numOf("temperature"), top_k: intOf("top-k"),
  };
  const response = await fetch("v1/generate", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    throw new Error(data.error || `HTTP ${response.status}`);
  }
  $("result").hidden = false;
  $("nbest").replaceChildren();
  $("output").textContent = prompt;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const event = /^event: (.*)$/m.exec(block)[1];
      const data = JSON.parse(/^data: (.*)$/m.exec(block)[1]);
      if (event === "token") $("output").textContent += data.text;
      else if (event === "error") throw new Error(data.error);
      else if (event === "done") {
        $("output").textContent = prompt + data.text; // the whole text, a last cut character included
        $("timing").textContent = `${[...data.text].length} characters in ${fmt(data.timing.total_ms, 0)} ms`;
      }
    }
  }
}

// ---- the attention explorer -------------------------------------------------------------------

async function loadAttention(text, asked, rank) {
  const body = { text, beam: asked.beam, alpha: asked.alpha, rank, ...controls() };
  if (asked.prefixes) body.prefix = asked.prefixes[0];
  const data = await api("v1/attention", body);
  state.attention = data;
  $("attention").hidden = false;
  $("att-for").textContent = `of hypothesis ${rank}: “${data.translation}”`;
  const layers = data.encoder.length || data.decoder.length;
  const heads = (data.encoder[0] || data.decoder[0]).length;
  fill($("att-layer"), layers);
  fill($("att-head"), heads);
  drawHeatmap();
}

function fill(select, n) {
  const keep = Math.min(parseInt(select.value || "1", 10), n);
  select.replaceChildren(...Array.from({ length: n }, (_, i) => new Option(String(i + 1), String(i + 1))));
  select.value = String(keep || 1);
}

// viridis, 5 stops (matplotlib's colormap, as in `aiayn plot attention`)
const VIRIDIS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function colour(w) {
  const x = Math.max(0, Math.min(1, w)) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const f = x - i;
  const c = VIRIDIS[i].map((v, k) => Math.round(v + f * (VIRIDIS[i + 1][k] - v)));
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}

// Per token, its display label: the whole character its byte-level pieces make (spans from the
// server: [first, count, label]), with the piece's place when a character has several.
function pieceLabels(spans) {
  const labels = [];
  for (const [, count, label] of spans) {
    for (let k = 0; k < count; k++) labels.push(count > 1 ? `${label} (piece ${k + 1}/${count})` : label);
  }
  return labels;
}

// A header cell per span: a character of several pieces spans their columns (rows).
function spanCell(span, axis) {
  const th = document.createElement("th");
  th.textContent = span[2];
  th.dataset.from = span[0];
  th.dataset.to = span[0] + span[1];
  if (span[1] > 1) th[axis === "col" ? "colSpan" : "rowSpan"] = span[1];
  return th;
}

function drawHeatmap() {
  const a = state.attention;
  const kind = $("att-kind").value;
  const layer = parseInt($("att-layer").value, 10) - 1;
  const head = parseInt($("att-head").value, 10) - 1;
  const src = a.src_spans;
  const tgt = a.tgt_spans;
  const rowSpans = { encoder: src, decoder: tgt, cross: tgt }[kind];
  const colSpans = { encoder: src, decoder: tgt, cross: src }[kind];
  const weights = a[kind][layer][head]; // (rows, cols)
  const queries = pieceLabels(rowSpans);
  const keys = pieceLabels(colSpans);
  const table = $("heatmap");
  const head_ = table.createTHead();
  head_.replaceChildren();
  const top = head_.insertRow();
  top.append(document.createElement("th"));
  for (const span of colSpans) top.append(spanCell(span, "col"));
  const starts = new Map(rowSpans.map((span) => [span[0], span]));
  const body = table.tBodies[0] || table.createTBody();
  body.replaceChildren();
  weights.forEach((row, i) => {
    const tr = body.insertRow();
    if (starts.has(i)) tr.append(spanCell(starts.get(i), "row"));
    row.forEach((w, j) => {
      const td = tr.insertCell();
      td.style.background = colour(w);
      td.dataset.row = i;
      td.dataset.col = j;
      td.title = `${queries[i]} → ${keys[j]}: ${w.toFixed(3)}`;
    });
  });
  table.dataset.rows = weights.length;
  table.dataset.cols = weights.length ? weights[0].length : 0;
}

function hover(event) {
  const td = event.target.closest("td");
  if (!td || !state.attention) return;
  const i = +td.dataset.row;
  const j = +td.dataset.col;
  const table = $("heatmap");
  for (const th of table.querySelectorAll("th.on")) th.classList.remove("on");
  const covers = (th, k) => +th.dataset.from <= k && k < +th.dataset.to;
  for (const th of table.tHead.rows[0].cells) if (covers(th, j)) th.classList.add("on");
  for (const th of table.tBodies[0].querySelectorAll("th")) if (covers(th, i)) th.classList.add("on");
  $("att-value").textContent = td.title;
}

// ---- start ------------------------------------------------------------------------------------

$("run").addEventListener("click", run);
$("input").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) run(); });
for (const id of ["att-kind", "att-layer", "att-head"]) $(id).addEventListener("change", drawHeatmap);
$("img-map").addEventListener("change", () => { if (state.image) drawImageAttention(); });
$("heatmap").addEventListener("mouseover", hover);

api("v1/model").then(setUp).catch((err) => {
  $("model-line").textContent = "the model could not be read";
  status(err.message, true);
});
