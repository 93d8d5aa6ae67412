// kioku for SillyTavern: names each chat and each generation for `kioku serve`, tells kioku
// what SillyTavern does to a chat outside a request (edits and deletes anywhere, renames,
// branches), and shows what the character remembers in a panel the user can work in.
//
// Every request of the Custom (OpenAI-compatible) source gets headers just before it leaves
// (event CHAT_COMPLETION_SETTINGS_READY; SillyTavern forwards "Include headers" YAML):
//   X-Kioku-Conversation  the chat's kioku id, kept in the chat's metadata (`chat_metadata.kioku`)
//                         so that it survives a rename; a new chat's id is its file name
//   X-Kioku-Parent        for a branch or checkpoint: the id of the chat it was made from
//   X-Kioku-Character / X-Kioku-User   the speaking character's and the persona's names
//   X-Kioku-Generation    SillyTavern's generation type (normal, group_chat, swipe, …; quiet
//                         for a request with no generation behind it, such as Test Message)
//   X-Kioku-Volatile      the leading system messages that change from turn to turn: world
//                         info a keyword triggered, extension prompts (author's note, vectors)
//   X-Kioku-Examples      gradual | always | never: SillyTavern's example-messages behaviour
//   X-Kioku-Speakers      a group chat's members
// Values are RFC 8187 `utf-8''…` (percent-encoded UTF-8): a header cannot carry a Japanese
// chat name as is.
//
// Through kioku's REST API (allowed by `kioku serve --cors-origin <this page's origin>`, with an
// operator key): the whole chat after an edit or a delete (POST …/sync: SillyTavern resends only
// what fits its context), a rename (POST …/rename), and the panel's reads and edits.

import { requestHeaders, resolveIdentity, safeId, stIndex, transcriptOf, withHeaders } from './chat.js';
import { PANEL, esc, itemHtml, linesHtml, range } from './render.js';

export { isSent, resolveIdentity, safeId, stIndex, transcriptOf, volatileIndices, withHeaders } from './chat.js';
export { esc, markdown } from './render.js';

const MODULE = 'kioku';
const DEFAULTS = { enabled: true, url: '', key: '' };
const POLL_MS = 4000;
const SYNC_DELAY_MS = 400;
const API_TIMEOUT_MS = 20000;
const EXAMPLES = { normal: 'gradual', keep: 'always', strip: 'never' }; // SillyTavern's names

let pendingType = null; // the generation SillyTavern started and has not sent yet
let activated = []; // world-info entries the generation triggered
let pollTimer = null;
let syncTimer = null;
let lastShown = '';
let known = null; // the chat identity resolved for the open chat (a promise)
let knownFor = null; // the chat it was resolved for

function st() {
    return globalThis.SillyTavern.getContext();
}

function settings() {
    const all = st().extensionSettings;
    all[MODULE] = Object.assign({}, DEFAULTS, all[MODULE] || {});
    return all[MODULE];
}

// the chat's identity -------------------------------------------------------------------------

async function resolveChat() {
    const ctx = st();
    const name = ctx.getCurrentChatId();
    if (!name) {
        return null;
    }
    const meta = ctx.chatMetadata;
    const plan = resolveIdentity(name, meta);
    let identity = plan.identity;
    if (plan.rename) {
        identity = await renamed(identity, plan.rename);
        plan.write = identity.chat === name;
    }
    if (plan.write && st().getCurrentChatId() === name) {
        st().chatMetadata.kioku = identity;
        await st().saveMetadata();
    }
    return identity;
}

/** Tell kioku about a rename; the identity to use until it is done. */
async function renamed(identity, { from, to }) {
    try {
        const done = await api(`/v1/conversations/${encodeURIComponent(from)}/rename`, {
            method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ id: to }),
        });
        // kioku has no conversation for it yet (done === null): it starts under the new name
        return { ...identity, id: done ? done.id : safeId(to), chat: to };
    } catch (error) {
        if (error.status === 409) {
            toastr.warning(`kioku keeps this chat under its old name: ${error.message}`, 'kioku');
            return { ...identity, chat: to };
        }
        return identity; // kioku is not reachable: the chat goes on under its old id
    }
}

function chatChanged() {
    $('#kioku_notes').val('').removeData('base'); // another chat's unsaved notes are not this one's
    knownFor = st().getCurrentChatId();
    known = settings().enabled ? resolveChat().catch(() => null) : Promise.resolve(null);
    lastShown = '';
    known.then(() => refresh());
}

