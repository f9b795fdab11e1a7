// The agent-driver console: one instance's timeline from the control plane's SSE stream (what the store
// committed) and actions as stored commands through the JSON API. No build step, no libraries.
"use strict";

const RUN_TERMINALS = new Set(["run.completed", "run.failed", "run.cancelled"]);
const STATUS_DONE = new Set(["completed", "failed", "cancelled"]);

const state = {
  instance: null,
  source: null,
  summary: null,
  activeRun: null,
  items: new Map(), // key (message/tool/permission/host call/command id) -> element
  seen: new Set(), // event ids shown (exposed for tests as window.agentConsole)
  received: 0, // stored events received, repeats included
  linkHistory: [],
  spend: new Map(), // run id (or "outside runs") -> the model proxy's figures (model.usage, PROTOCOL §6.7)
};
window.agentConsole = state;

// ---- small helpers ---------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function clock(iso) {
  return iso ? new Date(iso).toLocaleTimeString([], { hour12: false }) : "";
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

function text(value) {
  if (value === null || value === undefined) return "";
  return typeof value === "string" ? value : json(value);
}

function notice(message, isError = false) {
  const node = document.getElementById("notice");
  node.textContent = message;
  node.title = message; // the line never wraps (nothing below it moves): the whole text on hover
  node.classList.toggle("error", isError);
}

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.error || `${response.status} ${response.statusText}`);
  return data;
}

function instancePath(suffix) {
  return `/api/instances/${encodeURIComponent(state.instance)}${suffix}`;
}

async function command(kind, fields) {
  try {
    const answer = await api("POST", instancePath("/commands"), { kind, ...fields });
    notice(`${kind} queued (seq ${answer.seq})${answer.sent ? "" : "; it is sent when the driver connects"}`);
    return answer;
  } catch (error) {
    notice(`${kind} refused: ${error.message}`, true);
    return null;
  }
}

