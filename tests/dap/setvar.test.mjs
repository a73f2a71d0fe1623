// setVariable on tests/c/stepping.c, attached with "stopOnHit": "thread":
// the stepper held at a function breakpoint on step_here; in its caller's
// frame (`stepper`) a local (`i`) and a struct's member (`pace.add`) are
// changed, and after `continue` the program's next call of step_here gets
// the value they make. Refusals come with their DAP error ids: a value its
// type cannot hold (134), a register shown in the Registers scope (135), a
// local of a thread that runs (115). The Rust side checks the target is
// alive and untraced afterwards.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, attach, nextStop, num } from './lib.mjs';

/// The whole response to a request, failed or not (its error's id is in
/// `body.error.id`).
function raw(dc, command, args) {
  return new Promise((resolve) => dc.doSend(command, args, resolve));
}

async function refused(dc, args, id) {
  const r = await raw(dc, 'setVariable', args);
  assert.equal(r.success, false, JSON.stringify(r));
  assert.equal(r.body.error.id, id, JSON.stringify(r));
  return r.message;
}

/// Frame `n`'s Locals reference and variables, of held thread `tid`.
async function locals(dc, tid, n) {
  const frames = (await dc.stackTraceRequest({ threadId: tid, levels: n + 1 })).body.stackFrames;
  const scopes = (await dc.scopesRequest({ frameId: frames[n].id })).body.scopes;
  const ref = scopes.find((s) => s.name === 'Locals').variablesReference;
  const vars = (await dc.variablesRequest({ variablesReference: ref })).body.variables;
  return { frames, scopes, ref, vars };
}

test('setVariable changes a local and a member, and the program goes on with them', async () => {
  const dc = await client();
  try {
    const caps = await attach(dc, { stopOnHit: 'thread' });
    assert.equal(caps.supportsSetVariable, true);
    let stop = nextStop(dc);
    const set = (await dc.setFunctionBreakpointsRequest({ breakpoints: [{ name: 'step_here' }] }))
      .body.breakpoints;
    assert.equal(set[0].verified, true, JSON.stringify(set[0]));
    await dc.configurationDoneRequest();
    let ev = await stop;
    const tid = ev.body.threadId;

    // In the caller's frame: the local `i`, and `pace`'s member `add`.
    const l = await locals(dc, tid, 1);
    assert.equal(l.frames[1].name, 'stepper');
    const i = l.vars.find((v) => v.name === 'i');
    assert.ok(i, JSON.stringify(l.vars));
    assert.ok(num(i.value) < 1000000n, i.value);
    let r = (await dc.send('setVariable', { variablesReference: l.ref, name: 'i', value: '1000000' })).body;
    assert.equal(num(r.value), 1000000n, JSON.stringify(r));
    assert.equal(r.type, 'long int');
    const pace = l.vars.find((v) => v.name === 'pace');
    assert.ok(pace && pace.variablesReference > 0, JSON.stringify(pace));
    const members = (await dc.variablesRequest({ variablesReference: pace.variablesReference }))
      .body.variables;
    assert.deepEqual(members.map((m) => m.name), ['add', 'sleep_us']);
    r = (await dc.send('setVariable', {
      variablesReference: pace.variablesReference, name: 'add', value: '5000000',
    })).body;
    assert.equal(num(r.value), 5000000n, JSON.stringify(r));
    // The views read the new values.
    const again = (await dc.variablesRequest({ variablesReference: l.ref })).body.variables;
    assert.equal(num(again.find((v) => v.name === 'i').value), 1000000n);

    // Refused, each with its id; nothing written.
    let m = await refused(dc, { variablesReference: l.ref, name: 'i', value: 'banana' }, 134);
    assert.match(m, /banana/);
    m = await refused(dc, { variablesReference: pace.variablesReference, name: 'sleep_us', value: '5000000000' }, 134);
    assert.match(m, /range/);
    const regs = (await locals(dc, tid, 0)).scopes.find((s) => s.name === 'Registers');
    const groups = (await dc.variablesRequest({ variablesReference: regs.variablesReference }))
      .body.variables;
    await refused(dc, { variablesReference: groups[0].variablesReference, name: 'rip', value: '0' }, 135);

    // The next call of step_here is with i = 1000000 + 5000000 + 1 or 2.
    stop = nextStop(dc);
    await dc.continueRequest({ threadId: tid });
    ev = await stop;
    assert.equal(ev.body.threadId, tid);
    const f0 = (await dc.stackTraceRequest({ threadId: tid, levels: 1 })).body.stackFrames[0];
    assert.equal(f0.name, 'step_here');
    const arg = (await dc.evaluateRequest({ expression: 'i', frameId: f0.id })).body.result;
    assert.ok([6000001n, 6000002n].includes(num(arg)), `step_here(${arg})`);

    // A local of a thread that runs: the breakpoint removed, the stepper
    // goes on alone.
    const held = await locals(dc, tid, 1);
    await dc.setFunctionBreakpointsRequest({ breakpoints: [] });
    await dc.continueRequest({ threadId: tid, singleThread: true });
    m = await refused(dc, { variablesReference: held.ref, name: 'i', value: '1' }, 115);
    assert.match(m, /running/);
    await dc.disconnectRequest({ terminateDebuggee: false });
  } finally {
    dc._adapterProcess?.kill();
  }
});