/** The open chat's identity (resolved once per chat: SillyTavern emits CHAT_CHANGED). */
async function identity() {
    if (!known || knownFor !== st().getCurrentChatId()) {
        chatChanged();
    }
    return await known;
}

// the request's headers ------------------------------------------------------------------------

/** The headers of a request (`kioku.service.conventions` checks them). */
function kiokuHeaders(type, chat, messages = []) {
    const behaviour = globalThis.jQuery ? String($('#example_messages_behavior').val()) : '';
    return requestHeaders(st(), { type, chat, messages, activated, examples: EXAMPLES[behaviour] });
}

function onGenerationStarted(type, _options, dryRun) {
    if (!dryRun) {
        pendingType = type || 'normal';
        activated = [];
    }
}

function onWorldInfoActivated(entries) {
    activated = (entries || []).map(e => String(e?.content || ''));
}

/** "Test Message" sends [user "Hi"] with no generation behind it; a generation that a slash
 * command ended before it was sent leaves its type behind, so the shape decides too. */
function generationOf(data) {
    const messages = Array.isArray(data?.messages) ? data.messages : [];
    const lone = messages.length === 1 && messages[0].role === 'user';
    return lone || !pendingType ? 'quiet' : pendingType;
}

async function onSettingsReady(data) {
    const type = generationOf(data);
    pendingType = null;
    if (!settings().enabled || data?.chat_completion_source !== 'custom') {
        return;
    }
    const chat = await identity();
    const headers = kiokuHeaders(type, chat, data.messages || []);
    data.custom_include_headers = withHeaders(data.custom_include_headers, headers);
}

// edits and deletes anywhere -------------------------------------------------------------------

function generating() {
    return globalThis.jQuery ? $('#mes_stop').is(':visible') : false;
}

function scheduleSync() {
    clearTimeout(syncTimer);
    syncTimer = setTimeout(syncChat, SYNC_DELAY_MS);
}

/** After an edit or a delete: the whole chat to kioku, which applies what changed. */
async function syncChat() {
    if (!settings().enabled) {
        return;
    }
    if (generating()) {
        scheduleSync(); // the reply being written is not in the chat yet
        return;
    }
    const chat = await identity();
    if (!chat) {
        return;
    }
    const ctx = st();
    const messages = transcriptOf(ctx.chat, Boolean(ctx.groupId));
    if (!messages.length) {
        return;
    }
    try {
        const done = await api(`/v1/conversations/${encodeURIComponent(chat.id)}/sync`, {
            method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ messages }),
        });
        if (done && (done.edited.length || done.deleted.length)) {
            lastShown = '';
            schedule(300);
        }
    } catch (error) {
        toastr.warning(`kioku did not get the change: ${error.message}`, 'kioku');
    }
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
        // a generation waits for the chat's identity (a rename): never for long
        signal: globalThis.AbortSignal?.timeout
            ? AbortSignal.timeout(options.timeout ?? API_TIMEOUT_MS) : undefined,
    });
    if (response.status === 404) {
        return null;
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
        const error = new Error(body?.error?.message || `kioku answered ${response.status}`);
        error.status = response.status;
        throw error;
    }
    return body;
}

async function conversationPath(suffix) {
    const chat = await identity();
    return chat ? `/v1/conversations/${encodeURIComponent(chat.id)}${suffix}` : null;
}

// what the panel shows ---------------------------------------------------------------------------

let current = { memory: null, lines: {}, places: {} };

function showMemory() {
    const { memory, lines, places } = current;
    if (!memory) {
        $('#kioku_memory').html('');
        $('#kioku_notes').val('').removeData('base');
        return;
    }
    const parts = [];
    if (memory.synopsis) {
        parts.push(itemHtml(st().chat, 'Synopsis', memory.synopsis, places, lines[memory.synopsis.id]));
    }
    memory.chapters.forEach((c, k) => parts.push(itemHtml(st().chat, `Chapter ${k + 1}`, c, places, lines[c.id])));
    if (!parts.length) {
        parts.push('<div class="kioku-empty">No memory yet: the chat is still inside the raw window.</div>');
    }
    const waiting = (memory.ready || []).filter(i => !i.data?.operator_edits);
    if (waiting.length) {
        const names = waiting.map(i => `${i.kind === 'synopsis' ? 'a synopsis' : 'a chapter'} of messages ${range(st().chat, i, places)}`);
        parts.push(`<div class="kioku-waiting">Written, enters the prompt at the next fold: ${esc(names.join(', '))}.</div>`);
    }
    $('#kioku_memory').html(parts.join(''));
    // a refresh (the panel polls while summaries run) never throws away notes being edited:
    // the box is replaced only while it is not focused and holds no unsaved change
    const box = $('#kioku_notes');
    const unsaved = box.data('base') !== undefined && String(box.val()) !== String(box.data('base'));
    if (!box.is(':focus') && !unsaved) {
        box.val(memory.notes_editable || '').data('base', memory.notes_editable || '');
    }
}

