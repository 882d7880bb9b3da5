// Florin's operator console. Reads this node's own routes (/v1/info, /v1/ready, /v1/audit,
// /metrics, /v1/fraud, /v1/ledger/recent, the operator routes) and nothing else; renders with
// DOM text nodes only; verifies fraud proofs in the browser (WebCrypto SHA-256 and Ed25519);
// signs operator requests with a key held as a non-extractable WebCrypto key.
'use strict';

const POLL_MS = 2000;
const POINTS = 90;

// ---- small helpers ----------------------------------------------------------------------

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) {
    if (k === null || k === undefined) continue;
    e.append(typeof k === 'string' || typeof k === 'number' ? document.createTextNode(String(k)) : k);
  }
  return e;
}

function $(id) { return document.getElementById(id); }

function euros(cents) {
  if (cents === null || cents === undefined) return '—';
  return '€' + (cents / 100).toLocaleString('en', { minimumFractionDigits: 2, maximumFractionDigits: 2 });
}

function rows(table, head, items) {
  table.replaceChildren(el('tr', {}, ...head.map((h) => el('th', {}, h))), ...items);
}

async function getJson(path, init) {
  const r = await fetch(path, Object.assign({ cache: 'no-store' }, init || {}));
  const text = await r.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = { raw: text }; }
  return { status: r.status, body };
}

function hexToBytes(hex) {
  if (!/^([0-9a-fA-F]{2})*$/.test(hex)) throw new Error('not hex');
  const out = new Uint8Array(hex.length / 2);
  for (let i = 0; i < out.length; i++) out[i] = parseInt(hex.substr(2 * i, 2), 16);
  return out;
}

