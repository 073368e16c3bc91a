// Checks deploy/k8s without a cluster (ctest: k8s_manifests).
//
//   node tests/k8s/validate.mjs --bin-dir BUILD_DIR
//
// For deploy/k8s/base and every overlay:
//   1. render it with tests/k8s/render.mjs; where kubectl is installed, also
//      with `kubectl kustomize`, and require the two to agree;
//   2. validate every object against the Kubernetes schemas
//      (kubernetes-models, offline);
//   3. check invariants: GPUs only in limits; gRPC probe ports among the
//      container's ports; every flag a container passes to a SpecStream
//      binary is one that binary's --help lists (the binaries in BUILD_DIR),
//      and each daemon's actual values, expanded as Kubernetes would, pass
//      its --check-config;
//      students carry the pod name, pod IP and pod index and pass them as
//      --name and --host; images pinned (no `latest`, no untagged); Secrets
//      referenced, never embedded.
// Also: job*.yaml beside a kustomization passes `specstream validate`, and
// deploy/docker/Dockerfile and Dockerfile.cuda pin their base images.
//
// Exit 0 when everything holds, 1 otherwise (each problem printed), 77 when
// the npm packages are missing outside CI (ctest: skipped).
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { isDeepStrictEqual } from "node:util";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(HERE, "../..");
const K8S = path.join(ROOT, "deploy/k8s");

let YAML;
let render;
try {
  YAML = (await import("yaml")).default;
  ({ render } = await import("./render.mjs"));
  await import("kubernetes-models/v1/Pod");
} catch (error) {
  const message = `k8s checks: npm packages missing (run npm ci in tests/k8s): ${error.message}`;
  if (process.env.CI === "true") {
    console.error(message);
    process.exit(1);
  }
  console.log(message);
  process.exit(77);
}

const args = process.argv.slice(2);
const binDirIndex = args.indexOf("--bin-dir");
const binDir = binDirIndex >= 0 ? args[binDirIndex + 1] : path.join(ROOT, "build");
const BINARIES = {
  "specstream-coordinator": "bin/specstream-coordinator",
  "specstream-teacher": "bin/specstream-teacher",
  "specstream-student": "bin/specstream-student",
  specstream: "bin/specstream",
};

const problems = [];
const fail = (where, what) => problems.push(`${where}: ${what}`);

// --- rendering -------------------------------------------------------------

function haveKubectl() {
  try {
    execFileSync("kubectl", ["version", "--client"], { stdio: "ignore" });
    return true;
  } catch {
    return false;
  }
}

function renderTarget(dir, useKubectl) {
  const objects = render(dir);
  if (useKubectl) {
    const text = execFileSync("kubectl", ["kustomize", dir], { encoding: "utf8" });
    const theirs = YAML.parseAllDocuments(text).map((d) => d.toJS());
    const key = (o) => `${o.kind}/${o.metadata?.name}`;
    const mine = new Map(objects.map((o) => [key(o), JSON.parse(JSON.stringify(o))]));
    if (theirs.length !== objects.length) {
      fail(dir, `kubectl kustomize renders ${theirs.length} objects, render.mjs ${objects.length}`);
    }
    for (const object of theirs) {
      if (!isDeepStrictEqual(mine.get(key(object)), object)) {
        fail(dir, `${key(object)} differs between kubectl kustomize and render.mjs`);
      }
    }
  }
  return objects;
}

// --- schema validation -----------------------------------------------------

async function validateSchema(where, object) {
  const [group, version] = object.apiVersion.includes("/")
    ? object.apiVersion.split("/")
    : [null, object.apiVersion];
  const module = group
    ? `kubernetes-models/${group}/${version}/${object.kind}`
    : `kubernetes-models/${version}/${object.kind}`;
  let Model;
  try {
    Model = (await import(module))[object.kind];
  } catch {
    fail(where, `no schema for ${object.apiVersion} ${object.kind}`);
    return;
  }
  try {
    new Model(object).validate();
  } catch (error) {
    fail(where, `schema: ${error.message}`);
  }
  if (!object.metadata?.name) fail(where, "metadata.name missing");
}

// --- invariants ------------------------------------------------------------

