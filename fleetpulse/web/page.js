// The fleet page: asks /api/panel/NAME for each named panel over the last 15 minutes the store holds, every 5 s,
// and draws it: time series with uPlot (vendored), tables, stats, bars and a host x GPU heat map.
"use strict";

const state = (window.fleetpulse = { drawn: 0, rows: {}, errors: {} });
const plots = {};
const COLORS = ["#388bfd", "#f0883e", "#3fb950", "#d29922", "#a371f7", "#ff7b72", "#39c5cf", "#db61a2",
                "#8b949e", "#e3b341"];

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: ${r.status} ${(await r.text()).trim()}`);
  return r.json();
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k === "style") e.style.cssText = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

const isTime = (type) => /^(Nullable\()?DateTime/.test(type);
const isNumber = (type) => /^(Nullable\()?(U?Int|Float|Decimal)/.test(type);
const asSeconds = (v) => Date.parse(String(v).replace(" ", "T") + "Z") / 1000;

function show(v, unit) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "object") return Array.isArray(v) ? v.join(", ") : JSON.stringify(v);
  const n = Number(v);
  if (unit === "percentunit" && !Number.isNaN(n)) return (n * 100).toFixed(1) + " %";
  if (typeof v === "number" && !Number.isInteger(v)) return Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(2);
  return String(v);
}

function timeseries(body, p, got, from, to) {
  const timeAt = got.types.findIndex(isTime);
  const labelAt = got.types.findIndex((t, i) => i !== timeAt && !isNumber(t) && !isTime(t));
  const valueAts = got.types.map((t, i) => i).filter((i) => i !== timeAt && i !== labelAt && isNumber(got.types[i]));
  const xs = [...new Set(got.rows.map((r) => asSeconds(r[timeAt])))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const series = new Map();
  for (const row of got.rows) {
    const x = at.get(asSeconds(row[timeAt]));
    for (const i of valueAts) {
      const name = labelAt >= 0 ? `${row[labelAt]}${valueAts.length > 1 ? " " + got.columns[i] : ""}` : got.columns[i];
      if (!series.has(name)) series.set(name, new Array(xs.length).fill(null));
      series.get(name)[x] = row[i] === null ? null : Number(row[i]);
    }
  }
  const names = [...series.keys()].slice(0, 24);
  const opts = {
    width: Math.max(body.clientWidth - 4, 200), height: 190,
    scales: { x: { time: true, range: () => [from / 1000, to / 1000] } },  // the range asked, however few points
    axes: [{ stroke: "#9aa6b2", grid: { stroke: "#222a33" } },
           { stroke: "#9aa6b2", grid: { stroke: "#222a33" }, size: 70,
             values: (u, ticks) => ticks.map((t) => show(t, p.unit)) }],
    legend: { show: names.length <= 8 },
    series: [{}, ...names.map((name, i) => ({ label: name, stroke: COLORS[i % COLORS.length], width: 1.5,
                                              value: (u, v) => show(v, p.unit) }))],
  };
  if (plots[p.name]) plots[p.name].destroy();
  plots[p.name] = new uPlot(opts, [xs, ...names.map((n) => series.get(n))], body);
  if (series.size > names.length) body.append(el("div", { class: "legend" }, `${names.length} of ${series.size} series`));
}

function stat(body, p, got) {
  const box = el("div", { class: "stat" });
  got.columns.forEach((name, i) => {
    const unit = i === 0 ? p.unit : "";
    box.append(el("div", {}, el("b", {}, show(got.rows[0][i], unit)), el("span", {}, name.replaceAll("_", " "))));
  });
  body.append(box);
}

function table(body, p, got) {
  const head = el("tr", {}, ...got.columns.map((c) => el("th", {}, c)));
  const rows = got.rows.slice(0, 100).map((r) => el("tr", {}, ...r.map((v, i) => {
    const text = isTime(got.types[i]) ? String(v).slice(0, 19) : show(v, "");
    return el("td", { title: text }, text);
  })));
  body.append(el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows))));
}

function bars(body, p, got) {
  const top = Math.max(...got.rows.map((r) => Number(r[1])), 1);
  for (const r of got.rows) {
    const extra = got.columns.slice(2).map((c, i) => `${c} ${show(r[i + 2], "")}`).join(", ");
    body.append(el("div", { class: "bar", title: extra },
      el("span", {}, String(r[0])), el("i", { style: `width:${(100 * Number(r[1])) / top}%` }),
      el("span", {}, show(r[1], p.unit))));
  }
}

function heat(body, p, got) {
  // rows: host, gpu_index, gpu_temp_c, gpu_temp_c_max, power_w, throttled_share
  const hosts = [...new Set(got.rows.map((r) => r[0]))];
  const gpus = Math.max(...got.rows.map((r) => Number(r[1]))) + 1;
  const grid = el("div", { class: "heat", style: `grid-template-columns: 110px repeat(${gpus}, 1fr)` });
  const cell = new Map(got.rows.map((r) => [`${r[0]}/${r[1]}`, r]));
  const color = (t) => {
    const f = Math.min(Math.max((t - 30) / 60, 0), 1);  // 30 C blue .. 90 C red
    return `hsl(${Math.round(220 - 220 * f)}, 70%, ${55 - 10 * f}%)`;
  };
  for (const host of hosts.slice(0, 64)) {
    grid.append(el("span", { class: "host" }, host));
    for (let g = 0; g < gpus; g++) {
      const r = cell.get(`${host}/${g}`);
      grid.append(r ? el("span", { class: "cell", style: `background:${color(Number(r[3]))}`,
                                   title: `${host} GPU ${g}: mean ${r[2]} C, max ${r[3]} C, ${r[4]} W, ` +
                                          `throttled ${show(r[5], "percentunit")}` }, `${r[3]}°`)
                     : el("span", {}));
    }
  }
  body.append(grid, el("div", { class: "legend" },
    `hottest minute per GPU (colour: 30 °C blue to 90 °C red); hover for mean, power and throttling` +
    (hosts.length > 64 ? `; first 64 of ${hosts.length} hosts` : "")));
}

const DRAW = { timeseries, stat, table, bar: bars, heatmap: heat };

async function drawPanel(p, from, to) {
  const section = document.querySelector(`section[data-panel="${p.name}"]`);
  const body = section.querySelector(".body");
  try {
    const got = await getJSON(`/api/panel/${p.name}?from=${from}&to=${to}`);
    body.replaceChildren();
    state.rows[p.name] = got.rows.length;
    section.dataset.rows = String(got.rows.length);
    delete state.errors[p.name];
    if (!got.rows.length) body.append(el("div", { class: "empty" }, "nothing in this range"));
    else DRAW[p.kind](body, p, got, from, to);
  } catch (err) {
    state.errors[p.name] = String(err);
    body.replaceChildren(el("div", { class: "error" }, String(err)));
  }
}

async function refresh(panels) {
  try {
    const span = await getJSON("/api/span");
    if (!Number(span.gpu_rows)) {
      document.getElementById("range").textContent = "no samples stored yet";
      return;
    }
    const to = span.last + 1000;
    const from = Math.max(span.first, to - span.default_span_ms);
    const iso = (t) => new Date(t).toISOString().slice(0, 19).replace("T", " ");
    document.getElementById("range").textContent = `${iso(from)} to ${iso(to)} UTC`;
    await Promise.all(panels.map((p) => drawPanel(p, from, to)));
    state.drawn += 1;
    document.getElementById("updated").textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
  } catch (err) {
    document.getElementById("range").textContent = String(err);
  }
}

async function main() {
  const panels = await getJSON("/api/panels");
  const main = document.getElementById("panels");
  for (const p of panels) {
    main.append(el("section", { class: "panel", "data-panel": p.name, style: `grid-column: span ${p.width}` },
      el("h2", {}, p.title), el("p", { class: "desc" }, p.description), el("div", { class: "body" })));
  }
  const again = async () => {  // the next refresh 5 s after this one finished: a slow store never piles them up
    await refresh(panels);
    setTimeout(again, 5000);
  };
  await again();
}

main();