function bytesToHex(b) {
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

function concat(...parts) {
  const n = parts.reduce((a, p) => a + p.length, 0);
  const out = new Uint8Array(n);
  let at = 0;
  for (const p of parts) { out.set(p, at); at += p.length; }
  return out;
}

function u64le(n) {
  const b = new Uint8Array(8);
  let v = BigInt(n);
  for (let i = 0; i < 8; i++) { b[i] = Number(v & 0xffn); v >>= 8n; }
  return b;
}

// Florin's domain-separated SHA-256 (florin_crypto::hash): u16 LE length of the domain, the
// domain, then the parts.
async function florinHash(domain, ...parts) {
  const d = new TextEncoder().encode(domain);
  const len = new Uint8Array([d.length & 0xff, d.length >> 8]);
  return new Uint8Array(await crypto.subtle.digest('SHA-256', concat(len, d, ...parts)));
}

// bech32m (BIP 350) encoding of a 32-byte key under the `eur` prefix: Florin's addresses.
const CHARSET = 'qpzry9x8gf2tvdw0s3jn54khce6mua7l';
function polymod(values) {
  const G = [0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3];
  let chk = 1;
  for (const v of values) {
    const top = chk >>> 25;
    chk = ((chk & 0x1ffffff) << 5) ^ v;
    for (let i = 0; i < 5; i++) if ((top >>> i) & 1) chk ^= G[i];
  }
  return chk >>> 0;
}
function address(key) {
  const hrp = 'eur';
  const data = [];
  let acc = 0; let bits = 0;
  for (const b of key) {
    acc = (acc << 8) | b; bits += 8;
    while (bits >= 5) { bits -= 5; data.push((acc >>> bits) & 31); }
  }
  if (bits > 0) data.push((acc << (5 - bits)) & 31);
  const expand = [...hrp].map((c) => c.charCodeAt(0) >> 5).concat([0], [...hrp].map((c) => c.charCodeAt(0) & 31));
  const mod = polymod(expand.concat(data, [0, 0, 0, 0, 0, 0])) ^ 0x2bc830a3;
  const checksum = [0, 1, 2, 3, 4, 5].map((i) => (mod >>> (5 * (5 - i))) & 31);
  return hrp + '1' + data.concat(checksum).map((v) => CHARSET[v]).join('');
}

// ---- fraud proofs, checked here -----------------------------------------------------------

// Florin's signature rule (florin_crypto::verify) before WebCrypto's Ed25519: the key and R
// canonical (y < p) and not of small order, s below the group order. WebCrypto then checks the
// equation (cofactorless, where Florin's is cofactored: the two differ only for points with a
// torsion component, which the checks above do not all exclude; such a proof is one an honest
// wallet never signs, and the node's own check, `florin fraud verify`, is the reference).
const SMALL_ORDER = new Set([
  '0100000000000000000000000000000000000000000000000000000000000000',
  '0100000000000000000000000000000000000000000000000000000000000080',
  'ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f',
  'ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff',
  '0000000000000000000000000000000000000000000000000000000000000000',
  '0000000000000000000000000000000000000000000000000000000000000080',
  '26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05',
  '26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85',
  'c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a',
  'c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa',
]);
const P = (1n << 255n) - 19n;
const L = (1n << 252n) + 27742317777372353535851937790883648493n;

function le(bytes) {
  let v = 0n;
  for (let i = bytes.length - 1; i >= 0; i--) v = (v << 8n) | BigInt(bytes[i]);
  return v;
}

function checkPoint(bytes, what) {
  const y = bytes.slice();
  y[31] &= 0x7f;
  if (le(y) >= P) throw new Error(what + ' is not a canonical point encoding');
  if (SMALL_ORDER.has(bytesToHex(bytes))) throw new Error(what + ' has small order');
}

async function verifySignature(key, msg, sig, where) {
  try {
    checkPoint(key, 'the signing key');
    checkPoint(sig.slice(0, 32), 'the signature\'s R');
    if (le(sig.slice(32)) >= L) throw new Error('the signature\'s s is not canonical');
  } catch (e) {
    throw new Error(where + ': ' + e.message);
  }
  let ok = false;
  try {
    const k = await crypto.subtle.importKey('raw', key, { name: 'Ed25519' }, false, ['verify']);
    ok = await crypto.subtle.verify({ name: 'Ed25519' }, k, sig, msg);
  } catch (_) {
    ok = false;
  }
  if (!ok) throw new Error(where + ': the signature does not verify here (`florin fraud verify FILE` is the reference)');
}

// Decodes a fraud proof (florin_token::FraudProof::encode) and checks it as
// FraudProof::verify does, against `authority` (the node's key, required): the shape, the
// conflict, and every signature (the anchor's by the authority, each link's by the previous
// holder). Returns the proof's id, serial, value byte and culprit, recomputed from its bytes.
async function verifyFraudProof(hex, authority) {
  if (!authority) throw new Error('the authority\'s key is not known: nothing to check the proof against');
  const b = hexToBytes(hex);
  if (b.length < 110) throw new Error('truncated proof');
  if (b[0] !== 1) throw new Error('unknown proof version ' + b[0]);
  const serial = b.slice(1, 9);
  const value = b[9];
  if (value < 1 || value > 15) throw new Error('unknown denomination byte ' + value);
  const auth = b.slice(10, 42);
  const nonce = b.slice(42, 106);
  const np = b[106] | (b[107] << 8);
  const nb = b[108] | (b[109] << 8);
  if (b.length !== 110 + (np + 2 * nb) * 128) throw new Error('proof length does not match its counts');
  if (address(auth) !== authority) throw new Error('the proof is for another authority: ' + address(auth));
  const link = (i) => {
    const o = 110 + i * 128;
    return { recipient: b.slice(o, o + 32), handshake: b.slice(o + 32, o + 64), proof: b.slice(o + 64, o + 128) };
  };
  const prefix = []; const a = []; const c = [];
  for (let i = 0; i < np; i++) prefix.push(link(i));
  for (let i = 0; i < nb; i++) a.push(link(np + i));
  for (let i = 0; i < nb; i++) c.push(link(np + nb + i));
  if (np === 0) throw new Error('empty prefix');
  if (nb === 0) throw new Error('empty branches');
  const same = (x, y) => bytesToHex(x.recipient) === bytesToHex(y.recipient) && bytesToHex(x.handshake) === bytesToHex(y.handshake);
  for (let i = 0; i < nb - 1; i++) if (!same(a[i], c[i])) throw new Error('branches diverge before their last link');
  if (same(a[nb - 1], c[nb - 1])) throw new Error('the branches do not conflict: no key paid twice');
  for (const [name, branch] of [['branch a', a], ['branch b', c]]) {
    const chain = prefix.concat(branch);
    for (let i = 0; i < chain.length; i++) {
      if (name === 'branch b' && i < np) continue;
      const l = chain[i];
      const msg = i === 0
        ? await florinHash('florin/token/anchor/v1', new Uint8Array([1]), serial, new Uint8Array([value]), auth, nonce, l.recipient, l.handshake)
        : await florinHash('florin/token/link/v1', serial, chain[i - 1].proof, l.recipient, l.handshake);
      const signer = i === 0 ? auth : chain[i - 1].recipient;
      await verifySignature(signer, msg, l.proof, i < np ? 'prefix link ' + i : name + ' link ' + (i - np));
    }
  }
  const culprit = nb >= 2 ? a[nb - 2].recipient : prefix[np - 1].recipient;
  const id = bytesToHex(await florinHash('florin/fraud-proof/id/v1', b));
  return { id, culprit: address(culprit), serial: bytesToHex(serial), value };
}

// ---- metrics ----------------------------------------------------------------------------

function parseMetrics(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ([^ ]+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      for (const p of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[p[1]] = p[2];
    }
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

function sum(samples, name, pred) {
  return samples.filter((s) => s.name === name && (!pred || pred(s.labels))).reduce((a, s) => a + s.value, 0);
}

// Whether a route is the API's own work (not the console, the docs, or the scrape itself).
function apiRoute(route) {
  return route && !/^\/(metrics|console|docs|openapi\.json)/.test(route);
}

// The q-quantile of the requests between two scrapes, from histogram bucket differences.
function quantile(prev, cur, q) {
  const buckets = new Map();
  for (const s of cur) {
    if (s.name !== 'florin_http_request_duration_seconds_bucket' || !apiRoute(s.labels.route)) continue;
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) || 0) + s.value);
  }
  for (const s of prev) {
    if (s.name !== 'florin_http_request_duration_seconds_bucket' || !apiRoute(s.labels.route)) continue;
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    buckets.set(le, (buckets.get(le) || 0) - s.value);
  }
  const sorted = [...buckets.entries()].sort((x, y) => x[0] - y[0]);
  const total = sorted.length ? sorted[sorted.length - 1][1] : 0;
  if (total <= 0) return null;
  let lastLe = 0;
  for (const [le, count] of sorted) {
    if (count >= q * total) return le === Infinity ? lastLe : le;
    lastLe = le;
  }
  return lastLe;
}