const helpCache = new Map();
function acceptedFlags(binary, subcommand) {
  const cacheKey = `${binary} ${subcommand ?? ""}`;
  if (helpCache.has(cacheKey)) return helpCache.get(cacheKey);
  const exe = path.join(binDir, BINARIES[binary]);
  const run = (argv) => {
    try {
      return execFileSync(exe, argv, { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    } catch (error) {
      return `${error.stdout ?? ""}${error.stderr ?? ""}`;
    }
  };
  if (!fs.existsSync(exe)) {
    helpCache.set(cacheKey, null);
    return null;
  }
  let text = run(["--help"]);
  if (subcommand) text += run([subcommand, "--help"]);
  const flags = new Set(text.match(/--[a-z][a-z0-9-]*/g) ?? []);
  helpCache.set(cacheKey, flags);
  return flags;
}

function checkArgs(where, container) {
  const binary = container.command?.[0];
  if (!(binary in BINARIES)) return;
  const argv = container.args ?? [];
  const subcommand = argv.find((a) => !a.startsWith("-"));
  const flags = acceptedFlags(binary, subcommand);
  if (flags === null) {
    fail(where, `${binary} not built in ${binDir}; cannot check its flags`);
    return;
  }
  for (const arg of argv) {
    if (!arg.startsWith("--")) {
      if (arg !== subcommand) fail(where, `"${arg}": pass values as --flag=value`);
      continue;
    }
    const flag = arg.split("=")[0];
    if (!flags.has(flag)) fail(where, `${binary} ${subcommand ?? ""} does not accept ${flag}`);
  }
}

function podSpecOf(object) {
  return object.spec?.template?.spec ?? object.spec?.jobTemplate?.spec?.template?.spec ?? null;
}

function portNumber(container, port) {
  if (typeof port === "number") return port;
  return (container.ports ?? []).find((p) => p.name === port)?.containerPort;
}

function checkImage(where, image) {
  if (!image) return fail(where, "no image");
  const slash = image.lastIndexOf("/");
  const colon = image.lastIndexOf(":");
  if (image.includes("@sha256:")) return;
  if (colon <= slash) return fail(where, `image ${image} has no tag`);
  if (image.slice(colon + 1) === "latest") fail(where, `image ${image} uses the latest tag`);
}

function checkObject(where, object) {
  if (object.kind === "Secret") fail(where, "Secrets are referenced, never committed");
  const spec = podSpecOf(object);
  if (!spec) return;
  const all = [...(spec.initContainers ?? []), ...(spec.containers ?? [])];
  for (const container of all) {
    const at = `${where} container ${container.name}`;
    checkImage(at, container.image);
    checkArgs(at, container);
    for (const [field, value] of Object.entries(container.resources?.requests ?? {})) {
      if (field.endsWith("/gpu")) fail(at, `${field} in requests (GPUs go in limits only)`);
    }
    for (const probeName of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      const probe = container[probeName];
      if (!probe) continue;
      const port = probe.grpc?.port ?? probe.httpGet?.port ?? probe.tcpSocket?.port;
      const number = portNumber(container, port);
      if (!(container.ports ?? []).some((p) => p.containerPort === number)) {
        fail(at, `${probeName} port ${port} is not among the container's ports`);
      }
    }
  }
  for (const container of spec.containers ?? []) {
    const at = `${where} container ${container.name}`;
    if (!container.readinessProbe?.grpc || !container.livenessProbe?.grpc) {
      if ((container.command?.[0] ?? "") in BINARIES) {
        fail(at, "daemons need gRPC readiness and liveness probes (the health service)");
      }
    }
    const names = new Set(container.ports?.map((p) => p.name));
    if (names.size !== (container.ports ?? []).length || [...names].some((n) => !n)) {
      fail(at, "every container port is named, uniquely");
    }
  }
  if (object.metadata?.name === "specstream-student") {
    const student = (spec.containers ?? []).find((c) => c.name === "student");
    if (!student) return fail(where, "no student container");
    const env = new Map((student.env ?? []).map((e) => [e.name, e]));
    const fieldOf = (name) => env.get(name)?.valueFrom?.fieldRef?.fieldPath;
    if (fieldOf("POD_NAME") !== "metadata.name") fail(where, "POD_NAME must come from metadata.name");
    if (fieldOf("POD_IP") !== "status.podIP") fail(where, "POD_IP must come from status.podIP");
    if (fieldOf("SPECSTREAM_POD_INDEX") !== "metadata.labels['apps.kubernetes.io/pod-index']") {
      fail(where, "SPECSTREAM_POD_INDEX must come from the pod-index label");
    }
    const argv = student.args ?? [];
    if (!argv.includes("--name=$(POD_NAME)")) fail(where, "students register as --name=$(POD_NAME)");
    if (!argv.includes("--host=$(POD_IP)")) {
      fail(where, "students advertise --host=$(POD_IP) (rank 0's rendezvous address)");
    }
  }
}

// Every daemon container's real flag values, as Kubernetes would expand them
// ($(VAR) from the container's env: ConfigMap entries, literal values, and
// stand-ins for the downward API), through the binary's --check-config: the
// values parse and validate, not only the flag names.
// exe + argv -> null (accepted) or the binary's stderr: the same args recur
// in every overlay and every self-test mutation.
const checkConfigCache = new Map();
function checkConfigRefusal(exe, argv) {
  const cacheKey = JSON.stringify([exe, ...argv]);
  if (!checkConfigCache.has(cacheKey)) {
    let refusal = null;
    try {
      execFileSync(exe, [...argv, "--check-config"], { stdio: ["ignore", "pipe", "pipe"] });
    } catch (error) {
      refusal = `${error.stderr ?? ""}`.trim();
    }
    checkConfigCache.set(cacheKey, refusal);
  }
  return checkConfigCache.get(cacheKey);
}

const DAEMONS = { "specstream-coordinator": null, "specstream-teacher": "serve",
                  "specstream-student": "serve" };
function checkConfigValues(where, objects) {
  const configMaps = new Map(
    objects.filter((o) => o.kind === "ConfigMap").map((o) => [o.metadata.name, o.data ?? {}]),
  );
  for (const object of objects) {
    const spec = podSpecOf(object);
    if (!spec) continue;
    for (const container of spec.containers ?? []) {
      const binary = container.command?.[0];
      if (!(binary in DAEMONS)) continue;
      const argv = container.args ?? [];
      // Global flags (--log-level) come before the subcommand.
      if (DAEMONS[binary] !== null && !argv.includes(DAEMONS[binary])) continue;
      const env = new Map();
      for (const from of container.envFrom ?? []) {
        for (const [k, v] of Object.entries(configMaps.get(from.configMapRef?.name) ?? {})) {
          env.set(k, String(v));
        }
      }
      for (const e of container.env ?? []) {
        const field = e.valueFrom?.fieldRef?.fieldPath;
        env.set(
          e.name,
          "value" in e ? String(e.value)
            : field === "metadata.name" ? `${object.metadata.name}-0`
            : field === "status.podIP" ? "10.0.0.10"
            : field?.includes("pod-index") ? "0"
            : "stand-in",
        );
      }
      const expanded = argv.map((a) =>
        a.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, name) => (env.has(name) ? env.get(name) : m)),
      );
      const exe = path.join(binDir, BINARIES[binary]);
      if (!fs.existsSync(exe)) continue;  // checkArgs reports it
      const refusal = checkConfigRefusal(exe, expanded);
      if (refusal !== null) {
        fail(`${where} ${object.kind}/${object.metadata.name} container ${container.name}`,
             `${binary} --check-config refuses its values: ${refusal}`);
      }
    }
  }
}

