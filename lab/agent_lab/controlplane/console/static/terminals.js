// Terminals beside the agent (PROTOCOL §6.8): one xterm.js terminal per process of the selected
// instance, built from the stored process.* events of the console's stream, typing as process.input,
// window resizes as process.resize, and an exact catch-up through process.replay.
//
// Catch-up. process.output is best-effort: the store may miss some of it (the link was down, a buffer
// was full) and may hold a byte range twice (a replay). Each event carries the raw byte offset of its
// first byte; a pane writes an event only when it continues what the pane shows, holds the others, and
// asks the driver to replay from the offset of the last event it wrote (an offset it knows exactly: the
// raw length of a text with U+FFFD in it is not knowable here). The replay's first event starts at that
// same offset with the same text, so the pane writes only what follows it. After a page load, after a
// reconnect of the link and when a process exits with more bytes than shown, it asks the same way.
// Loaded after console.js: uses its api(), instancePath(), notice(), newId() and el().
"use strict";

const TERM_INPUT_CHUNK = 4096; // characters of one process.input
const TERM_SETTLE_MS = 400; // quiet time after the stream's backlog before the first catch-up
const TERM_RESIZE_MS = 150;

const terminals = {
  instance: null,
  panes: new Map(), // process_id -> Pane
  link: null,
  streamLost: false,
};
window.agentTerminals = terminals;

function utf8Length(s) {
  return new TextEncoder().encode(s).length;
}

class Pane {
  constructor(processId, started) {
    this.processId = processId;
    this.pty = started.pty;
    this.running = true;
    this.exit = null;
    this.last = null; // {offset, data} of the last event written
    this.held = new Map(); // offset -> payload, waiting for what comes before it
    this.replayFrom = null; // the from_offset of the replay asked and not yet answered
    this.queue = "";
    this.sending = false;
    this.settle = null;
    this.resizeTimer = null;
    this.status = el("span", { class: "status", text: "running" });
    const close = el("button", { type: "button", class: "hangup", text: "Hang up", title: "process.signal HUP" });
    close.addEventListener("click", () => terminalCommand("process.signal", { process_id: processId, signal: "HUP" }));
    const argv = (started.argv || []).join(" ");
    this.screen = el("div", { class: "term-screen" });
    this.node = el(
      "article",
      { class: "term-pane", "data-process-id": processId, "data-state": "running" },
      el("header", {}, el("span", { class: "name", text: processId }), el("code", { class: "argv", text: argv }), this.status, close),
      this.screen,
    );
    document.getElementById("terminal-list").append(this.node);
    const size = this.pty || { cols: 100, rows: 16 };
    this.term = new Terminal({ cols: size.cols, rows: size.rows, convertEol: !this.pty, scrollback: 5000, fontSize: 13 });
    this.fit = new FitAddon.FitAddon();
    this.term.loadAddon(this.fit);
    this.term.open(this.screen);
    this.term.onData((data) => this.type(data));
    if (this.pty) {
      this.term.onResize(({ cols, rows }) => {
        if (!this.running) return;
        clearTimeout(this.resizeTimer);
        this.resizeTimer = setTimeout(() => terminalCommand("process.resize", { process_id: processId, cols, rows }), TERM_RESIZE_MS);
      });
      this.refit();
    }
  }

  refit() {
    if (this.pty && this.running) {
      try {
        this.fit.fit();
      } catch (error) {
        // Not laid out yet (hidden): the next window resize fits it.
      }
    }
  }

  end() {
    return this.last ? this.last.offset + utf8Length(this.last.data) : 0;
  }

  // Whether an event at `offset` continues what is shown. A text with U+FFFD may stand for fewer raw
  // bytes than its UTF-8 length: then anything up to that estimate continues it.
  continues(offset) {
    const end = this.end();
    return offset === end || (this.last !== null && this.last.data.includes("\uFFFD") && offset > this.last.offset && offset < end);
  }

  write(p) {
    if (p.truncated_before && (this.last === null || p.offset > this.end())) {
      this.term.write("\r\n\x1b[2m[older output is gone]\x1b[0m\r\n");
    }
    this.term.write(p.data);
    this.last = { offset: p.offset, data: p.data };
    this.node.dataset.offset = String(this.end());
  }

  output(p) {
    this.bump();
    if (this.replayFrom !== null && p.offset <= this.replayFrom) this.replayFrom = null; // answered
    if (this.last === null) {
      if (p.offset === 0 || p.truncated_before) this.write(p);
      else {
        this.held.set(p.offset, p);
        this.replay(0);
      }
    } else if (p.offset === this.last.offset) {
      // A replay from the last event written: the same text first, then what follows it.
      if (p.data.length > this.last.data.length && p.data.startsWith(this.last.data)) {
        this.term.write(p.data.slice(this.last.data.length));
        this.last = { offset: p.offset, data: p.data };
        this.node.dataset.offset = String(this.end());
      }
    } else if (p.offset < this.last.offset) {
      return; // shown already
    } else if (this.continues(p.offset) || p.truncated_before) {
      this.write(p);
    } else if (p.offset > this.end()) {
      this.held.set(p.offset, p);
      this.replay(this.last.offset);
      return;
    }
    this.drain();
  }

