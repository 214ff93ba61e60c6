// The fleet page: asks /api/panel/NAME for each named panel over the last 15 minutes the store holds, every 5 s,
// and draws it: time series with uPlot (vendored), tables, stats, bars and a host x GPU heat map.
"use strict";

const state = (window.fleetpulse = { drawn: 0, rows: {}, errors: {}, range: null, outcomes: null, pipeline: null });
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

const TOP = 8;  // series per chart: the rest are named, never drawn unsaid

// Tick labels with as many decimals as the step between ticks needs, so no two read alike.
function ticks(unit) {
  return (u, splits, axis, space, incr) => {
    const scale = unit === "percentunit" ? 100 : 1;
    const step = Number((incr * scale).toPrecision(6));  // 0.25 % steps read 0.25, not 0.3
    const decimals = Math.min(3, (String(step).split(".")[1] || "").length);
    return splits.map((t) => (t * scale).toFixed(decimals) + (unit === "percentunit" ? " %" : ""));
  };
}

function timeLabels(from, to) {
  const long = to - from > 2 * 86400 * 1000;
  return (u, splits) => splits.map((t) => {
    const iso = new Date(t * 1000).toISOString();
    return long ? iso.slice(5, 10) + " " + iso.slice(11, 16) : iso.slice(11, to - from > 3 * 3600 * 1000 ? 16 : 19);
  });
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
  // Per host: the hottest (temperatures) or the ones that moved most (power, ...) are drawn, and the chart says so.
  const values = (n) => series.get(n).filter((v) => v !== null);
  const hottest = p.unit === "celsius";
  const rank = (n) => (hottest ? Math.max(...values(n)) : Math.max(...values(n)) - Math.min(...values(n)));
  const names = [...series.keys()].sort((a, b) => (labelAt >= 0 ? rank(b) - rank(a) : 0)).slice(0, TOP);
  const percent = p.unit === "percentunit";
  const opts = {
    width: Math.max(body.clientWidth - 4, 200), height: 200,
    // the range asked, however few points; from the start of a per-minute row that began before it
    scales: { x: { time: true, range: () => [Math.min(from / 1000, xs[0] ?? from / 1000), to / 1000] },
              // a share: 0-100 % where it is large (usable compute), else from 0 to a little over its peak
              y: percent ? { range: (u, lo, hi) => [0, hi > 0.5 ? Math.max(1, hi) : Math.max(hi * 1.25, 0.01)] } : {} },
    axes: [{ stroke: "#9aa6b2", grid: { stroke: "#222a33" }, space: 90, values: timeLabels(from, to) },
           { stroke: "#9aa6b2", grid: { stroke: "#222a33" }, size: 64, space: 30, values: ticks(p.unit) }],
    legend: { show: true, live: false },
    series: [{ label: "UTC" }, ...names.map((name, i) => ({ label: name, stroke: COLORS[i % COLORS.length], width: 1.5,
                                                            value: (u, v) => show(v, p.unit) }))],
  };
  if (plots[p.name]) plots[p.name].destroy();
  plots[p.name] = new uPlot(opts, [xs, ...names.map((n) => series.get(n))], body);
  // the grain of what was drawn: the bucket, or the rows' own (usable compute comes once a minute)
  const gaps = xs.slice(1).map((x, i) => x - xs[i]);
  const grain = Math.max(got.interval_s, gaps.length ? Math.min(...gaps) : 0);
  const step = grain < 60 ? `${grain} s` : grain % 3600 ? `${grain / 60} min` : `${grain / 3600} h`;
  body.append(el("div", { class: "legend" }, `one point per ${step}` + (series.size > names.length
    ? `; the ${names.length} ${hottest ? "hottest" : "that changed most"} of ${series.size} series in the range`
    : "")));
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
    const cut = text.length > 400 ? text.slice(0, 400) + " …" : text;  // all of it on hover
    return el("td", { title: text, class: text.length > 40 ? "long" : "" }, cut);
  })));
  body.append(el("div", { class: "table-wrap" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows))));
  if (got.rows.length > 100) body.append(el("div", { class: "legend" }, `the newest 100 of ${got.rows.length}`));
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
  // rows: host, gpu_index, gpu_temp_c, gpu_temp_c_max, power_w, throttled_share; hosts hottest first, all of them
  const hottest = new Map();
  for (const r of got.rows) hottest.set(r[0], Math.max(hottest.get(r[0]) ?? -Infinity, Number(r[3])));
  const hosts = [...hottest.keys()].sort((a, b) => hottest.get(b) - hottest.get(a) || (a < b ? -1 : 1));
  const gpus = Math.max(...got.rows.map((r) => Number(r[1]))) + 1;
  const grid = el("div", { class: "heat", style: `grid-template-columns: 110px repeat(${gpus}, 1fr)` });
  const cell = new Map(got.rows.map((r) => [`${r[0]}/${r[1]}`, r]));
  const color = (t) => {
    const f = Math.min(Math.max((t - 30) / 60, 0), 1);  // 30 C blue .. 90 C red
    return `hsl(${Math.round(220 - 220 * f)}, 70%, ${55 - 10 * f}%)`;
  };
  for (const host of hosts) {
    grid.append(el("span", { class: "host" }, host));
    for (let g = 0; g < gpus; g++) {
      const r = cell.get(`${host}/${g}`);
      grid.append(r ? el("span", { class: "cell", style: `background:${color(Number(r[3]))}`,
                                   title: `${host} GPU ${g}: mean ${r[2]} C, max ${r[3]} C, ${r[4]} W, ` +
                                          `throttled ${show(r[5], "percentunit")}` }, `${r[3]}°`)
                     : el("span", {}));
    }
  }
  body.append(el("div", { class: "heat-wrap" }, grid), el("div", { class: "legend" },
    `all ${hosts.length} hosts, hottest first` + (hosts.length > 16 ? " (scroll for the rest)" : "") +
    `; colour: hottest minute per GPU, 30 °C blue to 90 °C red; hover for mean, power and throttling`));
}

