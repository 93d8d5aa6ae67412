// kioku for SillyTavern: names each chat and each generation for `kioku serve`, and shows what
// the character remembers (synopsis, chapters, notes), folding in progress, and a Cut button.
//
// SillyTavern's Custom (OpenAI-compatible) source forwards "Additional Parameters → Include
// headers" (YAML) with every request; those are static. This extension adds per-request headers
// to that YAML just before each request leaves (event CHAT_COMPLETION_SETTINGS_READY):
//   X-Kioku-Conversation  the chat's id (getCurrentChatId), so each chat is its own conversation
//   X-Kioku-Character     the character's name,   X-Kioku-User  the persona's name
//   X-Kioku-Generation    normal | swipe | regenerate | continue | impersonate | quiet
// The type comes from GENERATION_STARTED; a request with no generation behind it ("Test
// Message", an extension's raw request) is quiet. Values are sent as RFC 8187 `utf-8''…`
// (percent-encoded UTF-8): HTTP headers cannot carry a Japanese chat name as is.
//
// The panel reads kioku's REST API from the browser: `kioku serve --cors-origin <this page's
// origin>` must allow it, and the panel needs kioku's URL and an API key (docs/sillytavern.md).

const MODULE = 'kioku';
const DEFAULTS = { enabled: true, url: '', key: '' };
const POLL_MS = 4000;

let pendingType = null; // the generation SillyTavern started and has not sent yet
let pollTimer = null;
let lastShown = '';

function st() {
    return globalThis.SillyTavern.getContext();
}

function settings() {
    const all = st().extensionSettings;
    all[MODULE] = Object.assign({}, DEFAULTS, all[MODULE] || {});
    return all[MODULE];
}

// the request's headers ------------------------------------------------------------------------

function encoded(value) {
    return "utf-8''" + encodeURIComponent(String(value));
}

/** The user's YAML with kioku's headers as the last item of a YAML list (SillyTavern merges
 * a list of mappings in order, so these win over a stale static X-Kioku-Conversation). */
export function withHeaders(yamlText, headers) {
    const ours = '- ' + JSON.stringify(headers); // a JSON object is a YAML flow mapping
    const text = String(yamlText || '').replace(/\s+$/, '');
    if (!text.trim()) {
        return ours;
    }
    const first = text.split('\n').find(line => line.trim() && !line.trim().startsWith('#')) || '';
    if (first.trim().startsWith('-')) {
        return `${text}\n${ours}`;
    }
    return `- ${text.split('\n').join('\n  ')}\n${ours}`;
}

export function kiokuHeaders(type) {
    const ctx = st();
    const headers = { 'X-Kioku-Generation': type };
    const chatId = ctx.getCurrentChatId();
    if (chatId) {
        headers['X-Kioku-Conversation'] = encoded(chatId);
    }
    if (ctx.name2) {
        headers['X-Kioku-Character'] = encoded(ctx.name2);
    }
    if (ctx.name1) {
        headers['X-Kioku-User'] = encoded(ctx.name1);
    }
    return headers;
}

function onGenerationStarted(type, _options, dryRun) {
    if (!dryRun) {
        pendingType = type || 'normal';
    }
}

/** "Test Message" sends [user "Hi"] with no generation behind it; a generation that a slash
 * command ended before it was sent leaves its type behind, so the shape decides too. */
function generationOf(data) {
    const messages = Array.isArray(data?.messages) ? data.messages : [];
    const lone = messages.length === 1 && messages[0].role === 'user';
    return lone || !pendingType ? 'quiet' : pendingType;
}

function onSettingsReady(data) {
    const type = generationOf(data);
    pendingType = null;
    if (!settings().enabled || data?.chat_completion_source !== 'custom') {
        return;
    }
    data.custom_include_headers = withHeaders(data.custom_include_headers, kiokuHeaders(type));
}

// kioku's REST API -------------------------------------------------------------------------------

function baseUrl() {
    const s = settings();
    let url = (s.url || String($('#custom_api_url_text').val() || '')).trim();
    url = url.replace(/\/+$/, '').replace(/\/v1$/, '');
    return url;
}

async function api(path, options = {}) {
    const url = baseUrl();
    if (!url) {
        throw new Error('set kioku\'s URL below (or the Custom endpoint of the API connection)');
    }
    const response = await fetch(`${url}${path}`, {
        ...options,
        headers: { Authorization: `Bearer ${settings().key}`, ...(options.headers || {}) },
    });
    if (response.status === 404) {
        return null;
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
        throw new Error(body?.error?.message || `kioku answered ${response.status}`);
    }
    return body;
}

function conversationPath(suffix) {
    const chatId = st().getCurrentChatId();
    return chatId ? `/v1/conversations/${encodeURIComponent(chatId)}${suffix}` : null;
}

// the panel --------------------------------------------------------------------------------------

const PANEL = `
<div id="kioku_settings" class="kioku-settings">
  <div class="inline-drawer">
    <div class="inline-drawer-toggle inline-drawer-header">
      <b>kioku — memory</b>
      <div class="inline-drawer-icon fa-solid fa-circle-chevron-down down"></div>
    </div>
    <div class="inline-drawer-content">
      <label class="checkbox_label"><input id="kioku_enabled" type="checkbox"> Name chats and generations for kioku</label>
      <label for="kioku_url">kioku URL</label>
      <input id="kioku_url" class="text_pole" type="text" placeholder="the Custom endpoint without /v1, e.g. http://127.0.0.1:8000">
      <label for="kioku_key">kioku API key</label>
      <input id="kioku_key" class="text_pole" type="password" placeholder="kioku_…">
      <div class="kioku-row">
        <div id="kioku_refresh" class="menu_button">Refresh</div>
        <div id="kioku_cut" class="menu_button" title="Fold everything not yet summarized and start the raw window now">Cut (区切り)</div>
      </div>
      <div id="kioku_status" class="kioku-status">—</div>
      <div id="kioku_folding" class="kioku-folding"></div>
      <div id="kioku_card" class="kioku-card"></div>
      <div id="kioku_memory" class="kioku-memory"></div>
    </div>
  </div>
</div>`;

