'use strict';
// Streams a generation to stdout:
//   node example.js MODEL.flm "Once upon a time" [--max-tokens 128] [--temperature 0.8] [--seed 0] [--threads 0]
// The prompt is printed first, then the continuation as it is generated; statistics go to stderr.

const { parseArgs } = require('node:util');
const { Model } = require('./fastllm');

function main() {
    const { values, positionals } = parseArgs({
        allowPositionals: true,
        options: {
            'max-tokens': { type: 'string', default: '128' },
            temperature: { type: 'string', default: '0.8' },
            seed: { type: 'string', default: '0' },
            threads: { type: 'string', default: '0' },
        },
    });
    if (positionals.length !== 2) {
        console.error('usage: node example.js MODEL.flm "prompt" [--max-tokens N] [--temperature T] [--seed S] '
            + '[--threads N]');
        process.exitCode = 2;
        return;
    }
    const [modelPath, prompt] = positionals;
    const number = (name) => {
        const x = Number(values[name]);
        if (!Number.isFinite(x)) throw new Error(`--${name}: not a number: ${values[name]}`);
        return x;
    };

    const threads = number('threads');
    const options = {
        maxNewTokens: number('max-tokens'),
        temperature: number('temperature'),
        seed: number('seed'),
        onToken: (piece) => {
            process.stdout.write(piece); // no return value: keep going (returning false would stop)
        },
    };

    const model = Model.load(modelPath, { threads });
    const session = model.createSession();
    try {
        process.stdout.write(prompt);
        const result = session.generate(prompt, options);
        process.stdout.write('\n');
        const tokPerS = result.generateMs > 0 ? (result.nTokens * 1000) / result.generateMs : 0;
        console.error(`[${result.nPromptTokens} prompt tokens in ${result.promptMs.toFixed(1)} ms, `
            + `${result.nTokens} tokens in ${result.generateMs.toFixed(1)} ms (${tokPerS.toFixed(1)} tok/s), `
            + `stopped by ${result.stopReason}]`);
    } finally {
        session.free();
        model.free();
    }
}

try {
    main();
} catch (e) {
    console.error(`error: ${e.message}`);
    process.exitCode = 1;
}