const KINDS = { fault: "#ff7b72", "out of service": "#d29922", validating: "#a371f7", returned: "#3fb950",
                paged: "#f0883e", straggler: "#39c5cf" };

function timeline(body, p, got, from, to) {
  // rows: lane (host), what, start_s, end_s, detail; one lane per host, marks placed on the range's time axis
  const lo = from / 1000, hi = to / 1000;
  const x = (t) => `${(100 * (Math.min(Math.max(t, lo), hi) - lo)) / (hi - lo)}%`;
  const lanes = new Map();
  for (const r of got.rows) (lanes.get(r[0]) ?? lanes.set(r[0], []).get(r[0])).push(r);
  const box = el("div", { class: "timeline" });
  const axis = el("div", { class: "lane axis" }, el("span", { class: "name" }, "UTC"));
  const track = el("div", { class: "track" });
  const fmt = timeLabels(from, to);
  for (let k = 0; k <= 6; k++) {
    const t = lo + ((hi - lo) * k) / 6;
    track.append(el("span", { class: "tick", style: `left:${x(t)}` }, fmt(null, [t])[0]));
  }
  axis.append(track);
  box.append(axis);
  for (const [lane, marks] of lanes) {
    const row = el("div", { class: "track" });
    for (const [, what, start, end, detail] of marks) {
      const s = Number(start), e = Number(end);
      const iso = (t) => new Date(t * 1000).toISOString().slice(11, 19);
      const tip = `${lane} ${what} ${iso(s)}${e > s ? "–" + iso(e) : ""}: ${detail}`;
      const style = `left:${x(s)};background:${KINDS[what] || "#8b949e"};` +
        (e > s ? `width:max(3px, calc(${x(e)} - ${x(s)}))` : "");
      row.append(el("span", { class: e > s ? "span" : "point", style, title: tip }));
    }
    box.append(el("div", { class: "lane" }, el("span", { class: "name" }, lane), row));
  }
  body.append(box, el("div", { class: "legend" },
    ...Object.entries(KINDS).map(([k, c]) => el("span", { class: "key" }, el("i", { style: `background:${c}` }), k)),
    ` · ${lanes.size} hosts; hover a mark for its time and reason`));
}

const DRAW = { timeseries, stat, table, bar: bars, heatmap: heat, timeline };

