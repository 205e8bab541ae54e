// The page of `xmatch serve`: queries the API of the same server (no other origin, no library).
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("xmatch-token") || "";
let card = null;
const objectUrls = [];

function headers() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { ...headers(), ...(options.headers || {}) } });
  if (response.status === 401) {
    $("login").hidden = false;
    throw new Error("this server asks for a token");
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

async function picture(path) {
  const blob = await (await api(path)).blob();
  const url = URL.createObjectURL(blob);
  objectUrls.push(url);
  return url;
}

function say(text) { $("status").textContent = text; }

async function loadCard() {
  try {
    card = await (await api("card")).json();
  } catch (error) {
    $("card").textContent = error.message;
    return;
  }
  $("card").textContent = `${card.size} ${card.side} · ${card.model} · ${card.pooler} · fingerprint ${card.fingerprint.slice(0, 12)}`;
  $("rerank-switch").hidden = !card.verifier;
  const texts = card.side === "texts";
  $("text").hidden = texts;
  $("picture").hidden = !texts;
}

async function search(event) {
  event.preventDefault();
  for (const url of objectUrls.splice(0)) URL.revokeObjectURL(url);
  const k = Number($("k").value);
  const params = new URLSearchParams({ k: String(k), exact: String($("exact").checked) });
  if ($("rerank").checked && card && card.verifier) params.set("rerank", String(Math.min(k, card.limits.max_rerank)));
  $("go").disabled = true;
  say("searching…");
  try {
    let answer;
    if (card && card.side === "texts") {
      const file = $("picture").files[0];
      if (!file) throw new Error("choose a picture first");
      answer = await (await api(`search/image?${params}`, { method: "POST", body: file })).json();
    } else {
      params.set("text", $("text").value);
      answer = await (await api(`search?${params}`)).json();
    }
    show(answer);
  } catch (error) {
    say(error.message);
  } finally {
    $("go").disabled = false;
  }
}

const HOW = { exhaustive: "exact: every item scored", proven: "exact: proven by the stage-1 bound",
  estimated: "estimated: may miss items", unsettled: "not settled: may miss items", unchecked: "two-stage" };

function show(answer) {
  const ms = Object.values(answer.timings || {}).reduce((a, b) => a + b, 0);
  say(`${answer.hits.length} of ${answer.total} · ${HOW[answer.exactness] || answer.exactness} · ${ms.toFixed(1)} ms`);
  $("unknown").hidden = !answer.unknown_words.length;
  $("unknown").textContent = `Unknown to the model (they do not steer the ranking): ${answer.unknown_words.join(", ")}`;
  $("warnings").replaceChildren(...answer.warnings.map((w) => Object.assign(document.createElement("li"), { textContent: w })));
  const list = $("results");
  list.replaceChildren();
  answer.hits.forEach((hit, rank) => list.append(tile(hit, rank + 1, answer.query)));
}

function tile(hit, rank, query) {
  const item = document.createElement("li");
  item.className = "hit";
  item.tabIndex = 0;
  item.dataset.id = hit.id;
  const frame = document.createElement("div");
  frame.className = "noimage";
  frame.textContent = card && card.side === "texts" ? "caption" : (card && card.pictures ? "…" : "no picture");
  item.append(frame);
  const meta = document.createElement("div");
  meta.className = "meta";
  const name = Object.assign(document.createElement("div"), { className: "name", textContent: `${rank}. ${hit.id}` });
  const verifier = hit.verifier !== undefined ? ` · verifier ${hit.verifier.toFixed(3)}` : "";
  const score = Object.assign(document.createElement("div"), { className: "score", textContent: `score ${hit.score.toFixed(4)}${verifier}` });
  meta.append(name, score);
  if (hit.text) meta.append(Object.assign(document.createElement("div"), { className: "caption", textContent: hit.text }));
  item.append(meta);
  if (card && card.pictures && card.side === "images") {
    picture(`items/${hit.id.split("/").map(encodeURIComponent).join("/")}/thumbnail`).then((url) => {
      const img = Object.assign(document.createElement("img"), { src: url, alt: hit.id });
      frame.replaceWith(img);
    }).catch(() => { frame.textContent = "no picture"; });
  }
  if (card && card.side === "images") {
    const open = () => openAlignment(query, hit.id);
    item.addEventListener("click", open);
    item.addEventListener("keydown", (e) => { if (e.key === "Enter") open(); });
  }
  return item;
}

async function openAlignment(query, id) {
  const params = new URLSearchParams({ query, item: id });
  $("alignment-title").textContent = `${id}: “${query}”`;
  $("legend").replaceChildren();
  $("alignment-picture").removeAttribute("src");
  $("overlay").hidden = true;
  $("alignment").showModal();
  try {
    const pair = await (await api(`alignment?${params}`)).json();
    $("legend").replaceChildren(...pair.best.map((b) => {
      const entry = document.createElement("li");
      const swatch = Object.assign(document.createElement("span"), { className: "swatch" });
      swatch.style.background = b.colour;
      entry.append(swatch, `${b.word} ${b.cosine.toFixed(2)}`);
      return entry;
    }));
    if (card.pictures && pair.boxes) drawBest(pair, await picture(`items/${id.split("/").map(encodeURIComponent).join("/")}/thumbnail`));
    params.set("format", "png");
    $("alignment-picture").src = await picture(`alignment?${params}`);
  } catch (error) {
    $("alignment-title").textContent = error.message;
  }
}

// Each word's best region drawn on the picture in the word's colour (the figure below numbers regions instead).
function drawBest(pair, url) {
  const image = new Image();
  image.onload = () => {
    const canvas = $("overlay");
    const scale = Math.max(1, Math.min(3, 448 / Math.max(image.width, image.height)));  // small pictures enlarged
    canvas.width = Math.round(image.width * scale);
    canvas.height = Math.round(image.height * scale);
    const context = canvas.getContext("2d");
    context.drawImage(image, 0, 0, canvas.width, canvas.height);
    context.lineWidth = 3;
    context.font = "bold 13px system-ui, sans-serif";
    const shared = new Map();  // words whose best region is the same: boxes inset, labels stacked
    const placed = pair.best.map((b) => {
      const nth = shared.get(b.region) || 0;
      shared.set(b.region, nth + 1);
      return { ...b, nth };
    });
    for (const b of placed) {  // every box first, so no box hides a label
      const [x1, y1, x2, y2] = b.box;
      const inset = Math.min(2 * b.nth, 8);
      context.strokeStyle = b.colour;
      context.strokeRect(x1 * canvas.width + inset, y1 * canvas.height + inset,
        Math.max((x2 - x1) * canvas.width - 2 * inset, 4), Math.max((y2 - y1) * canvas.height - 2 * inset, 4));
    }
    for (const b of placed) {
      const x = b.box[0] * canvas.width, y = b.box[1] * canvas.height + 17 * b.nth;
      context.fillStyle = b.colour;
      context.fillRect(x, y, context.measureText(b.word).width + 6, 16);
      context.fillStyle = "white";
      context.fillText(b.word, x + 3, y + 12);
    }
    canvas.hidden = false;
  };
  image.src = url;
}

$("search").addEventListener("submit", search);
$("login").addEventListener("submit", (event) => {
  event.preventDefault();
  token = $("token").value;
  sessionStorage.setItem("xmatch-token", token);
  $("login").hidden = true;
  loadCard();
});
loadCard();