function markInMemory(rawStart) {
    $('#chat .mes').each(function () {
        const id = Number($(this).attr('mesid'));
        $(this).toggleClass('kioku-in-memory', rawStart !== null && id < rawStart)
            .attr('data-kioku', rawStart !== null && id < rawStart ? 'in memory' : null);
    });
}

function showStatus(status) {
    const url = baseUrl();
    $('#kioku_console').attr('href', url ? `${url}/console/` : null).toggle(Boolean(url));
    if (!status) {
        $('#kioku_status').text('kioku has nothing for this chat yet (it starts at the next message).');
        $('#kioku_folding').text('');
        $('#kioku_card').text('');
        markInMemory(null);
        return;
    }
    const chat = st().chat;
    const rawStart = stIndex(chat, status.raw_start_position);
    const memory = status.raw_start_position > 0
        ? `messages #0–#${rawStart - 1} are in memory, the raw window starts at #${rawStart}`
        : 'nothing is in memory yet (the whole chat is in the raw window)';
    $('#kioku_status').text(`${status.shown} messages stored · ${memory} · profile ${status.profile}, window ${status.window} tokens · memory version ${status.memory_version}`);
    const f = status.folding;
    const folding = f.running ? `Folding in progress: writing ${f.kinds.join(', ')}…`
        : f.queued ? `Folding scheduled (${f.kinds.join(', ')}).` : '';
    $('#kioku_folding').text(folding).toggleClass('kioku-busy', Boolean(f.running || f.queued));
    $('#kioku_card').text(status.card_changes
        ? `The card changed ${status.card_changes}× in this chat: each change made the model read the whole prompt again (see kioku's SillyTavern guide).`
        : '');
    markInMemory(status.raw_start_position > 0 ? rawStart : 0);
}

function showError(error) {
    $('#kioku_status').text(`kioku: ${error.message}`);
}

async function places(memory) {
    const seqs = [];
    for (const it of [memory.synopsis, ...memory.chapters, ...(memory.ready || [])].filter(Boolean)) {
        seqs.push(it.first_seq, it.last_seq);
    }
    if (!seqs.length) {
        return {};
    }
    const query = seqs.map(q => `seq=${q}`).join('&');
    const got = await api(await conversationPath(`/positions?${query}`));
    return got ? got.positions : {};
}