// The range's outcomes, as `fleetpulse report --from --to` prints them (one source: fleetpulse/outcomes.py).
async function drawOutcomes(from, to) {
  const section = document.querySelector('section[data-panel="outcomes"]');
  const body = section.querySelector(".body");
  try {
    const r = await getJSON(`/api/outcomes?from=${from}&to=${to}`);
    state.outcomes = r;
    const u = r.usable_compute, d = r.drains;
    const figure = (value, name) => el("div", {}, el("b", {}, value), el("span", {}, name));
    body.replaceChildren(el("div", { class: "stat" },
      figure(u.gpu_weighted === null ? "not known" : (u.gpu_weighted * 100).toFixed(1) + " %",
             `usable compute (${u.minutes} min, ${u.installed_gpu_hours} GPU-h)`),
      figure(r.interruptions.total, "interruptions"), figure(d.requested, "drains requested"),
      figure(d.returned, "returned"), figure(d.replaced, "to replace"),
      figure(d.gpu_hours_at_stake, "GPU-h at stake, as the drains estimated"),
      figure(d.gpu_hours_saved_after_jobs, "GPU-h saved by draining after the job"),
      figure(u.gpu_hours_lost.drains, "GPU-h lost to drains"),
      figure(u.gpu_hours_lost.faults_before_drain, "GPU-h lost to faults before a drain"),
      figure(r.stragglers.job_seconds_lost, "straggler job-seconds lost"), figure(r.alerts.pages, "pages")),
      ...r.notes.map((n) => el("div", { class: "legend" }, "note: " + n)));
    state.rows.outcomes = 1;
    delete state.errors.outcomes;
  } catch (err) {
    state.errors.outcomes = String(err);
    body.replaceChildren(el("div", { class: "error" }, String(err)));
  }
}

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

// PipelineLagging and FleetSilent as the alert topic has them now, not as the store has them: a lagging sink stores
// the alert that says so late (fleetpulse/alert_feed.py). A silent fleet and a silent pipeline read apart here.
async function drawPipeline() {
  const bar = document.getElementById("pipeline");
  let r;
  try {
    r = await getJSON("/api/pipeline");
  } catch (err) {
    r = { alerts: [], error: String(err) };
  }
  state.pipeline = r;
  const since = (t) => new Date(t * 1000).toISOString().slice(11, 19);
  const lines = r.alerts.map((a) => el("div", { class: "alert", "data-alert": a.alertname },
    el("b", {}, a.alertname), ` since ${since(a.starts_at)} UTC: ${a.summary}`));
  if (r.error) lines.push(el("div", { class: "feed-error" }, `pipeline alerts unknown: ${r.error}`));
  bar.replaceChildren(...lines);
  bar.hidden = !lines.length;
}

async function refresh(panels) {
  drawPipeline();
  try {
    const span = await getJSON("/api/span");
    if (!Number(span.gpu_rows)) {
      document.getElementById("range").textContent = "no samples stored yet";
      return;
    }
    // the newest sample (or outcome: a return after the last sample) and up to 15 minutes before it
    const to = Math.max(span.last + 1000, span.outcomes_last || 0);
    const from = Math.max(span.first, to - span.default_span_ms);
    const iso = (t) => new Date(t).toISOString().slice(0, 19).replace("T", " ");
    state.range = { from, to };
    document.getElementById("range").textContent = `${iso(from)} to ${iso(to)} UTC`;
    await Promise.all([drawOutcomes(from, to), ...panels.map((p) => drawPanel(p, from, to))]);
    state.drawn += 1;
    document.getElementById("updated").textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
  } catch (err) {
    document.getElementById("range").textContent = String(err);
  }
}

async function main() {
  const panels = await getJSON("/api/panels");
  const main = document.getElementById("panels");
  main.append(el("section", { class: "panel", "data-panel": "outcomes", style: "grid-column: span 24" },
    el("h2", {}, "This range"), el("p", { class: "desc" }, "The figures `fleetpulse report --from --to` prints for " +
      "the same range: usable GPU-hours of installed, one interruption per fault, drains and returns."),
    el("div", { class: "body" })));
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
