// The panel's HTML, without I/O: memory rendered from escaped Markdown (see index.js).

import { stIndex } from './chat.js';

export function esc(text) {
    return String(text ?? '').replace(/[&<>"']/g, c => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', '\'': '&#39;' })[c]);
}

function inline(text) {
    return text
        .replace(/`([^`]+)`/g, '<code>$1</code>')
        .replace(/\*\*([^*]+)\*\*/g, '<strong>$1</strong>')
        .replace(/(^|[^*\w])\*([^*\s][^*]*)\*(?=[^*\w]|$)/g, '$1<em>$2</em>')
        .replace(/(^|[^\w])_([^_\s][^_]*)_(?=[^\w]|$)/g, '$1<em>$2</em>');
}

/** Markdown as the chronicler writes it (headings, lists, bold, italics, code), rendered from
 * escaped text: a memory's `<b>` or `<script>` shows as written, never as markup. */
export function markdown(text) {
    const out = [];
    let list = null;
    const close = () => {
        if (list) {
            out.push(`</${list}>`);
            list = null;
        }
    };
    for (const raw of String(text ?? '').split('\n')) {
        const line = esc(raw);
        const heading = line.match(/^(#{1,6})\s+(.*)$/);
        const bullet = line.match(/^\s*[-*+]\s+(.*)$/);
        const numbered = line.match(/^\s*\d+[.)]\s+(.*)$/);
        if (heading) {
            close();
            const level = Math.min(6, heading[1].length + 2); // inside a small drawer
            out.push(`<h${level}>${inline(heading[2])}</h${level}>`);
        } else if (bullet || numbered) {
            const kind = bullet ? 'ul' : 'ol';
            if (list !== kind) {
                close();
                out.push(`<${kind}>`);
                list = kind;
            }
            out.push(`<li>${inline((bullet || numbered)[1])}</li>`);
        } else if (!line.trim()) {
            close();
        } else {
            close();
            out.push(`<p>${inline(line)}</p>`);
        }
    }
    close();
    return out.join('');
}

export const PANEL = `
<div id="kioku_settings" class="kioku-settings">
  <div class="inline-drawer">
    <div class="inline-drawer-toggle inline-drawer-header">
      <b>kioku — memory</b>
      <div class="inline-drawer-icon fa-solid fa-circle-chevron-down down"></div>
    </div>
    <div class="inline-drawer-content">
      <label class="checkbox_label"><input id="kioku_enabled" type="checkbox"> Name chats and generations for kioku</label>
      <label for="kioku_url">kioku URL</label>
      <input id="kioku_url" class="text_pole" type="text" placeholder="the Custom endpoint without /v1, e.g. http://127.0.0.1:8001">
      <label for="kioku_key">kioku API key (operator)</label>
      <input id="kioku_key" class="text_pole" type="password" placeholder="kioku_…">
      <div class="kioku-row">
        <div id="kioku_refresh" class="menu_button" title="Read kioku's memory of this chat again">Refresh</div>
        <div id="kioku_summarize" class="menu_button" title="Write the summaries due soon now, without waiting">Summarize now</div>
        <div id="kioku_cut" class="menu_button" title="Fold every message not yet summarized into memory now and start the raw window afresh">Cut</div>
        <div id="kioku_delete" class="menu_button" title="Delete everything kioku keeps of this chat (SillyTavern's chat file stays)">Delete from kioku</div>
      </div>
      <div class="kioku-row kioku-links"><a id="kioku_console" target="_blank" rel="noopener noreferrer">Open kioku's console</a></div>
      <div id="kioku_status" class="kioku-status">—</div>
      <div id="kioku_folding" class="kioku-folding"></div>
      <div id="kioku_card" class="kioku-card"></div>
      <div id="kioku_memory" class="kioku-memory"></div>
      <details id="kioku_notes_box" class="kioku-item" data-kind="notes">
        <summary>Notes (one fact a line; edit and save)</summary>
        <textarea id="kioku_notes" class="text_pole textarea_compact" rows="8"></textarea>
        <div class="kioku-row"><div id="kioku_notes_save" class="menu_button">Save notes</div></div>
      </details>
    </div>
  </div>
</div>`;

export function range(chat, item, places) {
    const first = stIndex(chat, places[item.first_seq] ?? item.first_seq);
    const last = stIndex(chat, places[item.last_seq] ?? item.last_seq);
    return `#${first}–#${last}`;
}

export function itemHtml(chat, label, it, places, lines) {
    const stale = it.stale ? ' <span class="kioku-stale">(being written again)</span>' : '';
    // extractive lines in place of the model's summary, which failed: say so, and why
    const standIn = it.stand_in
        ? ` <span class="kioku-stand-in" title="the model's summary failed: these are the messages' own lines">stand-in (extractive: ${esc(it.stand_in)})</span>`
        : '';
    const again = it.kind === 'chapter'
        ? '<div class="menu_button kioku-resummarize" title="Write this chapter again from its messages">Write again</div>'
        : '';
    const pending = lines?.pending
        ? '<div class="kioku-pending">Your edit enters the prompt at the next fold.</div>' : '';
    return `<details class="kioku-item" data-kind="${esc(it.kind)}" data-id="${it.id}">`
        + `<summary>${esc(label)} · messages ${range(chat, it, places)}${standIn}${stale}</summary>`
        + `<div class="kioku-text">${markdown(it.text)}</div>${pending}`
        + `<div class="kioku-row"><div class="menu_button kioku-edit-lines">Edit lines</div>${again}</div>`
        + '<div class="kioku-lines"></div></details>';
}

export function linesHtml(entry) {
    const lines = entry?.pending ? entry.pending.lines : entry?.lines || [];
    return lines.map(line => `<div class="kioku-line" data-line="${esc(line)}">`
        + `<input class="text_pole kioku-line-text" value="${esc(line)}">`
        + '<div class="menu_button kioku-line-save" title="Save this line">Save</div>'
        + '<div class="menu_button kioku-line-drop" title="Remove this line from memory">Remove</div></div>').join('');
}

