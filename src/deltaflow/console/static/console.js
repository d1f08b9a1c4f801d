// deltaflow console: vanilla JS over the read-only JSON API. Data is only ever put on
// the page as text (textContent), never as HTML. Pages poll the API every 2 s.
"use strict";

const POLL_MS = 2000;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

async function api(path) {
  const response = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
  return body;
}

function showError(err) {
  const box = document.getElementById("error");
  box.textContent = err ? String(err.message || err) : "";
  box.style.display = err ? "block" : "none";
}

function stamp() {
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

function fmtNum(n) { return n === null || n === undefined ? "-" : Number(n).toLocaleString("en-US"); }
function fmtBytes(n) {
  if (n === null || n === undefined || n < 0) return "-";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + units[i];
}
function fmtTime(ms) { return ms ? new Date(ms).toISOString().replace("T", " ").slice(0, 19) : "-"; }
function ago(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 90) return Math.round(s) + " s ago";
  if (s < 5400) return Math.round(s / 60) + " min ago";
  if (s < 172800) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}

// A bar chart: bars [{label, value, title}] in an SVG that fits its container.
function barChart(container, bars, opts) {
  opts = opts || {};
  const width = Math.max(320, container.clientWidth - 12 || 800), height = opts.height || 140;
  const pad = { l: 48, r: 8, t: 8, b: 22 };
  const chart = svg("svg", { width, height, role: "img", "aria-label": opts.label || "chart" });
  const max = Math.max(1, ...bars.map((b) => b.value || 0));
  const w = Math.min(48, (width - pad.l - pad.r) / Math.max(1, bars.length));  // a few bars stay bars
  chart.append(svg("text", { x: 2, y: pad.t + 8 }, fmtNum(max)));
  chart.append(svg("text", { x: 2, y: height - pad.b }, "0"));
  chart.append(svg("line", { x1: pad.l, x2: width - pad.r, y1: height - pad.b, y2: height - pad.b, stroke: "#999" }));
  bars.forEach((b, i) => {
    const h = ((b.value || 0) / max) * (height - pad.t - pad.b);
    const rect = svg("rect", {
      class: "bar" + (b.alt ? " alt" : ""), x: pad.l + i * w + 1, y: height - pad.b - h,
      width: Math.max(1, w - 2), height: h, "data-value": b.value || 0,
    });
    rect.append(svg("title", {}, b.title || b.label + ": " + fmtNum(b.value)));
    chart.append(rect);
  });
  const step = Math.max(1, Math.ceil(bars.length / 10));
  bars.forEach((b, i) => {
    if (i % step === 0) chart.append(svg("text", { x: pad.l + i * w + 2, y: height - 6 }, b.label));
  });
  container.replaceChildren(chart);
}

function cell(value, cls) { return el("td", { class: cls }, value === null || value === undefined ? "-" : String(value)); }

// ---- tables page ---------------------------------------------------------------------

// A log this long makes every load of the table list it for a long time (docs/realtime.md).
function longLogBadge(t) {
  return el("span", { class: "badge warn long-log",
    title: "every reader lists these files when it loads the table; keep less log history:"
      + " ALTER TABLE ... SET TBLPROPERTIES ('delta.logRetentionDuration' = 'interval 2 hours')" },
    fmtNum(t.log_files) + " log files");
}

async function tablesPage() {
  const body = await api("/api/tables");
  document.getElementById("roots").textContent = "under " + body.roots.join(", ");
  const rows = body.tables.map((t) => {
    if (t.error) return el("tr", { "data-id": t.id }, el("td", {}, t.id), el("td", { colspan: 9, class: "bad" }, t.error));
    const link = el("a", { href: "/table?id=" + encodeURIComponent(t.id) }, t.id);
    const warnings = t.warnings || [];
    const health = [el("span", { class: "badge " + (warnings.includes("small-files") ? "warn" : "ok") },
      t.small_files + " of " + t.num_files)];
    if (warnings.includes("long-log")) health.push(" ", longLogBadge(t));
    const last = t.last_commit || {};
    return el("tr", { "data-id": t.id },
      el("td", {}, link), cell(t.version, "num version"), cell(fmtNum(t.num_rows), "num rows"),
      cell(fmtNum(t.num_files), "num files"), cell(fmtBytes(t.size_bytes), "num size"),
      el("td", { class: "health" }, ...health),
      el("td", { title: fmtTime(last.timestamp) }, last.timestamp ? ago(last.timestamp) : "-"),
      cell(last.operation, "operation"), cell(t.streams.join(", "), "streams"),
      cell(t.readers.join(", "), "readers"));
  });
  document.querySelector("#tables tbody").replaceChildren(...rows);
  stamp();
}

