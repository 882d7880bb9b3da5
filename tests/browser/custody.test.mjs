// The console of a devnet whose keys are shared in a 2-of-3 key-management network: every
// custody node up with its keys and nonces; one killed for real shows down while the node can
// still sign, and a withdrawal signed by the other two goes through.
// Run by scripts/browser-test.sh.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { OUT, florinAt, startDevnet, stop, openPage } from './helpers.mjs';

const dir = mkdtempSync(join(tmpdir(), 'florin-custody-console-'));
const data = join(dir, 'devnet');
let devnet;
let browser;
let page;
const problems = [];
const florin = (...args) => florinAt(dir, devnet.url, join(data, 'tls', 'ca.pem'), {}, ...args);

before(async () => {
  devnet = await startDevnet(data, ['--custody', 'threshold']);
  ({ browser, page } = await openPage(problems));
});

after(async () => {
  if (browser) await browser.close();
  if (devnet) await stop(devnet.proc);
  // The nodes exit with the devnet that started them; `custody down` makes sure.
  try { florinAt(dir, 'https://127.0.0.1:9', join(data, 'tls', 'ca.pem'), {}, 'custody', 'down', '--data', join(data, 'custody')); } catch (_) { /* already stopped */ }
  rmSync(dir, { recursive: true, force: true });
});

test('the console shows the key-management network and a node lost for real', async () => {
  await page.goto(devnet.url + '/console');
  // An operator's view (it shows the nodes' addresses).
  await page.setInputFiles('#opkey', join(data, 'operator.key'));
  await page.waitForFunction(() => document.getElementById('opwho').textContent.startsWith('signing as eur1'));
  await page.waitForFunction(() => document.querySelectorAll('#custody-nodes tr[data-party]').length === 3, null, { timeout: 30_000 });
  await page.waitForFunction(() => document.querySelectorAll('#custody-nodes tr[data-up="true"]').length === 3, null, { timeout: 30_000 });
  assert.match(await page.textContent('#custody-note'), /3 of 3 nodes up; 2 sign: the node can sign/);
  // The authority's and the issuer's keys on every node, and nonces ready.
  const keys = await page.$$eval('#custody-nodes tr[data-party]', (rs) => rs.map((r) => Number(r.children[3].textContent)));
  assert.ok(keys.every((k) => k >= 2), String(keys));
  await page.screenshot({ path: join(OUT, 'custody-console.png'), fullPage: true });

  florin('custody', 'kill', '2', '--data', join(data, 'custody'));
  await page.waitForFunction(() => document.querySelector('#custody-nodes tr[data-party="2"]')?.dataset.up === 'false', null, { timeout: 30_000 });
  assert.match(await page.textContent('#custody-note'), /2 of 3 nodes up; 2 sign: the node can sign/);

  // Two of three still sign: money is minted and withdrawn.
  florin('wallet', '--wallet', 'w', '--json', 'new', '--no-passphrase');
  florin('wallet', '--wallet', 'w', '--json', 'faucet', '2');
  const w = florin('wallet', '--wallet', 'w', '--json', 'withdraw', '1');
  assert.equal(w.withdrawn_cents, 100);
  await page.screenshot({ path: join(OUT, 'custody-console-node-down.png'), fullPage: true });
  assert.deepEqual(problems, []);
});
