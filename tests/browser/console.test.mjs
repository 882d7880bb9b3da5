// The operators' console and the API view in a real browser (Debian's Chromium driven by
// playwright-core) against a real devnet over TLS: the audit, the charts, a fraud proof made by
// a real double spend and verified in the page, recent transactions, the update after a
// payment, the operator's signed actions, and nothing loaded from anywhere but the node.
// Run by scripts/browser-test.sh (FLORIN_BIN, OUT_DIR, PLAYWRIGHT_CORE, CHROMIUM set there).

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, OUT, florinAt, startDevnet, stop } from './helpers.mjs';

const dir = mkdtempSync(join(tmpdir(), 'florin-console-'));
const data = join(dir, 'devnet');
let devnet;
let url;
let browser;

const florin = (...args) => florinAt(dir, url, join(data, 'tls', 'ca.pem'), {}, ...args);
const wallet = (name, ...args) => florin('wallet', '--wallet', name, '--json', ...args);

function offlinePay(payer, payee, amount, tag) {
  wallet(payee, 'offline', 'request', amount, '--out', tag + '.req');
  wallet(payer, 'offline', 'pay', tag + '.req', '--out', tag + '.pay');
  wallet(payee, 'offline', 'accept', tag + '.pay');
}

async function api(path) {
  // The devnet's CA is trusted by the browser context (below); from here, read through the CLI's
  // view instead: the console test compares the page with what the node answers to the page.
  return page.evaluate(async (p) => (await fetch(p)).json(), path);
}

let page;
const requests = [];
// Every request in full (URL, headers, body): the operator key must appear in none.
const sent = [];
const problems = [];

before(async () => {
  ({ proc: devnet, url } = await startDevnet(data, ['--audit-every', '2']));

  // A real double spend: a copied wallet pays its one token twice, offline; both payees
  // deposit, and the second deposit proves the fraud.
  for (const w of ['payer', 'alice', 'bob']) wallet(w, 'new', '--no-passphrase');
  wallet('payer', 'faucet', '0.05');
  wallet('payer', 'withdraw', '0.05');
  copyFileSync(join(dir, 'payer'), join(dir, 'payer-copy'));
  offlinePay('payer', 'alice', '0.05', 'a');
  offlinePay('payer-copy', 'bob', '0.05', 'b');
  wallet('alice', 'deposit');
  const b = wallet('bob', 'deposit');
  assert.equal(b.fraud.length, 1, 'the second deposit proves the double spend');

  browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ['--no-sandbox'] });
  const context = await browser.newContext({ ignoreHTTPSErrors: true, viewport: { width: 1280, height: 1400 } });
  page = await context.newPage();
  page.on('request', (r) => {
    requests.push(r.url());
    sent.push(r.url() + ' ' + JSON.stringify(r.headers()) + ' ' + (r.postData() || ''));
  });
  page.on('pageerror', (e) => problems.push('page error: ' + e.message));
  // The browser logs every 4xx as a console error; the tests cause some (a credential-less
  // operator call, a refused key) and check them. What must not happen: a script error, a
  // server error, or a page asking for something the node does not serve.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) problems.push('console: ' + m.text());
  });
  page.on('response', (r) => {
    const path = new URL(r.url()).pathname;
    // A devnet answers the console's one probe of /v1/cluster with 404 (not a sentinel), and
    // of /v1/custody (its keys are local).
    if (r.status() >= 500 || (r.status() === 404 && !['/favicon.ico', '/v1/cluster', '/v1/custody'].includes(path))) problems.push(r.status() + ' ' + r.url());
  });
});

after(async () => {
  if (browser) await browser.close();
  await stop(devnet);
  rmSync(dir, { recursive: true, force: true });
});

test('the console shows the audit, the charts and the fraud proof, and verifies the proof in the page', async () => {
  await page.goto(url + '/console');
  await page.waitForFunction(() => Number(document.body.dataset.updates || 0) >= 3, null, { timeout: 30_000 });

  const audit = await api('/v1/audit');
  assert.equal(audit.balanced, true);
  assert.equal(await page.textContent('#balanced'), 'balanced');
  const minted = await page.textContent('[data-field="minted_cents"] .v');
  assert.equal(minted, '€' + (audit.minted_cents / 100).toFixed(2));
  const outstanding = await page.textContent('[data-field="tokens_outstanding_cents"] .v');
  assert.equal(outstanding, '€' + (audit.tokens_outstanding_cents / 100).toFixed(2));

  // The charts have points and something drawn.
  assert.ok(Number(await page.getAttribute('#throughput', 'data-points')) >= 2);
  const blank = await page.evaluate(() => {
    const c = document.getElementById('latency');
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let i = 3; i < d.length; i += 4) if (d[i] !== 0) return false;
    return true;
  });
  assert.equal(blank, false, 'the latency chart is drawn');

  // The fraud proof, with its culprit; verified here, by the page's own code.
  const fraud = await api('/v1/fraud');
  assert.equal(fraud.length, 1);
  await page.waitForSelector('#fraud button[data-proof]');
  assert.match(await page.textContent('#fraud'), new RegExp(fraud[0].culprit));
  await page.click('#fraud button[data-proof]');
  await page.waitForSelector('#fraud .verified', { timeout: 10_000 });
  assert.match(await page.textContent('#fraud .verified'), /valid/);
  // A tampered proof fails the same check (a flipped bit in the last signature).
  const tampered = await page.evaluate(async (p) => {
    const hex = p.proof;
    const i = hex.length - 20;
    const flipped = hex.slice(0, i) + ((parseInt(hex[i], 16) ^ 1).toString(16)) + hex.slice(i + 1);
    try { await verifyFraudProof(flipped, info.authority); return 'accepted'; } catch (e) { return e.message; }
  }, fraud[0]);
  assert.match(tampered, /does not verify/);
  const wrongAuthority = await page.evaluate(async (p) => {
    try { await verifyFraudProof(p.proof, 'eur1someoneelse'); return 'accepted'; } catch (e) { return e.message; }
  }, fraud[0]);
  assert.match(wrongAuthority, /another authority/);
  // Without the authority's key nothing is called valid; Florin's signature rule holds:
  // small-order and non-canonical points, a non-canonical s, are refused before the equation.
  const checks = await page.evaluate(async (p) => {
    const out = [];
    try { await verifyFraudProof(p.proof, null); out.push('accepted'); } catch (e) { out.push(e.message); }
    for (const [what, hex] of [
      ['identity', '0100000000000000000000000000000000000000000000000000000000000000'],
      ['order 8', 'c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa'],
      ['y = p', 'edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f'],
    ]) {
      try { checkPoint(hexToBytes(hex), what); out.push('accepted'); } catch (e) { out.push(e.message); }
    }
    const sig = new Uint8Array(64).fill(0xff);
    sig.set(hexToBytes('5866666666666666666666666666666666666666666666666666666666666666'), 0);
    try { await verifySignature(hexToBytes('d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a'), new Uint8Array(32), sig, 'x'); out.push('accepted'); } catch (e) { out.push(e.message); }
    return out;
  }, fraud[0]);
  assert.match(checks[0], /authority's key is not known/);
  assert.match(checks[1], /small order/);
  assert.match(checks[2], /small order/);
  assert.match(checks[3], /not a canonical point/);
  assert.match(checks[4], /s is not canonical/);
  await page.screenshot({ path: join(OUT, 'console.png'), fullPage: true });
});