// ---- table page ----------------------------------------------------------------------

const tableState = { id: null, latest: -1, commits: [], version: -1, loaded: false };

function historyRow(c) {
  const streams = c.transactions.map((t) => t.app_id.slice(0, 8) + "#" + t.version).join(", ");
  const row = el("tr", { "data-version": c.version, title: "preview version " + c.version },
    cell(c.version, "num"), el("td", {}, fmtTime(c.timestamp)), cell(c.operation),
    cell(fmtNum(c.rows_added), "num rows-added"), cell(fmtNum(c.rows_removed), "num"),
    cell(fmtNum(c.rows_updated), "num"), cell(c.files_added, "num"), cell(c.files_removed, "num"),
    cell(streams));
  row.addEventListener("click", () => {
    document.getElementById("preview-version").value = c.version;
    loadPreview();
  });
  return row;
}

async function loadOlder() {
  const last = tableState.commits[tableState.commits.length - 1];
  if (!last || last.version <= 0) return;
  const page = await api("/api/table/history?id=" + encodeURIComponent(tableState.id) + "&before=" + last.version + "&limit=200");
  tableState.commits = tableState.commits.concat(page.commits);
  drawHistory();
}

function drawHistory() {
  const recent = tableState.commits.slice(0, 100).reverse();
  barChart(document.getElementById("history-chart"), recent.map((c) => ({
    label: "v" + c.version, value: c.rows_added || c.rows_removed || c.rows_updated || 0,
    alt: !c.rows_added && (c.rows_removed || c.rows_updated),
    title: "v" + c.version + " " + c.operation + ": +" + fmtNum(c.rows_added) + " rows, +" + c.files_added + "/-" + c.files_removed + " files",
  })), { label: "rows per version" });
  document.querySelector("#history tbody").replaceChildren(...tableState.commits.map(historyRow));
}

async function loadDetail(id) {
  const t = await api("/api/table?id=" + encodeURIComponent(id));
  tableState.version = t.version;
  document.getElementById("title").textContent = t.id + (t.name ? " (" + t.name + ")" : "");
  document.getElementById("version").textContent = t.version;
  document.getElementById("num-rows").textContent = fmtNum(t.num_rows);
  document.getElementById("num-files").textContent = fmtNum(t.num_files);
  document.getElementById("size").textContent = fmtBytes(t.size_bytes);
  document.getElementById("small-files").textContent = t.small_files + " < " + fmtBytes(t.small_file_bytes);
  const logFiles = document.getElementById("log-files");
  logFiles.replaceChildren((t.warnings || []).includes("long-log") ? longLogBadge(t) : fmtNum(t.log_files));
  document.getElementById("partitions").textContent = t.partition_columns.join(", ") || "none";
  document.getElementById("clustering").textContent = t.clustering_columns.join(", ") || "none";
  document.querySelector("#schema tbody").replaceChildren(...t.schema.fields.map((f) =>
    el("tr", {}, cell(f.name), cell(typeof f.type === "string" ? f.type : JSON.stringify(f.type)), cell(f.nullable))));
  document.querySelector("#properties tbody").replaceChildren(...Object.entries(t.properties).map(([k, v]) =>
    el("tr", {}, cell(k), cell(v))));
  const versionInput = document.getElementById("preview-version");
  if (!versionInput.value) versionInput.placeholder = "latest (" + t.version + ")";
  const files = await api("/api/table/files?id=" + encodeURIComponent(id));
  barChart(document.getElementById("files-chart"), files.histogram.map((b) => ({
    label: fmtBytes(b.min_bytes), value: b.files, alt: b.max_bytes > 0 && b.max_bytes <= files.small_file_bytes,
    title: fmtBytes(b.min_bytes) + " - " + fmtBytes(b.max_bytes) + ": " + b.files + " files",
  })), { label: "files per size" });
  return t;
}

