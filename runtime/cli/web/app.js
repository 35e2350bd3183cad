// The manta dashboard: polls the head's JSON API (/api/job, /api/actors,
// /api/curves, /api/errors) every 2 s and draws the page with DOM calls
// only (text through textContent: actor names and log lines are data, never
// markup). No library, no network beyond the head that served the page.
'use strict';

const TOKEN = new URLSearchParams(location.search).get('token');
const SVGNS = 'http://www.w3.org/2000/svg';
const REFRESH_MS = 2000;

function withToken(path) {
  return TOKEN ? path + '?token=' + encodeURIComponent(TOKEN) : path;
}

async function api(path) {
  const r = await fetch(withToken(path), {cache: 'no-store'});
  if (!r.ok) throw new Error(path + ': HTTP ' + r.status);
  return r.json();
}

// el('div', {class: 'x', 'data-y': 1}, child, 'text', ...)
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function sv(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  return e;
}

function fmt(v, unit) {
  if (v === null || v === undefined || !isFinite(v)) return '-';
  const a = Math.abs(v);
  let s;
  if (a >= 1e6) s = (v / 1e6).toFixed(1) + 'M';
  else if (a >= 1e4) s = (v / 1e3).toFixed(1) + 'k';
  else if (Number.isInteger(v)) s = String(v);
  else s = v.toFixed(a >= 100 ? 0 : a >= 10 ? 1 : 3);
  return unit === '%' ? s + '%' : unit ? s + ' ' + unit : s;
}

function dur(s) {
  if (s === null || s === undefined || !isFinite(s)) return '-';
  if (s < 1e-3) return Math.round(s * 1e6) + 'µs';
  if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 1 : 0) + 'ms';
  return s.toFixed(s < 10 ? 2 : 1) + 's';
}

// ---- the actor graph: one column per group, in the spec's order ----
function drawActors(doc) {
  const byGroup = new Map();
  for (const g of doc.groups) byGroup.set(g.name, {info: g, actors: []});
  for (const a of doc.actors) {
    if (!byGroup.has(a.group)) byGroup.set(a.group, {info: {name: a.group || '(none)', class: a.class}, actors: []});
    byGroup.get(a.group).actors.push(a);
  }
  const graph = document.getElementById('graph');
  const cols = [];
  for (const [name, g] of byGroup) {
    g.actors.sort((x, y) => x.name.localeCompare(y.name, 'en', {numeric: true}));
    const col = el('div', {class: 'group', 'data-group': name},
                   el('h3', {}, name + ' ', el('small', {}, g.info.class + ' ×' + g.actors.length)));
    for (const a of g.actors) {
      const dl = el('dl', {},
                    el('dt', {}, 'node'), el('dd', {}, a.node || '-'),
                    el('dt', {}, 'state'), el('dd', {class: 'state'}, a.state),
                    el('dt', {}, 'restarts'), el('dd', {class: 'restarts'}, a.restarts),
                    el('dt', {}, 'pid'), el('dd', {}, a.pid + ' #' + a.incarnation),
                    el('dt', {}, 'served'), el('dd', {}, fmt(a.calls_served)),
                    el('dt', {}, 'mailbox'), el('dd', {}, fmt(a.mailbox_depth)),
                    el('dt', {}, 'p50/p99'), el('dd', {}, dur(a.served_p50_s) + ' / ' + dur(a.served_p99_s)));
      const card = el('div', {class: 'actor state-' + a.state, 'data-actor': a.name,
                              'data-state': a.state, 'data-restarts': a.restarts,
                              'data-node': a.node},
                      el('div', {class: 'name'}, a.name), dl);
      if (a.error) card.append(el('div', {class: 'err'}, a.error));
      col.append(card);
    }
    if (cols.length) cols.push(el('div', {class: 'arrow'}, '→'));
    cols.push(col);
  }
  graph.replaceChildren(...cols);
}