const series = {
  confirmed: [], requests: [], refused: [], p50: [], p99: [],
};
let lastScrape = null;

function push(name, v) {
  series[name].push(v);
  if (series[name].length > POINTS) series[name].shift();
}

function drawChart(canvas, lines, unit) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || 520; const h = canvas.clientHeight || 180;
  canvas.width = w * dpr; canvas.height = h * dpr;
  const g = canvas.getContext('2d');
  g.scale(dpr, dpr);
  g.clearRect(0, 0, w, h);
  const values = lines.flatMap((l) => l.data.filter((v) => v !== null));
  const max = Math.max(1e-9, ...values) * 1.15;
  const left = 48; const bottom = h - 18; const top = 8;
  g.strokeStyle = '#d9dde5'; g.fillStyle = '#5b6475'; g.font = '11px system-ui, sans-serif';
  for (let i = 0; i <= 4; i++) {
    const y = top + (bottom - top) * (1 - i / 4);
    g.beginPath(); g.moveTo(left, y); g.lineTo(w - 4, y); g.stroke();
    const v = (max * i) / 4;
    g.fillText((v >= 100 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toPrecision(2)) + unit, 2, y + 4);
  }
  g.fillText('last ' + Math.round((POINTS * POLL_MS) / 1000) + ' s', left, h - 4);
  for (const line of lines) {
    g.strokeStyle = line.color; g.lineWidth = 1.6; g.beginPath();
    let started = false;
    line.data.forEach((v, i) => {
      if (v === null) return;
      const x = left + ((w - 4 - left) * (i + POINTS - line.data.length)) / (POINTS - 1);
      const y = bottom - ((bottom - top) * v) / max;
      if (!started) { g.moveTo(x, y); started = true; } else g.lineTo(x, y);
    });
    g.stroke();
  }
}