function fillRows(tableId, data) {
  const table = document.getElementById(tableId);
  table.querySelector("thead").replaceChildren(el("tr", {}, ...data.columns.map((c) => el("th", { title: c.type }, c.name))));
  table.querySelector("tbody").replaceChildren(...data.rows.map((r) => el("tr", {}, ...r.map((v) => cell(v)))));
}

async function loadPreview() {
  const version = document.getElementById("preview-version").value;
  const limit = document.getElementById("preview-limit").value || 20;
  const q = "/api/table/preview?id=" + encodeURIComponent(tableState.id) + "&limit=" + limit + (version ? "&version=" + version : "");
  try {
    const data = await api(q);
    fillRows("preview", data);
    document.getElementById("preview-note").textContent = data.num_rows + " rows of version " + data.version;
    document.getElementById("preview").setAttribute("data-version", data.version);
  } catch (err) { document.getElementById("preview-note").textContent = err.message; }
}

async function loadChanges(t) {
  const note = document.getElementById("cdf-note");
  if (!t.change_data_feed) { note.textContent = "Not enabled (delta.enableChangeDataFeed)."; return; }
  try {
    const data = await api("/api/table/changes?id=" + encodeURIComponent(t.id));
    fillRows("changes", data);
    note.textContent = data.num_rows + " change rows since version " + data.start + " (newest first)";
  } catch (err) { note.textContent = err.message; }
}

async function pollTable() {
  const id = tableState.id;
  const history = await api("/api/table/history?id=" + encodeURIComponent(id) + "&since=" + tableState.latest);
  if (history.commits.length) {
    tableState.commits = history.commits.concat(tableState.commits);
    tableState.latest = history.latest;
    drawHistory();
    const t = await loadDetail(id);
    loadChanges(t);
  }
  stamp();
}

async function tablePage() {
  tableState.id = new URLSearchParams(location.search).get("id");
  document.getElementById("preview-load").addEventListener("click", loadPreview);
  document.getElementById("history-older").addEventListener("click", () => run(loadOlder));
  const t = await loadDetail(tableState.id);
  const history = await api("/api/table/history?id=" + encodeURIComponent(tableState.id) + "&limit=200");
  tableState.commits = history.commits;
  tableState.latest = history.latest;
  drawHistory();
  tableState.loaded = true;
  loadPreview();
  loadChanges(t);
  stamp();
}

// ---- streams page --------------------------------------------------------------------

function ms(value) { return value === null || value === undefined ? "-" : fmtNum(value) + " ms"; }

async function streamsPage() {
  const body = await api("/api/streams");
  const cards = body.streams.map((s) => {
    const rates = el("div", { class: "chart rows" });
    const latency = el("div", { class: "chart latency" });
    const processing = el("div", { class: "chart processing" });
    const sources = s.sources.map((src) => src.table + " (read v" + src.read_version + ", " + src.versions_behind + " behind)");
    const box = el("section", { "data-app-id": s.app_id },
      el("h2", {}, "Query " + s.app_id),
      el("p", { class: "muted" }, "checkpoint: " + (s.checkpoint || "not under the roots") +
        " · reads: " + (sources.join(", ") || "-") + " · writes: " + (s.tables.join(", ") || "-")),
      el("div", { class: "cards" },
        card("Last batch", s.last_batch_id ?? "-", "last-batch"),
        card("Last commit", s.last_commit ? ago(s.last_commit) : "-"),
        card("Rows/s", s.rows_per_second ?? "-", "rate"),
        card("Latency p50", ms(s.latency_ms_p50), "latency-p50"), card("Latency p99", ms(s.latency_ms_p99), "latency-p99"),
        card("Processing p50", ms(s.processing_ms_p50)), card("Versions behind", s.versions_behind ?? "-", "behind")),
      s.last_error
        ? el("div", { class: "error last-error" },
            el("p", {}, "Last error (" + ago(s.last_error.timestamp) + (s.last_error.errorClass ? ", " + s.last_error.errorClass : "") + "):"),
            el("pre", { class: "error-detail" }, s.last_error.message))
        : el("p", { class: "muted last-error" }, "Last error: none recorded"),
      el("p", { class: "muted" }, "End-to-end latency per batch: sink commit minus the source commit of the oldest data read (ms)"), latency,
      el("p", { class: "muted" }, "Rows written per batch"), rates,
      el("p", { class: "muted" }, "Processing time per batch (ms)"), processing);
    document.getElementById("streams").append(box);
    const label = (b) => "#" + b.batch_id;
    barChart(latency, s.batches.map((b) => ({ label: label(b), value: b.latency_ms || 0 })), { height: 110 });
    barChart(rates, s.batches.map((b) => ({ label: label(b), value: b.rows || 0 })), { height: 110 });
    barChart(processing, s.batches.map((b) => ({ label: label(b), value: b.processing_ms || 0 })), { height: 110 });
    return box;
  });
  const list = document.getElementById("streams");
  list.replaceChildren(...(cards.length ? cards : [el("p", {}, "No streaming writes found in the tables' recent commits.")]));
  stamp();
}

