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
    range: null, // {first, last} of the source messages shown
    nextAfter: null,
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
    const data = await api("GET", "conversations");
    state.conversations = data.data || [];
    const list = $("conversations");
    list.replaceChildren(
      ...state.conversations.map((c) =>
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
            el("span", { class: "muted small", text: `${c.character || "—"} · ${c.messages} msgs` }),
          ),
        ),
      ),
    );
    $("no-conversations").hidden = state.conversations.length > 0;
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
    $("notes-status").textContent = "";
    clearMessages();
    await Promise.all([loadMemory(), loadTics(), loadLog(), loadStatus()]);
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
  }

  // --- memory ---------------------------------------------------------------------------------

  async function loadMemory() {
    const mem = await api("GET", `${conv(state.current)}/memory`);
    state.memory = mem;
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
    const badges = [
      el("span", { class: `badge ${it.source}`, text: it.source }),
      it.stale ? el("span", { class: "badge stale", text: "stale: source edited", dataset: { testid: "stale" } }) : null,
      el("span", { class: "muted small", text: `${it.tokens} tokens` }),
      it.model ? el("span", { class: "muted small", text: `${it.model} ${it.prompt_version || ""}` }) : null,
    ];
    return el(
      "article",
      {
        class: `item ${it.kind}`,
        dataset: { testid: "memory-item", kind: it.kind, first: it.first_seq, last: it.last_seq, id: it.id },
      },
      el("header", {}, el("b", { text: it.kind === "synopsis" ? "Synopsis" : "Chapter" }), rangeButton(it.first_seq, it.last_seq), ...badges),
      el("div", { class: "text", dataset: { testid: "item-text" }, text: it.text }),
    );
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
    state.range = null;
    state.nextAfter = null;
    $("messages").replaceChildren();
    $("messages-range").textContent = "";
    $("messages-more").hidden = true;
    $("messages-hint").hidden = false;
    for (const a of document.querySelectorAll("article.item.shown")) a.classList.remove("shown");
  }

  async function showMessages(first, last) {
    clearMessages();
    state.range = { first, last };
    $("messages-range").textContent = first === last ? `(seq ${first})` : `(seq ${first}–${last})`;
    $("messages-hint").hidden = true;
    for (const a of document.querySelectorAll("article.item")) {
      a.classList.toggle("shown", Number(a.dataset.first) === first && Number(a.dataset.last) === last);
    }
    await moreMessages(first - 1);
    $("messages").scrollIntoView({ block: "nearest" });
  }

  async function moreMessages(after) {
    const { first, last } = state.range;
    const limit = Math.min(PAGE, last - after);
    const q = new URLSearchParams({ limit: String(Math.max(1, limit)) });
    if (after >= 0) q.set("after", String(after));
    const data = await api("GET", `${conv(state.current)}/messages?${q}`);
    const rows = (data.data || []).filter((m) => m.seq >= first && m.seq <= last);
    $("messages").append(...rows.map(message));
    const lastShown = rows.length ? rows[rows.length - 1].seq : after;
    state.nextAfter = data.next_after ?? null;
    $("messages-more").hidden = !(state.nextAfter !== null && lastShown < last && rows.length > 0);
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
    const when = m.at ? new Date(m.at).toLocaleString() : "";
    return el(
      "li",
      { class: `msg ${m.role}${m.deleted ? " deleted" : ""}`, dataset: { testid: "message", seq: m.seq } },
      el(
        "div",
        { class: "msg-meta" },
        el("span", { class: "seq", text: `#${m.seq}` }),
        el("b", { text: m.author || m.role }),
        el("span", { class: "muted small", text: m.role }),
        when ? el("span", { class: "muted small", text: when }) : null,
        m.deleted ? el("span", { class: "badge stale", text: "deleted by the client" }) : null,
      ),
      el("div", { class: "msg-body" }, ...parts),
    );
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
      await Promise.all([loadMemory(), loadLog()]);
    } finally {
      $("cut-button").disabled = false;
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
    $("log-rows").replaceChildren(
      ...rows.flatMap((r) => {
        const seq =
          Number.isInteger(r.first_seq) && Number.isInteger(r.last_seq)
            ? rangeButton(r.first_seq, r.last_seq, `${r.first_seq}–${r.last_seq}`)
            : "";
        const tokens = r.input_tokens || r.output_tokens ? `${fmt(r.input_tokens)} → ${fmt(r.output_tokens)}` : "";
        const row = el(
          "tr",
          { class: `outcome-${r.outcome}`, dataset: { testid: "log-row", event: r.event } },
          el("td", { class: "nowrap", title: typeof r.at === "number" ? new Date(r.at * 1000).toString() : "", text: when(r.at) }),
          el("td", { text: r.event }),
          el("td", { text: r.outcome }),
          el("td", { class: "nowrap" }, seq),
          el("td", { class: "nowrap", text: tokens }),
          el("td", { text: typeof r.duration_s === "number" ? r.duration_s.toFixed(2) : "" }),
        );
        if (!r.detail) return [row];
        row.classList.add("has-detail");
        const detail = el("tr", { class: "detail-row" }, el("td", { colspan: 6, class: "detail", text: r.detail }));
        return [row, detail];
      }),
    );
    $("no-log").hidden = rows.length > 0;
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
    $("messages-more").addEventListener(
      "click",
      act(() => moreMessages(Number($("messages").lastElementChild?.dataset.seq ?? state.range.first - 1))),
    );
  }

  wire();
  if (state.key) act(() => useKey(state.key))();
  else forgetKey("");
})();