function legend(id, lines) {
  $(id).replaceChildren(...lines.map((l) => {
    const i = el('i'); i.style.background = l.color;
    const last = l.data.length ? l.data[l.data.length - 1] : null;
    return el('span', {}, i, l.label + ': ' + (last === null ? '—' : l.fmt(last)));
  }));
}

function renderMetrics(samples) {
  const now = performance.now();
  if (lastScrape) {
    const dt = (now - lastScrape.at) / 1000;
    const rate = (name, pred) => Math.max(0, (sum(samples, name, pred) - sum(lastScrape.samples, name, pred)) / dt);
    push('confirmed', rate('florin_ledger_transactions_total', (l) => l.outcome === 'confirmed'));
    push('refused', rate('florin_ledger_transactions_total', (l) => l.outcome === 'refused'));
    push('requests', rate('florin_http_requests_total', (l) => apiRoute(l.route)));
    const p50 = quantile(lastScrape.samples, samples, 0.5);
    const p99 = quantile(lastScrape.samples, samples, 0.99);
    push('p50', p50 === null ? null : p50 * 1000);
    push('p99', p99 === null ? null : p99 * 1000);
  }
  lastScrape = { at: now, samples };
  const perSec = (v) => v.toFixed(1) + '/s';
  const ms = (v) => v.toFixed(2) + ' ms';
  const tput = [
    { label: 'confirmed tx', color: '#2d8a4e', data: series.confirmed, fmt: perSec },
    { label: 'refused tx', color: '#b03030', data: series.refused, fmt: perSec },
    { label: 'API requests', color: '#2f6fb0', data: series.requests, fmt: perSec },
  ];
  const lat = [
    { label: 'p50 (≤ bucket)', color: '#2f6fb0', data: series.p50, fmt: ms },
    { label: 'p99 (≤ bucket)', color: '#a0522d', data: series.p99, fmt: ms },
  ];
  drawChart($('throughput'), tput, '/s'); legend('throughput-legend', tput);
  drawChart($('latency'), lat, ' ms'); legend('latency-legend', lat);
  $('throughput').dataset.points = String(series.requests.length);

  const count = (name, pred) => sum(samples, name, pred);
  rows($('counters'), ['what', 'count'], [
    ['transactions submitted', count('florin_ledger_transactions_total', (l) => l.outcome === 'submitted')],
    ['transactions confirmed', count('florin_ledger_transactions_total', (l) => l.outcome === 'confirmed')],
    ['transactions refused', count('florin_ledger_transactions_total', (l) => l.outcome === 'refused')],
    ['tokens minted (withdrawn)', count('florin_tokens_total', (l) => l.event === 'minted')],
    ['tokens deposited', count('florin_tokens_total', (l) => l.event === 'deposited')],
    ['tokens re-anchored', count('florin_tokens_total', (l) => l.event === 'reanchored')],
    ['fraud proofs', count('florin_fraud_proofs_total')],
  ].map(([k, v]) => el('tr', {}, el('td', {}, k), el('td', { class: 'mono', 'data-counter': k }, v))));

  // Raft groups this process takes part in (a replica's own metrics), unless the node is a
  // cluster sentinel that shows them all (/v1/cluster).
  if (clusterStatus) return renderPools(samples);
  const groups = new Map();
  for (const s of samples) {
    if (!s.name.startsWith('florin_raft_') || !s.labels.group) continue;
    const key = s.labels.group + '/' + (s.labels.replica || '');
    if (!groups.has(key)) groups.set(key, { group: s.labels.group, replica: s.labels.replica, lag: 0 });
    const g = groups.get(key);
    if (s.name === 'florin_raft_term') g.term = s.value;
    if (s.name === 'florin_raft_leader') g.leader = s.value;
    if (s.name === 'florin_raft_commit_index') g.commit = s.value;
    if (s.name === 'florin_raft_applied_index') g.applied = s.value;
    if (s.name === 'florin_raft_follower_lag') g.lag = Math.max(g.lag, s.value);
  }
  rows($('groups'), ['group', 'replica', 'leader', 'term', 'commit', 'applied', 'max follower lag', 'health'],
    [...groups.values()].map((g) => el('tr', {}, el('td', {}, g.group), el('td', {}, g.replica),
      el('td', {}, g.leader === undefined || g.leader < 0 ? 'none' : String(g.leader)), el('td', {}, g.term ?? '—'),
      el('td', {}, g.commit ?? '—'), el('td', {}, g.applied ?? '—'), el('td', {}, g.lag),
      el('td', {}, el('span', { class: 'badge ' + (g.leader >= 0 ? 'ok' : 'bad') }, g.leader >= 0 ? 'led' : 'no leader')))));
  const hint = operator ? '' : ' On a cluster\'s sentinel, load the operator key (below) to see every group.';
  $('groups-note').textContent = (groups.size ? 'The groups this process is a replica of (from its metrics).' : 'This process runs no replicated group.') + hint;

  renderPools(samples);
}