function card(title, value, cls) {
  return el("div", { class: "card" }, el("div", { class: "muted" }, title), el("div", { class: "value " + (cls || "") }, String(value)));
}

// ---- pipelines page -----------------------------------------------------------------

// The dataflow graph: datasets in columns by layer (sources left), flows as curves.
function graphChart(container, graph) {
  const layers = {};
  graph.nodes.forEach((n) => { (layers[n.layer] = layers[n.layer] || []).push(n); });
  const nw = 150, nh = 26, gx = 70, gy = 16;
  const columns = Object.keys(layers).length;
  const rows = Math.max(1, ...Object.values(layers).map((l) => l.length));
  const width = columns * (nw + gx) + 20, height = rows * (nh + gy) + 20;
  const chart = svg("svg", { width, height, class: "graph", role: "img", "aria-label": "dataflow graph" });
  const at = {};
  Object.entries(layers).forEach(([layer, nodes]) => nodes.forEach((n, i) => {
    at[n.name] = { x: 10 + Number(layer) * (nw + gx), y: 10 + i * (nh + gy) };
  }));
  graph.edges.forEach((e) => {
    const a = at[e.from], b = at[e.to];
    if (!a || !b) return;
    const x1 = a.x + nw, y1 = a.y + nh / 2, x2 = b.x, y2 = b.y + nh / 2, mid = (x1 + x2) / 2;
    const path = svg("path", { d: `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`, "data-flow": e.flow });
    path.append(svg("title", {}, "flow " + e.flow));
    chart.append(path);
  });
  graph.nodes.forEach((n) => {
    const p = at[n.name];
    const g = svg("g", { "data-dataset": n.name });
    g.append(svg("rect", { class: "node " + (n.kind === "source" ? "source" : n.status || ""), x: p.x, y: p.y, width: nw, height: nh, rx: 4 }));
    g.append(svg("text", { x: p.x + 6, y: p.y + 17 }, n.name.length > 22 ? n.name.slice(0, 21) + "…" : n.name));
    g.append(svg("title", {}, n.name + " (" + (n.kind || "?") + ")" + (n.status ? ": " + n.status : "")));
    chart.append(g);
  });
  container.replaceChildren(chart);
}

function meter(rate) {
  const bar = el("span", {});
  bar.style.width = (rate === null ? 0 : rate * 100) + "%";
  return el("span", { class: "meter", title: rate === null ? "no rows" : (rate * 100).toFixed(2) + "% passed" }, bar);
}