// --- self-test: every check catches what it is for -------------------------

// Each mutation of the rendered base must produce at least one problem.
async function selfTest() {
  const base = render(path.join(K8S, "base"));
  const find = (kind, name) => base.find((o) => o.kind === kind && o.metadata.name === name);
  const container = (o) => o.spec.template.spec.containers[0];
  const mutations = {
    "GPU in requests": (o) => {
      container(find("StatefulSet", "specstream-teacher")).resources.requests["nvidia.com/gpu"] = 1;
    },
    "probe on a port the container lacks": (o) => {
      container(find("Deployment", "specstream-coordinator")).readinessProbe.grpc.port = 7999;
    },
    "a flag the daemon does not accept": (o) => {
      container(find("StatefulSet", "specstream-student")).args.push("--no-such-flag=1");
    },
    "a latest tag": (o) => {
      container(find("Deployment", "specstream-coordinator")).image = "specstream:latest";
    },
    "an untagged image": (o) => {
      container(find("Deployment", "specstream-coordinator")).image = "specstream";
    },
    "students without POD_IP": (o) => {
      const student = container(find("StatefulSet", "specstream-student"));
      student.env = student.env.filter((e) => e.name !== "POD_IP");
    },
    "students not advertising their IP": (o) => {
      const student = container(find("StatefulSet", "specstream-student"));
      student.args = student.args.filter((a) => !a.startsWith("--host="));
    },
    "a schema violation": (o) => {
      find("StatefulSet", "specstream-teacher").spec.replicas = "two";
    },
    "a committed Secret": (o) => {
      base.push({ apiVersion: "v1", kind: "Secret", metadata: { name: "t" }, data: {} });
    },
    "a device name the teacher refuses": (o) => {
      find("ConfigMap", "specstream-config").data.TEACHER_DEVICES = "gpu0,gpu1";
    },
    "a heartbeat the coordinator refuses": (o) => {
      find("ConfigMap", "specstream-config").data.LOST_AFTER_S = "0";
    },
  };
  const pristine = JSON.stringify(base);
  let missed = 0;
  for (const [name, mutate] of Object.entries(mutations)) {
    base.splice(0, base.length, ...JSON.parse(pristine));
    mutate();
    problems.length = 0;
    for (const object of base) {
      const at = `${object.kind}/${object.metadata?.name}`;
      await validateSchema(at, object);
      checkObject(at, object);
    }
    checkConfigValues("base", base);
    if (problems.length === 0) {
      console.error(`self-test: "${name}" went unnoticed`);
      ++missed;
    } else {
      console.log(`self-test: "${name}" caught: ${problems[0]}`);
    }
  }
  problems.length = 0;
  base.splice(0, base.length, ...JSON.parse(pristine));
  for (const object of base) checkObject(`${object.kind}/${object.metadata?.name}`, object);
  checkConfigValues("base", base);
  if (problems.length > 0) {
    console.error(`self-test: the unmutated base has problems: ${problems.join("; ")}`);
    ++missed;
  }
  process.exit(missed === 0 ? 0 : 1);
}
if (args.includes("--self-test")) await selfTest();

