// The chat as kioku sees it, without I/O: a chat's identity from its metadata, what
// SillyTavern sends of it, its message numbers, the request's headers (see index.js).

/** A chat name kioku can keep as it is (`kioku.ids`); any other gets a suffix of its own. */
export function safeId(name) {
    const text = String(name ?? '');
    const ok = text.length > 0 && text.length <= 200 && text === text.trim()
        && text !== '.' && text !== '..' && !/[\\/\u0000-\u001f\u007f-\u009f\u2028\u2029]/.test(text);
    if (ok) {
        return text;
    }
    const kept = text.replace(/[\\/\u0000-\u001f\u007f-\u009f\u2028\u2029]/g, '_').replace(/\s+/g, ' ').trim().slice(0, 160) || 'chat';
    return `${kept} ~${Math.random().toString(16).slice(2, 14)}`;
}

/** What the metadata says about the chat now open, decided without I/O:
 * `{id, parent?}` for the request, and what to do (`write`: new metadata, `rename`: tell kioku).
 * A branch or checkpoint starts as a copy of its parent's metadata (SillyTavern copies it and
 * sets `main_chat`); a renamed chat keeps its metadata under a new file name. */
export function resolveIdentity(name, metadata) {
    const meta = metadata || {};
    const k = meta.kioku;
    if (!k || typeof k !== 'object' || !k.id) {
        const fresh = { id: safeId(name), chat: name };
        if (meta.main_chat && meta.main_chat !== name) {
            fresh.parent = meta.main_chat; // made before kioku named its parent: its file name
        }
        return { identity: fresh, write: true };
    }
    if (k.chat === name) {
        return { identity: k, write: false };
    }
    if (meta.main_chat && meta.main_chat === k.chat) {
        // the parent's metadata, copied into a branch or a checkpoint
        return { identity: { id: safeId(name), chat: name, parent: k.id }, write: true };
    }
    return { identity: { ...k }, write: false, rename: { from: k.id, to: name } };
}

export function encoded(value) {
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

/** Indices of the request's leading system messages that change from turn to turn: those
 * holding a world-info entry this generation triggered or an extension's prompt. */
export function volatileIndices(messages, changing) {
    const parts = (changing || []).map(p => String(p || '').trim()).filter(p => p.length >= 8);
    const out = [];
    for (let i = 0; i < messages.length && messages[i].role === 'system'; i++) {
        const content = String(messages[i].content || '');
        if (!messages[i].name && parts.some(p => content.includes(p))) {
            out.push(i);
        }
    }
    return out;
}

/** Whether SillyTavern sends this message to the model (kioku stores what it sends). */
export function isSent(message) {
    return Boolean(message) && !message.is_system && message.extra?.type !== 'narrator';
}

/** The whole chat as SillyTavern's requests show it (a group's messages under their names). */
export function transcriptOf(chat, group) {
    return chat.filter(isSent).map(m => ({
        role: m.is_user ? 'user' : 'assistant',
        content: group && !m.is_user ? `${m.name}: ${m.mes}` : String(m.mes ?? ''),
        name: m.name || undefined,
    }));
}

/** SillyTavern's message number of kioku's `position` (messages kioku stores, counted from 0):
 * SillyTavern also numbers messages it never sends (hidden ones, the narrator's). */
export function stIndex(chat, position) {
    let seen = 0;
    for (let i = 0; i < chat.length; i++) {
        if (!isSent(chat[i])) {
            continue;
        }
        if (seen === position) {
            return i;
        }
        seen++;
    }
    return chat.length;
}


function changingParts(ctx, activated) {
    const prompts = Object.values(ctx.extensionPrompts || {})
        .map(p => (p && p.value ? ctx.substituteParams(String(p.value)) : ''));
    return [...activated, ...prompts];
}

function groupMembers(ctx) {
    if (!ctx.groupId) {
        return null;
    }
    const group = (ctx.groups || []).find(g => g.id == ctx.groupId);
    const names = (group?.members || [])
        .map(avatar => (ctx.characters || []).find(c => c.avatar === avatar)?.name)
        .filter(Boolean);
    return names.length ? names : null;
}

/** The X-Kioku-* headers of a request, from SillyTavern's context `ctx`: the generation
 * `type`, the chat's identity, the request's `messages`, the world-info entries the generation
 * `activated`, the example-messages behaviour (`examples`). */
export function requestHeaders(ctx, { type, chat, messages = [], activated = [], examples = '' }) {
    const headers = { 'X-Kioku-Generation': type };
    if (chat) {
        headers['X-Kioku-Conversation'] = encoded(chat.id);
        if (chat.parent) {
            headers['X-Kioku-Parent'] = encoded(chat.parent);
        }
    }
    if (ctx.name2) {
        headers['X-Kioku-Character'] = encoded(ctx.name2);
    }
    if (ctx.name1) {
        headers['X-Kioku-User'] = encoded(ctx.name1);
    }
    const changing = volatileIndices(messages, changingParts(ctx, activated));
    if (changing.length) {
        headers['X-Kioku-Volatile'] = changing.join(',');
    }
    if (examples) {
        headers['X-Kioku-Examples'] = examples;
    }
    const members = groupMembers(ctx);
    if (members) {
        headers['X-Kioku-Speakers'] = encoded(JSON.stringify(members));
    }
    return headers;
}
