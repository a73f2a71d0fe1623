// A whole debug session against a C target whose spinning threads write
// `counter` (spin_worker -> bump_counter): what an IDE does, request by
// request, with the answers checked. The Rust test (tests/e2e/dap.rs)
// starts the daemon and the target, and checks the target afterwards.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { client, attach, nextStop, env, hex, num, PID } from './lib.mjs';

const COUNTER = BigInt(env('COUNTER_ADDR'));
const CONN1STATE = BigInt(env('CONN1STATE_ADDR'));
const ITEM = BigInt(env('ITEM_ADDR'));
const BUMP_LINE = Number(env('BUMP_LINE'));
const SPIN_LINE = Number(env('SPIN_LINE'));

test('a debug session: break on a variable by name, look around, continue, disconnect', async () => {
  const dc = await client();
  try {
    const caps = await attach(dc);
    for (const c of ['supportsDataBreakpoints', 'supportsDataBreakpointBytes',
      'supportsConfigurationDoneRequest', 'supportsConditionalBreakpoints',
      'supportsHitConditionalBreakpoints', 'supportsReadMemoryRequest']) {
      assert.equal(caps[c], true, c);
    }
    assert.equal(caps.supportTerminateDebuggee, false);

    // dataBreakpointInfo: by name, by expression, by address; refusals.
    let info = (await dc.dataBreakpointInfoRequest({ name: 'counter' })).body;
    assert.equal(info.dataId, 'name:counter');
    assert.deepEqual(info.accessTypes, ['write', 'readWrite']);
    assert.match(info.description, /counter \(long( int)?\): 8 bytes at 0x/);
    assert.match(info.description, /cannot watch reads/);
    assert.equal(info.canPersist, true);
    info = (await dc.dataBreakpointInfoRequest({ name: '&stats.errors' })).body;
    assert.equal(info.dataId, 'name:stats.errors');
    info = (await dc.dataBreakpointInfoRequest({ name: hex(COUNTER), asAddress: true, bytes: 8 })).body;
    assert.equal(info.dataId, `addr:${hex(COUNTER)}/8`);
    assert.equal(info.canPersist, false);
    for (const [name, why] of [['no_such_variable', /no variable or function named "no_such_variable"/],
      ['bump_counter', /function/], ['big_table', /slots per thread/]]) {
      info = (await dc.dataBreakpointInfoRequest({ name })).body;
      assert.equal(info.dataId, null, name);
      assert.match(info.description, why, `${name}: ${info.description}`);
    }
    await dc.configurationDoneRequest();

    // Arm; the first stop.
    let stop = nextStop(dc);
    let set = (await dc.setDataBreakpointsRequest({ breakpoints: [{ dataId: 'name:counter' }] })).body;
    assert.equal(set.breakpoints.length, 1);
    assert.equal(set.breakpoints[0].verified, true, JSON.stringify(set));
    const bp = set.breakpoints[0].id;
    let ev = await stop;
    assert.equal(ev.body.reason, 'data breakpoint');
    assert.deepEqual(ev.body.hitBreakpointIds, [bp]);
    assert.equal(ev.body.allThreadsStopped, true);
    assert.match(ev.body.description, new RegExp(`data breakpoint ${bp} \\(counter\\): .+ → .+`));
    const tid = ev.body.threadId;

    // threads, stackTrace, scopes, variables.
    const threads = (await dc.threadsRequest()).body.threads;
    assert.ok(threads.some((t) => t.id === tid), 'the stopped thread is listed');
    assert.ok(threads.some((t) => t.id === PID), 'the main thread is listed');
    assert.ok(threads.every((t) => typeof t.name === 'string' && t.name.length > 0));
    const frames = (await dc.stackTraceRequest({ threadId: tid })).body.stackFrames;
    assert.equal(frames[0].name, 'bump_counter');
    assert.match(frames[0].source.path, /ctarget\.c$/);
    assert.equal(frames[0].line, BUMP_LINE);
    assert.equal(frames[1].name, 'spin_worker');
    assert.equal(frames[1].line, SPIN_LINE);
    const scopes = (await dc.scopesRequest({ frameId: frames[0].id })).body.scopes;
    assert.deepEqual(scopes.map((s) => s.name), ['Locals', 'Data breakpoint hit', 'Watched', 'Globals', 'Registers']);
    assert.equal(scopes[0].presentationHint, 'locals');
    assert.equal(scopes[4].presentationHint, 'registers');
    // bump_counter(long v): its parameter is the value it stored.
    const locals0 = (await dc.variablesRequest({ variablesReference: scopes[0].variablesReference })).body.variables;
    const v0 = locals0.find((v) => v.name === 'v');
    assert.ok(v0, JSON.stringify(locals0));
    assert.match(v0.type, /^long( int)?$/);
    const groups = (await dc.variablesRequest({ variablesReference: scopes[4].variablesReference })).body.variables;
    assert.deepEqual(groups.map((g) => g.name), ['General Purpose Registers']);
    const regs = (await dc.variablesRequest({ variablesReference: groups[0].variablesReference })).body.variables;
    // eflags shows its flags after its value ("0x246 [PF ZF IF]").
    const reg = Object.fromEntries(regs.map((v) => [v.name, BigInt(v.value.split(' ')[0])]));
    for (const r of ['rax', 'rbx', 'rsp', 'rbp', 'r15', 'rip', 'eflags']) {
      assert.ok(r in reg, `register ${r}: ${JSON.stringify(regs.map((v) => v.name))}`);
    }
    // rip is where the thread is held: just after the store in bump_counter.
    assert.equal(reg.rip, BigInt(frames[0].instructionPointerReference));
    // Only the innermost frame has registers; every frame has its locals.
    const outer = (await dc.scopesRequest({ frameId: frames[1].id })).body.scopes;
    assert.deepEqual(outer.map((s) => s.name), ['Locals', 'Watched', 'Globals']);
    const locals1 = (await dc.variablesRequest({ variablesReference: outer[0].variablesReference })).body.variables;
    const v1 = locals1.find((v) => v.name === 'v');
    assert.ok(v1 && locals1.some((v) => v.name === 'arg'), JSON.stringify(locals1));
    // spin_worker's v is what it passed to bump_counter (bump_counter(++v)).
    assert.equal(num(v1.value), num(v0.value));
    assert.ok(v1.memoryReference, 'a local in memory has an address');
    // evaluate in a frame: its parameters and locals start expressions.
    assert.equal(num((await dc.evaluateRequest({ expression: 'v', frameId: frames[0].id })).body.result), num(v0.value));
    const atV1 = (await dc.evaluateRequest({ expression: '&v', frameId: frames[1].id })).body;
    assert.equal(atV1.result, v1.memoryReference);
    assert.match(atV1.type, /^long( int)? \*$/);
    const viaCast = (await dc.evaluateRequest({ expression: '*(unsigned long *)&v', frameId: frames[1].id })).body;
    assert.equal(num(viaCast.result), num(v1.value));
    assert.equal(viaCast.memoryReference, v1.memoryReference);
    // Without a frame, `v` is no global.
    await assert.rejects(dc.evaluateRequest({ expression: 'v' }), /no variable or function named "v"/);
    // A data breakpoint on that local, from the Variables view (gdb's watch -l).
    const local = (await dc.dataBreakpointInfoRequest({ name: 'v', variablesReference: outer[0].variablesReference })).body;
    assert.equal(local.dataId, `addr:${v1.memoryReference}/8`, JSON.stringify(local));
    assert.match(local.description, /v \(frame 1 of thread \d+\)/);
    const onReg = await dc.dataBreakpointInfoRequest({ name: 'rax', variablesReference: groups[0].variablesReference });
    assert.equal(onReg.body.dataId, null);
    assert.match(onReg.body.description, /register/);
    const hit = (await dc.variablesRequest({ variablesReference: scopes[1].variablesReference })).body.variables;
    const byName = Object.fromEntries(hit.map((v) => [v.name, v.value]));
    assert.equal(byName['address'], hex(COUNTER));
    assert.match(byName['accessed at'], /bump_counter\+0x[0-9a-f]+ \(ctarget\.c:\d+\)/);
    const watched = (await dc.variablesRequest({ variablesReference: scopes[2].variablesReference })).body.variables;
    assert.equal(watched.length, 1);
    assert.equal(watched[0].name, 'counter');
    assert.match(watched[0].type, /^long( int)?$/);
    assert.equal(watched[0].memoryReference, hex(COUNTER));
    // The value shown is the value in memory now, every thread held. It is
    // the stopped thread's new value unless the other spinner stored between
    // that hit and the stop of every thread (its store then stopped it at a
    // hit of its own): both are values a spinner stored.
    assert.ok(num(byName['new value']) > 0n, byName['new value']);
    // The stopped thread's own parameter is the value of its own store.
    assert.equal(num(v0.value), num(byName['new value']));
    assert.ok(num(watched[0].value) > 0n, watched[0].value);

    // evaluate and readMemory agree with it.
    const value = (await dc.evaluateRequest({ expression: 'counter', context: 'watch' })).body;
    assert.equal(num(value.result), num(watched[0].value));
    assert.match(value.type, /^long( int)?$/);
    assert.equal((await dc.evaluateRequest({ expression: '&counter' })).body.result, hex(COUNTER));
    assert.equal(num((await dc.evaluateRequest({ expression: 'initialized', context: 'hover' })).body.result), 7n);
    await assert.rejects(dc.evaluateRequest({ expression: 'no_such_variable' }));
    // Through pointers: a field of a heap object, read and watchable.
    assert.equal(num((await dc.evaluateRequest({ expression: 'conns->next->fd' })).body.result), 11n);
    assert.equal((await dc.evaluateRequest({ expression: '&conns->next->state' })).body.result, hex(CONN1STATE));
    info = (await dc.dataBreakpointInfoRequest({ name: 'conns->next->state' })).body;
    assert.equal(info.dataId, 'name:conns->next->state');
    assert.match(info.description, new RegExp(`4 bytes at ${hex(CONN1STATE)}`));
    await assert.rejects(dc.evaluateRequest({ expression: 'no_conn->state' }), /null pointer/);
    // Casts to the program's own types: a heap object by its address, a
    // value converted, a pointer made from a number; unknown type names.
    const refs = (await dc.evaluateRequest({ expression: `((struct item *)${hex(ITEM)})->refs` })).body;
    assert.equal(num(refs.result), 2n);
    assert.equal(refs.type, 'int');
    assert.equal(refs.memoryReference, hex(ITEM + 8n));
    const flags = (await dc.evaluateRequest({ expression: '(int)g_sess.flags' })).body;
    assert.equal(num(flags.result), -2n);
    assert.equal(flags.type, 'int');
    const made = (await dc.evaluateRequest({ expression: `(item_t *)${hex(ITEM)}` })).body;
    assert.equal(made.result, hex(ITEM));
    assert.equal(made.type, 'item_t *');
    assert.equal((await dc.evaluateRequest({ expression: '&g_item->refs' })).body.result, hex(ITEM + 8n));
    await assert.rejects(dc.evaluateRequest({ expression: '(struct itme *)0x10' }), /closest: struct item/);
    info = (await dc.dataBreakpointInfoRequest({ name: `((item_t *)${hex(ITEM)})->refs` })).body;
    assert.match(info.description, new RegExp(`4 bytes at ${hex(ITEM + 8n)}`));
    const mem = (await dc.customRequest('readMemory', { memoryReference: hex(COUNTER), count: 8 })).body;
    assert.equal(mem.address, hex(COUNTER));
    assert.equal(Buffer.from(mem.data, 'base64').readBigInt64LE(0), num(value.result));
    const edge = (await dc.customRequest('readMemory', { memoryReference: '0x1000', count: 16 })).body;
    assert.equal(edge.unreadableBytes, 16, 'page 1 is never mapped');

    // continue -> the next stop; old and new values follow each other.
    for (let i = 0; i < 5; i++) {
      stop = nextStop(dc);
      const c = (await dc.continueRequest({ threadId: tid })).body;
      assert.equal(c.allThreadsContinued, true);
      ev = await stop;
      assert.equal(ev.body.reason, 'data breakpoint');
      assert.deepEqual(ev.body.hitBreakpointIds, [bp]);
      const [, oldv, newv] = ev.body.description.match(/: (-?\d+) \(0x[0-9a-f]+\) → (-?\d+) \(0x[0-9a-f]+\)/);
      assert.notEqual(oldv, undefined, ev.body.description);
      assert.ok(BigInt(newv) > 0n, ev.body.description);
      console.log(`continue -> stopped: ${ev.ms.toFixed(2)} ms`);
    }

    // The set is replaced as a whole; unchanged breakpoints keep their id.
    set = (await dc.setDataBreakpointsRequest({
      breakpoints: [{ dataId: 'name:counter' }, { dataId: 'name:stats.errors', accessType: 'readWrite' }],
    })).body;
    assert.deepEqual(set.breakpoints.map((b) => b.verified), [true, true]);
    assert.equal(set.breakpoints[0].id, bp, 'an unchanged breakpoint keeps its id');
    assert.notEqual(set.breakpoints[1].id, bp);
    // read-only: refused with the reason; duplicates: the last one wins.
    set = (await dc.setDataBreakpointsRequest({
      breakpoints: [
        { dataId: `addr:${hex(COUNTER)}/8` },
        { dataId: 'name:stats.errors', accessType: 'read' },
        { dataId: 'name:counter' },
      ],
    })).body;
    assert.deepEqual(set.breakpoints.map((b) => b.verified), [false, false, true]);
    assert.equal(set.breakpoints[0].reason, 'failed');
    assert.match(set.breakpoints[0].message, /same address/);
    assert.match(set.breakpoints[1].message, /cannot watch reads/);
    assert.equal(set.breakpoints[2].id, bp);
    // A bad condition is refused with the syntax; a good one holds at every stop.
    set = (await dc.setDataBreakpointsRequest({
      breakpoints: [{ dataId: 'name:counter', condition: 'counter = 3' }],
    })).body;
    assert.equal(set.breakpoints[0].verified, false);
    assert.match(set.breakpoints[0].message, /Conditions compare the watched value/);
    stop = nextStop(dc);
    set = (await dc.setDataBreakpointsRequest({
      breakpoints: [{ dataId: 'name:counter', condition: '&0xf == 0', hitCondition: '2' }],
    })).body;
    assert.equal(set.breakpoints[0].verified, true, JSON.stringify(set));
    await dc.continueRequest({ threadId: tid });
    for (let i = 0; i < 3; i++) {
      ev = await stop;
      const [, newv] = ev.body.description.match(/→ (-?\d+) /) || ev.body.description.match(/now (-?\d+) /);
      assert.equal(BigInt(newv) % 16n, 0n, `condition &0xf == 0 held: ${ev.body.description}`);
      stop = nextStop(dc);
      await dc.continueRequest({ threadId: ev.body.threadId });
    }

    // Out of slots: four variables nobody writes take every slot; the fifth
    // is refused when it is set, naming the threads and who holds their
    // slots, in this session's words.
    const five = ['initialized', 'stats.errors', 'stats.hits', 'stats.flags[2]', 'stats.name[0]'];
    set = (await dc.setDataBreakpointsRequest({
      breakpoints: five.map((n) => ({ dataId: `name:${n}` })),
    })).body;
    assert.deepEqual(set.breakpoints.map((b) => b.verified), [true, true, true, true, false], JSON.stringify(set));
    const refused = set.breakpoints[4];
    assert.equal(refused.reason, 'failed');
    assert.match(refused.message, /out of debug-register slots in process \d+: \d+ threads? cannot take another watchpoint/);
    assert.match(refused.message, new RegExp(`tid ${PID} \\[watchpoints #\\d+,#\\d+,#\\d+,#\\d+\\]`));
    assert.match(refused.message, /In this session: watchpoint #\d+ is data breakpoint \d+ \(initialized\)/);

    // Clear, then pause: every thread stops; a stack of any of them.
    set = (await dc.setDataBreakpointsRequest({ breakpoints: [] })).body;
    assert.deepEqual(set.breakpoints, []);
    // A stop that came in before the clear may still be on its way.
    await new Promise((r) => setTimeout(r, 200));
    stop = nextStop(dc);
    await dc.pauseRequest({ threadId: PID });
    ev = await stop;
    assert.equal(ev.body.reason, 'pause');
    const main = (await dc.stackTraceRequest({ threadId: PID })).body.stackFrames;
    assert.ok(main.length >= 1, 'the paused main thread has a stack');
    await dc.continueRequest({ threadId: PID });
    await dc.disconnectRequest({ terminateDebuggee: false });
  } finally {
    // After a disconnect the adapter has exited; after a failure, end it.
    dc._adapterProcess?.kill();
  }
});
