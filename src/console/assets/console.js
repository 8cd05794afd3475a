'use strict';
/*
 * fsbroker: the person's console. Plain script, no dependencies, no build step.
 *
 * Every string the API returns may come from an MCP server (its name, its message, a path
 * it created) and is hostile: it only ever reaches the page through text nodes, and a
 * server's string is shown as a quoted value the page did not write (box(): a bordered box
 * in another typeface, cut to a length the page chose, with invisible, spacing and
 * direction-changing characters shown as ⟨U+XXXX⟩ and other characters outside printable
 * ASCII marked). Nothing here uses innerHTML, and no API string goes into a URL except a
 * root name through encodeURIComponent; ids in URLs are checked to be safe integers. The one
 * URL the API hands over, a sign-in page's, becomes a link only once checked to be https (or
 * http on this computer), and its origin is shown as text beside it.
 *
 * The page speaks to a person who may never have heard of MCP: a server is named by what it
 * calls itself (boxed, as its claim) and by the order it connected in ("server 3"); what it
 * did is said in words ("read report.pdf"), and the technical detail (session numbers,
 * method names, transports) is one click away, in a <details> element.
 *
 * Test hooks (stable):
 *   #connection                  "live" while the event stream is open; otherwise
 *                                "connecting", "disconnected, retrying", "not answering" or
 *                                "needs its token"
 *   #status                      role=status: the outcome of the person's acts, and errors
 *   #announce                    aria-live: each new prompt's heading
 *   #loading                     "Connecting…" until the first /api/state arrives
 *   #unauthorized                shown when /api/state answers 401
 *   #broker                      version and process id
 *   [data-claim]                 a server's string, in its box; [data-cut=true] when shortened
 *                                (the whole string is under the nearest details)
 *   #prompts [data-prompt-id=N]  one consent prompt card, oldest first
 *     [data-armed=true|false]    on the card: presses are ignored for 600 ms after it appears
 *                                or moves in the layout (a card above it added, answered or
 *                                grown, the status line changed), and the second click of a
 *                                double click never answers (wait for data-armed=true)
 *     [data-action=approve-selected|deny]  the one Approve button, and Deny
 *     input[type=checkbox][data-path-index=I]  ticked: send path I (only when several are asked)
 *     button[data-action=narrow][data-narrow=I]  shows or hides folder I's field (only for a
 *                                folder); it never changes what is sent; guarded as Approve is
 *     [data-narrow-panel=I]      folder I's field and its button[data-action=widen][data-widen=I]
 *                                ("Allow the whole folder asked for": undoes the change, guarded)
 *     input[data-path-input=I]   a folder to send instead of folder I (this one or one inside
 *                                it); unchanged, the path asked is sent exactly as asked; it
 *                                holds the asked path only when that is printable ASCII; a
 *                                change stays when the field is hidden
 *     [data-path-sent=I]         what Approve sends for folder I, in a box, shown whether the
 *                                field is or not
 *     [data-countdown]           "… denied automatically in 42 s"
 *     [data-verdict]             what approving lets the server do; data-reach=unconfined,
 *                                strict, best-effort, direct or gone
 *     details[data-tech]         the technical details (session number, connection, names and
 *                                paths in full)
 *   #signins-section             shown while the proxy has sign-ins to show
 *   #signins-needed [data-signin=needed]  a "Sign in to SERVER" card, one per server
 *     [data-origin]              the origin of its sign-in page, as text
 *     a[data-action=sign-in]     opens the sign-in page in a new tab: only an https address,
 *                                or http on a loopback host; otherwise [data-no-link] says why
 *   #signins-list [data-signin=signed-in|failed]  a remote session signed in, or a failed
 *                                sign-in ([data-reason]: why)
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
  // How much of a server's string a box shows, in characters as shown (an escape counts its
  // whole ⟨U+XXXX⟩): a name fits a heading's line, a path keeps its start and its end.
  const NAME_MAX = 40;
  const SHORT_NAME_MAX = 24;   // in the feed's rows
  const PATH_MAX = 72;
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
  const orders = new Map();    // session id -> its number in the order of connection
  const drawn = {};            // section -> JSON it was last drawn from, to skip redraws
  const posting = new Set();   // URLs of acts in flight, so a double press sends once
  const places = new WeakMap(); // prompt card -> where it sat in the layout when last armed
  const timers = new WeakMap(); // prompt card -> the timer that arms it

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

  // Makes `old` like `neu` in place, keeping every node that stays the same: while counters
  // tick twice a second, the button under the person's pointer or focus stays the element it
  // was (a press is not lost), and a <details> the person opened stays open (its `open` is
  // the person's, not the data's).
  function morph(old, neu) {
    if (old.nodeType !== neu.nodeType || old.nodeName !== neu.nodeName) { old.replaceWith(neu); return; }
    if (old.nodeType === Node.TEXT_NODE) { if (old.data !== neu.data) old.data = neu.data; return; }
    if (old.nodeType !== Node.ELEMENT_NODE) { old.replaceWith(neu); return; }
    for (const a of [...old.attributes]) {
      if (a.name !== 'open' && !neu.hasAttribute(a.name)) old.removeAttribute(a.name);
    }
    for (const a of [...neu.attributes]) {
      if (a.name !== 'open' && old.getAttribute(a.name) !== a.value) old.setAttribute(a.name, a.value);
    }
    const was = [...old.childNodes];
    const now = [...neu.childNodes];
    now.forEach((n, i) => (i < was.length ? morph(was[i], n) : old.append(n)));
    for (const n of was.slice(now.length)) n.remove();
  }

  // ---------------------------------------------------------------- server strings

  // What a server's string is made of, for the person to see it for what it is:
  // - escaped, shown as ⟨U+XXXX⟩: characters that hide or reorder text (every control (Cc)
  //   and format character (Cf): soft hyphen, zero-width and bidi marks, embeddings,
  //   overrides and isolates, word joiners, BOM, Arabic number signs, musical formatting,
  //   tags, interlinear annotation marks; the line and paragraph separators; blanks that draw
  //   nothing: the combining grapheme joiner, fillers (Hangul, Braille blank), variation
  //   selectors); every space but the plain one (an em space can push the page's own words
  //   onto another line); enclosing marks, and a third combining mark on one letter and
  //   beyond (they draw over the box's edge);
  // - marked: every other character outside printable ASCII, where look-alikes live (a
  //   Cyrillic о, a bold-looking 𝐯, a ✓ or a »), readable as what it is but never taken for
  //   the page's own text.
  const HIDDEN = '\\p{Cc}\\p{Cf}\\p{Zl}\\p{Zp}\\u034f\\u115f\\u1160\\u17b4\\u17b5' +
    '\\u180b-\\u180f\\u2800\\u3164\\ufe00-\\ufe0f\\uffa0\\u{e0100}-\\u{e01ef}';
  const ESCAPED_RE = new RegExp('^[' + HIDDEN + '\\p{Zs}\\p{Me}]$', 'u');
  const MARK_RE = /^\p{M}$/u;
  const PLAIN_RE = /^[\x20-\x7e]*$/; // what a box shows as it is

  // `text` as pieces {kind, text, size}: kind 'plain' (printable ASCII, and line breaks when
  // `lines`), 'esc' (one character, as its escape) or 'wide' (a run outside ASCII); size: the
  // characters it shows.
  function pieces(text, lines) {
    const out = [];
    let marks = 0;
    for (const ch of String(text)) {
      const cp = ch.codePointAt(0);
      const mark = MARK_RE.test(ch);
      let kind = 'wide';
      if ((cp >= 0x20 && cp < 0x7f) || (lines && ch === '\n')) kind = 'plain';
      else if (ESCAPED_RE.test(ch) || (mark && marks >= 2)) kind = 'esc';
      marks = mark ? marks + 1 : 0;
      const shown = kind === 'esc'
        ? '⟨U+' + cp.toString(16).toUpperCase().padStart(4, '0') + '⟩' : ch;
      const last = out[out.length - 1];
      if (last && last.kind === kind && kind !== 'esc') {
        last.text += shown;
        last.size += 1;
      } else {
        out.push({ kind, text: shown, size: kind === 'esc' ? shown.length : 1 });
      }
    }
    return out;
  }

  // The first `room` characters as shown of `list` (or the last, `fromEnd`); an escape is
  // kept whole or not at all.
  function take(list, room, fromEnd) {
    const got = [];
    for (const p of fromEnd ? [...list].reverse() : list) {
      if (room <= 0) break;
      if (p.size <= room) {
        got.push(p);
        room -= p.size;
      } else {
        if (p.kind !== 'esc') {
          const chars = Array.from(p.text);
          got.push({ kind: p.kind, text: (fromEnd ? chars.slice(-room) : chars.slice(0, room)).join(''), size: room });
        }
        break;
      }
    }
    return fromEnd ? got.reverse() : got;
  }

  const ellipsis = () => h('span', { class: 'cut', title: 'shortened here by this page' }, '…');

  function piece(p) {
    if (p.kind === 'plain') return p.text;
    if (p.kind === 'esc') {
      return h('span', { class: 'ctl', title: 'an invisible, spacing or direction-changing character' }, p.text);
    }
    return h('span', { class: 'nonascii', title: 'outside plain ASCII: it may look like another character' }, p.text);
  }

  // A server's string as a quoted value: a box the page draws (bordered, its own typeface,
  // never bold), the string isolated in it (<bdi>) so it cannot reorder the page's words, cut
  // to `max` characters as shown with a "…" of the page's. Options: max; middle (cut in the
  // middle: a path keeps its start and its file's name); lines (a message: line breaks
  // kept); block (a box of its own, its whole text, scrolling when long).
  function box(value, opts) {
    const o = opts || {};
    const all = pieces(value, o.lines);
    const max = o.max || Infinity;
    const size = all.reduce((n, p) => n + p.size, 0);
    const cut = size > max;
    let shown;
    if (!cut) shown = all.map(piece);
    else if (o.middle) {
      const head = Math.floor((max - 1) * 0.4);
      shown = [take(all, head).map(piece), ellipsis(), take(all, max - 1 - head, true).map(piece)];
    } else shown = [take(all, max - 1).map(piece), ellipsis()];
    return h(o.block ? 'div' : 'span', { class: 'box' + (o.block ? ' box-block' : '') + (o.cls ? ' ' + o.cls : ''),
      dataset: { claim: '', cut: String(cut) } },
    h('bdi', { dir: 'ltr', class: 'srv' }, shown));
  }

  // Whether a server's string holds characters the page shows escaped.
  const hasEscapes = (value) => pieces(value).some((p) => p.kind === 'esc');

  // A string of the broker's or the browser's (an error's reason, a root's name from the
  // policy) that may still carry a server's words: escaped as in box(), but unboxed.
  function srv(value, lines) {
    return h('bdi', { dir: 'ltr', class: 'srv' }, pieces(value, lines).map(piece));
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

  // ---------------------------------------------------------------- naming a server

  // A session's short label, which the page writes: its number in the order the servers
  // connected ("server 3"), or "a server" when the broker gave none.
  function label(order) {
    const n = num(order);
    return n !== null && n > 0 ? 'server ' + n : 'a server';
  }
  const labelOf = (id) => label(orders.get(id));
  const capital = (s) => s.charAt(0).toUpperCase() + s.slice(1);

  // How the page names a server: what it calls itself, in its box, then the page's label;
  // with no name, the label alone.
  function named(name, order, max) {
    if (typeof name === 'string' && name !== '') {
      return [box(name, { max: max || NAME_MAX }), h('span', { class: 'label' }, ' (' + label(order) + ')')];
    }
    return h('span', { class: 'label' }, capital(label(order)));
  }

  // A disclosure of technical details: `rows` are [term, description] pairs; null ones are
  // left out.
  function tech(summary, rows, attrs) {
    return h('details', Object.assign({ class: 'tech' }, attrs || {}),
      h('summary', {}, summary),
      h('dl', { class: 'facts' }, rows.filter(Boolean).map(([dt, dd]) => [h('dt', {}, dt), h('dd', {}, dd)])));
  }

  // What a session's connection is, in technical words, for its details.
  function connectionFacts(s) {
    return [
      ['Session number', String(s.id)],
      ['Connection', text(s.transport)],
      ['Protocol', text(s.era)],
      ['Confinement', s.confinement == null ? 'none' : text(s.confinement)],
      ['Started', when(s.startedAt)],
    ];
  }

  // What approving lets a server do, from what the broker knows of how it runs (never from
  // anything the server says): the fact a person needs most to decide. `paths` are a
  // prompt's (null for the sessions table's short form). Returns {reach, level, words}.
  function reach(s, paths) {
    if (!s) return { reach: 'gone', level: 'unknown', words: 'This server is no longer connected.' };
    const list = paths || [];
    const ro = list.every((x) => x.mode !== 'read-write');
    const one = list.length === 1;
    const under = one && list[0].kind === 'file' ? 'this file'
      : one && list[0].kind === 'folder' ? 'everything under this folder'
        : one ? 'this path and anything under it' : 'everything under these ' + list.length + ' paths';
    const conf = s.confinement === 'strict' || s.confinement === 'best-effort' ? s.confinement : null;
    // A proxy's server with no confinement the page knows of is taken as unconfined: the
    // warning errs on the side of the person's files.
    if (s.transport === 'proxy' && conf === null) {
      return { reach: 'unconfined', level: 'danger', words: !paths
        ? 'Not confined: it opens files itself, with your rights'
        : [h('strong', {}, 'This server is not confined.'),
          ' fsbroker started it on this computer, where it runs with your own rights and opens ' +
          'files itself. If you approve, it can read ' + under + ' with your own rights, and ' +
          (ro ? '“read-only” is not enforced on it: it can change and delete them too.'
            : 'change or delete them.') +
          ' Nothing holds it to your answer, and it can reach your other files as well: only a ' +
          'confined server is held to what you approve.'] };
    }
    if (s.transport === 'remote') {
      return { reach: 'remote', level: 'ok', words: !paths
        ? 'Runs on another computer: it can only ask fsbroker for files'
        : [h('strong', {}, 'This server runs on another computer.'),
          ' fsbroker reaches it over the network; it ' +
          'cannot open your files itself. If you approve, it can ask fsbroker for ' +
          (one && list[0].kind === 'file' ? 'this file' : 'what is there') + ', and fsbroker ' +
          'holds it to ' + (ro ? 'reading only' : 'reading and changing') + ' and to what you ' +
          'approve. What it reads leaves this computer.'] };
    }
    if (s.transport === 'proxy') {
      const strict = conf === 'strict';
      const holds = ro ? 'reading only' : 'reading and changing';
      return { reach: conf, level: strict ? 'ok' : 'caution', words: !paths
        ? (strict ? 'Confined by the kernel: every rule enforced' : 'Confined by the kernel, as far as it allows')
        : [h('strong', {}, strict ? 'The kernel confines this server.'
          : 'The kernel confines this server, as far as this computer allows.'),
        ' fsbroker started it in a sandbox (Landlock)' +
          (strict ? ' with every rule of the policy enforced' : '') +
          ': it cannot open ' + under.replace(/^everything under /, '') + ' itself, and approving ' +
          'does not change that. If you approve, it can only ask fsbroker for ' +
          (one && list[0].kind === 'file' ? 'it' : 'what is there') + ', and fsbroker holds it to ' +
          holds + ' and to what you approve.' +
          (strict ? '' : ' Rules this computer’s kernel cannot enforce are not held (“fsbroker ' +
            'confine check” lists them).')] };
    }
    return { reach: 'direct', level: 'caution', words: !paths
      ? 'Connects directly: fsbroker cannot tell whether it opens files itself'
      : [h('strong', {}, 'fsbroker cannot tell how this program runs.'),
        ' It connects to fsbroker directly; fsbroker did not start it. What it asks fsbroker ' +
        'for is held to your answer' + (ro ? ' and to reading only' : '') + '. But if it runs ' +
        'on this computer without confinement, it can open your files itself, with your own ' +
        'rights, whatever you answer.'] };
  }

  // A status line for the person; `parts` may hold srv() nodes.
  function say(parts, kind) {
    const el = $('status');
    el.className = 'status ' + (kind === 'error' ? 'status-error' : 'status-ok');
    el.replaceChildren(h('span', {}, parts));
    // The line sits above the prompts: if it grows or shrinks, every card moves.
    settle();
  }

  function setConn(words, kind) {
    const el = $('connection');
    el.textContent = words;
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
        ' records were left out here: the page fell behind.');
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
    fill($('broker'), 'fsbroker ', text(b.version),
      b.startedAt ? [', running since ', when(b.startedAt)] : '', ' (process ', String(num(b.pid) ?? '?'), ')');
    const sessions = (Array.isArray(s.sessions) ? s.sessions : []).filter((x) => x && num(x.id) !== null);
    const roots = (Array.isArray(s.roots) ? s.roots : []).filter((r) => r && typeof r.name === 'string');
    for (const x of sessions) {
      seenSessions.add(x.id);
      if (num(x.order) !== null) orders.set(x.id, x.order);
    }
    renderPrompts(Array.isArray(s.prompts) ? s.prompts : [], sessions, at);
    renderSignIns(Array.isArray(s.signIns) ? s.signIns : []);
    $('sessions-empty').hidden = sessions.length > 0;
    $('sessions-table').hidden = sessions.length === 0;
    redraw('sessions', [sessions, roots], () => sessionRows(sessions, roots));
    $('roots-empty').hidden = roots.length > 0;
    $('roots-table').hidden = roots.length === 0;
    redraw('roots', roots, () => rootRows(roots));
    renderAudit(s.audit);
    renderFilter(sessions);
  }

  // Redraws a table body only when its data changed, and then morphs each row that is still
  // there (by data-key) into its new self, so what the person points at, has focused or
  // opened stays. If the focused button did go, the focus moves to its row's new button, or
  // the section heading.
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
      if (keep) morph(keep, row);
      else keep = row;
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
    const cards = $('prompts');
    const ids = new Set();
    const added = [];
    let i = 0;
    for (const p of list) {
      const id = num(p && p.id);
      if (id === null || !Array.isArray(p.paths) || ids.has(id) || answered.has(id)) continue;
      ids.add(id);
      let card = [...cards.children].find((c) => idIn(c, 'promptId') === id);
      if (!card) { card = promptCard(p, id); added.push(card); }
      // Keep the server's order (oldest first) without moving cards needlessly: moving a
      // card would take the focus out of it.
      if (cards.children[i] !== card) cards.insertBefore(card, cards.children[i] || null);
      i += 1;
      fillKnown(card, p, sessions);
      const left = Number(p.expiresInMs);
      prompts.get(id).deadline = at + (Number.isFinite(left) ? left : 0);
    }
    let focusLost = false;
    for (const card of [...cards.children]) {
      if (!ids.has(idIn(card, 'promptId'))) focusLost = removeCard(card) || focusLost;
    }
    const n = ids.size;
    $('prompts-empty').hidden = n > 0;
    $('prompts-count').textContent = n ? '(' + n + ' waiting)' : '';
    settle();
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
        focusOn(cards.querySelector('h3'));
        return;
      }
    }
    if (focusLost) focusOn(cards.querySelector('h3') || $('prompts-h'));
  }

  // Focuses `el`. A focus that scrolls the page moves every card under the pointer, though
  // none moved in the layout: they are all armed anew.
  function focusOn(el) {
    const x = window.scrollX, y = window.scrollY;
    el.focus();
    if (window.scrollX !== x || window.scrollY !== y) for (const card of $('prompts').children) arm(card);
  }

  // Removes a card; says whether it held the focus. The cards below it move up into its
  // place, under the pointer that just answered it: they are armed anew at once, not at the
  // next read of the state.
  function removeCard(card) {
    const had = card.contains(document.activeElement);
    prompts.delete(idIn(card, 'promptId'));
    card.remove();
    settle();
    return had;
  }

  // A prompt's paths as the page uses them: {path, root, mode, kind} with kind "folder",
  // "file" or null (not there, or not known).
  const promptPaths = (p) => p.paths.filter((x) => x && typeof x.path === 'string')
    .map((x) => ({ path: x.path, root: x.root, mode: x.mode,
      kind: x.kind === 'folder' || x.kind === 'file' ? x.kind : null }));

  // "read a folder", "read and change 2 files": what a prompt asks, in words.
  function asks(paths) {
    const verb = paths.some((x) => x.mode === 'read-write') ? 'read and change' : 'read';
    const kinds = new Set(paths.map((x) => x.kind));
    let what;
    if (paths.length === 1) what = { folder: 'a folder', file: 'a file' }[paths[0].kind] || 'a path';
    else if (kinds.size === 1 && kinds.has('folder')) what = paths.length + ' folders';
    else if (kinds.size === 1 && kinds.has('file')) what = paths.length + ' files';
    else what = paths.length + ' paths';
    return 'asks to ' + verb + ' ' + what;
  }

  function promptCard(p, id) {
    const hid = 'prompt-' + id;
    const paths = promptPaths(p);
    const several = paths.length > 1;
    const folders = paths.some((x) => x.kind === 'folder');
    prompts.set(id, { paths: paths.map((x) => x.path), deadline: 0 });
    const card = h('article', { class: 'prompt', 'aria-labelledby': hid + '-h',
      dataset: { promptId: String(id), armed: 'false' } });
    const what = (x) => ({ folder: 'Folder', file: 'File' }[x.kind] || 'Path');
    // Narrowing applies to a folder only: a file has nothing inside it to pick.
    const hint = [folders ? 'To allow less, choose “Allow only a folder inside it” under a folder.' : '',
      several ? ' Untick a path to leave it out.' : ''].join('').trim();
    const fields = h('fieldset', { class: 'paths' },
      h('legend', {}, several ? 'The ' + paths.length + ' paths it asks for'
        : 'The ' + what(paths[0] || {}).toLowerCase() + ' it asks for'),
      hint ? h('p', { class: 'hint', id: hid + '-hint' }, hint) : null);
    paths.forEach((x, i) => {
      const cb = several ? h('input', { type: 'checkbox', id: hid + '-cb' + i, checked: true,
        dataset: { pathIndex: String(i) } }) : null;
      let narrow = null;
      if (x.kind === 'folder') {
        // The path asked for is sent as it was asked (a text field would drop a line break
        // from it), unless the person changes the field. The field shows the path only when
        // it reads as itself there: a field cannot escape or mark characters as the box does,
        // so U+202E, a zero-width space or a Cyrillic о would show another path.
        const input = h('input', { type: 'text', id: hid + '-in' + i, dir: 'ltr', spellcheck: 'false',
          autocomplete: 'off', autocapitalize: 'off', 'aria-describedby': hid + '-sent' + i,
          placeholder: 'the full path of a folder inside it',
          class: 'path-input', dataset: { pathInput: String(i) } });
        if (PLAIN_RE.test(x.path)) input.defaultValue = x.path;
        // The toggle only shows or hides the field: it never changes what Approve sends (a
        // stray click on it must not widen a narrowed folder); "Allow the whole folder asked
        // for" in the field's panel does. What Approve sends is shown under it, open or closed.
        narrow = [
          h('button', { type: 'button', class: 'narrow-toggle', 'aria-expanded': 'false',
            'aria-controls': hid + '-narrow' + i, dataset: { action: 'narrow', narrow: String(i) } },
          'Allow only a folder inside it…'),
          h('div', { class: 'narrow', id: hid + '-narrow' + i, hidden: true,
            dataset: { narrowPanel: String(i) } },
          // Before the field: Tab from the field goes on to Approve.
          h('button', { type: 'button', class: 'narrow-toggle',
            dataset: { action: 'widen', widen: String(i) } }, 'Allow the whole folder asked for'),
          h('label', { for: input.id, class: 'path-label' },
            'Folder to allow instead: this one, or one inside it'),
          input),
          h('div', { class: 'path-sent', id: hid + '-sent' + i, dataset: { pathSent: String(i) } },
            sentLine(x.path, x.path)),
        ];
      }
      const rw = x.mode === 'read-write';
      const name = [what(x), ' ', box(x.path, { max: PATH_MAX, middle: true })];
      fields.append(h('div', { class: 'path' },
        h('div', { class: 'path-head' }, cb,
          cb ? h('label', { for: cb.id }, name) : h('span', { class: 'path-name' }, name)),
        h('p', { class: 'path-meta' }, 'In ', text(x.root), ', ',
          h('span', { class: rw ? 'mode mode-rw' : 'mode' },
            rw ? 'shared to read and change' : 'shared read-only')),
        hasEscapes(x.path) ? h('p', { class: 'warn' }, 'This path holds invisible, spacing or ' +
          'direction-changing characters, shown above as ⟨U+…⟩.') : null,
        narrow));
    });
    const name = typeof p.server === 'string' && p.server !== '';
    const order = p.sessionOrder;
    card.append(
      h('h3', { id: hid + '-h', tabindex: '-1' }, named(p.server, order), ' ', asks(paths)),
      h('p', { class: 'note' }, name
        ? 'The name in the box is what the server calls itself; fsbroker did not check it. ' +
          '“' + capital(label(order)) + '” is the order it connected in.'
        : 'It gave no name. “' + capital(label(order)) + '” is the order it connected in.'),
      h('p', { class: 'countdown', dataset: { countdown: '' } }),
      h('div', { dataset: { verdict: '' } }),
      h('p', { class: 'says', id: hid + '-says' },
        p.messageFrom === 'broker' ? 'fsbroker asks on its behalf:' : 'The server says:'),
      box(typeof p.message === 'string' ? p.message : '', { lines: true, block: true, cls: 'message' }),
      fields,
      h('div', { class: 'actions' },
        h('button', { type: 'button', class: 'primary', dataset: { action: 'approve-selected' } },
          several ? 'Approve the ticked paths' : 'Approve'),
        h('button', { type: 'button', class: 'danger', dataset: { action: 'deny' } }, 'Deny')),
      h('details', { dataset: { tech: '' } }));
    const message = card.querySelector('.message');
    message.setAttribute('tabindex', '0');
    message.setAttribute('role', 'group');
    message.setAttribute('aria-labelledby', hid + '-says');
    return card;
  }

  // A card that appears or moves shifts the page: for ARM_MS its buttons ignore presses, so
  // a click meant for something else (the card answered a moment ago, whose place it took),
  // or a key press meant for the button that had the focus, does not answer it.
  function arm(card) {
    card.dataset.armed = 'false';
    clearTimeout(timers.get(card));
    timers.set(card, setTimeout(() => { card.dataset.armed = 'true'; }, ARM_MS));
  }

  // Where a card sits in the page's layout. Offsets, not the bounding box: the arrival
  // animation's transform would make a card seem to move after it was armed.
  function placeOf(card) {
    let x = 0, y = 0;
    for (let e = card; e; e = e.offsetParent) { x += e.offsetLeft; y += e.offsetTop; }
    return x + ',' + y;
  }

  // Arms anew every card that is not where it was armed, whatever moved it: a card above it
  // added, answered or grown, the status line, a window resized. Called after each change
  // the page makes, by a ResizeObserver for the rest, and once more when a card is pressed.
  function settle() {
    for (const card of $('prompts').children) {
      const at = placeOf(card);
      if (places.get(card) !== at) { places.set(card, at); arm(card); }
    }
  }

  // What the broker itself knows of the asking session (not the server's claims): what
  // approving lets it do, and the technical details.
  function fillKnown(card, p, sessions) {
    const s = sessions.find((x) => x.id === p.session);
    const paths = promptPaths(p);
    const r = reach(s, paths);
    morph(card.querySelector('[data-verdict]'), h('div', { class: 'verdict verdict-' + r.level,
      dataset: { verdict: '', reach: r.reach } }, h('p', {}, r.words)));
    const full = (v) => box(v, { block: true, cls: 'full' });
    morph(card.querySelector('details[data-tech]'), tech('Technical details', [
      ['Prompt number', String(num(p.id))],
      ...(s ? connectionFacts(s) : [['Session number', String(num(p.session))]]),
      typeof p.server === 'string' ? ['Name in full', full(p.server)] : null,
      ['Paths in full', paths.map((x) => full(x.path))],
    ], { dataset: { tech: '' } }));
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
    // A countdown that wraps onto another line moves the cards below it.
    settle();
  }

  // Like the broker's check (consent/desk.rs): the path asked for or a folder beneath it,
  // absolute, with no ".", ".." or empty part. The broker checks again.
  function within(path, asked) {
    if (!path.startsWith('/')) return false;
    if (path.slice(1).split('/').some((seg) => seg === '' || seg === '.' || seg === '..')) return false;
    return path === asked || path.startsWith(asked.endsWith('/') ? asked : asked + '/');
  }

  // The path I of a card to send: the one asked for, exactly, unless the person opened its
  // field and changed what it held (hiding the field again keeps the change: only "Allow the
  // whole folder asked for" undoes it).
  function toSend(card, i, asked) {
    const input = card.querySelector('input[data-path-input="' + i + '"]');
    if (!input || input.value === input.defaultValue) return asked;
    let path = input.value;
    while (path.length > 1 && path.endsWith('/')) path = path.slice(0, -1);
    return path;
  }

  // What Approve sends for a folder, in words and a box, escaped as every server string is.
  function sentLine(path, asked) {
    if (path === asked) return ['Approve sends the folder asked for: ', box(path, { block: true, cls: 'full' })];
    if (within(path, asked)) return ['Approve sends: ', box(path, { block: true, cls: 'full' })];
    return 'Approve refuses this: it is not the folder asked for or a folder inside it.';
  }

  // Under a folder, whether its field is shown or not: what Approve sends for it.
  function showSent(card, i) {
    const data = prompts.get(idIn(card, 'promptId'));
    const el = card.querySelector('[data-path-sent="' + i + '"]');
    if (!data || !el) return;
    const asked = data.paths[i];
    fill(el, sentLine(toSend(card, i, asked), asked));
    settle();
  }

  // Whether a press on a card's control counts: not the second click of a double click (it
  // lands where the first one's card was, which may by then be another card's control), and
  // only on a card armed (in place for ARM_MS; a move nothing reported yet counts now).
  function pressCounts(e, card, what) {
    if (e.detail > 1) return false;
    settle();
    if (card.dataset.armed === 'true') return true;
    say('This prompt has just appeared or moved: ' + what + ' Read it first.', 'error');
    return false;
  }

  // Answers a card; the press was checked (pressCounts).
  async function answer(card, action) {
    const id = idIn(card, 'promptId');
    const data = prompts.get(id);
    if (id === null || !data) return;
    let body, done;
    if (action === 'deny') {
      body = { deny: true };
      done = 'Denied prompt ' + id + '.';
    } else {
      const chosen = [];
      for (let i = 0; i < data.paths.length; i++) {
        // A box only when several paths are asked; an edit box only for a folder.
        const cb = card.querySelector('input[type="checkbox"][data-path-index="' + i + '"]');
        if (cb && !cb.checked) continue;
        const input = card.querySelector('input[data-path-input="' + i + '"]');
        const path = toSend(card, i, data.paths[i]);
        if (!within(path, data.paths[i])) {
          say('Path ' + (i + 1) + ' must be the folder asked for, or a folder inside it.', 'error');
          if (input) input.focus();
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
      const cards = $('prompts');
      if (removeCard(card)) focusOn(cards.querySelector('h3') || $('prompts-h'));
    }
  }

  // ---------------------------------------------------------------- sign-ins

  // Whether the page links to a sign-in page at `authorize`: an https address, or http on
  // this computer (a loopback host: nothing crosses the network), without a user name or
  // password (`https://bank.example@elsewhere.example/` reads as a bank's). {url} or {why}.
  function signInLink(authorize) {
    if (typeof authorize !== 'string' || authorize === '') {
      return { why: 'fsbroker gave no address for it.' };
    }
    let url;
    try {
      url = new URL(authorize);
    } catch (_) {
      return { why: 'its address is not a web address.' };
    }
    const host = url.hostname;
    const loopback = host === 'localhost' || host === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
    if (url.protocol !== 'https:' && !(url.protocol === 'http:' && loopback)) {
      return { why: 'its address is not a secure (https) one, and not on this computer.' };
    }
    if (url.username || url.password) return { why: 'its address holds a user name or password.' };
    return { url };
  }

  // The scopes asked for or granted, each as the server's text.
  function scopesOf(list) {
    const scopes = Array.isArray(list) ? list.filter((x) => typeof x === 'string' && x !== '') : [];
    if (scopes.length === 0) return 'none named';
    return scopes.map((x, i) => [i ? ', ' : '', srv(x)]);
  }

  // A "Sign in to SERVER" card: where the sign-in page is (its origin, as text, for the
  // person to recognise), and one link that opens it in a new tab.
  function signInCard(c, i) {
    const hid = 'signin-' + i;
    const link = signInLink(c.authorize);
    // The origin of the address the link opens, when there is a link: what the person checks
    // is where the link goes.
    const origin = link.url ? link.url.origin : c.origin;
    return h('article', { class: 'signin', 'aria-labelledby': hid + '-h',
      dataset: { signin: 'needed', key: 'n' + JSON.stringify(c.server) } },
    h('h3', { id: hid + '-h', tabindex: '-1' }, 'Sign in to ', text(c.server)),
    h('p', {}, 'This remote server asks you to sign in before it works with fsbroker. Its sign-in page is at:'),
    h('p', { class: 'origin', dataset: { origin: '' } }, text(origin)),
    h('p', { class: 'note' }, 'Sign in only if you know this address and expected it. ' +
      'fsbroker receives what the page hands back, never your password.'),
    link.url
      ? h('p', { class: 'actions' }, h('a', { href: link.url.href, target: '_blank',
        rel: 'noopener noreferrer', class: 'button primary', dataset: { action: 'sign-in' } },
      'Open the sign-in page (new tab)'))
      : h('p', { class: 'warn', dataset: { noLink: '' } },
        'This page offers no link to sign in: ', link.why),
    tech('Technical details', [
      ['Server', text(c.server)],
      ['Signs you in', text(c.issuer)],
      ['Access asked for', scopesOf(c.scopes)],
      ['Asked at', when(c.at)],
    ]));
  }

  // A remote session signed in, or a sign-in that failed.
  function signInRow(c) {
    const key = (c.state === 'failed' ? 'f' : 's') + JSON.stringify(c.server);
    if (c.state === 'failed') {
      return h('li', { class: 'signin-failed', dataset: { signin: 'failed', key } },
        h('strong', { class: 'bad' }, 'Sign-in failed'), ' for ', text(c.server),
        h('p', { class: 'reason', dataset: { reason: '' } }, 'Why: ', text(c.reason)),
        h('dl', { class: 'facts inline' },
          c.issuer ? [h('dt', {}, 'Signing in at'), h('dd', {}, text(c.issuer))] : '',
          h('dt', {}, 'When'), h('dd', {}, when(c.at))));
    }
    return h('li', { class: 'signed-in', dataset: { signin: 'signed-in', key } },
      h('strong', {}, 'Signed in'), ' to ', text(c.server),
      h('dl', { class: 'facts inline' },
        h('dt', {}, 'Signed in by'), h('dd', {}, text(c.issuer)),
        h('dt', {}, 'Access'), h('dd', {}, scopesOf(c.scopes)),
        h('dt', {}, 'Since'), h('dd', {}, when(c.at))));
  }

  const announcedSignIns = new Set(); // needed sign-ins already announced, by server and address

  function renderSignIns(list) {
    const cards = list.filter((c) => c && typeof c === 'object' && typeof c.server === 'string');
    const needed = cards.filter((c) => c.state === 'needed');
    const rest = cards.filter((c) => c.state === 'signed-in' || c.state === 'failed');
    $('signins-section').hidden = needed.length + rest.length === 0;
    $('signins-list').hidden = rest.length === 0;
    redraw('signins-needed', needed, () => needed.map(signInCard));
    redraw('signins-list', rest, () => rest.map(signInRow));
    const fresh = needed.filter((c) => !announcedSignIns.has(JSON.stringify([c.server, c.authorize])));
    for (const c of fresh) announcedSignIns.add(JSON.stringify([c.server, c.authorize]));
    if (fresh.length) {
      const heads = [...$('signins-needed').querySelectorAll('h3')].map((el) => el.textContent);
      $('announce').textContent = heads.join('. ') + '.';
    }
  }

  // ---------------------------------------------------------------- sessions and roots

  const td = (label, content, cls) => h('td', { 'data-label': label, class: cls }, content);
  // Words for screen readers only, so that each button's name says what it acts on.
  const srOnly = (...parts) => h('span', { class: 'visually-hidden' }, parts);

  // What a session did, in words: requests, bytes, refusals.
  function did(s) {
    const errors = Number(s.errors) || 0;
    const denials = Number(s.denials) || 0;
    const failed = Math.max(0, errors - denials);
    const moved = (n) => (Number(n) > 0 ? bytes(Number(n)) : 'nothing');
    return [plural(Number(s.requests) || 0, 'request') + ': read ' + moved(s.bytesRead) +
      ', wrote ' + moved(s.bytesWritten),
    denials > 0 ? ['; ', h('strong', { class: 'bad' }, plural(denials, 'refusal'))] : '',
    failed > 0 ? '; ' + count(failed) + ' failed' : ''];
  }

  function sessionRows(sessions, roots) {
    return sessions.map((s) => {
      const id = s.id;
      const who = label(s.order);
      const r = reach(s, null);
      const grants = (Array.isArray(s.grants) ? s.grants : []).filter((g) => g && num(g.id) !== null);
      return h('tr', { dataset: { sessionId: String(id), key: 's' + id, order: String(num(s.order) ?? '') } },
        h('th', { scope: 'row', 'data-label': 'Server' }, named(s.server, s.order)),
        td('Its access to your files', h('span', { class: 'reach reach-' + r.level }, r.words)),
        td('Connected', when(s.startedAt)),
        td('What it did', did(s), Number(s.denials) > 0 ? 'hot' : ''),
        td('Allowed now', grants.length ? h('ul', { class: 'grants' }, grants.map((g) => {
          const root = roots.find((x) => x.path === g.root);
          return h('li', { dataset: { grantId: String(g.id), key: 'g' + g.id } },
            h('span', { class: 'grant-path' }, box(String(g.path), { max: PATH_MAX, middle: true })),
            h('span', { class: 'grant-root' }, ' in ', root ? srv(root.name) : text(g.root)),
            ' ',
            h('button', { type: 'button', dataset: { action: 'revoke' } }, 'Revoke',
              srOnly(' grant ' + g.id + ' of ' + who)));
        })) : 'nothing yet'),
        td('Actions', h('button', { type: 'button', class: 'danger', dataset: { action: 'end-session' } },
          'End session', srOnly(' of ' + who))),
        td('Details', tech('Technical details', [
          ...connectionFacts(s),
          typeof s.server === 'string' ? ['Name in full', box(s.server, { block: true, cls: 'full' })] : null,
          ['Requests', count(s.requests) + ' (errors ' + count(s.errors) + ', of them refusals ' + count(s.denials) + ')'],
          ['Held now', [plural(s.uploads, 'unfinished upload'), plural(s.locks, 'kept lock'),
            plural(s.watches, 'watch', 'watches')].join(', ')],
        ])));
    });
  }

  const CONSENT = { auto: 'without asking you', prompt: 'only once you approve', deny: 'never' };

  // The managed policy's rules on a root: the person's organisation set them, and no one at
  // this desk can lift them (pausing still works). Server-made strings never become markup.
  function orgRules(rules) {
    const list = Array.isArray(rules) ? rules.filter((x) => typeof x === 'string') : [];
    if (list.length === 0) return '';
    return h('div', { class: 'org-rules' },
      h('strong', {}, 'Set by your organisation:'),
      h('ul', {}, ...list.map((x) => h('li', {}, text(x)))));
  }

  function rootRows(roots) {
    return roots.map((r) => {
      const action = r.paused ? 'resume' : 'pause';
      const tr = h('tr', { class: r.paused ? 'paused' : '' },
        h('th', { scope: 'row', 'data-label': 'Name' }, srv(r.name)),
        td('Folder', [text(r.path), orgRules(r.managed)]),
        td('Servers may', r.mode === 'read-write' ? 'read and change' : r.mode === 'read-only' ? 'read' : text(r.mode),
          r.mode === 'read-write' ? 'mode-rw-cell' : ''),
        td('Given to servers', Object.hasOwn(CONSENT, r.consent) ? CONSENT[r.consent] : text(r.consent)),
        td('State', r.paused ? h('strong', {}, 'paused') : 'shared'),
        td('Action', h('button', { type: 'button', dataset: { action } },
          r.paused ? 'Resume' : 'Pause', srOnly(' root ', srv(r.name)))));
      tr.dataset.rootName = r.name; // text in a dataset value: never parsed as markup
      tr.dataset.key = 'r:' + r.name;
      return tr;
    });
  }

  // ---------------------------------------------------------------- audit trail

  function renderAudit(a) {
    const dl = $('audit');
    const on = !!a && typeof a === 'object';
    $('audit-off').hidden = on;
    dl.hidden = !on;
    if (!on) { dl.dataset.chain = 'off'; return; }
    const c = a.chain && typeof a.chain === 'object' ? a.chain : {};
    const chain = c.intact === true ? 'intact' : c.intact === false ? 'broken' : 'unchecked';
    dl.dataset.chain = chain;
    const set = (key, ...content) => fill(dl.querySelector('[data-audit="' + key + '"]'), content);
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

  const redacted = (hex) => h('span', { class: 'redacted' }, 'a hidden path ',
    h('code', {}, srv(String(hex).slice(0, 8))), '…');

  // The paths of a record, each in its box (`full`: whole, for the details; else cut): path
  // (or its hash), a rename's new path, a consent request's paths, a consent answer's
  // approved paths.
  function pathsOf(r, full) {
    const show = (p) => (full ? box(String(p), { block: true, cls: 'full' }) : box(String(p), { max: PATH_MAX, middle: true }));
    const out = [];
    if (typeof r.path === 'string') out.push(show(r.path));
    else if (typeof r.pathSha256 === 'string') out.push(redacted(r.pathSha256));
    if (typeof r.newPath === 'string') out.push(' to ', show(r.newPath));
    else if (typeof r.newPathSha256 === 'string') out.push(' to ', redacted(r.newPathSha256));
    const lists = [[r.paths, show], [r.approvedPaths, show], [r.pathsSha256, redacted], [r.approvedSha256, redacted]];
    for (const [list, each] of lists) {
      if (!Array.isArray(list)) continue;
      list.forEach((p, i) => out.push(out.length && i === 0 ? '; ' : i ? ', ' : '', each(String(p))));
      const total = num(r.pathsCount);
      if (total !== null && total > list.length) out.push(' (and ' + (total - list.length) + ' more)');
    }
    return out;
  }

  // What each request is, in words, and whether its path follows. A Map: the method is the
  // server's string, and must not reach an object's own properties (`__proto__`).
  const DOING = new Map([
    ['roots/list', ['asked which folders it may use', false]],
    ['files/read', ['read', true]],
    ['files/list', ['listed the folder', true]],
    ['files/checksum', ['checked what is in', true]],
    ['files/write', ['wrote', true]],
    ['files/create', ['created', true]],
    ['files/delete', ['deleted', true]],
    ['files/rename', ['renamed', true]],
    ['files/unlock', ['unlocked', true]],
    ['files/consent', ['asked you for', true]],
    ['files/watch', ['started watching', true]],
    ['files/unwatch', ['stopped watching', true]],
    ['ping', ['checked that fsbroker answers', false]],
  ]);

  // Why a request failed, in words (its code is in the row's details).
  const REASONS = new Map([
    ['FILE_NOT_FOUND', 'not there'], ['INVALID_PATH', 'not a path it may use'],
    ['IO_ERROR', 'the disk failed'], ['TIMEOUT', 'took too long'],
    ['CONCURRENCY_CONFLICT', 'changed meanwhile'], ['QUOTA_EXCEEDED', 'over its limit'],
    ['RATE_LIMITED', 'too many requests'], ['ALREADY_EXISTS', 'already there'],
    ['CHECKSUM_MISMATCH', 'not what it expected'], ['FILE_LOCKED', 'locked'],
    ['INVALID_PARAMS', 'a malformed request'], ['INVALID_REQUEST', 'a malformed request'],
    ['PARSE_ERROR', 'a malformed request'], ['METHOD_NOT_FOUND', 'a request fsbroker does not know'],
  ]);

  function doing(r) {
    const known = typeof r.method === 'string' && DOING.has(r.method) ? DOING.get(r.method) : null;
    if (!known) return 'made a request fsbroker does not know';
    const paths = known[1] ? pathsOf(r, false) : [];
    return [known[0], paths.length ? [' ', paths] : ''];
  }

  // Whose a record is: its server, named as everywhere on the page.
  function whose(r) {
    const session = num(r.session);
    if (session === null) return '—';
    const order = num(r.order) ?? orders.get(session);
    return named(r.server, order, SHORT_NAME_MAX);
  }

  function actText(r) {
    const n = (v) => (num(v) === null ? '?' : num(v));
    const of = num(r.session) === null ? '' : ' of ' + label(num(r.order) ?? orders.get(num(r.session)));
    switch (r.event) {
      case 'revoke-grant': return 'You revoked grant ' + n(r.grant) + of;
      case 'end-session': return 'You ended the session' + of;
      case 'pause-root': return ['You paused ', text(r.root)];
      case 'resume-root': return ['You resumed ', text(r.root)];
      case 'consent-answer': return (r.granted ? 'You approved prompt ' : 'You denied prompt ') + n(r.prompt) + of;
      default: return ['Your act: ', text(r.event)];
    }
  }

  function addActivity(r) {
    const session = num(r.session);
    if (session !== null) {
      seenSessions.add(session);
      if (num(r.order) !== null) orders.set(session, r.order);
    }
    const time = h('td', { 'data-label': 'Time' });
    if (r.account === 'person' || typeof r.event === 'string') {
      newest = null;
      time.append(when(r.ts, true));
      const where = pathsOf(r, false);
      addRow(h('tr', { class: 'act' }, time, h('td', { 'data-label': 'Server' }, session === null ? '—' : label(num(r.order) ?? orders.get(session))),
        h('td', { colspan: '4', class: 'act-text' }, h('strong', {}, actText(r)),
          where.length ? [': ', where] : '')), session);
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
    const cells = { time, bytes: h('td', { 'data-label': 'Amount', class: 'num' }),
      count: h('td', { 'data-label': 'Times', class: 'num' }) };
    let result;
    if (outcome === 'ok') result = 'done';
    else if (outcome === 'PERMISSION_DENIED') result = h('span', { class: 'badge badge-refused' }, 'refused');
    else result = [h('span', { class: 'badge badge-failed' }, 'failed'), ' ', REASONS.get(outcome) || 'an error'];
    const also = num(r.alsoRefused);
    const details = tech(doing(r), [
      ['Request', typeof r.method === 'string' ? h('code', {}, box(r.method, { max: 64 })) : '—'],
      session === null ? null : ['Session number', String(session)],
      typeof r.server === 'string' ? ['Name in full', box(r.server, { block: true, cls: 'full' })] : null,
      pathsOf(r, true).length ? ['Path in full', pathsOf(r, true)] : null,
      ['Outcome', srv(outcome)],
    ]);
    const row = h('tr', { class: outcome === 'ok' ? '' : outcome === 'PERMISSION_DENIED' ? 'refused' : 'failed' },
      time, h('td', { 'data-label': 'Server' }, whose(r)),
      h('td', { 'data-label': 'What it did', class: 'path-cell' }, details),
      h('td', { 'data-label': 'Result' }, result,
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
    addRow(h('tr', { class: 'note' }, h('td', { colspan: '6' }, message)), null);
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
    const sig = JSON.stringify([ids, lastOpen, ids.map((id) => orders.get(id))]);
    if (select.dataset.sig === sig) return;
    select.dataset.sig = sig;
    const value = select.value;
    // Labels only: an option is plain text, where a server's name could not be boxed.
    select.replaceChildren(h('option', { value: '' }, 'All servers'), ...ids.map((id) =>
      h('option', { value: String(id) }, capital(labelOf(id)) + (lastOpen.includes(id) ? '' : ' (gone)'))));
    select.value = ids.includes(Number(value)) ? value : '';
  }

  // ---------------------------------------------------------------- the person's input

  document.addEventListener('click', (e) => {
    const btn = e.target instanceof Element ? e.target.closest('button[data-action]') : null;
    if (!btn) return;
    const action = btn.dataset.action;
    if (action === 'approve-selected' || action === 'deny') {
      const card = btn.closest('[data-prompt-id]');
      if (card && pressCounts(e, card, 'nothing was sent.')) answer(card, action);
    } else if (action === 'narrow' || action === 'widen') {
      // Guarded as Approve is: a stray click must not change what Approve sends, nor hide it.
      const card = btn.closest('[data-prompt-id]');
      const i = idIn(btn, action);
      const panel = card && i !== null ? card.querySelector('[data-narrow-panel="' + i + '"]') : null;
      const toggle = card && i !== null ? card.querySelector('button[data-narrow="' + i + '"]') : null;
      if (!panel || !toggle || !pressCounts(e, card, 'nothing was changed.')) return;
      const input = panel.querySelector('input');
      if (action === 'widen') input.value = input.defaultValue;
      const open = action === 'narrow' && panel.hidden;
      panel.hidden = !open;
      toggle.setAttribute('aria-expanded', String(open));
      toggle.textContent = open ? 'Hide the field' : 'Allow only a folder inside it…';
      showSent(card, i);
      if (open) input.focus();
      else if (action === 'widen') toggle.focus();
    } else if (action === 'revoke') {
      const id = idIn(btn.closest('[data-grant-id]'), 'grantId');
      if (id !== null) post('/api/grants/' + id + '/revoke', undefined, 'Revoked grant ' + id + '.');
    } else if (action === 'end-session') {
      const row = btn.closest('[data-session-id]');
      const id = idIn(row, 'sessionId');
      if (id === null) return;
      const who = label(idIn(row, 'order'));
      if (!window.confirm('End the session of ' + who + '? It loses all its access at once and its connection is closed.')) return;
      post('/api/sessions/' + id + '/end', undefined, 'Ended the session of ' + who + '.');
    } else if (action === 'pause' || action === 'resume') {
      const row = btn.closest('[data-root-name]');
      const name = row && row.dataset.rootName;
      if (typeof name !== 'string') return;
      post('/api/roots/' + encodeURIComponent(name) + '/' + action, undefined,
        [action === 'pause' ? 'Paused ' : 'Resumed ', srv(name), '.']);
    }
  });

  document.addEventListener('input', (e) => {
    const t = e.target;
    if (t instanceof HTMLInputElement && t.dataset.pathInput !== undefined) {
      showSent(t.closest('[data-prompt-id]'), idIn(t, 'pathInput'));
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
      const toggle = [...card.querySelectorAll('button[data-narrow]')].find((el) => idIn(el, 'narrow') === i);
      if (toggle) toggle.disabled = !t.checked;
    } else if (t === $('feed-filter')) {
      for (const row of $('feed').rows) row.hidden = !shownByFilter(row);
    }
  });

  // Whatever else reflows the page (a window resized, a font loaded) arms the moved cards too.
  if (typeof ResizeObserver === 'function') new ResizeObserver(settle).observe(document.body);

  setConn('connecting', 'wait');
  if (takeKey()) { load(); connect(); }
})();
