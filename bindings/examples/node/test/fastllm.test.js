'use strict';
// Tests of fastllm.js against a real model. Needs:
//   FASTLLM_MODEL   a .flm file (tests/test_node.py converts stories260K for it)
//   FASTLLM_GOLDEN  a JSON file with "prompt", "greedy_max_new_tokens", "greedy_output_text" (the prompt
//                   and its greedy continuation) and optionally "input_ids" / "greedy_output_ids"
// and the library (FASTLLM_LIBRARY, or the checkout's build/libfastllm.so).
// Run: FASTLLM_MODEL=... FASTLLM_GOLDEN=... node --test

const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const fastllm = require('../fastllm');
const { Model, Session, FastllmError } = fastllm;

for (const name of ['FASTLLM_MODEL', 'FASTLLM_GOLDEN']) {
    if (!process.env[name]) {
        throw new Error(`set ${name} (see the top of ${path.basename(__filename)}); tests/test_node.py sets both`);
    }
}
const MODEL_PATH = process.env.FASTLLM_MODEL;
const GOLDEN = JSON.parse(fs.readFileSync(process.env.FASTLLM_GOLDEN, 'utf8'));
const N_NEW = GOLDEN.greedy_max_new_tokens
    ?? GOLDEN.greedy_output_ids.length - GOLDEN.input_ids.length;
const CONTINUATION = GOLDEN.greedy_output_text.slice(GOLDEN.prompt.length);
const GREEDY = { maxNewTokens: N_NEW, temperature: 0 };

let model;
test.before(() => {
    model = Model.load(MODEL_PATH, { threads: 2 });
});
test.after(() => model.free());

function withSession(fn) {
    const session = model.createSession();
    try {
        return fn(session);
    } finally {
        session.free();
    }
}

