// The published tarball holds the package's code, its type declarations,
// its README, LICENSE and package.json: no tests, lock file or
// node_modules.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');

test('npm pack lists only the code, the types, README and license', () => {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'],
    { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  const files = JSON.parse(out)[0].files.map((f) => f.path).sort();
  const expected = ['LICENSE', 'README.md', 'index.d.ts', 'index.js', 'package.json',
    ...fs.readdirSync(path.join(root, 'lib')).map((f) => `lib/${f}`)];
  assert.deepStrictEqual(files, expected.sort());
  // every module the package requires is in the tarball
  for (const f of files.filter((f) => f.endsWith('.js'))) {
    const src = fs.readFileSync(path.join(root, f), 'utf8');
    for (const [, dep] of src.matchAll(/require\('(\.[^']+)'\)/g)) {
      const target = path.relative(root, require.resolve(path.join(root, path.dirname(f), dep)));
      assert.ok(files.includes(target), `${f} requires ${dep}, which is not packed`);
    }
  }
});

test('the package loads from its entry point and declares every export', () => {
  const idem = require(root);
  const dts = fs.readFileSync(path.join(root, 'index.d.ts'), 'utf8');
  for (const name of Object.keys(idem))
    assert.match(dts, new RegExp(`export (declare )?(function|class) ${name}\\b`), `${name} is not declared`);
  const pkg = require(path.join(root, 'package.json'));
  // nothing at run time: the dependencies are the types index.d.ts imports
  assert.deepStrictEqual(Object.keys(pkg.dependencies || {}).sort(), ['@types/node', '@types/pg']);
  assert.deepStrictEqual(Object.keys(pkg.peerDependencies).sort(), ['@opentelemetry/api', '@platformatic/kafka', 'pg']);
  // tracing and consumeKafka are optional: the package works without the
  // OpenTelemetry API, and consumeKafka on the caller's Consumer, whose
  // client no file of the package requires
  assert.deepStrictEqual(pkg.peerDependenciesMeta,
    { '@opentelemetry/api': { optional: true }, '@platformatic/kafka': { optional: true } });
  for (const f of ['index.js', ...fs.readdirSync(path.join(root, 'lib')).map((f) => `lib/${f}`)])
    assert.doesNotMatch(fs.readFileSync(path.join(root, f), 'utf8'), /require\(['"]@platformatic/, f);
  // the project's license (META.json, debian/copyright)
  assert.strictEqual(pkg.license, 'PostgreSQL');
});
