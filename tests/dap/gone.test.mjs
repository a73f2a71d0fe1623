// A session that ends mid-stop, with every thread held at a data
// breakpoint, in the way GONE says: "disconnect" (the IDE's normal end),
// "close" (the IDE's connection drops, no disconnect) or "kill" (the
// adapter process is killed: only the daemon can clean up). The Rust test
// then checks that the target runs free.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, attach, nextStop, env } from './lib.mjs';

const GONE = env('GONE');

test(`a session that ends by ${GONE} while threads are held`, async () => {
  const dc = await client();
  await attach(dc);
  await dc.configurationDoneRequest();
  const stop = nextStop(dc);
  const set = (await dc.setDataBreakpointsRequest({
    breakpoints: [{ dataId: 'name:counter' }, { dataId: 'name:stats.errors' }],
  })).body;
  assert.deepEqual(set.breakpoints.map((b) => b.verified), [true, true]);
  const ev = await stop;
  assert.equal(ev.body.reason, 'data breakpoint');
  switch (GONE) {
    case 'disconnect':
      await dc.disconnectRequest({ terminateDebuggee: false });
      break;
    case 'close':
      dc._socket.destroy();
      break;
    case 'kill':
      dc._adapterProcess.kill('SIGKILL');
      break;
    default:
      assert.fail(`GONE=${GONE}`);
  }
});