export async function refresh() {
    const status = await conversationPath('/status');
    if (!status) {
        $('#kioku_status').text('Open a chat to see what kioku remembers.');
        current = { memory: null, lines: {}, places: {} };
        showMemory();
        return null;
    }
    try {
        const [s, memory] = await Promise.all([api(status), api(await conversationPath('/memory'))]);
        showStatus(s);
        const shown = JSON.stringify([memory, s?.shown]);
        if (shown !== lastShown) {
            lastShown = shown;
            const lines = memory ? await api(await conversationPath('/memory/lines')) : null;
            current = {
                memory,
                lines: Object.fromEntries((lines?.items || []).map(i => [i.id, i])),
                places: memory ? await places(memory) : {},
            };
            showMemory();
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

// what the panel does ------------------------------------------------------------------------------

async function act(button, what, run) {
    $(button).addClass('disabled');
    try {
        const done = await run();
        if (done !== undefined) {
            toastr.success(done, 'kioku');
        }
    } catch (error) {
        toastr.error(error.message, `kioku: ${what} failed`);
    } finally {
        $(button).removeClass('disabled');
        lastShown = '';
        await refresh();
    }
}

async function cut() {
    const path = await conversationPath('/cut');
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
    $('#kioku_status').text('Cutting: summarizing everything not yet in memory…');
    await act('#kioku_cut', 'cut', async () => {
        // a cut summarizes now, on the chronicler's model: as long as that takes
        const done = await api(path, { method: 'POST', timeout: 30 * 60 * 1000 });
        return done ? done.reasons.join('; ') : 'nothing to cut';
    });
}

async function deleteChat() {
    const path = await conversationPath('');
    if (!path) {
        return;
    }
    const ctx = st();
    const sure = await ctx.callGenericPopup(
        'Delete everything kioku keeps of this chat: its log, memory, notes and index? It cannot be undone (`kioku export` keeps a copy first). SillyTavern\'s own chat file stays; chat on and kioku starts again from what SillyTavern sends.',
        ctx.POPUP_TYPE.CONFIRM);
    if (!sure) {
        return;
    }
    await act('#kioku_delete', 'delete', async () => {
        // it waits for a reply in flight to finish first
        const done = await api(path, { method: 'DELETE', timeout: 30 * 60 * 1000 });
        return done ? `Deleted: ${done.deleted.messages ?? 0} messages and all kioku kept of them.` : 'kioku had nothing for this chat';
    });
}

async function summarizeNow() {
    await act('#kioku_summarize', 'summarize', async () => {
        const done = await api(await conversationPath('/summarize'), { method: 'POST' });
        if (!done) {
            return 'kioku has nothing for this chat yet';
        }
        const n = done.scheduled.length + done.hurried;
        return n ? 'Writing the summary now; it enters the prompt when the chat needs the room (Cut folds at once).'
            : 'Nothing to summarize yet: the raw window holds no more than its minimum.';
    });
}

async function writeAgain(id) {
    await act(`.kioku-item[data-id="${id}"] .kioku-resummarize`, 'write again', async () => {
        await api(await conversationPath(`/memory/${id}/resummarize`), { method: 'POST' });
        return 'The chapter is being written again from its messages.';
    });
}

async function editLine(id, line, text) {
    await act(`.kioku-item[data-id="${id}"] .kioku-lines`, 'edit', async () => {
        await api(await conversationPath(`/memory/${id}/lines`), {
            method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ line, text }),
        });
        return text === null ? 'Line removed; memory changes at the next fold.'
            : 'Line saved; memory changes at the next fold.';
    });
}

async function saveNotes() {
    await act('#kioku_notes_save', 'notes', async () => {
        const done = await api(await conversationPath('/notes'), {
            method: 'PUT',
            headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ text: String($('#kioku_notes').val()), base: $('#kioku_notes').data('base') ?? null }),
        });
        // saved: the next refresh shows the notes as kioku now renders them
        $('#kioku_notes').removeData('base').trigger('blur');
        return done ? `Notes saved: ${done.added} added, ${done.changed} changed, ${done.retracted} removed.` : 'kioku has nothing for this chat yet';
    });
}

function bindPanel() {
    const s = settings();
    $('#kioku_enabled').prop('checked', s.enabled).on('change', function () {
        settings().enabled = Boolean($(this).prop('checked'));
        st().saveSettingsDebounced();
        chatChanged();
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
    $('#kioku_delete').on('click', deleteChat);
    $('#kioku_summarize').on('click', summarizeNow);
    $('#kioku_notes_save').on('click', saveNotes);
    $('#kioku_memory')
        .on('click', '.kioku-resummarize', function () { writeAgain($(this).closest('.kioku-item').data('id')); })
        .on('click', '.kioku-edit-lines', function () {
            const item = $(this).closest('.kioku-item');
            item.find('.kioku-lines').html(linesHtml(current.lines[item.data('id')]));
        })
        .on('click', '.kioku-line-save', function () {
            const row = $(this).closest('.kioku-line');
            editLine(row.closest('.kioku-item').data('id'), row.attr('data-line'), String(row.find('input').val()));
        })
        .on('click', '.kioku-line-drop', function () {
            const row = $(this).closest('.kioku-line');
            editLine(row.closest('.kioku-item').data('id'), row.attr('data-line'), null);
        });
}

function start() {
    const ctx = st();
    const events = ctx.eventTypes;
    $('#extensions_settings2').append(PANEL);
    bindPanel();
    ctx.eventSource.on(events.GENERATION_STARTED, onGenerationStarted);
    ctx.eventSource.on(events.WORLD_INFO_ACTIVATED, onWorldInfoActivated);
    ctx.eventSource.on(events.CHAT_COMPLETION_SETTINGS_READY, onSettingsReady);
    // SillyTavern also emits GENERATION_ENDED while a generation starts: only refresh on it
    ctx.eventSource.on(events.GENERATION_ENDED, () => schedule(500));
    ctx.eventSource.on(events.CHAT_CHANGED, chatChanged);
    ctx.eventSource.on(events.MESSAGE_EDITED, scheduleSync);
    ctx.eventSource.on(events.MESSAGE_DELETED, scheduleSync);
    for (const rendered of [events.USER_MESSAGE_RENDERED, events.CHARACTER_MESSAGE_RENDERED]) {
        ctx.eventSource.on(rendered, () => schedule(300)); // mark the new message too
    }
    chatChanged();
}

if (globalThis.jQuery) {
    jQuery(start); // in SillyTavern's page (the module is also imported by kioku's tests)
}