function newId(prefix) {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// ---- instances ---------------------------------------------------------------------------------------

async function loadInstances() {
  let data;
  try {
    data = await api("GET", "/console/instances");
  } catch (error) {
    notice(`cannot list instances: ${error.message}`, true);
    return;
  }
  const list = document.getElementById("instance-list");
  const known = Array.from(list.querySelectorAll("button"), (b) => b.dataset.instance).join("\n");
  if (known === data.instances.map((i) => i.instance_id).join("\n")) {
    // Same instances: update in place, so keyboard focus stays where it is.
    for (const inst of data.instances) {
      const button = list.querySelector(`button[data-instance="${CSS.escape(inst.instance_id)}"]`);
      button.dataset.link = inst.link;
      button.querySelector(".meta").textContent = `${inst.runtime || "?"} · ${inst.link} · epoch ${inst.epoch ?? "?"}`;
    }
    return;
  }
  list.replaceChildren();
  for (const inst of data.instances) {
    const button = el(
      "button",
      { type: "button", "data-instance": inst.instance_id, "data-link": inst.link },
      el("span", { class: "name", text: inst.instance_id }),
      el("span", { class: "meta", text: `${inst.runtime || "?"} · ${inst.link} · epoch ${inst.epoch ?? "?"}` }),
    );
    if (inst.instance_id === state.instance) button.setAttribute("aria-current", "true");
    button.addEventListener("click", () => select(inst.instance_id));
    list.append(el("li", {}, button));
  }
  const wanted = decodeURIComponent(location.hash.replace(/^#instance=/, "").replace(/&.*$/, ""));
  if (!state.instance && data.instances.length) {
    const pick = data.instances.find((i) => i.instance_id === wanted) || data.instances[0];
    select(pick.instance_id);
  }
}

function select(instanceId) {
  if (state.source) state.source.close();
  Object.assign(state, { instance: instanceId, summary: null, activeRun: null, received: 0, linkHistory: [] });
  state.items = new Map();
  state.seen = new Set();
  history.replaceState(null, "", `#instance=${encodeURIComponent(instanceId)}`);
  document.getElementById("timeline").replaceChildren();
  document.getElementById("waiting").replaceChildren();
  document.getElementById("summary").hidden = false;
  document.getElementById("composer").hidden = false;
  document.getElementById("summary-id").textContent = instanceId;
  for (const b of document.querySelectorAll("#instance-list button")) {
    b.toggleAttribute("aria-current", b.dataset.instance === instanceId);
  }
  // EventSource resends the last `id` as Last-Event-ID when it reconnects: the stream resumes there.
  const source = new EventSource(`/console/instances/${encodeURIComponent(instanceId)}/stream`);
  state.source = source;
  const streamState = document.getElementById("stream-state");
  source.onopen = () => {
    streamState.dataset.stream = "live";
    streamState.textContent = "live";
  };
  source.onerror = () => {
    streamState.dataset.stream = "reconnecting";
    streamState.textContent = "reconnecting…";
  };
  source.addEventListener("instance", (e) => showSummary(JSON.parse(e.data)));
  source.addEventListener("commands", (e) => following(() => JSON.parse(e.data).forEach(showCommand)));
  source.addEventListener("command", (e) => following(() => showCommand(JSON.parse(e.data))));
  source.addEventListener("stored", (e) => following(() => showEvent(JSON.parse(e.data))));
  if (window.agentTerminals) window.agentTerminals.select(instanceId, source); // terminals.js
}

function showSummary(s) {
  state.summary = s;
  const link = document.getElementById("link-state");
  link.dataset.link = s.link;
  link.textContent = s.link;
  if (state.linkHistory[state.linkHistory.length - 1] !== s.link) state.linkHistory.push(s.link);
  const outbox = s.outbox || {};
  // Fields that do not apply are null (PROTOCOL §2.5): show the rest.
  const activity = Object.fromEntries(Object.entries(s.activity || {}).filter(([, v]) => v !== null));
  // One line, always (it never wraps): a heartbeat must not change the height of what is above the
  // timeline, or every row and button below it moves under the pointer (a lost Deny click).
  // What changes first (cut last when the line is too long for the window), what never changes last.
  const fields = [
    ["state", s.state],
    ["run", s.run_id],
    ["queued", (s.queued || []).length ? s.queued.join(", ") : "-"],
    ["provider restarts", s.provider_restarts],
    ["epoch", s.epoch],
    ["runtime", s.runtime],
    ["session", s.session_kind],
  ];
  // What changes at every heartbeat: folded under "Diagnostics".
  const diagnostics = [
    ["last heartbeat", clock(s.last_heartbeat)],
    ["outbox pending", outbox.lossless_pending],
    ["best-effort drops", outbox.best_effort_dropped],
    ["activity", Object.keys(activity).length ? Object.entries(activity).map(([k, v]) => `${k}=${v}`).join(", ") : "-"],
  ];
  const pairs = (list) => list.flatMap(([k, v]) => [
    el("dt", { text: k }),
    el("dd", { "data-field": k.replace(/ /g, "-"), text: v === null || v === undefined ? "-" : String(v) }),
  ]);
  const line = document.getElementById("summary-fields");
  line.replaceChildren(...pairs(fields));
  line.title = fields.map(([k, v]) => `${k} ${v ?? "-"}`).join(" · "); // the whole line, when it is cut
  document.getElementById("diagnostic-fields").replaceChildren(...pairs(diagnostics));
  const item = document.querySelector(`#instance-list button[data-instance="${CSS.escape(s.instance_id)}"]`);
  if (item) item.dataset.link = s.link;
}

// ---- the timeline ------------------------------------------------------------------------------------

// Rows are kept in control-plane time order: commands (created_at) and stored events (stored_at).
function place(row, at) {
  row.dataset.at = at || "";
  const timeline = document.getElementById("timeline");
  let after = timeline.lastElementChild;
  while (after && after.dataset.at > row.dataset.at) after = after.previousElementSibling;
  if (after) after.after(row);
  else timeline.prepend(row);
}

// Follow the newest rows while the reader is at the bottom; leave them alone after they scrolled up.
function following(update) {
  const timeline = document.getElementById("timeline");
  const atBottom = timeline.scrollHeight - timeline.scrollTop - timeline.clientHeight < 80;
  update();
  if (atBottom) timeline.scrollTop = timeline.scrollHeight;
}

function rawOf(event) {
  return {
    event_id: event.event_id,
    seq: event.seq,
    epoch: event.epoch,
    delivery: event.delivery,
    kind: event.kind,
    run_id: event.run_id,
    session_id: event.session_id,
    occurred_at: event.occurred_at,
    stored_at: event.stored_at,
    payload: event.payload,
  };
}

function rawDetails(event) {
  const raw = rawOf(event);
  return el("details", { class: "raw" }, el("summary", { text: `${event.kind} · seq ${event.seq} · epoch ${event.epoch} · ${event.delivery}` }), el("pre", { text: json(raw) }));
}

function row(kind, event, cls, ...body) {
  const node = el("article", { class: `ev ${cls || ""}`, "data-kind": event ? event.kind : kind, "data-event-id": event ? event.event_id : null });
  node.append(el("header", {}, el("time", { text: clock(event ? event.occurred_at : null) }), el("span", { class: "kind", text: kind })), ...body);
  if (event) node.append(rawDetails(event));
  return node;
}

// A row that is not the conversation (diagnostics, timings, log lines, commands, bookkeeping): one line,
// folded; opening it shows the whole event. The conversation (messages, tools, prompts, terminals)
// keeps the room.
function folded(label, event, cls, detail, ...body) {
  const node = el(
    "details",
    { class: `ev folded ${cls || ""}`, "data-kind": event.kind, "data-event-id": event.event_id },
    el("summary", {}, el("time", { text: clock(event.occurred_at) }), el("span", { class: "kind", text: label }), el("span", { class: "detail", text: detail })),
    ...body,
  );
  node.append(el("pre", { class: "raw-json", text: json(rawOf(event)) }));
  return node;
}

// `key=value` pairs of a payload on one line (what a folded row of an unknown kind says).
function brief(p) {
  return Object.entries(p || {})
    .filter(([, v]) => v !== null && v !== undefined && v !== "")
    .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`)
    .join(" ");
}

function keyed(key, make, at, event) {
  let node = state.items.get(key);
  if (!node) {
    node = make();
    const time = node.querySelector("time");
    if (time && event) time.textContent = clock(event.occurred_at);
    state.items.set(key, node);
    place(node, at);
  }
  return node;
}

// A card built from several events (started, completed...) has one raw line for all of them.
function addRaw(node, event) {
  const raw = node.querySelector(":scope > details.raw");
  if (!raw) return node.append(rawDetails(event));
  raw.append(el("pre", { text: json(rawOf(event)) }));
  const events = raw.querySelectorAll("pre").length;
  raw.querySelector("summary").textContent = `${events} events · last: ${event.kind} · seq ${event.seq} · epoch ${event.epoch} · ${event.delivery}`;
}

function showEvent(event) {
  state.received += 1;
  if (state.seen.has(event.event_id)) return;
  state.seen.add(event.event_id);
  const p = event.payload || {};
  const at = event.stored_at;
  const handler = HANDLERS[event.kind];
  if (handler) handler(event, p, at);
  else place(folded(event.kind, event, "generic", brief(p)), at);
  if (event.kind === "run.started") state.activeRun = p.run_id || event.run_id;
  if (RUN_TERMINALS.has(event.kind) && state.activeRun === event.run_id) state.activeRun = null;
  busyHint();
}

function streamed(key, label, cls, event, at) {
  return keyed(key, () => {
    const node = row(label, null, cls, el("div", { class: "text" }));
    node.dataset.state = "streaming";
    node.dataset.deltas = "0";
    return node;
  }, at, event);
}

function message(event, p, at) {
  const node = streamed(`m:${p.message_id}`, p.role === "user" ? "user message" : "assistant", "message", event, at);
  node.querySelector("header .kind").textContent = p.role === "user" ? "user message" : "assistant";
  if (event.kind === "message.delta") {
    if (node.dataset.state === "settled") return; // the completed text already arbitrated
    node.querySelector(".text").textContent += p.text || "";
    node.dataset.deltas = String(Number(node.dataset.deltas) + 1);
  } else if (event.kind === "message.completed") {
    node.querySelector(".text").textContent = p.text || "";
    node.dataset.state = "settled";
  }
  if (event.kind !== "message.delta") addRaw(node, event);
}

function thought(event, p, at) {
  const node = keyed(`t:${p.thought_id}`, () => {
    const n = el("details", { class: "ev thought", "data-kind": "thought" }, el("summary", { text: "thinking…" }), el("div", { class: "text" }));
    n.dataset.state = "streaming";
    return n;
  }, at);
  if (event.kind === "thought.delta") {
    if (node.dataset.state !== "settled") node.querySelector(".text").textContent += p.text || "";
  } else if (event.kind === "thought.completed") {
    node.querySelector(".text").textContent = p.text || "";
    node.dataset.state = "settled";
    node.querySelector("summary").textContent = "thought";
  }
  if (event.kind !== "thought.delta") addRaw(node, event);
}

function tool(event, p, at) {
  const node = keyed(`tool:${p.tool_call_id}`, () => {
    const n = row("tool", null, "tool", el("div", { class: "title" }), el("pre", { class: "input" }), el("pre", { class: "output" }));
    n.dataset.toolCallId = p.tool_call_id;
    n.dataset.status = "running";
    n.querySelector("header").append(el("span", { class: "status", text: "running" }));
    return n;
  }, at, event);
  if (event.kind === "tool.started") {
    node.querySelector(".title").textContent = `${p.name || "tool"}${p.title ? `: ${p.title}` : ""}`;
    node.querySelector(".input").textContent = text(p.input);
  } else if (event.kind === "tool.output.delta") {
    node.querySelector(".output").textContent += p.text || "";
  } else if (event.kind === "tool.completed") {
    node.dataset.status = p.status;
    const exit = p.exit_code === null || p.exit_code === undefined ? "" : ` (exit ${p.exit_code})`;
    node.querySelector(".status").textContent = p.status + exit;
    if (p.output !== null && p.output !== undefined && p.output !== "") node.querySelector(".output").textContent = text(p.output);
  }
  if (event.kind !== "tool.output.delta") addRaw(node, event);
}

function chooseOption(options, allow) {
  const want = allow ? "allow" : "reject";
  const ok = options.filter((o) => String(o.kind || "").startsWith(want));
  const pick = ok.find((o) => o.kind === `${want}_once`) || ok[0];
  return pick ? pick.option_id : null;
}

function permission(event, p, at) {
  if (event.kind === "permission.requested") {
    const allow = el("button", { type: "button", class: "allow", text: "Allow" });
    const deny = el("button", { type: "button", class: "deny", text: "Deny" });
    const left = el("span", { class: "time-left" });
    const node = row("permission", event, "permission", el("div", { class: "title", text: p.title || "a tool call" }), el("div", { class: "choices" }, allow, deny, left));
    node.dataset.requestId = p.request_id;
    node.dataset.toolCallId = p.tool_call_id || "";
    node.dataset.outcome = "pending";
    const answer = async (yes) => {
      const option = chooseOption(p.options || [], yes);
      if (!option) return notice(`no ${yes ? "allow" : "reject"} option was offered`, true);
      allow.disabled = deny.disabled = true;
      const sent = await command("permission.resolve", { request_id: p.request_id, option_id: option });
      if (!sent) allow.disabled = deny.disabled = false;
    };
    allow.addEventListener("click", () => answer(true));
    deny.addEventListener("click", () => answer(false));
    const tick = () => {
      if (node.dataset.outcome !== "pending") return;
      const ms = p.expires_at ? new Date(p.expires_at) - Date.now() : NaN;
      left.textContent = Number.isFinite(ms) ? `${Math.max(0, Math.round(ms / 1000))} s left` : "";
      setTimeout(tick, 1000);
    };
    tick();
    state.items.set(`perm:${p.request_id}`, node);
    // Pending: docked below the timeline until answered (in view, and still under the pointer when
    // more rows arrive); its place in the timeline is kept for when it is resolved.
    node.dataset.at = at || "";
    document.getElementById("waiting").append(node);
  } else {
    const node = state.items.get(`perm:${p.request_id}`);
    const outcome = `${p.outcome} (by ${p.decided_by})`;
    if (node) {
      if (node.parentElement && node.parentElement.id === "waiting") place(node, node.dataset.at);
      node.dataset.outcome = p.outcome;
      node.querySelectorAll("button").forEach((b) => (b.disabled = true));
      node.querySelector(".time-left").textContent = outcome;
      addRaw(node, event);
    } else {
      place(row("permission resolved", event, "permission", el("div", { text: outcome })), at);
    }
  }
}

function hostTool(event, p, at) {
  if (event.kind === "host_tool.called") {
    const box = el("textarea", { class: "result", rows: 4, "aria-label": "host tool result (JSON)" });
    box.value = json({ content: [{ type: "text", text: "" }], is_error: false });
    const send = el("button", { type: "button", class: "send-result", text: "Send result" });
    const node = row("host tool", event, "host-tool", el("div", { class: "title", text: p.name }), el("pre", { class: "input", text: text(p.arguments) }), box, send);
    node.dataset.callId = p.call_id;
    node.dataset.outcome = "pending";
    send.addEventListener("click", async () => {
      let result;
      try {
        result = JSON.parse(box.value);
      } catch (error) {
        return notice(`the result is not JSON: ${error.message}`, true);
      }
      if (await command("host_tool.result", { call_id: p.call_id, content: result.content || [], is_error: Boolean(result.is_error) })) send.disabled = true;
    });
    state.items.set(`host:${p.call_id}`, node);
    place(node, at);
  } else {
    const node = state.items.get(`host:${p.call_id}`);
    if (node) {
      node.dataset.outcome = p.outcome;
      node.querySelector(".send-result").disabled = true;
      node.querySelector("header").append(el("span", { class: "status", text: p.outcome }));
      addRaw(node, event);
    } else place(row("host tool resolved", event, "host-tool", el("div", { text: p.outcome })), at);
  }
}

function runTerminal(event, p, at) {
  const parts = [];
  if (event.kind === "run.completed") parts.push(`stop: ${p.stop_reason}`);
  if (event.kind === "run.failed") parts.push(`${(p.error || {}).code}: ${(p.error || {}).message}`);
  const phase = (p.details || {}).phase;
  if (event.kind === "run.cancelled") parts.push(`by ${p.requested_by}`, phase ? `phase: ${phase}` : null, p.reason);
  if (p.dropped_best_effort) parts.push(`${p.dropped_best_effort} best-effort dropped`);
  const spent = state.spend.get(event.run_id);
  if (spent) parts.push(`spent ${money(spent)}`);
  const node = row(event.kind, event, `terminal ${event.kind.replace(".", "-")}`, el("div", { class: "detail", text: parts.filter(Boolean).join(" · ") }));
  node.dataset.runId = event.run_id;
  if (event.kind === "run.cancelled") node.dataset.phase = (p.details || {}).phase || "";
  place(node, at);
}

function artifact(event, p, at) {
  const href = `/console/instances/${encodeURIComponent(state.instance)}/artifacts?event_id=${encodeURIComponent(event.event_id)}`;
  const link = el("a", { href, download: p.path.split("/").pop(), text: p.path });
  place(row("artifact", event, "artifact", el("div", {}, link, el("span", { class: "meta", text: ` ${p.size} bytes · sha256 ${p.sha256}` }))), at);
}

function logRecords(event, p, at) {
  const lines = (p.records || []).map((r) => `${clock(r.at)} ${r.level} ${r.logger}: ${r.message}${r.fields && Object.keys(r.fields).length ? " " + JSON.stringify(r.fields) : ""}`);
  const dropped = p.dropped ? `, ${p.dropped} dropped before them` : "";
  place(folded("log", event, "log", `${lines.length} driver log line(s)${dropped}`, el("pre", { class: "lines", text: lines.join("\n") })), at);
}

// The spend of each run, from the model proxy's model.usage (one per model request): one row per run,
// updated in place, and the run's terminal row says what it spent.
function money(s) {
  const usd = s.requests > s.unpriced ? `$${s.cost.toFixed(4)}` : "$-";
  return s.unpriced && s.requests > s.unpriced ? `${usd} (+${s.unpriced} unpriced)` : usd;
}

function modelUsage(event, p, at) {
  const runId = p.run_id || event.run_id || "outside runs";
  const s = state.spend.get(runId) || { requests: 0, input: 0, output: 0, cached: 0, cost: 0, unpriced: 0 };
  s.requests += 1;
  s.input += p.input_tokens || 0;
  s.output += p.output_tokens || 0;
  s.cached += p.cached_input_tokens || 0;
  if (p.cost_usd === null || p.cost_usd === undefined) s.unpriced += 1;
  else s.cost += Number(p.cost_usd);
  state.spend.set(runId, s);
  const node = keyed(`spend:${runId}`, () => {
    const made = row("spend", null, "usage spend", el("div", { class: "detail" }), el("details", { class: "requests" }, el("summary", { text: "requests" }), el("pre")));
    made.dataset.kind = "model.usage";
    return made;
  }, at, event);
  node.dataset.runId = runId;
  node.dataset.costUsd = s.cost.toFixed(8);
  node.dataset.requests = String(s.requests);
  node.querySelector(".detail").textContent = `${runId}: ${money(s)} · ${s.requests} model request(s) · in ${s.input} · out ${s.output} · cached ${s.cached}`;
  const cost = p.cost_usd === null || p.cost_usd === undefined ? "-" : "$" + Number(p.cost_usd).toFixed(6);
  node.querySelector(".requests pre").textContent += `${clock(event.occurred_at)} ${p.model} in ${p.input_tokens} out ${p.output_tokens} cached ${p.cached_input_tokens} ${cost} ${p.request_id || ""} (${p.upstream})\n`;
}

const simple = (label, cls, describe) => (event, p, at) => place(row(label, event, cls, el("div", { class: "detail", text: describe(p, event) })), at);
const quiet = (label, cls, describe) => (event, p, at) => place(folded(label, event, cls, describe(p, event)), at);

const HANDLERS = {
  "message.started": message,
  "message.delta": message,
  "message.completed": message,
  "thought.started": thought,
  "thought.delta": thought,
  "thought.completed": thought,
  "tool.started": tool,
  "tool.output.delta": tool,
  "tool.completed": tool,
  "permission.requested": permission,
  "permission.resolved": permission,
  "host_tool.called": hostTool,
  "host_tool.resolved": hostTool,
  "run.completed": runTerminal,
  "run.failed": runTerminal,
  "run.cancelled": runTerminal,
  "artifact.produced": artifact,
  "log.records": logRecords,
  "model.usage": modelUsage,
  "run.started": quiet("run.started", "run", (p) => `${p.run_id}: ${p.input_summary || ""}`),
  "input.steered": simple("steered", "steered", (p) => `${p.mode === "native" ? "into the running turn" : "as one more turn"}: ${p.text}`),
  "driver.started": quiet("driver.started", "driver", (p) => `${p.runtime}, epoch ${p.epoch}, revision ${p.revision}`),
  "file.changed": quiet("file", "file", (p) => `${p.change} ${p.path}`),
  "usage.updated": quiet("usage", "usage", (p) => `in ${p.input_tokens} · out ${p.output_tokens} · cached ${p.cached_input_tokens ?? "-"} · cost ${p.cost_usd === null || p.cost_usd === undefined ? "-" : "$" + Number(p.cost_usd).toFixed(4)}`),
  "diagnostic.reported": quiet("diagnostic", "diagnostic", (p) => `[${p.severity}] ${p.code}: ${p.message}`),
  "command.finished": quiet("command finished", "command-finished", (p) => `${p.command_kind} ${p.command_id}: ${p.status}`),
  // The output goes to the process's terminal (terminals.js), not to the timeline.
  "process.output": () => {},
  "process.started": quiet("process started", "process", (p) => `${p.process_id}: ${(p.argv || []).join(" ")} (pid ${p.pid})`),
  "process.exited": quiet("process exited", "process", (p) => `${p.process_id}: ${p.signal ? `signal ${p.signal}` : `exit ${p.exit_code}`}, ${p.output_bytes} bytes`),
  "plan.updated": simple("plan", "plan", (p) => (p.entries || []).map((e) => `${e.status}: ${e.content}`).join("\n")),
  // §8.1: one row per checkpoint, from its manifest; the chunks (base64 of the session files) stay out.
  "checkpoint.recorded": quiet("checkpoint", "checkpoint", (p) => {
    const bytes = (p.files || []).reduce((n, f) => n + f.size, 0);
    return `${p.run_id ? "after " + p.run_id : "at session.stop"} · ${(p.files || []).length} file(s), ${bytes} bytes · ${p.runtime} session ${p.native_ref} · ${p.checkpoint_id}`;
  }),
  "checkpoint.file": () => {},
  "runtime.timing.recorded": quiet("timing", "timing", (p) => `${p.phase} at ${Math.round(p.ms)} ms (${p.mode})${p.run_id ? " · " + p.run_id : ""}`),
  "runtime.session.reset": quiet("session reset", "session-reset", (p) => `${p.previous || "-"} → ${p.current || "-"}${p.reason ? " · " + p.reason : ""}`),
};

// ---- commands ----------------------------------------------------------------------------------------

function showCommand(c) {
  const key = `cmd:${c.command_id}`;
  let node = state.items.get(key);
  if (!node) {
    if (c.kind === "input.start" || c.kind === "input.steer") {
      const input = c.body.input || {};
      const names = (input.attachments || []).map((a) => a.name).join(", ");
      // PROTOCOL §3.1: a steer joins the active run; a queued input waits for the run before it.
      const how = c.kind === "input.steer" ? "steer" : c.body.queue ? "queued" : "";
      node = el("article", { class: "ev user-input", "data-kind": "input", "data-input": how || "start" },
        el("header", {}, el("time", { text: clock(c.created_at) }), el("span", { class: "kind", text: how ? `you · ${how}` : "you" }), el("span", { class: "status" })),
        el("div", { class: "text", text: input.text || "" }),
        names ? el("div", { class: "meta", text: `attachments: ${names}` }) : null);
    } else {
      // A command of the console's own (cancel, permission.resolve, reset...): one folded line with
      // its status; the conversation shows what it did.
      const fields = Object.fromEntries(Object.entries(c.body).filter(([k]) => !["type", "seq", "command_id", "kind"].includes(k)));
      node = el("details", { class: "ev folded command", "data-kind": "command" },
        el("summary", {}, el("time", { text: clock(c.created_at) }), el("span", { class: "kind", text: c.kind }), el("span", { class: "status" })),
        el("pre", { class: "raw-json", text: `command ${c.command_id} · seq ${c.seq}\n${json(fields)}` }));
    }
    node.dataset.commandId = c.command_id;
    state.items.set(key, node);
    place(node, c.created_at);
  }
  node.dataset.status = c.status;
  if (c.kind === "host_tool.result") {
    // Until the driver reports host_tool.resolved, the command's status says whether the answer arrived.
    const call = state.items.get(`host:${c.body.call_id}`);
    if (call) call.dataset.answer = c.status;
  }
  const error = c.error ? ` (${c.error.code}: ${c.error.message})` : "";
  node.querySelector(".status").textContent = c.status + error;
  node.classList.toggle("done", STATUS_DONE.has(c.status));
}

// ---- actions -----------------------------------------------------------------------------------------

// What Enter does now: start a run, or (while one is active) steer it or queue behind it.
function busyHint() {
  const box = document.getElementById("input-text");
  const mode = (document.querySelector('input[name="busy-mode"]:checked') || {}).value || "steer";
  const busy = Boolean(state.activeRun);
  document.getElementById("composer").dataset.busy = busy ? mode : "";
  box.placeholder = !busy
    ? "Message (Enter sends, Shift+Enter for a new line)"
    : mode === "steer"
      ? "The agent is working: Enter steers the running turn"
      : "The agent is working: Enter queues this for after the run";
}

function base64Of(buffer) {
  // In slices: String.fromCharCode with a whole large file would overflow the call stack.
  const bytes = new Uint8Array(buffer);
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

async function upload(file) {
  // A JSON body, like every request that changes something (the console refuses any other).
  const path = `/console/instances/${encodeURIComponent(state.instance)}/uploads`;
  return api("POST", path, { name: file.name, data_b64: base64Of(await file.arrayBuffer()) });
}

async function send(event) {
  event.preventDefault();
  const box = document.getElementById("input-text");
  const files = document.getElementById("input-files");
  const message = box.value.trim();
  if (!message && !files.files.length) return;
  let attachments = [];
  try {
    attachments = await Promise.all(Array.from(files.files, upload));
  } catch (error) {
    return notice(`upload failed: ${error.message}`, true);
  }
  const input = { text: message, attachments };
  // While a run is active a message steers it by default, or waits its turn (PROTOCOL §3.1).
  const active = state.activeRun; // from the stored run.started / terminal: newer than a heartbeat
  const mode = (document.querySelector('input[name="busy-mode"]:checked') || {}).value || "steer";
  const sent = !active
    ? await command("input.start", { run_id: newId("run-"), input })
    : mode === "steer"
      ? await command("input.steer", { run_id: active, input })
      : await command("input.start", { run_id: newId("run-"), input, queue: true });
  if (sent) {
    box.value = "";
    files.value = "";
    document.getElementById("attachment-names").textContent = "";
  }
}

function init() {
  document.getElementById("composer").addEventListener("submit", send);
  document.getElementById("input-text").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) send(e);
  });
  document.getElementById("input-files").addEventListener("change", (e) => {
    document.getElementById("attachment-names").textContent = Array.from(e.target.files, (f) => f.name).join(", ");
  });
  document.getElementById("cancel-run").addEventListener("click", () => {
    const runId = state.activeRun || (state.summary || {}).run_id;
    if (!runId) return notice("no run is active");
    command("turn.cancel", { run_id: runId, reason: "cancelled from the console" });
  });
  document.querySelectorAll('input[name="busy-mode"]').forEach((r) => r.addEventListener("change", busyHint));
  document.getElementById("reset-session").addEventListener("click", () => command("session.reset", { reason: "reset from the console" }));
  document.getElementById("stop-driver").addEventListener("click", () => command("session.stop", { reason: "stopped from the console" }));
  loadInstances();
  // The list is a summary; the selected instance's details arrive live on its stream.
  setInterval(loadInstances, 5000);
}

document.addEventListener("DOMContentLoaded", init);
