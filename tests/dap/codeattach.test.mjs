// A function breakpoint on a running process (attach): two threads of the
// target call bump_counter(long v) all the time (spin_worker). The
// breakpoint stops one of them there and, with it, every thread; its frame
// shows the parameter. Removed, and continued, the target runs on: the
// Rust side checks that it still writes `counter` and that nothing of the
// session is left.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, attach, nextStop, env, num } from './lib.mjs';

const BUMP_LINE = Number(env('BUMP_LINE'));
const SPIN_LINE = Number(env('SPIN_LINE'));

test('a function breakpoint stops a running process until continue', async () => {
  const dc = await client();
  try {
    await attach(dc);
    const stop = nextStop(dc);
    const set = (await dc.setFunctionBreakpointsRequest({
      breakpoints: [{ name: 'bump_counter' }],
    })).body.breakpoints;
    assert.equal(set[0].verified, true, JSON.stringify(set[0]));
    assert.equal(set[0].line, BUMP_LINE);
    await dc.configurationDoneRequest();
    const ev = await stop;
    assert.equal(ev.body.reason, 'function breakpoint', JSON.stringify(ev.body));
    assert.equal(ev.body.allThreadsStopped, true);
    assert.deepEqual(ev.body.hitBreakpointIds, [set[0].id]);
    const tid = ev.body.threadId;
    const frames = (await dc.stackTraceRequest({ threadId: tid })).body.stackFrames;
    assert.equal(frames[0].name, 'bump_counter');
    assert.equal(frames[0].line, BUMP_LINE);
    assert.equal(frames[1].name, 'spin_worker');
    assert.equal(frames[1].line, SPIN_LINE);
    const scopes = (await dc.scopesRequest({ frameId: frames[0].id })).body.scopes;
    const locals = (await dc.variablesRequest({
      variablesReference: scopes.find((s) => s.name === 'Locals').variablesReference,
    })).body.variables;
    const v = locals.find((x) => x.name === 'v');
    assert.ok(v && v.type === 'long int', JSON.stringify(locals));
    assert.ok(num(v.value) > 0n, v.value);
    // Removed, then continued: every thread runs on.
    const cleared = (await dc.setFunctionBreakpointsRequest({ breakpoints: [] })).body;
    assert.deepEqual(cleared.breakpoints, []);
    await dc.continueRequest({ threadId: tid });
    await dc.disconnectRequest({ terminateDebuggee: false });
  } finally {
    dc._adapterProcess?.kill();
  }
});