function renderPools(samples) {
  const pools = samples.filter((s) => s.name === 'florin_custody_pool_depth');
  rows($('pools'), ['pool', 'ready'], pools.map((s) => el('tr', {}, el('td', {}, s.labels.pool), el('td', { class: 'mono' }, s.value))));
  $('pools-note').textContent = pools.length ? 'This process\'s own pools.' : (hasCustody ? '' : 'No threshold custody behind this node (local keys).');
}

// ---- the node's answers -----------------------------------------------------------------

let custodyStatus = null;
// Asked once; a node whose keys are local (404) is not asked again.
let hasCustody = true;

async function refreshCustody() {
  if (!hasCustody) return;
  if (!operator) {
    if (!custodyStatus) $('custody-note').textContent = 'Load the operator key (below) to see the key-management network, if this node signs through one.';
    return;
  }
  const { status, body } = await operatorFetch('GET', '/v1/custody');
  if (status === 404) { hasCustody = false; $('custody-note').textContent = ''; return; }
  if (status !== 200) return;
  custodyStatus = body;
  rows($('custody-nodes'), ['node', 'address', 'state', 'keys', 'nonces ready', 'presignatures'],
    body.nodes.map((n) => el('tr', { 'data-party': String(n.party), 'data-up': String(n.up) },
      el('td', {}, String(n.party)), el('td', { class: 'mono' }, n.addr),
      el('td', {}, el('span', { class: 'badge ' + (n.up ? 'ok' : 'bad') }, n.up ? 'up' : 'down'), n.error ? ' ' + n.error : ''),
      el('td', {}, n.keys), el('td', {}, n.nonces_ready), el('td', {}, n.presignatures))));
  const up = body.nodes.filter((n) => n.up).length;
  $('custody-note').textContent = up + ' of ' + body.n + ' nodes up; ' + body.t + ' sign: ' + (body.healthy ? 'the node can sign' : 'NOT enough nodes to sign');
  $('custody-note').className = body.healthy ? 'muted' : 'failed';
}

let clusterStatus = null;
// Asked once; a node that is not a cluster sentinel (404) is not asked again.
let isSentinel = true;

// The cluster's groups and the custody network are operators' views (they show the internal
// addresses): asked with the operator's credential once a key is loaded.
async function refreshCluster() {
  if (!isSentinel) return;
  if (!operator) return;
  const { status, body } = await operatorFetch('GET', '/v1/cluster');
  if (status === 404) { isSentinel = false; clusterStatus = null; $('groups-note').textContent = ''; return; }
  if (status !== 200) return;
  clusterStatus = body;
  const items = [];
  for (const g of body.groups) {
    for (const m of g.members) {
      items.push(el('tr', { 'data-group': g.role + '-' + g.group, 'data-state': m.state || 'down' },
        el('td', {}, g.role + ' ' + g.group), el('td', {}, String(m.id)), el('td', { class: 'mono' }, m.addr),
        el('td', {}, m.up ? m.state : 'down'), el('td', {}, g.leader === null ? 'none' : String(g.leader)),
        el('td', {}, m.term ?? '—'), el('td', {}, m.last_applied ?? '—'), el('td', {}, m.lag ?? '—'),
        el('td', {}, el('span', { class: 'badge ' + (g.healthy ? 'ok' : 'bad') }, g.healthy ? 'healthy' : 'unhealthy'))));
    }
  }
  rows($('groups'), ['group', 'replica', 'host address', 'state', 'leader', 'term', 'applied', 'lag', 'group health'], items);
  $('groups-note').textContent = body.groups.length + ' groups, ' + (body.healthy ? 'all healthy' : 'NOT all healthy') + ' (asked over the cluster\'s RPC by this sentinel).';
  $('groups-note').className = body.healthy ? 'muted' : 'failed';
}

