// evaluate in a frame of a held thread: the expression starts from the
// frame's parameters and locals. The target's refs_worker thread stores into
// g_item->refs through touch_item(item_t *c, int v); a data breakpoint there
// stops it inside touch_item, where `c` is a local pointer to the heap object.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, attach, nextStop, env, hex, num } from './lib.mjs';

const ITEM = BigInt(env('ITEM_ADDR'));

test('evaluate with a frameId follows a local pointer to its heap object', async () => {
  const dc = await client();
  try {
    await attach(dc);
    const info = (await dc.dataBreakpointInfoRequest({ name: 'g_item->refs' })).body;
    assert.match(info.description, new RegExp(`4 bytes at ${hex(ITEM + 8n)}`));
    const stop = nextStop(dc);
    const set = (await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: info.dataId }] })).body;
    assert.equal(set.breakpoints[0].verified, true, JSON.stringify(set));
    const ev = await stop;
    const frames = (await dc.stackTraceRequest({ threadId: ev.body.threadId })).body.stackFrames;
    assert.equal(frames[0].name, 'touch_item');
    assert.equal(frames[1].name, 'refs_worker');
    const top = frames[0].id;
    const evaluate = async (expression, frameId = top) =>
      (await dc.evaluateRequest({ expression, frameId, context: 'watch' })).body;
    const refs = await evaluate('c->refs');
    assert.equal(refs.type, 'int');
    assert.equal(refs.memoryReference, hex(ITEM + 8n));
    // c->refs = v was the store that stopped it.
    assert.equal(num(refs.result), num((await evaluate('v')).result));
    assert.equal((await evaluate('c')).result, hex(ITEM));
    assert.equal(num((await evaluate('c->key')).result), 42n);
    assert.equal(num((await evaluate('(*c).tag')).result), 9n);
    assert.equal(num((await evaluate('((struct item *)c)->tag')).result), 9n);
    assert.equal((await evaluate('&c->tag')).result, hex(ITEM + 12n));
    // The caller's own local: v, the value it passed.
    assert.equal(num((await evaluate('v', frames[1].id)).result), num(refs.result));
    await assert.rejects(evaluate('c.refs'), /use '->'/);
    // A data breakpoint from the frame: by address, the object where it is
    // now; a global named from the same frame stays by name.
    let bp = (await dc.dataBreakpointInfoRequest({ name: 'c->refs', frameId: top })).body;
    assert.equal(bp.dataId, `addr:${hex(ITEM + 8n)}/4`, JSON.stringify(bp));
    assert.match(bp.description, /^c->refs \(frame 0 of thread \d+\) \(int\): 4 bytes/);
    bp = (await dc.dataBreakpointInfoRequest({ name: 'g_sess.id', frameId: top })).body;
    assert.equal(bp.dataId, 'name:g_sess.id', JSON.stringify(bp));
    await dc.disconnectRequest({ terminateDebuggee: false });
  } finally {
    // After a disconnect the adapter has exited; after a failure, end it.
    dc._adapterProcess?.kill();
  }
});