// --- main ------------------------------------------------------------------

const useKubectl = haveKubectl();
const targets = [
  path.join(K8S, "base"),
  ...fs
    .readdirSync(path.join(K8S, "overlays"))
    .map((o) => path.join(K8S, "overlays", o))
    .filter((d) => fs.existsSync(path.join(d, "kustomization.yaml"))),
];
let checked = 0;
for (const dir of targets) {
  const where = path.relative(ROOT, dir);
  let objects = [];
  try {
    objects = renderTarget(dir, useKubectl);
  } catch (error) {
    fail(where, `render: ${error.message}`);
    continue;
  }
  for (const object of objects) {
    const at = `${where} ${object.kind}/${object.metadata?.name}`;
    await validateSchema(at, object);
    checkObject(at, object);
    ++checked;
  }
  checkConfigValues(where, objects);
}
// Job specs shipped beside the manifests validate as the coordinator would.
for (const dir of targets) {
  for (const name of fs.readdirSync(dir).filter((f) => /^job.*\.ya?ml$/.test(f))) {
    const file = path.join(dir, name);
    const cli = path.join(binDir, BINARIES.specstream);
    if (!fs.existsSync(cli)) {
      fail(path.relative(ROOT, file), `specstream not built in ${binDir}`);
      continue;
    }
    try {
      execFileSync(cli, ["validate", file], { stdio: ["ignore", "pipe", "pipe"] });
    } catch (error) {
      fail(path.relative(ROOT, file), `specstream validate: ${error.stderr}`.trim());
    }
  }
}

for (const name of ["Dockerfile", "Dockerfile.cuda"]) {
  const dockerfile = path.join(ROOT, "deploy/docker", name);
  if (!fs.existsSync(dockerfile)) {
    fail(`deploy/docker/${name}`, "missing");
    continue;
  }
  for (const line of fs.readFileSync(dockerfile, "utf8").split("\n")) {
    const match = line.match(/^FROM\s+(\S+)/i);
    if (match) checkImage(`deploy/docker/${name}`, match[1]);
  }
}

console.log(
  `k8s checks: ${targets.length} kustomizations, ${checked} objects, renderer ${
    useKubectl ? "render.mjs + kubectl kustomize (agreeing)" : "render.mjs"
  }, binaries from ${binDir}`,
);
if (problems.length > 0) {
  for (const problem of problems) console.error(`  ${problem}`);
  console.error(`k8s checks: ${problems.length} problem(s)`);
  process.exit(1);
}
console.log("k8s checks: all hold");