async function pipelinesPage() {
  const body = await api("/api/pipelines");
  const list = document.getElementById("pipelines");
  const sections = body.pipelines.map((p) => {
    const graph = el("div", { class: "chart" });
    const latest = p.updates[0] || {};
    const section = el("section", { "data-pipeline": p.id },
      el("h2", {}, "Pipeline " + (p.pipeline_name || p.pipeline_id || p.id)),
      el("p", { class: "muted" }, "event log: " + p.event_log),
      el("div", { class: "cards" },
        card("Latest update", (latest.update_id || "-").slice(0, 8)),
        card("State", latest.state || "-", "update-state"),
        card("Started", latest.started ? ago(latest.started) : "-"),
        card("Updates", p.updates.length)),
      el("p", { class: "muted" }, "Dataflow graph of the latest update"), graph,
      el("h2", {}, "Flows"),
      el("table", { class: "grid flows" }, el("thead", {}, el("tr", {}, ...["Flow", "Dataset", "Status", "Trigger", "Rows", "Error"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...p.flows.map((f) => el("tr", { "data-flow": f.name },
          cell(f.name), cell(f.dataset), cell(f.status, "status"), cell(f.trigger === "RealTime" ? "real-time" : (f.trigger || ""), "trigger"), cell(fmtNum(f.rows), "num rows"), cell(f.error || ""))))),
      el("h2", {}, "Expectations"),
      el("table", { class: "grid expectations" }, el("thead", {}, el("tr", {}, ...["Dataset", "Expectation", "Passed", "Failed", "Pass rate"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...p.expectations.map((e) => el("tr", { "data-expectation": e.dataset + "." + e.name },
          cell(e.dataset), cell(e.name), cell(fmtNum(e.passed_records), "num passed"), cell(fmtNum(e.failed_records), "num failed"),
          el("td", {}, meter(e.pass_rate), " ", e.pass_rate === null ? "-" : (e.pass_rate * 100).toFixed(1) + "%"))))),
      el("h2", {}, "Updates"),
      el("table", { class: "grid updates" }, el("thead", {}, el("tr", {}, ...["Update", "Started", "State", "States", "Errors"].map((h) => el("th", {}, h)))),
        el("tbody", {}, ...p.updates.map((u) => el("tr", {},
          cell(u.update_id.slice(0, 8)), cell(fmtTime(u.started)), cell(u.state),
          cell(u.states.map((s) => s.state).join(" → ")), cell(u.errors.map((e) => e.error).join("; ")))))));
    list.append(section);
    graphChart(graph, p.graph);
    return section;
  });
  list.replaceChildren(...(sections.length ? sections : [el("p", {}, "No pipeline event logs (system/events) under the roots.")]));
  stamp();
}

// ---- ingest page --------------------------------------------------------------------

async function ingestPage() {
  const body = await api("/api/ingest");
  const list = document.getElementById("ingest");
  const sections = body.services.map((svc) => {
    const section = el("section", { "data-service": svc.url },
      el("h2", {}, svc.url + (svc.up ? "" : " (down)")),
      svc.error ? el("p", { class: "bad" }, svc.error) : el("p", { class: "muted" }, "scraped " + (svc.scraped_at ? ago(svc.scraped_at) : "-")));
    list.append(section);
    for (const t of svc.tables) {
      const rate = el("div", { class: "chart events" });
      const ack = el("div", { class: "chart ack" });
      section.append(el("div", { "data-table": t.table },
        el("h2", {}, "Table " + t.table),
        el("div", { class: "cards" },
          card("Events/s", t.events_per_second ?? "-", "events-rate"), card("Events", fmtNum(t.events_total), "events-total"),
          card("Rejected records", fmtNum(t.rejected_total), "rejected"), card("Ack p50", ms(t.ack_ms_p50)),
          card("Ack p99", ms(t.ack_ms_p99), "ack-p99"), card("Commits", fmtNum(t.commits_total)),
          card("Requests", Object.entries(t.requests_by_status).map(([k, v]) => k + ": " + v).join(", ") || "-")),
        el("p", { class: "muted" }, "Events per second"), rate,
        el("p", { class: "muted" }, "Acknowledgement latency p99 (ms)"), ack));
      const label = (p) => new Date(p.t).toLocaleTimeString();
      barChart(rate, svc.series.map((p) => ({ label: label(p), value: (p[t.table] || {}).events_per_second || 0 })), { height: 110 });
      barChart(ack, svc.series.map((p) => ({ label: label(p), value: (p[t.table] || {}).ack_ms_p99 || 0 })), { height: 110 });
    }
    return section;
  });
  list.replaceChildren(...(sections.length ? sections : [el("p", {}, "No services: start the console with --ingest http://HOST:PORT of a running deltaflow serve.")]));
  stamp();
}

// ---- start ---------------------------------------------------------------------------

function run(step) {
  step().then(() => showError(null), showError);
}

const page = document.body.dataset.page;
if (page === "tables") { run(tablesPage); setInterval(() => run(tablesPage), POLL_MS); }
if (page === "table") { run(tablePage); setInterval(() => { if (tableState.loaded) run(pollTable); }, POLL_MS); }
if (page === "pipelines") { run(pipelinesPage); setInterval(() => run(pipelinesPage), POLL_MS); }
if (page === "ingest") { run(ingestPage); setInterval(() => run(ingestPage), POLL_MS); }
if (page === "streams") { run(streamsPage); setInterval(() => run(streamsPage), POLL_MS); }