let info = null;
const verified = new Map();

async function loadInfo() {
  const r = await getJson('/v1/info');
  if (r.status === 200) {
    info = r.body;
    $('node').textContent = 'authority ' + info.authority + (info.issuer ? ' · issuer ' + info.issuer : '') + ' · v' + info.version;
  } else {
    $('node').textContent = 'a sentinel without a token authority';
  }
}

async function refreshAudit() {
  const { status, body } = await getJson('/v1/audit');
  const box = $('audit');
  if (status !== 200) {
    box.replaceChildren(el('div', { class: 'muted' }, 'No audit here: ' + ((body && body.error && body.error.message) || status)));
    $('balanced').textContent = 'n/a'; $('balanced').className = 'badge';
    return;
  }
  const f = (k, v, note) => el('div', { class: 'figure', 'data-field': k }, el('div', { class: 'v' }, v), el('div', { class: 'k' }, note));
  box.replaceChildren(
    f('minted_cents', euros(body.minted_cents), 'minted on the ledger'),
    f('redeemed_cents', euros(body.redeemed_cents), 'redeemed'),
    f('ledger_supply_cents', euros(body.ledger_supply_cents), 'in ledger outputs'),
    f('reserve_cents', euros(body.reserve_cents), "authority's reserve"),
    f('ledger_circulating_cents', euros(body.ledger_circulating_cents), 'held by users on the ledger'),
    f('tokens_outstanding_cents', euros(body.tokens_outstanding_cents), 'tokens outstanding (offline cash)'),
  );
  $('balanced').textContent = body.balanced ? 'balanced' : 'NOT balanced';
  $('balanced').className = 'badge ' + (body.balanced ? 'ok' : 'bad');
  $('problems').replaceChildren(...(body.problems || []).map((p) => el('li', {}, p)));
}

async function refreshReady() {
  const { status, body } = await getJson('/v1/ready');
  const r = $('ready');
  r.textContent = status === 200 ? 'ready' : 'not ready';
  r.className = 'badge ' + (status === 200 ? 'ok' : 'bad');
  r.title = body && body.checks ? Object.entries(body.checks).map(([k, v]) => k + ': ' + v).join('; ') : '';
}

async function refreshFraud() {
  const { status, body } = await getJson('/v1/fraud');
  if (status !== 200) { $('fraud-note').textContent = 'No token authority here.'; return; }
  $('fraud-note').textContent = body.length ? 'Verify checks the proof in this browser: every signature, against the authority\'s key alone.' : 'No double spend detected.';
  rows($('fraud'), ['detected', 'serial', 'value', 'culprit (signed twice)', 'offline check'], body.map((p) => {
    const cell = el('td', { class: 'check' });
    const show = () => {
      const v = verified.get(p.proof);
      if (!v) {
        const b = el('button', { 'data-proof': p.id }, 'Verify');
        b.addEventListener('click', async () => {
          // The verdict is about this row: the proof's own id, serial and culprit must be the
          // ones the row shows, and it is remembered under the id the proof hashes to.
          let verdict;
          try {
            if (!info) await loadInfo();
            const r = await verifyFraudProof(p.proof, info && info.authority);
            const mismatch = [['id', r.id, p.id], ['serial', r.serial, p.serial], ['culprit', r.culprit, p.culprit]]
              .find(([, mine, theirs]) => mine !== theirs);
            verdict = mismatch
              ? { ok: false, text: '✘ the proof\'s ' + mismatch[0] + ' is ' + mismatch[1] + ', the node says ' + mismatch[2] }
              : { ok: true, text: '✔ valid: ' + r.culprit.slice(0, 16) + '… signed two payments of token ' + r.serial };
          } catch (e) {
            verdict = { ok: false, text: '✘ ' + e.message };
          }
          verified.set(p.proof, verdict);
          show();
        });
        cell.replaceChildren(b);
      } else {
        cell.replaceChildren(el('span', { class: v.ok ? 'verified' : 'failed' }, v.text));
      }
    };
    show();
    return el('tr', {}, el('td', {}, new Date(p.detected_at * 1000).toLocaleString()), el('td', { class: 'mono' }, p.serial),
      el('td', {}, euros(p.value_cents)), el('td', { class: 'mono' }, p.culprit), cell);
  }));
}

