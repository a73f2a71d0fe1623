// Run as another user than the adapter's (uid 65534; the Rust test starts
// it so): a connection to `wpctl dap --listen` (DAP_PORT or DAP_SOCKET) is
// refused before anything is done. The first request is answered with the
// refusal, the connection is closed, and what an attacker would send next
// (attach to the target, read its memory) gets no answer. EXPECT says how
// the refusal comes: "adapter" (the adapter refuses the peer's uid) or
// "eacces" (the Unix socket's mode keeps the peer from connecting at all).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, env, PID } from './lib.mjs';

const EXPECT = env('EXPECT');

test(`another user is refused (${EXPECT}) and can do nothing`, async () => {
  assert.notEqual(process.getuid(), 0, 'the Rust test runs this as another user');
  if (EXPECT === 'eacces') {
    await assert.rejects(client(), { code: 'EACCES' });
    return;
  }
  assert.equal(EXPECT, 'adapter');
  const dc = await client();
  try {
    await refusedAndInert(dc);
  } finally {
    dc._socket.destroy();
  }
});

async function refusedAndInert(dc) {
  const outcome = (p) => Promise.race([
    p.then((r) => ({ answered: r }), (e) => ({ refused: e.message })),
    dc.closed.then(() => ({ closed: true })),
  ]);
  // Everything an attacker needs, sent at once, as a client may.
  const init = dc.initializeRequest({ adapterID: 'wpd', clientID: 'node-test' });
  const attach = dc.attachRequest({ pid: PID });
  const read = dc.customRequest('readMemory', { memoryReference: env('COUNTER_ADDR'), count: 8 });
  const first = await outcome(init);
  assert.ok(first.refused, `initialize was not refused: ${JSON.stringify(first)}`);
  assert.match(first.refused,
    new RegExp(`serves uid 0 only, and this connection comes from uid ${process.getuid()}`));
  for (const [what, p] of [['attach', attach], ['readMemory', read]]) {
    const o = await outcome(p);
    assert.deepEqual(o, { closed: true }, `${what}: ${JSON.stringify(o)}`);
  }
}