test('fastllm.js mirrors the ABI version of the header in this checkout', () => {
    const header = path.resolve(__dirname, '..', '..', '..', '..', 'include', 'fastllm.h');
    const m = fs.readFileSync(header, 'utf8').match(/#define FASTLLM_ABI_VERSION (\d+)/);
    assert.ok(m, `no FASTLLM_ABI_VERSION in ${header}`);
    assert.equal(fastllm.ABI_VERSION, Number(m[1]));
    assert.match(fastllm.version, /^\d+\.\d+\.\d+/);
});

test('model info', () => {
    assert.ok(model.info.vocabSize > 0);
    assert.ok(model.info.contextLength > N_NEW);
    assert.equal(typeof model.info.architecture, 'string');
});

test('tokenize matches the golden ids, and detokenize round-trips', () => {
    const ids = model.tokenize(GOLDEN.prompt);
    assert.ok(ids instanceof Int32Array);
    if (GOLDEN.input_ids) assert.deepEqual(Array.from(ids), GOLDEN.input_ids);
    assert.equal(model.detokenize(ids), GOLDEN.prompt); // BOS gives no text
    for (const text of [GOLDEN.greedy_output_text, 'héllo wörld ✓', ' two  spaces\nand a newline', '']) {
        const noBos = model.tokenize(text, { addBos: false });
        assert.equal(model.detokenize(noBos), text);
        assert.equal(model.detokenize(Array.from(noBos)), text); // plain arrays work too
    }
    assert.equal(model.tokenize('', { addBos: true }).length, 1);
    assert.equal(model.tokenize('', { addBos: false }).length, 0);
});

test('greedy generation reproduces the golden output', () => {
    withSession((session) => {
        const r = session.generate(GOLDEN.prompt, GREEDY);
        assert.equal(GOLDEN.prompt + r.text, GOLDEN.greedy_output_text);
        assert.equal(r.nTokens, N_NEW);
        assert.equal(r.stopReason, 'max_tokens');
        if (GOLDEN.greedy_output_ids) assert.deepEqual(Array.from(session.tokens), GOLDEN.greedy_output_ids);
    });
});

test('streamed pieces concatenate to the returned text', () => {
    withSession((session) => {
        const pieces = [];
        const r = session.generate(GOLDEN.prompt, { ...GREEDY, onToken: (piece) => { pieces.push(piece); } });
        assert.ok(pieces.length > 5, `only ${pieces.length} pieces`);
        assert.ok(pieces.every((p) => typeof p === 'string' && p.length > 0));
        assert.equal(pieces.join(''), r.text);
        assert.equal(r.text, CONTINUATION);
    });
});

test('onToken returning false stops after exactly that many tokens', () => {
    withSession((session) => {
        for (const n of [1, 3]) {
            session.reset();
            const pieces = [];
            const r = session.generate(GOLDEN.prompt, {
                ...GREEDY,
                onToken: (piece) => {
                    pieces.push(piece);
                    return pieces.length < n; // false on the n-th piece
                },
            });
            assert.equal(pieces.length, n);
            assert.equal(r.nTokens, n);
            assert.equal(r.stopReason, 'callback');
            assert.equal(r.text, pieces.join(''));
            assert.ok(CONTINUATION.startsWith(r.text));
        }
    });
});

test('onToken returning true or undefined continues', () => {
    withSession((session) => {
        const r = session.generate(GOLDEN.prompt, { ...GREEDY, onToken: () => true });
        assert.equal(r.nTokens, N_NEW);
    });
});

test('an exception in onToken stops the generation and is rethrown; the session stays usable', () => {
    withSession((session) => {
        assert.throws(
            () => session.generate(GOLDEN.prompt, { ...GREEDY, onToken: () => { throw new RangeError('from onToken'); } }),
            { name: 'RangeError', message: 'from onToken' });
        session.reset();
        assert.equal(session.generate(GOLDEN.prompt, GREEDY).text, CONTINUATION);
    });
});

test('a stop string ends the text before it', () => {
    const stop = CONTINUATION.slice(12, 17);
    withSession((session) => {
        const r = session.generate(GOLDEN.prompt, { ...GREEDY, stop: ['@@never@@', stop] });
        assert.equal(r.stopReason, 'stop_string');
        assert.equal(r.text, CONTINUATION.slice(0, CONTINUATION.indexOf(stop)));
    });
});

test('a session continues its context; reset forgets it', () => {
    withSession((session) => {
        const half = Math.floor(N_NEW / 2);
        const a = session.generate(GOLDEN.prompt, { ...GREEDY, maxNewTokens: half });
        const b = session.generate([], { ...GREEDY, maxNewTokens: N_NEW - half });
        assert.equal(a.text + b.text, CONTINUATION);
        if (GOLDEN.greedy_output_ids) assert.equal(session.nTokens, GOLDEN.greedy_output_ids.length);
        session.reset();
        assert.equal(session.nTokens, 0);
        assert.equal(session.generate(GOLDEN.prompt, GREEDY).text, CONTINUATION);
    });
});

test('a fork shares the prefix; a saved state restores the conversation', () => {
    const persona = model.createSession({ kvType: 'f32' });
    try {
        persona.generate(GOLDEN.prompt, { ...GREEDY, maxNewTokens: 1 });
        const npc = persona.fork();
        try {
            assert.equal(npc.nTokens, persona.nTokens);
            const m = npc.memory();
            assert.ok(m.kv_shared_bytes > 0 && m.kv_shared_bytes <= m.kv_bytes);
            const state = npc.saveState();
            const first = npc.generate([], { ...GREEDY, maxNewTokens: 8 }).text;
            const restored = model.createSession({ kvType: 'f32' });
            try {
                restored.loadState(state);
                assert.equal(restored.generate([], { ...GREEDY, maxNewTokens: 8 }).text, first);
                assert.throws(() => restored.loadState(state.subarray(0, 50)),
                    (e) => e instanceof FastllmError && e.statusName === 'FASTLLM_ERR_BAD_FORMAT');
            } finally {
                restored.free();
            }
            assert.equal(npc.cancel(), false);  // nothing in progress
        } finally {
            npc.free();
        }
    } finally {
        persona.free();
    }
    assert.throws(() => model.createSession({ kvType: 'q4' }), TypeError);
});

test('sampling with a seed is reproducible', () => {
    const opts = { maxNewTokens: 20, temperature: 1.0, topK: 0, topP: 1.0, minP: 0 };
    const run = (seed) => withSession((s) => s.generate(GOLDEN.prompt, { ...opts, seed }).text);
    assert.equal(run(7), run(7));
    assert.equal(run(7n), run(7)); // BigInt seeds (uint64) too
});

test('loading a missing file throws a readable FastllmError', () => {
    const missing = path.join(os.tmpdir(), `fastllm-node-missing-${process.pid}.flm`);
    assert.throws(() => Model.load(missing), (e) => {
        assert.ok(e instanceof FastllmError);
        assert.equal(e.statusName, 'FASTLLM_ERR_IO');
        assert.ok(e.message.includes(missing), e.message);
        return true;
    });
});

test('loading a garbage or empty file throws a readable FastllmError', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'fastllm-node-'));
    try {
        const garbage = path.join(dir, 'garbage.flm');
        fs.writeFileSync(garbage, Buffer.from('this is not a model\n'.repeat(200)));
        const empty = path.join(dir, 'empty.flm');
        fs.writeFileSync(empty, '');
        for (const file of [garbage, empty]) {
            assert.throws(() => Model.load(file), (e) => {
                assert.ok(e instanceof FastllmError);
                assert.equal(e.statusName, 'FASTLLM_ERR_BAD_FORMAT');
                assert.ok(e.message.length > 'FASTLLM_ERR_BAD_FORMAT'.length + 10, e.message);
                return true;
            });
        }
    } finally {
        fs.rmSync(dir, { recursive: true, force: true });
    }
});