// The transactions this node decided: an operator's view (`/v1/ledger/recent` needs the
// credential: the list tells who paid when).
function renderRecent(status, body) {
  if (status !== 200) {
    $('tx-summary').textContent = status === 404 ? 'No ledger here.' : 'Refused: ' + ((body && body.error && body.error.message) || status);
    return;
  }
  const txs = body.transactions || [];
  const by = {};
  for (const t of txs) by[t.status] = (by[t.status] || 0) + 1;
  $('tx-summary').textContent = (txs.length
    ? 'The last ' + txs.length + ' decided here: ' + Object.entries(by).map(([k, v]) => v + ' ' + k).join(', ')
    : 'No transaction decided here yet.') + ' (as of ' + new Date().toLocaleTimeString() + ')';
  rows($('recent'), ['when', 'txid', 'status', 'why'], txs.slice(0, 50).map((t) => el('tr', { 'data-status': t.status },
    el('td', {}, new Date(t.at * 1000).toLocaleTimeString()), el('td', { class: 'mono' }, t.txid),
    el('td', {}, el('span', { class: 'badge ' + (t.status === 'confirmed' ? 'ok' : t.status === 'pending' ? '' : 'bad') }, t.status)),
    el('td', {}, t.error || ''))));
}

async function refreshMetrics() {
  const r = await fetch('/metrics', { cache: 'no-store' });
  if (r.ok) renderMetrics(parseMetrics(await r.text()));
}

async function tick(what) {
  try { await what(); } catch (e) { console.warn(e); }
}

let rounds = 0;

// Metrics and readiness every round; the audit (which reads the whole books) and the fraud
// list every third; with an operator key, the groups and the custody network every second
// round and the operator's lists every eighth, while the page is in view (each a signed
// request, which a replicated node records), and on demand.
async function loop() {
  const slow = rounds % 3 === 0;
  if (rounds % 2 === 0 && document.visibilityState === 'visible') {
    await tick(refreshCluster);
    await tick(refreshCustody);
  }
  await Promise.all([tick(refreshMetrics), tick(refreshReady),
    slow ? tick(refreshAudit) : null, slow ? tick(refreshFraud) : null]);
  if (operator && rounds % 8 === 0 && document.visibilityState === 'visible') await tick(refreshOperator);
  rounds += 1;
  $('updated').textContent = 'updated ' + new Date().toLocaleTimeString();
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  setTimeout(loop, POLL_MS);
}

// ---- operator -----------------------------------------------------------------------------

let operator = null; // { key: CryptoKey (non-extractable), public: Uint8Array }

function unb64url(s) {
  const bin = atob(s.replace(/-/g, '+').replace(/_/g, '/'));
  return Uint8Array.from(bin, (c) => c.charCodeAt(0));
}

async function loadOperatorKey(file) {
  const text = (await file.text()).trim();
  const seed = hexToBytes(text);
  if (seed.length !== 32) throw new Error('an operator key file holds 64 hex digits');
  // PKCS#8 wrapping of an Ed25519 seed (RFC 8410), to learn the public key once, then kept
  // only as a key the page cannot export.
  const pkcs8 = concat(hexToBytes('302e020100300506032b657004220420'), seed);
  seed.fill(0);
  let jwk;
  try {
    const tmp = await crypto.subtle.importKey('pkcs8', pkcs8, { name: 'Ed25519' }, true, ['sign']);
    jwk = await crypto.subtle.exportKey('jwk', tmp);
  } finally {
    pkcs8.fill(0);
  }
  const key = await crypto.subtle.importKey('jwk', { kty: 'OKP', crv: 'Ed25519', d: jwk.d, x: jwk.x }, { name: 'Ed25519' }, false, ['sign']);
  // What JavaScript lets a page clear (strings, such as the file's text and `jwk.d`, cannot
  // be; they are dropped here and collected).
  jwk.d = '';
  return { key, public: unb64url(jwk.x) };
}