  drain() {
    for (const offset of [...this.held.keys()].sort((a, b) => a - b)) {
      const p = this.held.get(offset);
      if (this.last !== null && offset < this.last.offset) this.held.delete(offset);
      else if (this.last !== null && (offset === this.last.offset || this.continues(offset))) {
        this.held.delete(offset);
        this.output(p);
        return;
      } else break;
    }
  }

  replay(from) {
    if (this.replayFrom === from) return;
    this.replayFrom = from;
    terminalCommand("process.replay", { process_id: this.processId, from_offset: from });
  }

  // Once the stream has gone quiet (its backlog is in), or the link came back: ask for what the store
  // missed. Asking costs one event when nothing was missed.
  bump() {
    clearTimeout(this.settle);
    this.settle = setTimeout(() => this.catchUp(), TERM_SETTLE_MS);
  }

  catchUp(force = false) {
    if (terminals.link !== "connected") return;
    const missing = this.exit ? this.exit.output_bytes > this.end() && !(this.last && this.last.data.includes("\uFFFD")) : this.running;
    if (!missing) return;
    if (force) this.replayFrom = null;
    this.replay(this.last ? this.last.offset : 0);
  }

  exited(p) {
    this.running = false;
    this.exit = p;
    const how = p.signal ? `signal ${p.signal}` : `exit ${p.exit_code}`;
    this.status.textContent = `exited (${how})`;
    this.node.dataset.state = "exited";
    this.node.dataset.exit = how;
    this.node.querySelector(".hangup").disabled = true;
    this.bump();
  }

  type(data) {
    if (!this.running) return;
    this.queue += data;
    if (!this.sending) this.flush();
  }

  // One command at a time, in order: what is typed meanwhile goes in the next one.
  async flush() {
    this.sending = true;
    try {
      while (this.queue) {
        const data = this.queue.slice(0, TERM_INPUT_CHUNK);
        this.queue = this.queue.slice(TERM_INPUT_CHUNK);
        await terminalCommand("process.input", { process_id: this.processId, data });
      }
    } finally {
      this.sending = false;
    }
  }

  // What the terminal shows, line by line, a line the terminal wrapped joined again (for tests and
  // for copying).
  text() {
    const buffer = this.term.buffer.active;
    const lines = [];
    for (let i = 0; i < buffer.length; i++) {
      const line = buffer.getLine(i);
      if (line.isWrapped && lines.length) lines[lines.length - 1] += line.translateToString(true);
      else lines.push(line.translateToString(true));
    }
    while (lines.length && lines[lines.length - 1] === "") lines.pop();
    return lines.join("\n");
  }

  dispose() {
    clearTimeout(this.settle);
    clearTimeout(this.resizeTimer);
    this.term.dispose();
    this.node.remove();
  }
}

async function terminalCommand(kind, fields) {
  try {
    return await api("POST", instancePath("/commands"), { kind, ...fields });
  } catch (error) {
    notice(`${kind} refused: ${error.message}`, true);
    return null;
  }
}

function onStored(event) {
  const p = event.payload || {};
  if (!event.kind.startsWith("process.") || typeof p.process_id !== "string") return;
  let pane = terminals.panes.get(p.process_id);
  if (event.kind === "process.started") {
    if (pane && pane.startedBy === event.event_id) return;
    if (pane) pane.dispose(); // the id was used again: a new process, a new output
    pane = new Pane(p.process_id, p);
    pane.startedBy = event.event_id;
    terminals.panes.set(p.process_id, pane);
    document.getElementById("terminals").dataset.count = String(terminals.panes.size);
    pane.bump();
  } else if (!pane) {
    return; // its process.started is older than this page knows (another instance)
  } else if (event.kind === "process.output") {
    pane.output(p);
  } else if (event.kind === "process.exited" && pane.running) {
    pane.exited(p);
  }
}

// The driver's link came back, or the page's own stream did (the control plane may have restarted
// while the link was down, and the driver reconnected before the page heard of it): catch up.
function onInstance(summary) {
  const before = terminals.link;
  terminals.link = summary.link;
  const back = (before !== null && before !== "connected") || terminals.streamLost;
  if (summary.link === "connected" && back) {
    terminals.streamLost = false;
    for (const pane of terminals.panes.values()) pane.catchUp(true);
  }
}

terminals.select = (instanceId, source) => {
  for (const pane of terminals.panes.values()) pane.dispose();
  terminals.panes = new Map();
  terminals.instance = instanceId;
  terminals.link = null;
  terminals.streamLost = false;
  // Shown once a terminal exists (data-count, console.css): "Open shell" is among the session's actions.
  const section = document.getElementById("terminals");
  section.hidden = false;
  delete section.dataset.count;
  source.addEventListener("stored", (e) => onStored(JSON.parse(e.data)));
  source.addEventListener("instance", (e) => onInstance(JSON.parse(e.data)));
  source.addEventListener("error", () => {
    terminals.streamLost = true;
  });
  if (terminals.openOnSelect) {
    terminals.openOnSelect = false; // `agent-driver dev`'s /shell: one shell, once
    openShell();
  }
};

function openShell() {
  if (!terminals.instance) return;
  terminalCommand("process.start", { process_id: newId("term-"), argv: [], cwd: null, env: {}, pty: { cols: 100, rows: 24 } });
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("open-shell").addEventListener("click", openShell);
  window.addEventListener("resize", () => {
    for (const pane of terminals.panes.values()) pane.refit();
  });
  if (location.hash.includes("shell=1")) terminals.openOnSelect = true;
});