test('an operator blacklists the double-spent token from the page, signing in the browser', async () => {
  const fraud = await api('/v1/fraud');
  // Without a key: the page has no operator and the routes refuse.
  assert.equal(await page.isVisible('#opforms'), false);
  assert.equal((await page.evaluate(async () => (await fetch('/v1/admin/log')).status)), 401);
  // A file that is no key is refused.
  await page.setInputFiles('#opkey', { name: 'junk.key', mimeType: 'text/plain', buffer: Buffer.from('not a key') });
  await page.waitForFunction(() => document.getElementById('opwho').textContent.includes('not an operator key'));
  await page.setInputFiles('#opkey', join(data, 'operator.key'));
  await page.waitForFunction(() => document.getElementById('opwho').textContent.startsWith('signing as eur1'));
  await page.fill('#blacklist-form input[name=serial]', fraud[0].serial);
  await page.fill('#blacklist-form input[name=reason]', 'double spent (console test)');
  await page.click('#blacklist-form button');
  await page.waitForFunction(() => document.getElementById('opresult').textContent.startsWith('done'), null, { timeout: 10_000 });
  await page.waitForFunction((s) => document.getElementById('blacklist').textContent.includes(s), fraud[0].serial);
  assert.match(await page.textContent('#adminlog'), /blacklist/);
  // A bad key to revoke is refused with the node's reason, and nothing is recorded.
  await page.fill('#revoke-form input[name=key]', 'eur1notakey');
  await page.click('#revoke-form button');
  await page.waitForFunction(() => document.getElementById('opresult').textContent.startsWith('refused (400)'));
  assert.doesNotMatch(await page.textContent('#revoked'), /eur1notakey/);
  // The key never left the page: no request carried it.
  const seed = readFileSync(join(data, 'operator.key'), 'utf8').trim();
  assert.ok(sent.length > 0 && sent.every((r) => !r.includes(seed)));
  await page.screenshot({ path: join(OUT, 'console-operator.png'), fullPage: true });
});

test("a payment shows up: counters, the operator's recent transactions, and the books stay balanced", async () => {
  const confirmedBefore = Number(await page.textContent('[data-counter="transactions confirmed"]'));
  const bob = wallet('bob', 'address').address;
  const paid = wallet('alice', 'pay', bob, '0.02');
  assert.equal(paid.status, 'confirmed');
  await page.waitForFunction((n) => Number(document.querySelector('[data-counter="transactions confirmed"]').textContent) > n,
    confirmedBefore, { timeout: 15_000 });
  // Recent transactions are an operator's view (the key was loaded above): refreshed on demand.
  await page.click('#oprefresh');
  await page.waitForFunction((txid) => document.getElementById('recent').textContent.includes(txid), paid.txid, { timeout: 15_000 });
  const row = await page.getAttribute(`#recent tr:has-text("${paid.txid}")`, 'data-status');
  assert.equal(row, 'confirmed');
  await page.waitForFunction(() => document.getElementById('balanced').textContent === 'balanced');
  await page.screenshot({ path: join(OUT, 'console-after-payment.png'), fullPage: true });
});

test('the API view renders every operation of the contract', async () => {
  const doc = await api('/openapi.json');
  const operations = Object.values(doc.paths).reduce((n, item) => n + Object.keys(item).filter((k) => ['get', 'post'].includes(k)).length, 0);
  await page.goto(url + '/docs');
  await page.waitForSelector('details.op');
  assert.equal(await page.locator('details.op').count(), operations);
  await page.fill('#filter', '/v1/ledger/batch');
  assert.equal(await page.locator('details.op:visible').count(), 1);
  await page.fill('#filter', '');
  await page.click('details.op >> nth=0');
  await page.screenshot({ path: join(OUT, 'docs.png'), fullPage: false });
});

test('nothing came from anywhere but the node, and the pages raised no error', () => {
  const foreign = requests.filter((u) => !u.startsWith(url));
  assert.deepEqual(foreign, []);
  assert.deepEqual(problems, []);
});