test('errors from the library carry the status and its message', () => {
    withSession((session) => {
        assert.throws(() => session.generate([model.info.vocabSize + 5], GREEDY), (e) => {
            assert.ok(e instanceof FastllmError);
            assert.equal(e.statusName, 'FASTLLM_ERR_TOKEN_OUT_OF_RANGE');
            return true;
        });
    });
    assert.throws(() => model.detokenize([-1]), { statusName: 'FASTLLM_ERR_TOKEN_OUT_OF_RANGE' });
});

test('using a freed session or model throws instead of crashing', () => {
    const m = Model.load(MODEL_PATH, { threads: 1 });
    const s1 = new Session(m);
    const s2 = m.createSession();
    s1.free();
    s1.free(); // twice is harmless
    assert.throws(() => s1.generate(GOLDEN.prompt, GREEDY), /session has been freed/);
    assert.throws(() => s1.reset(), /session has been freed/);
    assert.throws(() => s1.nTokens, /session has been freed/);

    m.free(); // also frees s2, which must not outlive it
    m.free();
    assert.throws(() => s2.generate(GOLDEN.prompt, GREEDY), FastllmError);
    assert.throws(() => m.tokenize('x'), /model has been freed/);
    assert.throws(() => m.detokenize([1]), /model has been freed/);
    assert.throws(() => m.createSession(), /model has been freed/);
});

test('a grammar constrains the output and ends it with stop reason "grammar"', () => {
    withSession((session) => {
        const r = session.generate(GOLDEN.prompt, { maxNewTokens: 40, temperature: 1, seed: 3,
                                                    grammar: 'root ::= ("yes" | "no") "."' });
        assert.ok(r.text === 'yes.' || r.text === 'no.', r.text);
        assert.equal(r.stopReason, 'grammar');
    });
});

test('grammarTriggers make a grammar lazy: free text, then the grammar from the trigger on', () => {
    withSession((session) => {
        let r;
        for (let seed = 2; seed < 8 && !(r && r.text.includes(' the')); seed++) {  // nearly always the first
            session.reset();
            r = session.generate(GOLDEN.prompt, { maxNewTokens: 120, temperature: 1, seed,
                                                  grammar: 'root ::= " the" " end."', grammarTriggers: [' the'] });
        }
        const at = r.text.indexOf(' the');
        assert.ok(at >= 0, r.text);  // stories260K writes " the" within 120 tokens
        assert.equal(r.text.slice(at), ' the end.');
        assert.equal(r.stopReason, 'grammar');
        assert.throws(() => session.generate(GOLDEN.prompt, { grammarTriggers: ['x'] }),
                      { statusName: 'FASTLLM_ERR_INVALID_ARGUMENT', message: /without a grammar/ });
    });
});

test('a JSON schema (an object) gives JSON of that shape', () => {
    const schema = { type: 'object', properties: { n: { type: 'integer', minimum: 1, maximum: 9 } },
                     required: ['n'] };
    withSession((session) => {
        const r = session.generate(GOLDEN.prompt, { maxNewTokens: 40, temperature: 1, seed: 5, jsonSchema: schema });
        const value = JSON.parse(r.text);
        assert.deepEqual(Object.keys(value), ['n']);
        assert.ok(Number.isInteger(value.n) && value.n >= 1 && value.n <= 9, r.text);
        assert.equal(r.stopReason, 'grammar');
    });
    assert.match(fastllm.jsonSchemaToGrammar(schema), /^root ::= /);
    assert.throws(() => fastllm.jsonSchemaToGrammar({ type: 'string', pattern: 'a+' }), (e) => {
        assert.equal(e.statusName, 'FASTLLM_ERR_UNSUPPORTED');
        assert.match(e.message, /unsupported keyword 'pattern' at \//);
        return true;
    });
    withSession((session) => {
        assert.throws(() => session.generate(GOLDEN.prompt, { grammar: 'root ::= "a' }),
                      { statusName: 'FASTLLM_ERR_INVALID_ARGUMENT', message: /grammar: line 1 col 10/ });
    });
});

test('embed gives unit vectors of the hidden size, one per text (or per token); rerank needs a cross-encoder', () => {
    const v = model.embed(['Once upon a time', 'The dog ran']);
    assert.equal(v.length, 2);
    for (const row of v) {
        assert.equal(row.length, model.info.hiddenSize);
        assert.ok(Math.abs(Math.hypot(...row) - 1) < 1e-5);
    }
    const alone = model.embed('Once upon a time')[0]; // alone as in the batch (up to rounding)
    assert.ok(alone.every((x, i) => Math.abs(x - v[0][i]) < 1e-5));
    assert.equal(model.embed(['Once upon a time'], { pooling: 'none' }).length, model.tokenize('Once upon a time').length);
    assert.throws(() => model.embed([]), (e) => e instanceof FastllmError && /no inputs/.test(e.message));
    assert.throws(() => model.rerank('q', ['d']), (e) => e instanceof FastllmError && /cross-encoder/.test(e.message));
});
