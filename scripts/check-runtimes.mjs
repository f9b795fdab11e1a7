// Checks the pinned toolchain after `npm install` / `npm ci` (run by `make setup` and the Dockerfile,
// with the pinned Node itself: node_modules/.bin/node scripts/check-runtimes.mjs [project dir]).
//
// It fails, with one line per problem, when: this Node is not the version package.json pins; a
// pinned runtime is missing or installed at another version than pinned; any installed package's
// `engines.node` does not accept this Node (npm only warns about that). `--json` prints the versions
// instead of the summary, for tests and image labels.
import { readFileSync, readdirSync, existsSync } from "node:fs";
import { join, resolve } from "node:path";
import semver from "semver";

const args = process.argv.slice(2);
const asJson = args.includes("--json");
const root = resolve(args.find((a) => !a.startsWith("--")) ?? ".");
const modules = join(root, "node_modules");

function readJson(path) {
  return JSON.parse(readFileSync(path, "utf8"));
}

// Every installed package.json (scoped and nested node_modules included), once per directory.
function* installed(dir) {
  if (!existsSync(dir)) return;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    if (!entry.isDirectory() || entry.name.startsWith(".")) continue;
    const path = join(dir, entry.name);
    if (entry.name.startsWith("@")) {
      yield* installed(path);
      continue;
    }
    const manifest = join(path, "package.json");
    if (existsSync(manifest)) yield [path, readJson(manifest)];
    yield* installed(join(path, "node_modules"));
  }
}

const pins = readJson(join(root, "package.json")).dependencies ?? {};
const node = process.version.replace(/^v/, "");
const problems = [];

if (!pins.node) {
  problems.push("package.json pins no Node: add the npm package `node` at an exact version to dependencies");
} else if (pins.node !== node) {
  problems.push(
    `this Node is ${node} but package.json pins node ${pins.node}: run \`npm ci\` (or \`make setup\`) ` +
      `and run this check with node_modules/.bin/node`,
  );
}

const versions = { node };
for (const [name, pinned] of Object.entries(pins)) {
  if (name === "node") continue;
  const manifest = join(modules, name, "package.json");
  if (!existsSync(manifest)) {
    problems.push(`${name} ${pinned} is pinned in package.json but not installed: run \`npm ci\``);
    continue;
  }
  const { version, engines } = readJson(manifest);
  versions[name] = { version, engines_node: engines?.node ?? null };
  if (version !== pinned) {
    problems.push(`${name} is installed at ${version} but package.json pins ${pinned}: run \`npm ci\``);
  }
}

for (const [path, manifest] of installed(modules)) {
  const range = manifest.engines?.node;
  if (typeof range !== "string") continue;
  if (semver.validRange(range) === null) {
    problems.push(`${manifest.name} ${manifest.version} (${path}) declares an unreadable engines.node ${JSON.stringify(range)}`);
  } else if (!semver.satisfies(node, range)) {
    problems.push(`${manifest.name} ${manifest.version} needs node ${range}, but this Node is ${node}`);
  }
}

if (problems.length > 0) {
  for (const line of problems) console.error(`check-runtimes: ${line}`);
  process.exit(1);
}
if (asJson) {
  console.log(JSON.stringify(versions, null, 2));
} else {
  const listed = Object.entries(versions)
    .filter(([name]) => name !== "node")
    .map(([name, v]) => `${name} ${v.version}`);
  console.log(`check-runtimes: node ${node} satisfies every installed package's engines; ${listed.join(", ")}`);
}