// ---- the curves: one small line chart per progress field ----
function chart(steps, s) {
  const W = 320, H = 150, L = 44, R = 8, T = 8, B = 20;
  const pts = [];
  for (let i = 0; i < steps.length; i++)
    if (s.values[i] !== null) pts.push([steps[i], s.values[i]]);
  const g = sv('svg', {class: 'chart', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none',
                       role: 'img', 'aria-label': s.label});
  if (!pts.length) return g;
  let x0 = pts[0][0], x1 = pts[pts.length - 1][0];
  let y0 = Math.min(...pts.map(p => p[1])), y1 = Math.max(...pts.map(p => p[1]));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  if (y0 > 0 && y0 < (y1 - y0)) y0 = 0; // start at zero when it is close
  const X = x => L + (x - x0) / (x1 - x0) * (W - L - R);
  const Y = y => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (const y of [y0, y1]) {
    g.append(sv('line', {x1: L, x2: W - R, y1: Y(y), y2: Y(y)}));
    const t = sv('text', {x: L - 4, y: Y(y) + 3, 'text-anchor': 'end'});
    t.textContent = fmt(y, s.unit === '%' ? '%' : '');
    g.append(t);
  }
  for (const [x, anchor] of [[x0, 'start'], [x1, 'end']]) {
    const t = sv('text', {x: X(x), y: H - 5, 'text-anchor': anchor});
    t.textContent = String(x);
    g.append(t);
  }
  g.append(sv('polyline', {points: pts.map(p => X(p[0]).toFixed(1) + ',' + Y(p[1]).toFixed(1)).join(' ')}));
  return g;
}

function drawCurves(doc) {
  document.getElementById('unit').textContent = doc.unit + 's';
  const box = document.getElementById('charts');
  if (!doc.series.length) return;
  const figs = doc.series.map(s => {
    const vals = s.values.filter(v => v !== null);
    const first = vals.length ? vals[0] : null, last = vals.length ? vals[vals.length - 1] : null;
    const max = vals.length ? Math.max(...vals) : null;
    const cap = el('figcaption', {class: 'summary', 'data-series': s.label, 'data-first': first,
                                  'data-last': last, 'data-max': max, 'data-points': vals.length},
                   el('b', {}, s.label + ' ' + fmt(last, s.unit)),
                   ' — from ' + fmt(first, s.unit) + ', best ' + fmt(max, s.unit) +
                   ', ' + vals.length + ' points');
    return el('figure', {}, cap, chart(doc.steps, s));
  });
  box.replaceChildren(...figs);
}

function drawErrors(doc) {
  const tb = document.querySelector('#tool-errors tbody');
  const rows = doc.tool_errors.map(e => el('tr', {'data-kind': e.kind},
                                           el('td', {}, e.actor), el('td', {}, e.kind), el('td', {}, e.count)));
  if (!rows.length) rows.push(el('tr', {}, el('td', {colspan: 3, class: 'muted'}, 'none')));
  tb.replaceChildren(...rows);
  const items = doc.recent.slice().reverse().map(l =>
    el('li', {class: 'level-' + l.level},
       (l.time || '').replace(/^.*T/, '').replace(/Z$/, '') + ' ' + (l.level || '').toUpperCase() +
       ' ' + (l.actor || l.role || '') + (l.incarnation ? '#' + l.incarnation : '') + ' ' + (l.msg || '')));
  if (!items.length) items.push(el('li', {class: 'muted'}, 'none'));
  document.getElementById('recent').replaceChildren(...items);
}

function drawJob(doc) {
  document.getElementById('job').textContent = doc.job;
  document.title = doc.job + ' · manta';
  document.getElementById('line').textContent = doc.line;
  const tb = document.querySelector('#nodes tbody');
  tb.replaceChildren(...doc.nodes.map(n => el('tr', {},
    el('td', {}, n.id), el('td', {}, n.host), el('td', {}, n.state), el('td', {}, n.cpu),
    el('td', {}, n.gpu), el('td', {}, n.heartbeat_age_s === null ? '-' : dur(n.heartbeat_age_s) + ' ago'))));
}

async function refresh() {
  const status = document.getElementById('status');
  try {
    const [job, actors, curves, errors] = await Promise.all(
      ['/api/job', '/api/actors', '/api/curves', '/api/errors'].map(api));
    drawJob(job);
    drawActors(actors);
    drawCurves(curves);
    drawErrors(errors);
    status.textContent = 'updated ' + new Date().toLocaleTimeString();
    status.className = 'status';
  } catch (e) {
    status.textContent = 'no answer from the head (the job may have ended): ' + e.message;
    status.className = 'status bad';
  }
  setTimeout(refresh, REFRESH_MS);
}

document.getElementById('metrics-link').href = withToken('metrics');
refresh();
