// The sluice dashboard: a backend table from /status and time-series plots
// from /status/history (loaded whole once, then the new samples every
// second), with events from /events as markers. Plain script, no build
// step; uPlot is vendored next to it.
'use strict';
(() => {
  const PERIOD_MS = 1000;
  const EVENTS_MS = 5000;
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

  function merge(h) {
    if (!hist) { hist = h; return; }
    const n0 = hist.t.length, n = h.t.length;
    hist.memory.limit_bytes = h.memory.limit_bytes;
    hist.mop_max_heap_percent = h.mop_max_heap_percent;
    if (n === 0) return;
    hist.t = hist.t.concat(h.t);
    for (const c of columns(h.memory)) hist.memory[c] = hist.memory[c].concat(h.memory[c]);
    for (const r of Object.keys(h.refused)) hist.refused[r] = (hist.refused[r] || nulls(n0)).concat(h.refused[r]);
    mergeList(hist.backends, h.backends, bkey, n0, n);
    mergeList(hist.arm, h.arm, (r) => r.name, n0, n);
    const drop = hist.t.length - hist.capacity;
    if (drop > 0) {
      const cut = (o) => { for (const c of columns(o)) o[c] = o[c].slice(drop); };
      cut(hist); cut(hist.memory); cut(hist.refused);
      hist.backends.forEach(cut); hist.arm.forEach(cut);
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
            const x1 = u.valToPos(i + 1 < t.length ? t[i + 1] : t[i] + 1, 'x', true);
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

  function redraw() {
    if (!hist) return;
    if (layout()) return; // new plots were drawn with the current data
    for (const p of plots.values()) p.u.setData(p.data());
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
      ? eventsOmitted + ' older event' + (eventsOmitted === 1 ? '' : 's') + ' of the last 15 minutes not shown (markers from ' +
        (events.length ? new Date(events[0].t * 1000).toLocaleTimeString() : 'now') + ' on); all of them: /events?since=15m&limit=10000'
      : '';
    om.hidden = eventsOmitted === 0;
    document.body.dataset.eventsOmitted = eventsOmitted;
  }

  async function tick() {
    if (busy) return;
    busy = true;
    try {
      const since = hist && hist.t.length ? Math.round(hist.t[hist.t.length - 1] * 1000) : 0;
      const [st, h] = await Promise.all([getJSON('/status'), getJSON('/status/history' + (hist ? '?since=' + since : ''))]);
      status = st;
      merge(h);
      renderTable();
      redraw();
      $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      document.body.dataset.samples = hist.t.length;
      showError('');
    } catch (e) {
      showError(e.message);
    } finally {
      busy = false;
    }
  }

  async function loadEvents() {
    try {
      // The newest 1,000 of the window: what just happened (a backend
      // down, a MOP cut) must show however busy the log is.
      const page = await getJSON('/events?since=15m&limit=1000&order=newest');
      events = page.events.map((e) => ({ t: Date.parse(e.time) / 1000, kind: e.kind, subject: e.subject, message: e.message }));
      eventsOmitted = page.omitted || 0;
      renderEvents();
    } catch (e) {
      // No event store (or it is busy): the plots go on without markers.
    }
  }

  tick();
  loadEvents();
  setInterval(tick, PERIOD_MS);
  setInterval(loadEvents, EVENTS_MS);
})();
