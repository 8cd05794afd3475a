'use strict';
/*
 * fsbroker: the person's console. Plain script, no dependencies, no build step.
 *
 * Every string the API returns may come from an MCP server (its name, its message, a path
 * it created) and is hostile: it only ever reaches the page through text nodes (srv()),
 * wrapped in <bdi dir="ltr"> with invisible and direction-changing characters shown as
 * \u{XXXX}. Nothing here uses innerHTML, and no API string goes into a URL except a root
 * name through encodeURIComponent; ids in URLs are checked to be safe integers.
 *
 * Test hooks (stable):
 *   #connection                  "live" while the event stream is open; otherwise
 *                                "connecting", "disconnected, retrying", "not answering" or
 *                                "needs its token"
 *   #status                      role=status: the outcome of the person's acts, and errors
 *   #announce                    aria-live: "Session N asks for file access" for new prompts
 *   #loading                     "Connecting…" until the first /api/state arrives
 *   #unauthorized                shown when /api/state answers 401
 *   #broker                      pid and version
 *   #prompts [data-prompt-id=N]  one consent prompt card, oldest first
 *     [data-armed=true|false]    on the card: presses are ignored for 600 ms after it appears
 *                                or moves (wait for data-armed=true before pressing)
 *     [data-action=approve-selected|approve-all|deny]
 *     input[type=checkbox][data-path-index=I]  ticked: send path I
 *     input[data-path-input=I]   path I as it will be sent (the person may narrow it)
 *     [data-countdown]           "… denied automatically in 42 s"
 *   #sessions tr[data-session-id=N]   a session; button[data-action=end-session]
 *     li[data-grant-id=N]        one of its grants; button[data-action=revoke]
 *   #roots tr[data-root-name]    a root (dataset.rootName is its name); [data-action=pause|resume]
 *   #feed tr[data-feed-session]  an activity row ("" for rows of no one session); [data-count];
 *                                classes: refused (PERMISSION_DENIED), failed (other errors),
 *                                act (the person's own act), note (dropped records, reconnects)
 *   #feed-filter                 select: "" = all sessions, else a session id
 *   #audit[data-chain=intact|broken|unchecked|off], #audit [data-audit=KEY], #audit-head
 */