async function operatorFetch(method, path, body) {
  const bytes = body === undefined ? new Uint8Array() : new TextEncoder().encode(JSON.stringify(body));
  const ts = Math.floor(Date.now() / 1000);
  const nonce = crypto.getRandomValues(new Uint8Array(16));
  const enc = new TextEncoder();
  const m = enc.encode(method); const p = enc.encode(path);
  const bodyHash = await florinHash('florin/operator/body/v1', bytes);
  const digest = await florinHash('florin/operator/request/v1', u64le(m.length), m, u64le(p.length), p, u64le(ts), nonce, bodyHash);
  const sig = new Uint8Array(await crypto.subtle.sign({ name: 'Ed25519' }, operator.key, digest));
  const auth = ['Florin-Operator', 'v1', address(operator.public), ts, bytesToHex(nonce), bytesToHex(sig)].join(' ');
  const headers = { Authorization: auth };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  return getJson(path, { method, headers, body: body === undefined ? undefined : bytes });
}

function entryRows(table, list, withAction) {
  rows(table, (withAction ? ['#', 'action'] : []).concat(['subject', 'operator', 'when', 'reason']), (list || []).map((e) => el('tr', {},
    ...(withAction ? [el('td', {}, e.seq), el('td', {}, e.action)] : []),
    el('td', { class: 'mono' }, e.subject), el('td', { class: 'mono' }, e.operator.slice(0, 16) + '…'),
    el('td', {}, new Date(e.at * 1000).toLocaleString()), el('td', {}, e.reason))));
}

async function refreshOperator() {
  const bl = await operatorFetch('GET', '/v1/admin/blacklist');
  if (bl.status !== 200) {
    $('opwho').textContent = 'refused: ' + ((bl.body && bl.body.error && bl.body.error.message) || bl.status);
    return;
  }
  const rv = await operatorFetch('GET', '/v1/admin/revoked');
  const log = await operatorFetch('GET', '/v1/admin/log');
  const recent = await operatorFetch('GET', '/v1/ledger/recent');
  entryRows($('blacklist'), bl.body, false);
  if (rv.status === 200) entryRows($('revoked'), rv.body, false);
  if (log.status === 200) entryRows($('adminlog'), log.body, true);
  renderRecent(recent.status, recent.body);
}

async function operatorAction(method, path, body) {
  const r = await operatorFetch(method, path, body);
  $('opresult').textContent = r.status === 200
    ? 'done: ' + path.split('/').pop() + ' ' + (r.body.subject || '')
    : 'refused (' + r.status + '): ' + ((r.body && r.body.error && r.body.error.message) || '');
  $('opresult').className = r.status === 200 ? 'verified' : 'failed';
  await tick(refreshOperator);
}

function setupOperator() {
  $('opkey').addEventListener('change', async (ev) => {
    const file = ev.target.files[0];
    ev.target.value = '';
    if (!file) return;
    try {
      operator = await loadOperatorKey(file);
      $('opwho').textContent = 'signing as ' + address(operator.public);
      $('opforms').hidden = false;
      await tick(refreshOperator);
      await tick(refreshCluster);
      await tick(refreshCustody);
    } catch (e) {
      operator = null;
      $('opwho').textContent = 'not an operator key: ' + e.message;
    }
  });
  $('oprefresh').addEventListener('click', () => tick(refreshOperator));
  $('blacklist-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    operatorAction('POST', '/v1/admin/blacklist', { serial: f.get('serial').trim(), reason: f.get('reason') });
  });
  $('revoke-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    operatorAction('POST', '/v1/admin/revoke', { key: f.get('key').trim(), reason: f.get('reason') });
  });
  $('unrevoke').addEventListener('click', () => {
    const f = new FormData($('revoke-form'));
    operatorAction('POST', '/v1/admin/unrevoke', { key: f.get('key').trim(), reason: f.get('reason') });
  });
}

document.addEventListener('DOMContentLoaded', async () => {
  setupOperator();
  await tick(loadInfo);
  loop();
});