function esc(text) {
    return String(text ?? '').replace(/[&<>"']/g, c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', '\'': '&#39;' })[c]);
}

function item(label, it) {
    const stale = it.stale ? ' <span class="kioku-stale">(being rewritten after an edit)</span>' : '';
    return `<details class="kioku-item" data-kind="${esc(it.kind)}"><summary>${esc(label)} #${it.first_seq}–#${it.last_seq}${stale}</summary><div class="kioku-text">${esc(it.text)}</div></details>`;
}

function showMemory(memory) {
    if (!memory) {
        $('#kioku_memory').html('');
        return;
    }
    const parts = [];
    if (memory.synopsis) {
        parts.push(item('Synopsis', memory.synopsis));
    }
    memory.chapters.forEach((c, k) => parts.push(item(`Chapter ${k + 1}`, c)));
    if (!parts.length) {
        parts.push('<div class="kioku-empty">No memory yet: the chat is still inside the raw window.</div>');
    }
    if (memory.notes) {
        parts.push(`<details class="kioku-item" data-kind="notes"><summary>Notes</summary><div class="kioku-text">${esc(memory.notes)}</div></details>`);
    }
    $('#kioku_memory').html(parts.join(''));
}

function showStatus(status) {
    if (!status) {
        $('#kioku_status').text('kioku has nothing for this chat yet (it starts at the next message).');
        $('#kioku_folding').text('');
        $('#kioku_card').text('');
        return;
    }
    $('#kioku_status').text(
        `${status.messages} messages stored · raw window from #${status.raw_start} · memory version ${status.memory_version}`);
    const f = status.folding;
    const folding = f.running ? `Folding in progress: writing ${f.kinds.join(', ')}…`
        : f.queued ? `Folding scheduled (${f.kinds.join(', ')}).` : '';
    $('#kioku_folding').text(folding).toggleClass('kioku-busy', Boolean(f.running || f.queued));
    $('#kioku_card').text(status.card_changes
        ? `The card changed ${status.card_changes}× in this chat: each change made the model read the whole prompt again (see kioku's SillyTavern guide).`
        : '');
}

function showError(error) {
    $('#kioku_status').text(`kioku: ${error.message}`);
}

export async function refresh() {
    const status = conversationPath('/status');
    if (!status) {
        $('#kioku_status').text('Open a chat to see what kioku remembers.');
        showMemory(null);
        return null;
    }
    try {
        const [s, memory] = await Promise.all([api(status), api(conversationPath('/memory'))]);
        showStatus(s);
        const shown = JSON.stringify(memory);
        if (shown !== lastShown) {
            lastShown = shown;
            showMemory(memory);
        }
        if (s && (s.folding.running || s.folding.queued)) {
            schedule(POLL_MS);
        }
        return s;
    } catch (error) {
        showError(error);
        return null;
    }
}

function schedule(ms) {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(refresh, ms);
}

async function cut() {
    const path = conversationPath('/cut');
    if (!path) {
        return;
    }
    const ctx = st();
    const sure = await ctx.callGenericPopup(
        'Fold every message not yet summarized into memory and start the raw window now? kioku keeps every message in its archive.',
        ctx.POPUP_TYPE.CONFIRM);
    if (!sure) {
        return;
    }
    $('#kioku_cut').addClass('disabled');
    $('#kioku_status').text('Cutting: summarizing everything not yet in memory…');
    try {
        const done = await api(path, { method: 'POST' });
        toastr.success(done ? done.reasons.join('; ') : 'nothing to cut', 'kioku');
    } catch (error) {
        toastr.error(error.message, 'kioku cut failed');
    } finally {
        $('#kioku_cut').removeClass('disabled');
        lastShown = '';
        await refresh();
    }
}

function bindPanel() {
    const s = settings();
    $('#kioku_enabled').prop('checked', s.enabled).on('change', function () {
        settings().enabled = Boolean($(this).prop('checked'));
        st().saveSettingsDebounced();
    });
    $('#kioku_url').val(s.url).on('change', function () {
        settings().url = String($(this).val()).trim();
        st().saveSettingsDebounced();
        refresh();
    });
    $('#kioku_key').val(s.key).on('change', function () {
        settings().key = String($(this).val()).trim();
        st().saveSettingsDebounced();
        refresh();
    });
    $('#kioku_refresh').on('click', () => { lastShown = ''; refresh(); });
    $('#kioku_cut').on('click', cut);
}

function start() {
    const ctx = st();
    const events = ctx.eventTypes;
    $('#extensions_settings2').append(PANEL);
    bindPanel();
    ctx.eventSource.on(events.GENERATION_STARTED, onGenerationStarted);
    ctx.eventSource.on(events.CHAT_COMPLETION_SETTINGS_READY, onSettingsReady);
    // SillyTavern also emits GENERATION_ENDED while a generation starts: only refresh on it
    ctx.eventSource.on(events.GENERATION_ENDED, () => schedule(500));
    ctx.eventSource.on(events.CHAT_CHANGED, () => { lastShown = ''; refresh(); });
    refresh();
}

if (globalThis.jQuery) {
    jQuery(start); // in SillyTavern's page (the module is also imported by kioku's tests)
}
