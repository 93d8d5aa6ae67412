// kioku operator console: plain JS, no build step, no network beyond kioku's own REST API.
// Every piece of conversation data is put on the page with textContent, never as HTML.
"use strict";

(() => {
  const KEY_STORE = "kioku.apiKey";
  const API = new URL("../v1/", document.baseURI); // the console lives at <base>/console/
  const PAGE = 100; // messages per request

  const state = {
    key: sessionStorage.getItem(KEY_STORE) || "",
    conversations: [],
    current: null, // conversation id
    memory: null,
    range: null, // {first, last} of the messages shown (null: browsing the whole transcript)
    nextAfter: null,
    page: null, // {first, last, total} of the transcript page shown while browsing
    lines: {}, // memory item id -> {lines, edits, pending}
    view: 0, // bumped whenever the transcript pane changes: late answers for an old view are dropped
    filter: "",
  };

  const $ = (id) => document.getElementById(id);

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else if (k === "dataset") Object.assign(node.dataset, v);
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === undefined || c === null || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  class AuthError extends Error {}

  // --- talking to kioku -------------------------------------------------------------------

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${state.key}`, Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(new URL(path, API), {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (res.status === 401) {
      forgetKey("kioku refused this key (401): enter a valid one.");
      throw new AuthError("unauthorized");
    }
    let data = null;
    try {
      data = await res.json();
    } catch (_) {
      data = null;
    }
    if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${explain(data) || res.statusText}`);
    return data;
  }

  function explain(data) {
    if (data && data.error && data.error.message) return data.error.message; // kioku's shape
    if (!data || data.detail === undefined) return "";
    if (typeof data.detail === "string") return data.detail;
    if (Array.isArray(data.detail)) return data.detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
    return JSON.stringify(data.detail);
  }

  const conv = (id) => `conversations/${encodeURIComponent(id)}`;

  function showError(err) {
    if (err instanceof AuthError) return;
    const box = $("error");
    box.textContent = String(err && err.message ? err.message : err);
    box.hidden = false;
  }

  function clearError() {
    $("error").hidden = true;
    $("error").textContent = "";
  }

  // guard an async UI action: errors are shown, never swallowed
  const act = (fn) => async (...args) => {
    try {
      clearError();
      await fn(...args);
    } catch (err) {
      showError(err);
    }
  };

  // --- key ----------------------------------------------------------------------------------

  function forgetKey(message) {
    state.key = "";
    sessionStorage.removeItem(KEY_STORE);
    $("app").hidden = true;
    $("logout").hidden = true;
    $("login").hidden = false;
    $("api-key").value = "";
    if (message) {
      $("error").textContent = message;
      $("error").hidden = false;
    }
    $("api-key").focus();
  }

  async function useKey(key) {
    state.key = key;
    await loadConversations(); // throws AuthError on a bad key
    sessionStorage.setItem(KEY_STORE, key);
    $("login").hidden = true;
    $("app").hidden = false;
    $("logout").hidden = false;
    $("whoami").textContent = `key ${key.slice(0, 10)}…`;
    const wanted = new URLSearchParams(location.hash.slice(1)).get("c");
    if (wanted && state.conversations.some((c) => c.id === wanted)) await select(wanted);
  }

  // --- conversations --------------------------------------------------------------------------

  async function loadConversations() {
    // a page at a time, latest activity first, until the last page
    const all = [];
    let cursor = null;
    do {
      const page = await api(
        "GET",
        `conversations?limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`,
      );
      all.push(...(page.data || []));
      cursor = page.next_cursor || null;
    } while (cursor && all.length < 100000);
    state.conversations = all;
    renderConversations();
  }

  function renderConversations() {
    const needle = state.filter.trim().toLowerCase();
    const shown = state.conversations.filter(
      (c) => !needle || `${c.id}\n${c.character || ""}`.toLowerCase().includes(needle),
    );
    $("conversations").replaceChildren(
      ...shown.map((c) =>
        el(
          "li",
          {},
          el(
            "button",
            {
              type: "button",
              class: c.id === state.current ? "conv active" : "conv",
              dataset: { testid: "conversation", id: c.id },
              onclick: act(() => select(c.id)),
            },
            el("span", { class: "conv-id", text: c.id }),
            el("span", {
              class: "muted small",
              text: `${c.character || "—"} · ${c.messages} msgs · ${ago(c.last_activity)}`,
            }),
          ),
        ),
      ),
    );
    $("no-conversations").hidden = state.conversations.length > 0;
    $("no-match").hidden = !(state.conversations.length > 0 && shown.length === 0);
  }

  // "3 min ago", "yesterday 14:02", or a date: when something last happened
  function ago(ts) {
    if (typeof ts !== "number") return "never";
    const s = Math.max(0, Date.now() / 1000 - ts);
    if (s < 60) return "just now";
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
    return new Date(ts * 1000).toLocaleDateString([], { year: "numeric", month: "short", day: "numeric" });
  }

  async function select(id) {
    state.current = id;
    history.replaceState(null, "", `#c=${encodeURIComponent(id)}`);
    for (const b of document.querySelectorAll("#conversations button.conv")) {
      b.classList.toggle("active", b.dataset.id === id);
    }
    $("empty").hidden = true;
    $("conversation").hidden = false;
    $("cut-result").hidden = true;
    $("cut-confirm-box").hidden = true;
    $("delete-confirm-box").hidden = true;
    $("notes-status").textContent = "";
    $("search-hits").replaceChildren();
    $("no-hits").hidden = true;
    clearMessages();
    await Promise.all([
      loadMemory(), loadTics(), loadLog(), loadJobs(), loadStatus(), browse({ before: null }),
    ]);
  }

  // folding in progress, and the cache breaks the client caused by changing the card
  async function loadStatus() {
    const s = await api("GET", `${conv(state.current)}/status`);
    const f = s.folding;
    $("folding").hidden = !(f.running || f.queued);
    $("folding").textContent = f.running ? `folding: writing ${f.kinds.join(", ")}…` : `folding scheduled (${f.kinds.join(", ")})`;
    $("card-changes-box").hidden = !s.card_changes;
    $("card-changes").textContent = String(s.card_changes);
  }

  function header(mem) {
    const c = state.conversations.find((x) => x.id === state.current) || {};
    $("conv-title").textContent = c.character ? `${state.current} · ${c.character}` : state.current;
    $("conv-messages").textContent = c.messages ?? "?";
    $("raw-start").textContent = mem.raw_start;
    $("memory-version").textContent = mem.memory_version;
    $("conv-active").textContent = ago(c.last_activity);
  }

  // --- memory ---------------------------------------------------------------------------------

  async function loadMemory() {
    const [mem, lines] = await Promise.all([
      api("GET", `${conv(state.current)}/memory`),
      api("GET", `${conv(state.current)}/memory/lines`),
    ]);
    state.memory = mem;
    state.lines = Object.fromEntries((lines.items || []).map((i) => [i.id, i]));
    header(mem);
    $("synopsis").replaceChildren(...(mem.synopsis ? [item(mem.synopsis)] : []));
    $("chapters").replaceChildren(...(mem.chapters || []).map(item));
    $("no-memory").hidden = Boolean(mem.synopsis || (mem.chapters || []).length);
    renderThreads(mem.threads || []);
    renderKeyLines(mem.key_lines || []);
    $("notes-text").value = mem.notes_editable || "";
    $("notes-current").textContent = mem.notes || "(no notes in the prompt)";
  }

  function rangeButton(first, last, label) {
    return el("button", {
      type: "button",
      class: "range",
      title: "show the source messages",
      dataset: { testid: "source-link", first, last },
      text: label || (first === last ? `seq ${first}` : `seq ${first}–${last}`),
      onclick: act(() => showMessages(first, last)),
    });
  }

  function item(it) {
    const info = state.lines[it.id] || { lines: it.text.split("\n").filter((x) => x.trim()), edits: [], pending: null };
    const badges = [
      el("span", { class: `badge ${it.source}`, text: it.source }),
      standInBadge(it),
      it.stale ? el("span", { class: "badge stale", text: "stale: source edited", dataset: { testid: "stale" } }) : null,
      info.edits.length
        ? el("span", { class: "badge operator", text: `edited by operator (${info.edits.length})`, dataset: { testid: "operator-badge" } })
        : null,
      el("span", { class: "muted small", text: `${it.tokens} tokens` }),
      it.model ? el("span", { class: "muted small", text: `${it.model} ${it.prompt_version || ""}` }) : null,
      groundedBadge(it),
    ];
    return el(
      "article",
      {
        class: `item ${it.kind}`,
        dataset: { testid: "memory-item", kind: it.kind, first: it.first_seq, last: it.last_seq, id: it.id },
      },
      el("header", {}, el("b", { text: it.kind === "synopsis" ? "Synopsis" : "Chapter" }), rangeButton(it.first_seq, it.last_seq), ...badges),
      el("div", { class: "text lines", dataset: { testid: "item-text" } }, ...info.lines.map((line) => memoryLine(it, line))),
      info.pending ? pendingBox(info.pending) : null,
    );
  }

  // extractive lines standing in for the model's summary, and why it failed (kioku.outcomes)
  function standInBadge(it) {
    if (!it.stand_in) return null;
    return el("span", {
      class: "badge stand-in",
      title: "the model's summary failed: these are the messages' own lines, chosen without a model",
      text: `stand-in (extractive: ${it.stand_in})`,
      dataset: { testid: "stand-in" },
    });
  }

  // how much of what the model wrote was borne out by the messages it cites (kioku.grounding)
  function groundedBadge(it) {
    const g = (it.data || {}).grounding;
    if (!g || g.extractive) return null;
    const dropped = Object.entries(g.dropped || {}).map(([k, n]) => `${k} ${n}`).join(", ");
    return el("span", {
      class: `badge grounded${g.share < 0.8 ? " low" : ""}`,
      title: dropped ? `lines dropped: ${dropped}` : "every line the model wrote is grounded",
      text: `grounded ${Math.round(100 * g.share)}% (${g.grounded}/${g.lines})`,
      dataset: { testid: "grounded" },
    });
  }

  // one line of memory, with the operator's two actions: correct it, retract it
  function memoryLine(it, line) {
    const row = el("div", { class: "line", dataset: { testid: "item-line" } });
    const show = () =>
      row.replaceChildren(
        el("span", { class: "line-text", text: line }),
        el(
          "span",
          { class: "line-actions" },
          el("button", { type: "button", class: "link small", text: "correct", title: "correct this line", dataset: { testid: "line-edit" }, onclick: () => editing() }),
          el("button", { type: "button", class: "link small danger-link", text: "retract", title: "retract this line", dataset: { testid: "line-retract" }, onclick: () => retracting() }),
        ),
      );
    const editing = () => {
      const input = el("input", { class: "line-input", value: line.trim(), dataset: { testid: "line-input" }, "aria-label": "corrected line" });
      input.value = line.trim();
      row.replaceChildren(
        input,
        el(
          "span",
          { class: "line-actions" },
          el("button", { type: "button", text: "Save", dataset: { testid: "line-save" }, onclick: act(() => sendLine(it.id, line, input.value)) }),
          el("button", { type: "button", text: "Cancel", onclick: show }),
        ),
      );
      input.focus();
    };
    const retracting = () =>
      row.replaceChildren(
        el("del", { class: "line-text", text: line }),
        el(
          "span",
          { class: "line-actions" },
          el("button", { type: "button", class: "danger", text: "Retract", dataset: { testid: "line-retract-confirm" }, onclick: act(() => sendLine(it.id, line, null)) }),
          el("button", { type: "button", text: "Keep", onclick: show }),
        ),
      );
    show();
    return row;
  }

  function pendingBox(p) {
    return el(
      "div",
      { class: "pending", dataset: { testid: "pending-edit" } },
      el("b", { text: "Waiting for the next fold: " }),
      el("span", { class: "muted small", text: "the prompt changes when memory next folds (one cache break)." }),
      el(
        "ul",
        { class: "plain" },
        ...p.edits.map((e) =>
          e.text === null
            ? el("li", {}, "retract ", el("del", { text: e.line }))
            : el("li", {}, el("del", { text: e.line }), " → ", el("ins", { text: e.text })),
        ),
      ),
    );
  }

  async function sendLine(itemId, line, text) {
    await api("POST", `${conv(state.current)}/memory/${itemId}/lines`, { line, text });
    await Promise.all([loadMemory(), loadLog()]);
  }

  function renderThreads(threads) {
    $("threads-box").hidden = threads.length === 0;
    $("threads").replaceChildren(
      ...threads.map((t) => {
        if (typeof t !== "object" || t === null) return el("li", { text: String(t) });
        const seq = t.changed_seq ?? t.seq ?? t.opened_seq;
        return el(
          "li",
          { dataset: { testid: "thread", status: t.status || "" } },
          el("span", { class: `badge ${t.status === "resolved" ? "resolved" : "open"}`, text: t.status || "?" }),
          " ",
          el("span", { text: t.title || t.id || JSON.stringify(t) }),
          " ",
          Number.isInteger(seq) ? rangeButton(Math.max(0, seq - 1), seq + 1, `seq ${seq}`) : null,
        );
      }),
    );
  }

  function renderKeyLines(lines) {
    $("key-lines-box").hidden = lines.length === 0;
    $("key-lines").replaceChildren(
      ...lines.map((k) => {
        if (typeof k !== "object" || k === null) return el("li", { text: String(k) });
        return el(
          "li",
          { dataset: { testid: "key-line" } },
          el("b", { text: k.speaker ? `${k.speaker}: ` : "" }),
          el("q", { text: k.text || "" }),
          " ",
          Number.isInteger(k.seq) ? rangeButton(k.seq, k.seq) : null,
        );
      }),
    );
  }

  // --- source messages ------------------------------------------------------------------------

  function clearMessages() {
    state.view += 1;
    state.range = null;
    state.page = null;
    state.nextAfter = null;
    $("messages").replaceChildren();
    $("messages-range").textContent = "";
    $("messages-more").hidden = true;
    $("messages-hint").hidden = false;
    for (const a of document.querySelectorAll("article.item.shown")) a.classList.remove("shown");
  }

  async function transcript(params) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined) q.set(k, String(v));
    return api("GET", `${conv(state.current)}/transcript?${q}`);
  }

  // browse the whole transcript a page at a time: {before} (null: the newest) or {after}
  async function browse(where) {
    clearMessages();
    const view = state.view;
    const data = await transcript({ ...where, limit: PAGE });
    if (view !== state.view) return; // the operator asked for something else meanwhile
    const rows = data.data || [];
    state.page = { first: data.first, last: data.last, total: data.total };
    $("messages").append(...rows.map(message));
    if (!rows.length) $("messages").append(el("li", { class: "muted", text: "No messages." }));
    $("messages-range").textContent = rows.length ? `(seq ${data.first}–${data.last} of ${data.total})` : "";
    updateNav();
  }

  function updateNav() {
    const p = state.page;
    const total = p ? p.total : state.conversations.find((c) => c.id === state.current)?.messages ?? 0;
    const first = p ? p.first : state.range ? state.range.first : 0;
    const last = p ? p.last : state.range ? state.range.last : total - 1;
    $("tr-start").disabled = first === 0 || first === null;
    $("tr-earlier").disabled = first === 0 || first === null;
    $("tr-later").disabled = last === null || last >= total - 1;
    $("tr-newest").disabled = last === null || last >= total - 1;
  }

  async function showMessages(first, last, mark) {
    clearMessages();
    state.range = { first, last };
    $("messages-range").textContent = first === last ? `(seq ${first})` : `(seq ${first}–${last})`;
    $("messages-hint").hidden = true;
    for (const a of document.querySelectorAll("article.item")) {
      a.classList.toggle("shown", Number(a.dataset.first) === first && Number(a.dataset.last) === last);
    }
    await moreMessages(first - 1);
    if (mark !== undefined) {
      const hit = document.querySelector(`#messages li[data-seq="${mark}"]`);
      if (hit) {
        hit.classList.add("marked");
        hit.scrollIntoView({ block: "nearest" });
      }
    } else {
      $("messages").scrollIntoView({ block: "nearest" });
    }
    updateNav();
  }

  async function moreMessages(after) {
    const { first, last } = state.range;
    const view = state.view;
    const limit = Math.min(PAGE, last - after);
    const data = await transcript({ after, limit: Math.max(1, limit) });
    if (view !== state.view) return;
    const rows = (data.data || []).filter((m) => m.seq >= first && m.seq <= last);
    $("messages").append(...rows.map(message));
    const lastShown = rows.length ? rows[rows.length - 1].seq : after;
    $("messages-more").hidden = !(lastShown < last && rows.length > 0 && lastShown < data.total - 1);
    if (!rows.length && !$("messages").children.length) {
      $("messages").append(el("li", { class: "muted", text: "No messages in this range." }));
    }
  }

  function part(p) {
    const kind = p.kind || p.type || "text";
    const text = p.text ?? "";
    if (kind === "speech") {
      return el("p", { class: "part speech" }, p.speaker ? el("b", { text: `${p.speaker}: ` }) : null, `“${text}”`);
    }
    if (kind === "thought") return el("p", { class: "part thought", title: "inner thought (unspoken)", text: `(${text})` });
    if (kind === "narration") return el("p", { class: "part narration", text });
    return el("p", { class: "part", text });
  }

  function message(m) {
    const parts = Array.isArray(m.parts) && m.parts.length ? m.parts.map(part) : [el("p", { class: "part", text: m.text })];
    const stamp = m.at ? new Date(m.at) : typeof m.stored_at === "number" ? new Date(m.stored_at * 1000) : null;
    const when = stamp && !Number.isNaN(stamp.getTime()) ? stamp.toLocaleString() : "";
    return el(
      "li",
      { class: `msg ${m.role}${m.deleted ? " deleted" : ""}`, dataset: { testid: "message", seq: m.seq } },
      el(
        "div",
        { class: "msg-meta" },
        el("span", { class: "seq", text: `#${m.seq}` }),
        el("b", { text: m.author || m.role }),
        el("span", { class: "muted small", text: m.role }),
        when ? el("time", { class: "muted small", datetime: stamp.toISOString(), title: m.at ? "the client's time" : "stored at", dataset: { testid: "message-time" }, text: when }) : null,
        m.deleted ? el("span", { class: "badge stale", text: "deleted" }) : null,
        m.deleted
          ? null
          : el("button", {
              type: "button",
              class: "small forget",
              title: "Delete this message: its notes, recollections and chapter lines go with it (the log keeps it as a version)",
              dataset: { testid: "forget" },
              onclick: act(() => forgetMessage(m.seq)),
              text: "Forget",
            }),
      ),
      el("div", { class: "msg-body" }, ...parts),
      m.recall ? recallNote(m.recall) : null,
    );
  }

  // the turn's account of recall: was the past shown to answer this message, why, and what
  function recallNote(r) {
    const got = (r.got || []).map(([a, b]) => (a === b ? `#${a}` : `#${a}–${b}`)).join(", ");
    const what = r.on ? ` — ${got} (${r.tokens} tokens)` : "";
    return el(
      "p",
      { class: `recall-note muted small ${r.on ? "on" : "off"}`, dataset: { testid: "recall-note" } },
      el("b", { text: r.on ? "recall on: " : "recall off: " }),
      `${r.why}${what}`,
    );
  }

  // what the user takes back: gone from every prompt, kept in the log as a version
  async function forgetMessage(seq) {
    if (!window.confirm(`Delete message #${seq}? No model will read it again; the log keeps it as a version.`)) return;
    await api("DELETE", `${conv(state.current)}/messages/${seq}`);
    await Promise.all([loadMemory(), loadLog(), loadJobs(), loadStatus()]);
    const li = document.querySelector(`#messages li[data-seq="${seq}"]`);
    if (li) li.classList.add("deleted");
  }

  // --- notes, cut, tics, log ------------------------------------------------------------------

  async function saveNotes() {
    const text = $("notes-text").value;
    $("notes-save").disabled = true;
    try {
      const r = await api("PUT", `${conv(state.current)}/notes`, { text });
      const n = (x) => (Array.isArray(x) ? x.length : Number(x) || 0);
      $("notes-status").textContent = `Saved: ${n(r.added)} added, ${n(r.changed)} changed, ${n(r.retracted)} retracted.`;
      await loadMemory();
      if (typeof r.notes_editable === "string") $("notes-text").value = r.notes_editable;
      await loadLog();
    } finally {
      $("notes-save").disabled = false;
    }
  }

  async function cut() {
    $("cut-confirm-box").hidden = true;
    $("cut-button").disabled = true;
    const before = state.memory ? state.memory.raw_start : null;
    try {
      const r = await api("POST", `${conv(state.current)}/cut`);
      const reasons = (r.reasons || []).join("; ");
      $("cut-result").textContent =
        `Cut done: the raw window now starts at seq ${r.raw_start}` +
        (before !== null ? ` (was ${before})` : "") +
        `, memory version ${r.memory_version}.` +
        (reasons ? ` ${reasons}` : "");
      $("cut-result").hidden = false;
      await loadConversations();
      await Promise.all([loadMemory(), loadLog(), loadJobs(), loadStatus(), browse({ before: null })]);
    } finally {
      $("cut-button").disabled = false;
    }
  }

  // every row of the conversation goes; the list no longer shows it
  async function deleteConversation() {
    $("delete-confirm-box").hidden = true;
    $("delete-button").disabled = true;
    const id = state.current;
    try {
      await api("DELETE", conv(id));
      state.current = null;
      history.replaceState(null, "", "#");
      $("conversation").hidden = true;
      $("empty").hidden = false;
      await loadConversations();
    } finally {
      $("delete-button").disabled = false;
    }
  }

  async function loadTics() {
    const data = await api("GET", `${conv(state.current)}/tics`);
    const alerts = data.alerts || [];
    $("tics").replaceChildren(
      ...alerts.map((a) =>
        el(
          "li",
          { class: "tic", dataset: { testid: "tic", phrase: a.phrase } },
          el("q", { text: a.phrase }),
          el("span", { class: "muted", text: ` in ${a.count} of the last ${a.window} replies` }),
        ),
      ),
    );
    $("no-tics").hidden = alerts.length > 0;
  }

  function when(at) {
    if (at === null || at === undefined) return "";
    const d = typeof at === "number" ? new Date(at * 1000) : new Date(at);
    if (Number.isNaN(d.getTime())) return String(at);
    const today = d.toDateString() === new Date().toDateString();
    const opts = { hour: "2-digit", minute: "2-digit", second: "2-digit" };
    return today ? d.toLocaleTimeString([], opts) : d.toLocaleString([], { month: "short", day: "numeric", ...opts });
  }

  async function loadLog() {
    const data = await api("GET", `${conv(state.current)}/log`);
    const rows = (data.data || []).slice().reverse(); // newest first
    const fmt = (x) => (x === null || x === undefined ? "" : String(x));
    $("log").replaceChildren(
      ...rows.map((r) => {
        const seq =
          Number.isInteger(r.first_seq) && Number.isInteger(r.last_seq)
            ? rangeButton(r.first_seq, r.last_seq, `${r.first_seq}–${r.last_seq}`)
            : null;
        const tokens = r.input_tokens || r.output_tokens ? `${fmt(r.input_tokens)} → ${fmt(r.output_tokens)} tokens` : "";
        return el(
          "li",
          { class: `log-row outcome-${r.outcome}`, dataset: { testid: "log-row", event: r.event } },
          el(
            "div",
            { class: "log-head" },
            el("time", { class: "muted", title: typeof r.at === "number" ? new Date(r.at * 1000).toString() : "", text: when(r.at) }),
            el("b", { text: r.event }),
            el("span", { class: "outcome", text: r.outcome }),
            seq,
            tokens ? el("span", { class: "muted", text: tokens }) : null,
            typeof r.duration_s === "number" ? el("span", { class: "muted", text: `${r.duration_s.toFixed(2)} s` }) : null,
          ),
          r.detail ? el("div", { class: "detail", text: r.detail }) : null,
        );
      }),
    );
    $("no-log").hidden = rows.length > 0;
  }

  async function loadJobs() {
    const data = await api("GET", `${conv(state.current)}/jobs`);
    const jobs = data.data || [];
    $("jobs").replaceChildren(
      ...jobs.map((j) =>
        el(
          "li",
          { class: "job", dataset: { testid: "job-row", kind: j.kind, status: j.status } },
          el("b", { text: j.kind }),
          " ",
          rangeButton(j.first_seq, j.last_seq),
          " ",
          el("span", { class: `badge ${j.status === "running" ? "open" : ""}`, text: j.status }),
          el("span", {
            class: "muted small",
            text: ` ${j.attempts ? `${j.attempts} attempt${j.attempts === 1 ? "" : "s"} · ` : ""}due ${when(j.run_after)}`,
          }),
        ),
      ),
    );
    $("no-jobs").hidden = jobs.length > 0;
  }

  async function search(ev) {
    ev.preventDefault();
    const q = $("search-q").value.trim();
    if (!q) return;
    const data = await api("GET", `${conv(state.current)}/search?${new URLSearchParams({ q, k: "10" })}`);
    const hits = data.hits || [];
    $("search-hits").replaceChildren(
      ...hits.map((h) => {
        const stamp = h.at ? new Date(h.at) : typeof h.stored_at === "number" ? new Date(h.stored_at * 1000) : null;
        return el(
          "li",
          { class: `hit ${h.role}`, dataset: { testid: "search-hit", seq: h.seq } },
          el(
            "div",
            { class: "msg-meta" },
            el("span", { class: "seq", text: `#${h.seq}` }),
            el("b", { text: h.author || h.role }),
            stamp && !Number.isNaN(stamp.getTime()) ? el("span", { class: "muted small", text: stamp.toLocaleString() }) : null,
            el("button", {
              type: "button",
              class: "link small",
              text: "show in transcript",
              dataset: { testid: "hit-open" },
              onclick: act(() => showMessages(Math.max(0, h.seq - 3), h.seq + 3, h.seq)),
            }),
          ),
          el("p", { class: "part", text: h.text }),
        );
      }),
    );
    $("no-hits").hidden = hits.length > 0;
  }

  // --- wiring ---------------------------------------------------------------------------------

  function wire() {
    $("key-form").addEventListener(
      "submit",
      act(async (ev) => {
        ev.preventDefault();
        const key = $("api-key").value.trim();
        if (key) await useKey(key);
      }),
    );
    $("logout").addEventListener("click", () => forgetKey(""));
    $("refresh").addEventListener("click", act(loadConversations));
    $("notes-save").addEventListener("click", act(saveNotes));
    $("cut-button").addEventListener("click", () => {
      $("cut-confirm-box").hidden = false;
      $("cut-confirm").focus();
    });
    $("cut-cancel").addEventListener("click", () => {
      $("cut-confirm-box").hidden = true;
    });
    $("cut-confirm").addEventListener("click", act(cut));
    $("delete-button").addEventListener("click", () => {
      $("delete-confirm-box").hidden = false;
      $("delete-cancel").focus(); // the safe choice first
    });
    $("delete-cancel").addEventListener("click", () => {
      $("delete-confirm-box").hidden = true;
    });
    $("delete-confirm").addEventListener("click", act(deleteConversation));
    $("messages-more").addEventListener(
      "click",
      act(() => moreMessages(Number($("messages").lastElementChild?.dataset.seq ?? state.range.first - 1))),
    );
    $("conv-filter").addEventListener("input", () => {
      state.filter = $("conv-filter").value;
      renderConversations();
    });
    $("search-form").addEventListener("submit", act(search));
    const edge = () => (state.page ? state.page : state.range ? { first: state.range.first, last: state.range.last } : null);
    $("tr-start").addEventListener("click", act(() => browse({ after: -1 })));
    $("tr-newest").addEventListener("click", act(() => browse({ before: null })));
    $("tr-earlier").addEventListener("click", act(() => browse({ before: edge()?.first ?? null })));
    $("tr-later").addEventListener("click", act(() => browse({ after: edge()?.last ?? -1 })));
  }

  wire();
  if (state.key) act(() => useKey(state.key))();
  else forgetKey("");
})();
