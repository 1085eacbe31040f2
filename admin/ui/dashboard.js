// The sluice dashboard: a backend table from /status (every second) and
// time-series plots from /status/history (loaded whole once, then the new
// samples), with events from /events as markers. The plots span the last
// 15 minutes (1 s samples, refreshed every second) or the 10 s history
// (24 h by default, refreshed every 10 s); the choice is kept in the URL
// hash (#span=15m, #span=24h). Plain script, no build step; uPlot is
// vendored next to it.
'use strict';
(() => {
  const PERIOD_MS = 1000;
  const EVENTS_MS = 5000;
  // The spans the plots can show: the history's resolution, how often it
  // has new samples, and the window of events asked for.
  const SPANS = {
    '15m': { resolution: '1s', period: 1000, events: '15m', words: 'the last 15 minutes' },
    '24h': { resolution: '10s', period: 10000, events: '24h', words: 'the last 24 hours' },
  };
  // A pause longer than this many sample intervals (sluice was stopped)
  // is drawn as a break in the lines, not bridged.
  const GAP = 2.5;
  const W = 460, HGT = 170;
  const BAND = ['rgba(46,125,50,0.10)', 'rgba(249,168,37,0.30)', 'rgba(239,108,0,0.30)', 'rgba(198,40,40,0.30)'];
  const EVENT_COLOR = { 'memory.state': '#c62828', 'backend.state': '#6a1b9a', 'mop.phase': '#1565c0', 'mop.learned': '#1565c0', 'arm.engaged': '#ef6c00', 'arm.released': '#2e7d32', 'arm.refusing': '#ef6c00' };
  const REASON_COLOR = { memory: '#c62828', arm: '#ef6c00', mop: '#1565c0', draining: '#6a1b9a' };

  let hist = null;     // merged columnar history
  let events = [];     // {t (unix s), kind, subject, message}
  let eventsOmitted = 0; // older events of the window /events left out
  let status = null;   // last /status
  const plots = new Map(); // plot key -> {u, data: () => uPlot data}
  let layoutKey = '';
  let busy = false;
  let again = false;   // a tick was asked for while one ran
  let span = spanOf(location.hash);
  let gen = 0;         // bumped when the span changes: answers for the old one are dropped
  let lastHistory = 0; // Date.now() of the last history answer

  // spanOf reads the span from a URL hash (#span=24h); 15m by default.
  function spanOf(hash) {
    const v = new URLSearchParams(hash.replace(/^#/, '')).get('span');
    return Object.hasOwn(SPANS, v) ? v : '15m';
  }

  const $ = (s) => document.querySelector(s);
  const el = (tag, attrs = {}, text) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  };
  const num = (v, d = 1) => (v === null || v === undefined || Number.isNaN(v)) ? '–' : Number(v).toFixed(d).replace(/\.0+$/, '');
  const mib = (b) => (b / 1048576).toFixed(0) + ' MiB';

  function showError(msg) { $('#error').textContent = msg || ''; }

  async function getJSON(url) {
    const r = await fetch(url, { cache: 'no-store' });
    if (!r.ok) throw new Error(url + ': ' + r.status + ' ' + (await r.text()).trim());
    return r.json();
  }

  // Every array-valued field of an object is a column aligned with t.
  const columns = (o) => Object.keys(o).filter((k) => Array.isArray(o[k]) && k !== 'states');
  const nulls = (n) => new Array(n).fill(null);

  // mergeList appends the columns of the items in add (n new samples) to
  // those in have (n0 samples so far), matching items by key; an item
  // missing on one side gets nulls.
  function mergeList(have, add, key, n0, n) {
    const byKey = new Map(have.map((x) => [key(x), x]));
    for (const a of add) {
      const h = byKey.get(key(a));
      if (!h) {
        for (const c of columns(a)) a[c] = nulls(n0).concat(a[c]);
        have.push(a);
        continue;
      }
      for (const c of columns(a)) h[c] = (h[c] || nulls(n0)).concat(a[c]);
      byKey.delete(key(a));
    }
    for (const h of byKey.values()) for (const c of columns(h)) h[c] = h[c].concat(nulls(n));
  }

  const bkey = (b) => b.protocol + '/' + b.id;

  // groups lists the pools of /status in order ({key, title, ids}), each
  // with the keys of its backends; a backend is shown in the first pool
  // that has it, and backends of no pool (a sluice without pools in
  // /status) in one last group.
  function groups(st) {
    const out = [], seen = new Set();
    for (const p of (st && st.pools) || []) {
      const title = p.protocol + ' pool ' + p.name + ' (' + p.policy + (p.panic ? ', panic' : '') + ')';
      const keys = p.backends.map((id) => p.protocol + '/' + id).filter((k) => !seen.has(k));
      keys.forEach((k) => seen.add(k));
      out.push({ key: p.protocol + '/' + p.name, title, keys });
    }
    const rest = ((st && st.backends) || []).map(bkey).filter((k) => !seen.has(k));
    if (rest.length) out.push({ key: '', title: '', keys: rest });
    return out;
  }

  // eachColumn calls f(object, key) for every column of a history
  // document but t: memory, refusals, backends, rules.
  function eachColumn(h, f) {
    for (const o of [h.memory, h.refused, ...h.backends, ...h.arm]) for (const c of columns(o)) f(o, c);
  }

  // merge adds a /status/history answer to hist, breaks the lines where
  // samples are missing, and keeps the span's window: at most the ring's
  // capacity and its time (capacity × interval before the newest sample).
  function merge(h) {
    let from = 0;
    if (!hist) {
      hist = h;
    } else {
      const n0 = hist.t.length, n = h.t.length;
      hist.memory.limit_bytes = h.memory.limit_bytes;
      hist.mop_max_heap_percent = h.mop_max_heap_percent;
      if (n === 0) return;
      hist.t = hist.t.concat(h.t);
      for (const c of columns(h.memory)) hist.memory[c] = hist.memory[c].concat(h.memory[c]);
      for (const r of Object.keys(h.refused)) hist.refused[r] = (hist.refused[r] || nulls(n0)).concat(h.refused[r]);
      mergeList(hist.backends, h.backends, bkey, n0, n);
      mergeList(hist.arm, h.arm, (r) => r.name, n0, n);
      from = n0;
    }
    insertGaps(from);
    const t = hist.t;
    if (!t.length) return;
    const oldest = t[t.length - 1] - hist.capacity * (hist.interval_seconds || 1);
    let drop = Math.max(0, t.length - hist.capacity);
    while (drop < t.length && t[drop] <= oldest) drop++;
    if (drop > 0) {
      hist.t = t.slice(drop);
      eachColumn(hist, (o, c) => { o[c] = o[c].slice(drop); });
    }
  }

  // insertGaps puts an empty sample (nulls, one interval after the one
  // before) where consecutive samples from index from on are more than GAP
  // intervals apart, so uPlot breaks its lines there: a restart shows as
  // a break, with what was learned before it on its left.
  function insertGaps(from) {
    const t = hist.t, iv = hist.interval_seconds || 1, at = [];
    for (let i = Math.max(1, from); i < t.length; i++) if (t[i] - t[i - 1] > GAP * iv) at.push(i);
    for (let k = at.length - 1; k >= 0; k--) {
      const i = at[k];
      t.splice(i, 0, t[i - 1] + iv);
      eachColumn(hist, (o, c) => { o[c].splice(i, 0, null); });
    }
  }

  // Plugin: node memory state as bands behind the series, events as
  // dashed vertical lines.
  function decorations(bands) {
    return {
      hooks: {
        drawClear: [(u) => {
          if (!bands || !hist) return;
          const t = hist.t, st = hist.memory.state, ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
          ctx.save();
          for (let i = 0; i < t.length; i++) {
            if (st[i] === null) continue;
            const x0 = u.valToPos(t[i], 'x', true);
            const x1 = u.valToPos(i + 1 < t.length ? t[i + 1] : t[i] + (hist.interval_seconds || 1), 'x', true);
            ctx.fillStyle = BAND[st[i]] || BAND[3];
            ctx.fillRect(x0, top, Math.max(1, x1 - x0), h);
          }
          ctx.restore();
        }],
        draw: [(u) => {
          const ctx = u.ctx, { left, top, width, height } = u.bbox;
          ctx.save();
          ctx.setLineDash([4, 3]);
          ctx.lineWidth = 1;
          for (const ev of events) {
            const x = u.valToPos(ev.t, 'x', true);
            if (x < left || x > left + width) continue;
            ctx.strokeStyle = EVENT_COLOR[ev.kind] || '#555';
            ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
          }
          ctx.restore();
        }],
      },
    };
  }

  function makePlot(container, key, title, series, axes, data, bands) {
    const box = el('div', { class: 'plot', 'data-plot': key });
    box.appendChild(el('h3', {}, title));
    container.appendChild(box);
    const opts = {
      width: W, height: HGT,
      series: [{}].concat(series),
      axes: [{}].concat(axes),
      scales: { x: { time: true } },
      legend: { live: false },
      cursor: { drag: { x: false, y: false } },
      plugins: [decorations(bands)],
    };
    for (const a of axes) if (a.scale && !opts.scales[a.scale]) opts.scales[a.scale] = { auto: true, range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] };
    const u = new uPlot(opts, data(), box);
    box._u = u;
    plots.set(key, { u, data });
  }

  const rateAxis = { scale: 'rate', label: 'per second', size: 50 };
  const pctAxis = { scale: '%', side: 1, label: '% of max', size: 45, grid: { show: false } };

  // layout builds the plots for the current backends and rules; it runs
  // again only when they change.
  function layout() {
    const gs = groups(status);
    const k = hist.backends.map(bkey).join(',') + '|' + hist.arm.map((r) => r.name).join(',') + '|' + gs.map((g) => g.key + ':' + g.keys.join(',')).join(';');
    if (k === layoutKey) return false;
    layoutKey = k;
    for (const p of plots.values()) p.u.destroy();
    plots.clear();
    for (const id of ['#node-plots', '#backend-plots', '#rule-plots']) $(id).replaceChildren();

    const mem = hist.memory;
    makePlot($('#node-plots'), 'memory', 'node memory (bands: memory state)',
      [{ label: 'used MiB', stroke: '#37474f', width: 2, scale: 'mib' },
        { label: 'limit MiB', stroke: '#c62828', dash: [6, 4], scale: 'mib' }],
      [{ scale: 'mib', label: 'MiB', size: 50 }],
      () => [hist.t, mem.used_bytes.map((v) => v === null ? null : v / 1048576),
        hist.t.map(() => hist.memory.limit_bytes > 0 ? hist.memory.limit_bytes / 1048576 : null)], true);
    const reasons = Object.keys(hist.refused);
    makePlot($('#node-plots'), 'refused', 'refusals by reason',
      reasons.map((r) => ({ label: r, stroke: REASON_COLOR[r] || '#555', width: 2, scale: 'rate' })),
      [rateAxis], () => [hist.t].concat(reasons.map((r) => hist.refused[r])), true);

    // One group of plots per pool, in the order of /status; backends
    // with history but no pool now (removed) last.
    const order = [], groupOf = new Map();
    for (const g of gs) for (const key of g.keys) { order.push(key); groupOf.set(key, g); }
    for (const b of hist.backends) if (!groupOf.has(bkey(b))) { order.push(bkey(b)); groupOf.set(bkey(b), { key: '', title: '' }); }
    const boxes = new Map();
    const boxOf = (g) => {
      if (!boxes.has(g.key)) {
        const box = el('div', { class: 'pool-plots', 'data-pool': g.key });
        if (g.title) box.appendChild(el('h3', { class: 'pool-title' }, g.title));
        const inner = el('div', { class: 'plots' });
        box.appendChild(inner);
        $('#backend-plots').appendChild(box);
        boxes.set(g.key, inner);
      }
      return boxes.get(g.key);
    };
    for (const key of order) {
      const b = hist.backends.find((x) => bkey(x) === key);
      if (!b) continue;
      const find = () => hist.backends.find((x) => bkey(x) === key);
      makePlot(boxOf(groupOf.get(key)), 'backend:' + key, b.protocol + ' ' + b.id,
        [{ label: 'admitted new /s', stroke: '#2e7d32', width: 2, scale: 'rate' },
          { label: 'allowed /s', stroke: '#1565c0', dash: [6, 3], scale: 'rate' },
          { label: 'learned /s', stroke: '#6a1b9a', dash: [2, 2], scale: 'rate' },
          { label: 'memory %', stroke: '#ef6c00', width: 2, scale: '%' },
          { label: 'ceiling %', stroke: '#c62828', dash: [8, 4], scale: '%' }],
        [rateAxis, pctAxis],
        () => {
          const x = find() || b;
          const ceil = hist.mop_max_heap_percent > 0 ? hist.mop_max_heap_percent : null;
          return [hist.t, x.new_rate, x.allowed_rate, x.learned_rate, x.memory_percent, hist.t.map(() => ceil)];
        }, false);
    }
    $('#rule-title').hidden = hist.arm.length === 0;
    for (const r of hist.arm) {
      const find = () => hist.arm.find((x) => x.name === r.name) || r;
      makePlot($('#rule-plots'), 'rule:' + r.name, 'ARM ' + r.name,
        [{ label: 'rate', stroke: '#2e7d32', width: 2, scale: 'n' },
          { label: 'limit', stroke: '#c62828', dash: [6, 4], scale: 'n' },
          { label: 'queued', stroke: '#ef6c00', width: 2, scale: 'q' }],
        [{ scale: 'n', label: 'per unit', size: 50 }, { scale: 'q', side: 1, label: 'queued', size: 45, grid: { show: false } }],
        () => { const x = find(); return [hist.t, x.rate, x.limit, x.queued]; }, false);
    }
    return true;
  }

  // redraw lays the plots out again when the backends or rules changed,
  // else gives them the new samples (when there are any).
  function redraw(fresh) {
    if (!hist) return;
    if (layout()) return; // new plots were drawn with the current data
    if (fresh) for (const p of plots.values()) p.u.setData(p.data());
  }



  function memoryCell(td, b) {
    td.replaceChildren();
    if (!b.mop.enabled) { td.textContent = 'no MOP'; return; }
    const ceil = hist ? hist.mop_max_heap_percent : 0;
    const bar = el('span', { class: 'bar' });
    const fill = el('i', { class: ceil > 0 && b.mop.memory_percent >= ceil ? 'over' : '' });
    fill.style.width = Math.min(100, b.mop.memory_percent) + '%';
    bar.appendChild(fill);
    if (ceil > 0) { const m = el('b'); m.style.left = ceil + '%'; bar.appendChild(m); }
    td.appendChild(bar);
    td.appendChild(document.createTextNode(num(b.mop.memory_percent) + '% / ' + (ceil > 0 ? num(ceil) + '%' : '–')));
    td.title = b.mop.probe_error || '';
    if (b.mop.probe_error) td.appendChild(document.createTextNode(' probe failing'));
  }

  async function control(b, action, body) {
    const url = '/control/backends/' + encodeURIComponent(b.id) + '/' + action + '?protocol=' + encodeURIComponent(b.protocol);
    try {
      const r = await fetch(url, { method: 'POST', body });
      if (!r.ok) throw new Error(action + ' ' + b.id + ': ' + r.status + ' ' + (await r.text()).trim());
      showError('');
    } catch (e) { showError(e.message); }
    tick();
  }

  function row(b) {
    const tr = el('tr', { 'data-key': bkey(b) });
    for (const c of ['pool', 'protocol', 'id', 'addr', 'state', 'weight', 'outstanding', 'requests', 'failures', 'phase', 'allowed', 'learned', 'memory', 'actions']) tr.appendChild(el('td', { class: 'c-' + c }));
    tr.querySelector('.c-id').textContent = b.id;
    tr.querySelector('.c-protocol').textContent = b.protocol;
    tr.querySelector('.c-addr').textContent = b.addr;
    const input = el('input', { class: 'weight', type: 'number', min: '1', max: '1000', 'aria-label': 'weight of ' + b.id });
    const set = el('button', { class: 'set-weight' }, 'set');
    set.onclick = () => control(tr._b, 'weight', new URLSearchParams({ weight: input.value }));
    tr.querySelector('.c-weight').append(input, ' ', set);
    const drain = el('button', { class: 'drain' });
    drain.onclick = () => control(tr._b, tr._b.state === 'draining' ? 'undrain' : 'drain');
    tr.querySelector('.c-actions').appendChild(drain);
    return tr;
  }

  function renderTable() {
    const body = $('#backends tbody');
    const rows = new Map([...body.children].map((tr) => [tr.dataset.key, tr]));
    const keep = new Set();
    const byKey = new Map(status.backends.map((b) => [bkey(b), b]));
    // Rows in pool order: the first row of each pool names it.
    const ordered = [];
    for (const g of groups(status)) g.keys.forEach((k, i) => { if (byKey.has(k)) ordered.push([byKey.get(k), g, i === 0]); });
    ordered.forEach(([b, g, first], i) => {
      const k = bkey(b);
      keep.add(k);
      let tr = rows.get(k);
      if (!tr) tr = row(b);
      // Moved only when out of place, so a weight being typed keeps focus.
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
      tr.classList.toggle('pool-first', first);
      tr.dataset.pool = g.key;
      tr.querySelector('.c-pool').textContent = first ? g.title.replace(/^\S+ pool /, '') : '';
      tr._b = b;
      const st = tr.querySelector('.c-state');
      st.textContent = b.state;
      st.className = 'c-state state state-' + b.state;
      const input = tr.querySelector('input.weight');
      if (document.activeElement !== input) input.value = b.weight;
      tr.querySelector('.c-outstanding').textContent = b.outstanding;
      tr.querySelector('.c-requests').textContent = b.requests;
      tr.querySelector('.c-failures').textContent = b.failures;
      tr.querySelector('.c-phase').textContent = b.mop.phase;
      tr.querySelector('.c-allowed').textContent = b.mop.enabled ? num(b.mop.allowed_rate) : '–';
      tr.querySelector('.c-learned').textContent = b.mop.enabled && b.mop.learned_rate > 0 ? num(b.mop.learned_rate) : '–';
      memoryCell(tr.querySelector('.c-memory'), b);
      tr.querySelector('button.drain').textContent = b.state === 'draining' ? 'undrain' : 'drain';
    });
    for (const [k, tr] of rows) if (!keep.has(k)) tr.remove();

    const rules = $('#rules');
    rules.hidden = status.arm.length === 0;
    rules.tBodies[0].replaceChildren(...status.arm.map((r) => {
      const tr = el('tr');
      for (const v of [r.name, r.rate, r.limit, r.unit, r.queued, r.admitted, r.delayed, r.refused]) tr.appendChild(el('td', {}, String(v)));
      return tr;
    }));

    const ms = $('#memstate');
    ms.textContent = 'memory ' + status.memory_state;
    ms.className = 'badge mem-' + status.memory_state;
    $('#memory').textContent = status.memory.limit_bytes > 0 ? mib(status.memory.used_bytes) + ' of ' + mib(status.memory.limit_bytes) : 'memory states off';
  }

  function renderEvents() {
    const ul = $('#events');
    ul.replaceChildren(...events.slice(-8).reverse().map((e) =>
      el('li', {}, new Date(e.t * 1000).toLocaleTimeString() + '  ' + e.kind + '  ' + (e.subject || '') + '  ' + e.message)));
    const om = $('#events-omitted');
    om.textContent = eventsOmitted > 0
      ? eventsOmitted + ' older event' + (eventsOmitted === 1 ? '' : 's') + ' of ' + SPANS[span].words + ' not shown (markers from ' +
        (events.length ? new Date(events[0].t * 1000).toLocaleTimeString() : 'now') + ' on); all of them: /events?since=' + SPANS[span].events + '&limit=10000'
      : '';
    om.hidden = eventsOmitted === 0;
    document.body.dataset.eventsOmitted = eventsOmitted;
  }

  // tick refreshes the table every second and the plots when the span's
  // history has new samples: every second for 15 minutes, every 10 s for
  // 24 hours.
  async function tick() {
    if (busy) { again = true; return; }
    busy = true;
    const g = gen, sp = SPANS[span];
    try {
      const wantHistory = !hist || Date.now() - lastHistory >= sp.period - PERIOD_MS / 2;
      const since = hist && hist.t.length ? Math.round(hist.t[hist.t.length - 1] * 1000) : 0;
      const q = '?resolution=' + sp.resolution + (hist ? '&since=' + since : '');
      const [st, h] = await Promise.all([getJSON('/status'), wantHistory ? getJSON('/status/history' + q) : null]);
      if (g !== gen) return; // the span changed meanwhile
      status = st;
      if (h) { merge(h); lastHistory = Date.now(); }
      renderTable();
      redraw(!!h);
      $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      const ds = document.body.dataset;
      ds.samples = hist.t.filter((_, i) => hist.memory.state[i] !== null || hist.memory.used_bytes[i] !== null).length;
      ds.span = span;
      ds.interval = hist.interval_seconds;
      ds.oldest = hist.t.length ? hist.t[0] : '';
      showError('');
    } catch (e) {
      if (g === gen) showError(e.message);
    } finally {
      busy = false;
      if (again || g !== gen) { again = false; tick(); }
    }
  }

  // showSpan marks the button of the span shown.
  function showSpan() {
    for (const b of document.querySelectorAll('.span-choice button')) b.setAttribute('aria-pressed', String(b.dataset.span === span));
  }

  // setSpan shows span s: the plots start over from its whole history.
  function setSpan(s) {
    if (s === span) return;
    span = s;
    gen++;
    hist = null;
    layoutKey = '';
    events = [];
    eventsOmitted = 0;
    lastHistory = 0;
    if (spanOf(location.hash) !== s) location.hash = 'span=' + s;
    showSpan();
    tick();
    loadEvents();
  }

  async function loadEvents() {
    const g = gen;
    try {
      // The newest 1,000 of the window: what just happened (a backend
      // down, a MOP cut) must show however busy the log is.
      const page = await getJSON('/events?since=' + SPANS[span].events + '&limit=1000&order=newest');
      if (g !== gen) return;
      events = page.events.map((e) => ({ t: Date.parse(e.time) / 1000, kind: e.kind, subject: e.subject, message: e.message }));
      eventsOmitted = page.omitted || 0;
      renderEvents();
    } catch (e) {
      // No event store (or it is busy): the plots go on without markers.
    }
  }

  for (const b of document.querySelectorAll('.span-choice button')) b.onclick = () => setSpan(b.dataset.span);
  window.addEventListener('hashchange', () => setSpan(spanOf(location.hash)));
  showSpan();
  tick();
  loadEvents();
  setInterval(tick, PERIOD_MS);
  setInterval(loadEvents, EVENTS_MS);
})();
