// An application in TypeScript that installs the packed package (npm pack)
// with typescript and pg, and nothing else, compiles against its
// declarations with tsc --strict: the types they import (@types/pg,
// @types/node) come with the package.  Needs the npm registry (or the npm
// cache that `npm ci` filled); bounded in time.
'use strict';

const test = require('node:test');
const assert = require('node:assert');
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const root = path.join(__dirname, '..');
const pkg = require(path.join(root, 'package.json'));
const NPM_TIMEOUT_MS = 240000;

function run(cmd, args, cwd) {
  const r = spawnSync(cmd, args, { cwd, encoding: 'utf8', timeout: NPM_TIMEOUT_MS });
  assert.ok(!r.error, `${cmd} ${args.join(' ')}: ${r.error}`);
  return r;
}

// installs the package into a new project in dir/app with the arguments
// given (a tarball, or a directory and the option the README names)
function compileProject(dir, packageArgs) {
  const app = path.join(dir, 'app');
  fs.mkdirSync(app);
  fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }));
  fs.copyFileSync(path.join(__dirname, 'packed', 'consumer.ts'), path.join(app, 'consumer.ts'));
  const installed = run('npm', ['install', '--no-audit', '--no-fund', '--ignore-scripts', '--prefer-offline',
    ...packageArgs, `typescript@${pkg.devDependencies.typescript}`, `pg@${pkg.devDependencies.pg}`], app);
  assert.strictEqual(installed.status, 0, installed.stdout + installed.stderr);

  // the consumer uses every export of the installed package
  const source = fs.readFileSync(path.join(app, 'consumer.ts'), 'utf8');
  for (const name of Object.keys(require(path.join(app, 'node_modules', 'idem-consumer'))))
    assert.match(source, new RegExp(`idem\\.${name}\\b`), `consumer.ts does not use ${name}`);

  const tsc = run(process.execPath, [path.join(app, 'node_modules', 'typescript', 'bin', 'tsc'),
    '--strict', '--noEmit', '--target', 'es2020', '--module', 'commonjs', 'consumer.ts'], app);
  assert.strictEqual(tsc.status, 0, tsc.stdout + tsc.stderr);
}

test('a TypeScript project compiles against the installed tarball with tsc --strict', { timeout: 2 * NPM_TIMEOUT_MS + 60000 }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-consumer-ts-'));
  try {
    const packed = run('npm', ['pack', '--ignore-scripts', '--silent', '--pack-destination', dir], root);
    assert.strictEqual(packed.status, 0, packed.stderr);
    compileProject(dir, [path.join(dir, packed.stdout.trim().split('\n').pop())]);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// a plain directory install is a symbolic link, whose dependencies npm does
// not install: the README's directory install copies it, as a tarball is
test('and against the package installed from its directory with --install-links', { timeout: 2 * NPM_TIMEOUT_MS + 60000 }, () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-consumer-ts-'));
  try {
    compileProject(dir, ['--install-links', root]);
    const installed = path.join(dir, 'app', 'node_modules', 'idem-consumer');
    assert.ok(!fs.lstatSync(installed).isSymbolicLink(), 'the package was linked, not installed');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
