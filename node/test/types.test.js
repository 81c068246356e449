// The hand-written declarations compile, strictly, against node-postgres's
// own types, and refuse what they should (test/types/usage.ts).
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

test('index.d.ts type-checks the README\'s usage and refuses wrong calls', () => {
  const tsc = require.resolve('typescript/bin/tsc');
  const r = spawnSync(process.execPath, [tsc, '--noEmit', '--strict', '--module', 'commonjs',
    '--moduleResolution', 'node', '--target', 'es2020', '--types', 'node',
    path.join(__dirname, 'types', 'usage.ts')], { encoding: 'utf8' });
  assert.strictEqual(r.status, 0, r.stdout + r.stderr);
});