(() => {
  const $ = (id) => document.getElementById(id);
  const ARM_MS = 600;          // a prompt's buttons ignore presses this long after it appears
  const FEED_CAP = 500;        // rows kept in the activity feed
  const MERGE_GAP_MS = 30000;  // identical records further apart than this get their own row
  const REFRESH_MS = 500;      // /api/state at most twice a second
  const FETCH_MS = 10000;      // a request not answered by then is given up
  const FIRST_RETRY_MS = 1000; // a failed read of the state is tried again after this,
  const MAX_RETRY_MS = 8000;   // doubling each time it fails again, up to this
  let retryMs = FIRST_RETRY_MS / 2;

  // This page's key (see takeKey()): sent with every request, kept in sessionStorage, which
  // belongs to this origin (this port) alone, unlike cookies, which every port shares.
  let csrf = '';
  let stopped = false;         // set on 401: nothing more to do without the token
  let source = null;           // the EventSource
  let wasLive = false;
  let ticker = 0;              // countdown interval, running only while prompts are shown
  let newest = null;           // the feed's newest request row, which the next record may extend
  const prompts = new Map();   // prompt id -> {paths: [as asked], deadline: performance.now() ms}
  const answered = new Set();  // prompts answered here: a state read before the answer must not bring them back
  const seenSessions = new Set();
  const drawn = {};            // section -> JSON it was last drawn from, to skip redraws
  const posting = new Set();   // URLs of acts in flight, so a double press sends once

  // ---------------------------------------------------------------- building nodes

  // Builds an element. Attribute names and class names are always constants of this file;
  // API strings only go in as children (text) or dataset values.
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false || (v === '' && k === 'class')) continue;
      if (k === 'dataset') Object.assign(el.dataset, v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c !== null && c !== undefined && c !== false) el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  // Replaces an element's content; `parts` as for h().
  const fill = (el, ...parts) => el.replaceChildren(...h('span', {}, parts).childNodes);

  // Characters that hide or reorder text: every control (Cc), every format character (Cf:
  // soft hyphen, zero-width and bidi marks, embeddings, overrides and isolates, word joiners,
  // BOM, Arabic number signs, musical formatting, tags, interlinear annotation marks), the
  // line and paragraph separators, and blanks that draw nothing: the combining grapheme
  // joiner, fillers (Hangul, Braille blank), variation selectors.
  const HIDDEN = '\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}\\u034f\\u115f\\u1160\\u17b4\\u17b5' +
    '\\u180b-\\u180f\\u2800\\u3164\\ufe00-\\ufe0f\\uffa0\\u{e0100}-\\u{e01ef}';
  const HIDDEN_RE = new RegExp('[' + HIDDEN + ']', 'gu');
  // In a message a line break is just a line break.
  const HIDDEN_BUT_NL_RE = new RegExp('(?![\\n])[' + HIDDEN + ']', 'gu');
  const hasHidden = (s) => new RegExp(HIDDEN_RE.source, 'u').test(s);

  // A string someone else chose, as text: isolated from the text around it and with its
  // invisible characters made visible, so the person sees that they were used.
  function srv(value, keepNewlines) {
    const text = String(value);
    const out = h('bdi', { dir: 'ltr', class: 'srv' });
    let last = 0;
    for (const m of text.matchAll(keepNewlines ? HIDDEN_BUT_NL_RE : HIDDEN_RE)) {
      out.append(text.slice(last, m.index));
      const code = m[0].codePointAt(0).toString(16).toUpperCase().padStart(4, '0');
      out.append(h('span', { class: 'ctl', title: 'an invisible or direction-changing character' },
        '\\u{' + code + '}'));
      last = m.index + m[0].length;
    }
    out.append(text.slice(last));
    return out;
  }

  const num = (v) => (Number.isSafeInteger(v) && v >= 0 ? v : null);
  // An id read back from a dataset value this file wrote.
  const idIn = (el, key) => {
    const s = el && el.dataset[key];
    return typeof s === 'string' && /^\d{1,16}$/.test(s) ? num(Number(s)) : null;
  };
  const text = (v) => (typeof v === 'string' && v !== '' ? srv(v) : '—');
  const count = (v) => (Number.isFinite(v) ? v.toLocaleString() : '—');
  const plural = (v, one, many) => count(v) + ' ' + (v === 1 ? one : many || one + 's');

  function bytes(n) {
    if (!Number.isFinite(n) || n < 0) return '—';
    if (n < 1024) return n + ' B';
    const units = ['KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
    let i = -1;
    do { n /= 1024; i += 1; } while (n >= 1024 && i < units.length - 1);
    return n.toFixed(n < 10 ? 1 : 0) + ' ' + units[i];
  }

  // A timestamp as a <time>; one that does not parse is shown as the text it is.
  function when(s, timeOnly) {
    if (typeof s !== 'string') return '—';
    const d = new Date(s);
    if (Number.isNaN(d.getTime())) return srv(s);
    return h('time', { datetime: d.toISOString() },
      timeOnly ? d.toLocaleTimeString() : d.toLocaleString());
  }

  const dur = (s) => (s < 120 ? s + ' s' : Math.floor(s / 60) + ' min ' + (s % 60) + ' s');

  // A status line for the person; `parts` may hold srv() nodes.
  function say(parts, kind) {
    const box = $('status');
    box.className = 'status ' + (kind === 'error' ? 'status-error' : 'status-ok');
    box.replaceChildren(h('span', {}, parts));
  }

  function setConn(label, kind) {
    const el = $('connection');
    el.textContent = label;
    el.className = 'conn conn-' + kind;
  }

  // ---------------------------------------------------------------- talking to the broker

  async function errorText(res) {
    try {
      const body = await res.json();
      if (body && typeof body.error === 'string') return body.error;
    } catch (_) { /* not JSON: fall through */ }
    return 'HTTP ' + res.status;
  }

  // One of the person's acts. Resolves true on success (204).
  async function post(url, body, done) {
    if (posting.has(url)) return false;
    posting.add(url);
    const headers = { 'X-CSRF-Token': csrf };
    // No cookie is needed, and none is sent: the page's key is its credential.
    const init = { method: 'POST', credentials: 'omit', cache: 'no-store', headers };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    try {
      const res = await fetch(url, init);
      if (res.status === 401) { signedOut(); return false; }
      if (res.ok) { say(done, 'ok'); return true; }
      say(['Not done: ', srv(await errorText(res))], 'error');
      return false;
    } catch (e) {
      say(['Not done: the broker cannot be reached (', srv(e.message), ').'], 'error');
      return false;
    } finally {
      posting.delete(url);
      refresh();
    }
  }

  // Re-reads /api/state, at most every REFRESH_MS and one request at a time: activity may
  // arrive hundreds of times a second.
  let pending = 0, inFlight = false, again = false, urgent = false, lastLoad = 0, failed = false;
  function refresh() {
    if (pending || stopped) return;
    pending = setTimeout(() => { pending = 0; load(); },
      Math.max(0, lastLoad + REFRESH_MS - Date.now()));
  }

  // Re-reads /api/state now: a `state` event (a prompt came, a grant went) is rare and must
  // show at once, not wait out the throttle that activity needs.
  function refreshNow() {
    if (stopped) return;
    if (pending) { clearTimeout(pending); pending = 0; }
    if (inFlight) { again = true; urgent = true; return; }
    load();
  }

  async function load() {
    if (inFlight) { again = true; return; }
    inFlight = true;
    lastLoad = Date.now();
    // A console that does not answer (busy with other connections, or gone) is said so
    // rather than left looking live.
    const timer = new AbortController();
    const giveUp = setTimeout(() => timer.abort(), FETCH_MS);
    try {
      const res = await fetch('/api/state', {
        credentials: 'omit', cache: 'no-store', headers: { 'X-CSRF-Token': csrf },
        signal: timer.signal,
      });
      if (res.status === 401) { signedOut(); return; }
      if (!res.ok) throw new Error(await errorText(res));
      render(await res.json(), performance.now());
      if (failed) say('Reading the broker\'s state works again.', 'ok');
      retryMs = FIRST_RETRY_MS / 2;
      if (source && source.readyState === EventSource.OPEN) setConn('live', 'live');
      failed = false;
    } catch (e) {
      failed = true;
      // Whatever went wrong, the page no longer shows the broker as it is: it says so, and
      // tries again, less often the longer it fails (a prompt must not wait for an event).
      setConn('not answering', 'down');
      if (timer.signal.aborted) {
        say('The console did not answer within ' + FETCH_MS / 1000 + ' s; trying again.', 'error');
      } else {
        say(['Could not read the broker\'s state: ', srv(e.message), '; trying again.'], 'error');
      }
      retryMs = Math.min(retryMs * 2, MAX_RETRY_MS);
      setTimeout(load, retryMs);
    } finally {
      clearTimeout(giveUp);
      inFlight = false;
      if (again) {
        again = false;
        if (urgent) { urgent = false; load(); } else refresh();
      }
    }
  }

  // Takes this page's key: the console's address carried a one-time ticket, and the console
  // answered it with this page and a new page session's key in a <meta> element (never in a
  // URL, which the browser's history would keep). The key moves to sessionStorage, the
  // element goes, and the spent ticket leaves the address bar. A reload of this tab keeps the
  // key; another tab must open the console anew.
  function takeKey() {
    const meta = document.querySelector('meta[name="fsbroker-key"]');
    if (meta) {
      const given = meta.getAttribute('content') || '';
      meta.remove();
      if (/^[0-9a-f]{64}$/.test(given)) sessionStorage.setItem('fsbroker-key', given);
    }
    if (location.search || location.hash) history.replaceState(null, '', location.pathname);
    const kept = sessionStorage.getItem('fsbroker-key');
    if (kept && /^[0-9a-f]{64}$/.test(kept)) { csrf = kept; return true; }
    signedOut();
    return false;
  }

  function signedOut() {
    stopped = true;
    if (source) source.close();
    $('loading').hidden = true;
    $('content').hidden = true;
    $('unauthorized').hidden = false;
    setConn('needs its token', 'down');
  }

  function connect() {
    if (stopped) return;
    if (source) source.close();
    // An EventSource sends no headers of its own, so the
    // page's key is in the query (a request's URL, never the address bar or history).
    source = new EventSource('/api/events?csrf=' + encodeURIComponent(csrf));
    source.addEventListener('open', () => {
      setConn('live', 'live');
      if (wasLive) feedNote('Reconnected. Requests answered while disconnected are not listed.');
      wasLive = true;
      refresh(); // changes may have happened while the stream was down
    });
    source.addEventListener('error', () => {
      setConn('disconnected, retrying', 'down');
      // EventSource retries by itself after a network error, but gives up for good after
      // an HTTP error (such as 401): then check the state (which notices 401) and reopen.
      if (source.readyState === EventSource.CLOSED) {
        setTimeout(async () => { await load(); connect(); }, 3000);
      }
    });
    source.addEventListener('state', refreshNow);
    source.addEventListener('activity', (e) => {
      const rec = parse(e.data);
      if (rec) addActivity(rec);
      refresh(); // the session's counters changed
    });
    source.addEventListener('lost', (e) => {
      const n = num((parse(e.data) || {}).count);
      feedNote((n === null ? 'Some' : n.toLocaleString()) +
        ' activity records were dropped here: the feed fell behind.');
    });
  }

  function parse(data) {
    try {
      const v = JSON.parse(data);
      return v && typeof v === 'object' && !Array.isArray(v) ? v : null;
    } catch (_) {
      return null;
    }
  }

  // ---------------------------------------------------------------- the whole state

  function render(s, at) {
    if (!s || typeof s !== 'object') throw new Error('the answer is not a state object');
    $('loading').hidden = true;
    $('content').hidden = false;
    const b = s.broker || {};
    fill($('broker'), 'Broker pid ', count(num(b.pid)), ', version ', text(b.version),
      b.startedAt ? [', running since ', when(b.startedAt)] : '');
    const sessions = (Array.isArray(s.sessions) ? s.sessions : []).filter((x) => x && num(x.id) !== null);
    const roots = (Array.isArray(s.roots) ? s.roots : []).filter((r) => r && typeof r.name === 'string');
    for (const x of sessions) seenSessions.add(x.id);
    renderPrompts(Array.isArray(s.prompts) ? s.prompts : [], sessions, at);
    $('sessions-empty').hidden = sessions.length > 0;
    $('sessions-table').hidden = sessions.length === 0;
    redraw('sessions', [sessions, roots], () => sessionRows(sessions, roots));
    $('roots-empty').hidden = roots.length > 0;
    $('roots-table').hidden = roots.length === 0;
    redraw('roots', roots, () => rootRows(roots));
    renderAudit(s.audit);
    renderFilter(sessions);
  }

  // Redraws a table body only when its data changed, and then keeps every row and cell that
  // is the same as before (by data-key and isEqualNode): while counters tick twice a second,
  // the button under the person's pointer or focus stays the same element, so a press is not
  // lost. If the focused button did go, the focus moves to its row's new button, or the
  // section heading.
  function redraw(name, data, rows) {
    const sig = JSON.stringify(data);
    if (drawn[name] === sig) return;
    drawn[name] = sig;
    const body = $(name);
    const a = document.activeElement;
    const had = a && body.contains(a);
    const keys = []; // the focused button's row, then the rows around it
    for (let n = had ? a.closest('[data-key]') : null; n; n = n.parentElement && n.parentElement.closest('[data-key]')) {
      keys.push(n.dataset.key);
    }
    const old = new Map([...body.children].map((r) => [r.dataset.key, r]));
    rows().forEach((row, i) => {
      let keep = old.get(row.dataset.key);
      old.delete(row.dataset.key);
      if (keep && keep.cells.length === row.cells.length) {
        keep.className = row.className;
        [...row.cells].forEach((cell, j) => {
          if (!keep.cells[j].isEqualNode(cell)) keep.replaceChild(cell, keep.cells[j]);
        });
      } else {
        if (keep) keep.remove();
        keep = row;
      }
      if (body.children[i] !== keep) body.insertBefore(keep, body.children[i] || null);
    });
    for (const r of old.values()) r.remove();
    if (!had || body.contains(a)) return;
    const buttons = [...body.querySelectorAll('[data-action]')];
    for (const key of keys) {
      const same = buttons.filter((el) => el.closest('[data-key]').dataset.key === key);
      const back = same.find((el) => el.dataset.action === a.dataset.action) || same[0];
      if (back) { back.focus(); return; }
    }
    body.closest('section').querySelector('h2').focus();
  }

  // ---------------------------------------------------------------- consent prompts

  function renderPrompts(list, sessions, at) {
    const box = $('prompts');
    const ids = new Set();
    const added = [];
    let i = 0;
    for (const p of list) {
      const id = num(p && p.id);
      if (id === null || !Array.isArray(p.paths) || ids.has(id) || answered.has(id)) continue;
      ids.add(id);
      let card = [...box.children].find((c) => idIn(c, 'promptId') === id);
      if (!card) { card = promptCard(p, id); added.push(card); }
      // Keep the server's order (oldest first) without moving cards needlessly: moving a
      // card would take the focus out of it.
      if (box.children[i] !== card) box.insertBefore(card, box.children[i] || null);
      i += 1;
      fillKnown(card, p, sessions);
      const left = Number(p.expiresInMs);
      prompts.get(id).deadline = at + (Number.isFinite(left) ? left : 0);
    }
    let focusLost = false;
    for (const card of [...box.children]) {
      if (!ids.has(idIn(card, 'promptId'))) focusLost = removeCard(card) || focusLost;
    }
    // A card that moved (one above it went) is under the pointer by surprise: arm it anew.
    [...box.children].forEach((card, at) => {
      if (places.get(card) !== at) { places.set(card, at); arm(card); }
    });
    const n = ids.size;
    $('prompts-empty').hidden = n > 0;
    $('prompts-count').textContent = n ? '(' + n + ' waiting)' : '';
    document.title = (n ? '(' + n + ') ' : '') + 'fsbroker console';
    if (n && !ticker) ticker = setInterval(tick, 1000);
    if (!n && ticker) { clearInterval(ticker); ticker = 0; }
    tick();
    if (added.length) {
      $('announce').textContent = added.map((c) => c.querySelector('h3').textContent).join('. ') +
        '. ' + n + ' prompt' + (n === 1 ? '' : 's') + ' waiting.';
      const a = document.activeElement;
      // Take the focus only when the person is not in the middle of something else.
      // Never a button: a key pressed to scroll must not answer the prompt.
      if (!a || a === document.body || a === document.documentElement) {
        box.querySelector('h3').focus();
        return;
      }
    }
    if (focusLost) (box.querySelector('h3') || $('prompts-h')).focus();
  }

  // Removes a card; says whether it held the focus.
  function removeCard(card) {
    const had = card.contains(document.activeElement);
    prompts.delete(idIn(card, 'promptId'));
    card.remove();
    return had;
  }

  function promptCard(p, id) {
    const hid = 'prompt-' + id;
    const session = num(p.session);
    const paths = p.paths.filter((x) => x && typeof x.path === 'string');
    prompts.set(id, { paths: paths.map((x) => x.path), deadline: 0 });
    const card = h('article', { class: 'prompt', 'aria-labelledby': hid + '-h',
      dataset: { promptId: String(id), armed: 'false' } });
    const fields = h('fieldset', { class: 'paths' },
      h('legend', {}, paths.length === 1 ? 'The path asked for' : paths.length + ' paths asked for'),
      h('p', { class: 'hint', id: hid + '-hint' },
        'You can shorten access to a folder inside this path: edit it to a folder beneath ' +
        'it (never above it). Untick a path to leave it out.'));
    paths.forEach((x, i) => {
      const cb = h('input', { type: 'checkbox', id: hid + '-cb' + i, checked: true,
        dataset: { pathIndex: String(i) } });
      const input = h('input', { type: 'text', id: hid + '-in' + i, dir: 'ltr', spellcheck: 'false',
        autocomplete: 'off', autocapitalize: 'off', 'aria-describedby': hid + '-hint',
        class: 'path-input', dataset: { pathInput: String(i) } });
      input.value = x.path;
      const rw = x.mode === 'read-write';
      fields.append(h('div', { class: 'path' },
        h('div', { class: 'path-head' }, cb,
          h('label', { for: cb.id }, 'Grant ', srv(x.path))),
        h('p', { class: 'path-meta' }, 'In root ', text(x.root), ', ',
          h('span', { class: rw ? 'mode mode-rw' : 'mode' },
            rw ? 'read-write' : x.mode === 'read-only' ? 'read-only' : text(x.mode))),
        hasHidden(x.path) ? h('p', { class: 'warn' }, 'This path holds invisible or ' +
          'direction-changing characters, shown above as \\u{…}; the box below holds them as they are.') : null,
        h('label', { for: input.id, class: 'path-label' }, 'Path to grant'), input));
    });
    card.append(
      h('h3', { id: hid + '-h', tabindex: '-1' },
        'Session ' + (session === null ? '?' : session) + ' asks for file access'),
      h('p', { class: 'countdown', dataset: { countdown: '' } }),
      h('div', { class: 'who' },
        h('p', { class: 'claim' }, 'It calls itself ',
          typeof p.server === 'string' ? ['«', srv(p.server), '»'] : h('em', {}, '(no name given)'),
          h('span', { class: 'note' }, ' (the server\'s own claim, not checked)')),
        h('div', { class: 'known', dataset: { known: '' } })),
      h('p', { class: 'says', id: hid + '-says' },
        p.messageFrom === 'broker' ? 'The broker asks on the server\'s behalf:' : 'The server says:'),
      h('blockquote', { class: 'message', tabindex: '0', 'aria-labelledby': hid + '-says' },
        srv(typeof p.message === 'string' ? p.message : '', true)),
      fields,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'primary', dataset: { action: 'approve-selected' } },
          'Approve selected'),
        h('button', { type: 'button', dataset: { action: 'approve-all' } }, 'Approve all as asked'),
        h('button', { type: 'button', class: 'danger', dataset: { action: 'deny' } }, 'Deny')));
    return card;
  }

  // A card that appears or moves shifts the page: for ARM_MS its buttons ignore presses, so
  // a click meant for something else, or a key press meant for the button that had the
  // focus, does not answer it.
  const places = new WeakMap(); // card -> its index when last armed
  const timers = new WeakMap();
  function arm(card) {
    card.dataset.armed = 'false';
    clearTimeout(timers.get(card));
    timers.set(card, setTimeout(() => { card.dataset.armed = 'true'; }, ARM_MS));
  }

  // What the broker itself knows of the asking session (not the server's claims).
  function fillKnown(card, p, sessions) {
    const s = sessions.find((x) => x.id === p.session);
    fill(card.querySelector('[data-known]'),
      h('p', { class: 'known-h' }, 'What the broker knows of this session:'),
      s ? h('dl', { class: 'facts inline' },
        h('dt', {}, 'Transport'), h('dd', {}, text(s.transport)),
        h('dt', {}, 'Protocol'), h('dd', {}, text(s.era)),
        h('dt', {}, 'Confinement'), h('dd', {}, s.confinement == null ? 'none' : text(s.confinement)),
        h('dt', {}, 'Started'), h('dd', {}, when(s.startedAt)))
        : h('p', {}, 'Nothing: the session is no longer open.'));
  }

  function tick() {
    const now = performance.now();
    for (const card of $('prompts').children) {
      const d = prompts.get(idIn(card, 'promptId'));
      if (!d) continue;
      const left = Math.max(0, Math.ceil((d.deadline - now) / 1000));
      const el = card.querySelector('[data-countdown]');
      el.textContent = left > 0 ? 'If you do not answer: denied automatically in ' + dur(left)
        : 'Time is up: denied automatically.';
      el.classList.toggle('urgent', left <= 10);
    }
  }

  // Like the broker's check (consent/desk.rs): the path asked for or a folder beneath it,
  // absolute, with no ".", ".." or empty part. The broker checks again.
  function within(path, asked) {
    if (!path.startsWith('/')) return false;
    if (path.slice(1).split('/').some((seg) => seg === '' || seg === '.' || seg === '..')) return false;
    return path === asked || path.startsWith(asked.endsWith('/') ? asked : asked + '/');
  }

  async function answer(card, action) {
    const id = idIn(card, 'promptId');
    const data = prompts.get(id);
    if (id === null || !data) return;
    if (card.dataset.armed !== 'true') {
      say('This prompt has just appeared or moved: nothing was sent. Read it first.', 'error');
      return;
    }
    let body, done;
    if (action === 'deny') {
      body = { deny: true };
      done = 'Denied prompt ' + id + '.';
    } else if (action === 'approve-all') {
      body = { approvedPaths: data.paths.slice() };
      done = 'Approved prompt ' + id + ' as asked.';
    } else {
      const chosen = [];
      for (const cb of card.querySelectorAll('input[type="checkbox"][data-path-index]')) {
        if (!cb.checked) continue;
        const i = idIn(cb, 'pathIndex');
        const input = [...card.querySelectorAll('input[data-path-input]')].find((el) => idIn(el, 'pathInput') === i);
        let path = input.value;
        while (path.length > 1 && path.endsWith('/')) path = path.slice(0, -1);
        if (!within(path, data.paths[i])) {
          say('Path ' + (i + 1) + ' must be the path asked for, or a folder inside it.', 'error');
          input.focus();
          return;
        }
        chosen.push(path);
      }
      if (!chosen.length) {
        say('No path is ticked: tick one, or press Deny.', 'error');
        return;
      }
      body = { approvedPaths: chosen };
      done = 'Approved ' + chosen.length + ' path' + (chosen.length === 1 ? '' : 's') +
        ' for prompt ' + id + '.';
    }
    card.setAttribute('aria-busy', 'true');
    const ok = await post('/api/prompts/' + id, body, done);
    card.removeAttribute('aria-busy');
    if (ok) answered.add(id);
    if (ok && card.isConnected) {
      const box = $('prompts');
      if (removeCard(card)) (box.querySelector('h3') || $('prompts-h')).focus();
    }
  }

  // ---------------------------------------------------------------- sessions and roots

  const td = (label, content, cls) => h('td', { 'data-label': label, class: cls }, content);
  // Words for screen readers only, so that each button's name says what it acts on.
  const srOnly = (...parts) => h('span', { class: 'visually-hidden' }, parts);

  function sessionRows(sessions, roots) {
    return sessions.map((s) => {
      const id = s.id;
      const errors = Number(s.errors) || 0;
      const denials = Number(s.denials) || 0;
      const grants = (Array.isArray(s.grants) ? s.grants : []).filter((g) => g && num(g.id) !== null);
      return h('tr', { dataset: { sessionId: String(id), key: 's' + id } },
        h('th', { scope: 'row', 'data-label': 'Session' }, String(id)),
        td('Calls itself', typeof s.server === 'string' ? srv(s.server) : h('em', {}, 'no name given')),
        td('Connection', [text(s.transport), ', protocol ', text(s.era), ', confinement ',
          s.confinement == null ? 'none' : text(s.confinement)]),
        td('Started', when(s.startedAt)),
        td('Requests', count(s.requests)),
        td('Read / written', bytes(s.bytesRead) + ' / ' + bytes(s.bytesWritten)),
        td('Errors', count(errors), errors > 0 ? 'warm' : ''),
        td('Denials', denials > 0 ? h('strong', {}, denials.toLocaleString() + ' refused') : '0',
          denials > 0 ? 'hot' : ''),
        td('Held now', [plural(s.uploads, 'upload'), plural(s.locks, 'lock'),
          plural(s.watches, 'watch', 'watches')].join(', ')),
        td('Grants', grants.length ? h('ul', { class: 'grants' }, grants.map((g) => {
          const root = roots.find((r) => r.path === g.root);
          return h('li', { dataset: { grantId: String(g.id), key: 'g' + g.id } },
            h('span', { class: 'grant-path' }, srv(String(g.path))),
            h('span', { class: 'grant-root' }, ' in root ', root ? srv(root.name) : text(g.root)),
            ' ',
            h('button', { type: 'button', dataset: { action: 'revoke' } }, 'Revoke',
              srOnly(' grant ' + g.id + ' of session ' + id)));
        })) : 'none'),
        td('Actions', h('button', { type: 'button', class: 'danger', dataset: { action: 'end-session' } },
          'End session', srOnly(' ' + id))));
    });
  }

  function rootRows(roots) {
    return roots.map((r) => {
      const action = r.paused ? 'resume' : 'pause';
      const tr = h('tr', { class: r.paused ? 'paused' : '' },
        h('th', { scope: 'row', 'data-label': 'Name' }, srv(r.name)),
        td('Path', text(r.path)),
        td('Mode', text(r.mode), r.mode === 'read-write' ? 'mode-rw-cell' : ''),
        td('Consent', text(r.consent)),
        td('State', r.paused ? h('strong', {}, 'paused') : 'active'),
        td('Action', h('button', { type: 'button', dataset: { action } },
          r.paused ? 'Resume' : 'Pause', srOnly(' root ', srv(r.name)))));
      tr.dataset.rootName = r.name; // text in a dataset value: never parsed as markup
      tr.dataset.key = 'r:' + r.name;
      return tr;
    });
  }

  // ---------------------------------------------------------------- audit trail

  function renderAudit(a) {
    const box = $('audit');
    const on = !!a && typeof a === 'object';
    $('audit-off').hidden = on;
    box.hidden = !on;
    if (!on) { box.dataset.chain = 'off'; return; }
    const c = a.chain && typeof a.chain === 'object' ? a.chain : {};
    const chain = c.intact === true ? 'intact' : c.intact === false ? 'broken' : 'unchecked';
    box.dataset.chain = chain;
    const set = (key, ...content) => fill(box.querySelector('[data-audit="' + key + '"]'), content);
    set('enabled', 'on');
    set('path', text(a.path));
    set('writable', a.writable === false ? h('strong', { class: 'bad' }, 'no: new records cannot be written') : 'yes');
    set('chain', chain === 'intact' ? 'intact' : chain === 'broken'
      ? [h('strong', { class: 'bad' }, 'BROKEN'), typeof c.error === 'string' ? [': ', srv(c.error)] : '']
      : 'not checked yet');
    set('checkedAt', c.checkedAt ? when(c.checkedAt) : 'not yet');
    set('lines', count(c.lines));
    set('lastSeal', c.lastSeal ? when(c.lastSeal) : 'none');
    set('copies', a.copiesUp === true ? 'up' : a.copiesUp === false
      ? h('strong', { class: 'bad' }, 'down: copies are not reaching their destination') : 'none configured');
    // Only the hash's own text changes, so an open "Full hash" stays open.
    const head = typeof a.head === 'string' ? a.head : '';
    const short = head.length > 24 ? head.slice(0, 12) + '…' + head.slice(-8) : head || '—';
    if ($('audit-head').textContent !== head) $('audit-head').textContent = head;
    if ($('audit-head-short').textContent !== short) $('audit-head-short').textContent = short;
  }

  // ---------------------------------------------------------------- activity feed

  const redacted = (hex) => h('span', { class: 'redacted' }, 'redacted ',
    h('code', {}, srv(String(hex).slice(0, 8))), '…');

  // The paths of a record, as text nodes: path (or its hash), a rename's new path, a
  // consent request's paths, a consent answer's approved paths.
  function pathsOf(r) {
    const out = [];
    if (typeof r.path === 'string') out.push(srv(r.path));
    else if (typeof r.pathSha256 === 'string') out.push(redacted(r.pathSha256));
    if (typeof r.newPath === 'string') out.push(' → ', srv(r.newPath));
    else if (typeof r.newPathSha256 === 'string') out.push(' → ', redacted(r.newPathSha256));
    const lists = [[r.paths, srv], [r.approvedPaths, srv], [r.pathsSha256, redacted], [r.approvedSha256, redacted]];
    for (const [list, show] of lists) {
      if (!Array.isArray(list)) continue;
      list.forEach((p, i) => out.push(out.length && i === 0 ? '; ' : i ? ', ' : '', show(String(p))));
      const total = num(r.pathsCount);
      if (total !== null && total > list.length) out.push(' (and ' + (total - list.length) + ' more)');
    }
    return out.length ? out : ['—'];
  }

  function actText(r) {
    const n = (v) => (num(v) === null ? '?' : num(v));
    switch (r.event) {
      case 'revoke-grant': return 'You revoked grant ' + n(r.grant);
      case 'end-session': return 'You ended session ' + n(r.session);
      case 'pause-root': return ['You paused root ', text(r.root)];
      case 'resume-root': return ['You resumed root ', text(r.root)];
      case 'consent-answer': return (r.granted ? 'You approved prompt ' : 'You denied prompt ') + n(r.prompt);
      default: return ['Your act: ', text(r.event)];
    }
  }

  function addActivity(r) {
    const session = num(r.session);
    if (session !== null) seenSessions.add(session);
    const time = h('td', { 'data-label': 'Time' });
    if (r.account === 'person' || typeof r.event === 'string') {
      newest = null;
      time.append(when(r.ts, true));
      const where = pathsOf(r);
      addRow(h('tr', { class: 'act' }, time, h('td', { 'data-label': 'Session' }, session === null ? '—' : String(session)),
        h('td', { colspan: '5', class: 'act-text' }, h('strong', {}, actText(r)),
          where[0] === '—' ? '' : [': ', where])), session);
      return;
    }
    const n = Math.max(1, num(r.count) || 1);
    const b = num(r.bytes) || 0;
    const outcome = typeof r.outcome === 'string' ? r.outcome : '?';
    const key = JSON.stringify([session, r.method, r.path, r.pathSha256, r.newPath, r.newPathSha256,
      r.paths, r.pathsSha256, outcome]);
    const first = Date.parse(typeof r.firstTs === 'string' ? r.firstTs : r.ts);
    const last = Date.parse(r.ts);
    // The same request again, right after: one row that counts, so a bulk read stays one row.
    if (newest && newest.key === key && newest.row.isConnected && !(first - newest.last > MERGE_GAP_MS)) {
      newest.count += n;
      newest.bytes += b;
      newest.last = Number.isNaN(last) ? newest.last : last;
      newest.ts = r.ts;
      showCounts(newest);
      return;
    }
    const cells = { time, bytes: h('td', { 'data-label': 'Bytes', class: 'num' }),
      count: h('td', { 'data-label': 'Count', class: 'num' }) };
    let result;
    if (outcome === 'ok') result = 'ok';
    else if (outcome === 'PERMISSION_DENIED') result = [h('span', { class: 'badge badge-refused' }, 'refused'), ' ', srv(outcome)];
    else result = [h('span', { class: 'badge badge-failed' }, 'failed'), ' ', srv(outcome)];
    const also = num(r.alsoRefused);
    const row = h('tr', { class: outcome === 'ok' ? '' : outcome === 'PERMISSION_DENIED' ? 'refused' : 'failed' },
      time, h('td', { 'data-label': 'Session' }, session === null ? '—' : String(session)),
      h('td', { 'data-label': 'Method' }, text(r.method)),
      h('td', { 'data-label': 'Path', class: 'path-cell' }, pathsOf(r)),
      h('td', { 'data-label': 'Outcome' }, result,
        also ? ' (and ' + also + ' more refused: too many requests)' : ''),
      cells.bytes, cells.count);
    newest = { key, row, cells, count: n, bytes: b, first, last,
      firstTs: typeof r.firstTs === 'string' ? r.firstTs : r.ts, ts: r.ts };
    showCounts(newest);
    addRow(row, session);
  }

  function showCounts(e) {
    const span = !Number.isNaN(e.first) && !Number.isNaN(e.last) && e.last - e.first >= 1000;
    fill(e.cells.time, span ? [when(e.firstTs, true), '–', when(e.ts, true)] : when(e.ts, true));
    e.cells.bytes.textContent = e.bytes ? bytes(e.bytes) : '—';
    e.cells.count.textContent = e.count > 1 ? '×' + e.count.toLocaleString() : '';
    e.row.dataset.count = String(e.count);
  }

  function feedNote(message) {
    newest = null;
    addRow(h('tr', { class: 'note' }, h('td', { colspan: '7' }, message)), null);
  }

  function addRow(row, session) {
    row.dataset.feedSession = session === null ? '' : String(session);
    row.hidden = !shownByFilter(row);
    const body = $('feed');
    body.prepend(row);
    trimFeed(body);
    $('feed-empty').hidden = true;
    renderFilter();
  }

  // Past the cap, a row goes from whichever session has the most, so one server's flood cannot
  // push another's record off the page. Within that session its oldest plain row goes first:
  // refusals, failures and the person's own acts are kept while it has any other.
  function trimFeed(body) {
    if (body.rows.length <= FEED_CAP) return;
    const counts = new Map();
    for (const r of body.rows) counts.set(r.dataset.feedSession, (counts.get(r.dataset.feedSession) || 0) + 1);
    while (body.rows.length > FEED_CAP) {
      let top = null;
      for (const [s, c] of counts) if (top === null || c > counts.get(top)) top = s;
      let victim = null;
      for (let i = body.rows.length - 1; i >= 0; i--) {
        const r = body.rows[i];
        if (r.dataset.feedSession !== top) continue;
        if (victim === null) victim = r;
        if (r.className === '') { victim = r; break; }
      }
      victim.remove();
      counts.set(top, counts.get(top) - 1);
    }
  }

  // Rows of no one session (notes, pausing a root) show whatever the filter.
  function shownByFilter(row) {
    const f = $('feed-filter').value;
    return f === '' || row.dataset.feedSession === '' || row.dataset.feedSession === f;
  }

  let lastOpen = [];
  function renderFilter(sessions) {
    if (sessions) lastOpen = sessions.map((s) => s.id);
    const select = $('feed-filter');
    const ids = [...seenSessions].sort((a, b) => a - b);
    const sig = JSON.stringify([ids, lastOpen]);
    if (select.dataset.sig === sig) return;
    select.dataset.sig = sig;
    const value = select.value;
    select.replaceChildren(h('option', { value: '' }, 'All sessions'), ...ids.map((id) =>
      h('option', { value: String(id) }, 'Session ' + id + (lastOpen.includes(id) ? '' : ' (ended)'))));
    select.value = ids.includes(Number(value)) ? value : '';
  }

  // ---------------------------------------------------------------- the person's input

  document.addEventListener('click', (e) => {
    const btn = e.target instanceof Element ? e.target.closest('button[data-action]') : null;
    if (!btn) return;
    const action = btn.dataset.action;
    if (action === 'approve-selected' || action === 'approve-all' || action === 'deny') {
      const card = btn.closest('[data-prompt-id]');
      if (card) answer(card, action);
    } else if (action === 'revoke') {
      const id = idIn(btn.closest('[data-grant-id]'), 'grantId');
      if (id !== null) post('/api/grants/' + id + '/revoke', undefined, 'Revoked grant ' + id + '.');
    } else if (action === 'end-session') {
      const id = idIn(btn.closest('[data-session-id]'), 'sessionId');
      if (id === null) return;
      if (!window.confirm('End session ' + id + '? It loses all its access at once and its connection is closed.')) return;
      post('/api/sessions/' + id + '/end', undefined, 'Ended session ' + id + '.');
    } else if (action === 'pause' || action === 'resume') {
      const row = btn.closest('[data-root-name]');
      const name = row && row.dataset.rootName;
      if (typeof name !== 'string') return;
      post('/api/roots/' + encodeURIComponent(name) + '/' + action, undefined,
        [action === 'pause' ? 'Paused root ' : 'Resumed root ', srv(name), '.']);
    }
  });

  document.addEventListener('change', (e) => {
    const t = e.target;
    if (t instanceof HTMLInputElement && t.type === 'checkbox' && t.dataset.pathIndex !== undefined) {
      // An unticked path is not sent: show that its box does not count.
      const card = t.closest('[data-prompt-id]');
      const i = idIn(t, 'pathIndex');
      const input = [...card.querySelectorAll('input[data-path-input]')].find((el) => idIn(el, 'pathInput') === i);
      if (input) input.disabled = !t.checked;
    } else if (t === $('feed-filter')) {
      for (const row of $('feed').rows) row.hidden = !shownByFilter(row);
    }
  });

  setConn('connecting', 'wait');
  if (takeKey()) { load(); connect(); }
})();
